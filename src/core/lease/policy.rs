//! The lease policy's state and its inputs (S-L2).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::super::time::Time;
use super::config::LeaseConfig;
use super::event::{LeaseEvent, NotWritable, PartitionState, StopCause};
use super::health::{LeaseCounters, LeaseHealth, LeaseState};
use super::id::{Epoch, Partition};
use super::phase::{Kind, Pending, Phase};
use super::store::{Request, RequestId, StoreError};
use super::writes::{WriteGrant, Writes};

/// How a shutdown leaves the fleet (S-L28).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Departure {
    /// The instance comes back under the same id (a restart, a rolling
    /// deploy): its heartbeat row stays, so for `rejoin_grace` no other
    /// member takes its partitions and it gets them back (S-L21).
    Rejoin,
    /// The instance leaves for good (scaling down): once its leases are
    /// released its heartbeat row is deleted, and the others rebalance at
    /// their next heartbeat.
    Leave,
}

/// Where a leaving shutdown's delete of the heartbeat row stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LeaveStep {
    NotSent,
    Sent,
    Done,
}

/// The lease policy of one instance: a deterministic, sans-IO state
/// machine (S-L2). It decides when to heartbeat and renew, each lease's
/// local deadline, when a partition's writes must stop, which partitions
/// to take and release, and the epoch rule; the driver runs the store
/// operations it asks for and tells it what they answered.
///
/// Inputs, each with the instance's monotonic [`Time`] (never the
/// store's):
/// [`handle_reply`](Self::handle_reply) (every request's reply or error),
/// [`begin_write`](Self::begin_write) and [`end_write`](Self::end_write)
/// (each write of a partition's items, S-L8, S-L17),
/// [`handle_stale_epoch`](Self::handle_stale_epoch) (a write the sink
/// refused, S-L15), [`shutdown`](Self::shutdown) (S-L28),
/// [`handle_timeout`](Self::handle_timeout). After every input, drain its
/// outputs in this order:
/// 1. [`poll_request`](Self::poll_request) until `None`: store operations
///    to send, at once (the instant it is polled is taken as the instant
///    it is sent, S-L4);
/// 2. [`poll_event`](Self::poll_event) until `None`: partitions that
///    became writable, stopped or were released;
/// 3. [`poll_timeout`](Self::poll_timeout): when to call
///    [`handle_timeout`](Self::handle_timeout) next.
///
/// Every input first handles what is due at its `now` (deadlines passed,
/// requests unanswered for [`request_timeout`](LeaseConfig::request_timeout)),
/// so a driver late with `handle_timeout` never starts a write past a
/// deadline. Time never runs backwards: a `now` earlier than one already
/// seen is taken as the latest seen. A spurious `handle_timeout` is
/// harmless.
///
/// The driver answers each request once, with what its statement returned
/// or a [`StoreError`], and should give a statement up (as
/// [`StoreError::Unknown`]) before `request_timeout`; a reply later than
/// that is refused ([`ReplyError::Unknown`](super::ReplyError::Unknown)),
/// a late grant in it released.
///
/// Cost: O(H + R) per input for H partitions this instance has business
/// with and R requests in flight (at most a few per period), and
/// O(P + F · N · log(F · N)) per heartbeat whose view changed the plan
/// ([`Plan`](super::Plan)). It keeps O(P + W) memory for W writes in
/// flight.
#[derive(Debug)]
pub struct LeasePolicy {
    pub(super) config: LeaseConfig,
    /// The latest time seen.
    pub(super) now: Time,
    pub(super) next_id: u64,
    pub(super) pending: BTreeMap<RequestId, Pending>,
    pub(super) parts: BTreeMap<Partition, Phase>,
    /// When the heartbeat whose view the share comes from was sent.
    pub(super) view_sent: Option<Time>,
    /// Members in that view.
    pub(super) members: usize,
    /// The partitions the plan gives this instance.
    pub(super) share: BTreeSet<Partition>,
    pub(super) writes: Writes,
    pub(super) next_heartbeat: Time,
    /// `None` while nothing is held.
    pub(super) next_renewal: Option<Time>,
    pub(super) next_acquire: Time,
    /// Leases granted that nothing wants: released with the next release.
    pub(super) strays: Vec<(Partition, Epoch)>,
    pub(super) departure: Option<Departure>,
    pub(super) leave: LeaveStep,
    pub(super) events: VecDeque<LeaseEvent>,
    pub(super) counters: LeaseCounters,
    pub(super) last_renewed: Option<Time>,
    pub(super) renewal_failures: u32,
    /// Requests failed in a row, and when the first of them was sent.
    pub(super) failures: u32,
    pub(super) failing_since: Option<Time>,
    pub(super) last_loss: Option<(StopCause, Time)>,
    /// No deadline passes and no request times out before this.
    pub(super) next_check: Time,
}

impl LeasePolicy {
    /// A policy for the instance `config` names, starting at `now`. Its
    /// first request is a heartbeat (S-L3).
    pub fn new(config: LeaseConfig, now: Time) -> LeasePolicy {
        LeasePolicy {
            config,
            now,
            next_id: 0,
            pending: BTreeMap::new(),
            parts: BTreeMap::new(),
            view_sent: None,
            members: 0,
            share: BTreeSet::new(),
            writes: Writes::default(),
            next_heartbeat: now,
            next_renewal: None,
            next_acquire: now,
            strays: Vec::new(),
            departure: None,
            leave: LeaveStep::NotSent,
            events: VecDeque::new(),
            counters: LeaseCounters::default(),
            last_renewed: None,
            renewal_failures: 0,
            failures: 0,
            failing_since: None,
            last_loss: None,
            next_check: Time::MAX,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// Handles what is due at `now`: leases whose deadline passed stop
    /// (S-L8), requests unanswered for `request_timeout` are given up.
    pub fn handle_timeout(&mut self, now: Time) {
        self.advance(now);
    }

    /// Leave to start one write of `partition` now (S-L8): granted only
    /// while the partition is writable and `now` is before its deadline.
    /// The grant carries the epoch the write must carry to the sink.
    ///
    /// # Errors
    /// [`NotWritable`] says why not; nothing is recorded.
    pub fn begin_write(
        &mut self,
        now: Time,
        partition: Partition,
    ) -> Result<WriteGrant, NotWritable> {
        self.advance(now);
        match self.parts.get(&partition) {
            Some(&Phase::Writable { epoch, deadline }) if self.now < deadline => {
                Ok(self.writes.begin(self.now, partition, epoch))
            }
            Some(Phase::Writable { .. }) => Err(NotWritable::Stopped(StopCause::DeadlinePassed)),
            Some(Phase::Installing { .. }) => Err(NotWritable::Installing),
            Some(Phase::Stopping { cause, .. } | Phase::Releasing { cause, .. }) => {
                Err(NotWritable::Stopped(*cause))
            }
            Some(Phase::Floors { .. } | Phase::Acquiring { .. }) | None => {
                Err(NotWritable::NotHeld)
            }
        }
    }

    /// A write granted by [`begin_write`](Self::begin_write) ended (S-L17).
    /// Returns whether it was in flight (a grant ends once).
    pub fn end_write(&mut self, now: Time, grant: WriteGrant) -> bool {
        self.advance(now);
        self.writes.end(&grant)
    }

    /// A write of `partition` under `epoch` came back `stale_epoch`: a
    /// newer epoch is installed at the sink, so the partition is lost
    /// (S-L15). Its grant still goes back to `end_write`.
    pub fn handle_stale_epoch(&mut self, now: Time, partition: Partition, epoch: Epoch) {
        self.advance(now);
        self.counters.stale_epoch_writes += 1;
        if matches!(self.parts.get(&partition), Some(&Phase::Writable { epoch: e, .. }) if e == epoch)
        {
            self.stop(partition, StopCause::StaleEpoch);
        }
    }

    /// Shut down (S-L28): nothing more is acquired; every partition stops
    /// at once ([`StopCause::Shutdown`]) and is released once its writes in
    /// flight have ended or passed `write_timeout`; with
    /// [`Departure::Leave`], the heartbeat row is deleted last. Heartbeats
    /// go on until then. A second call may turn a `Rejoin` into a `Leave`.
    pub fn shutdown(&mut self, now: Time, departure: Departure) {
        self.advance(now);
        if self.departure != Some(Departure::Leave) {
            self.departure = Some(departure);
        }
        let held: Vec<Partition> = self.parts.keys().copied().collect();
        for partition in held {
            self.stop(partition, StopCause::Shutdown);
        }
    }

    /// The next event, if any (see [`LeaseEvent`]).
    pub fn poll_event(&mut self) -> Option<LeaseEvent> {
        self.events.pop_front()
    }

    /// When to call [`handle_timeout`](Self::handle_timeout) next; `None`
    /// once shut down. It changes only after an input.
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.is_shut_down() {
            return None;
        }
        let mut t = self.next_check.min(self.next_heartbeat);
        if let Some(r) = self.next_renewal {
            t = t.min(r);
        }
        if self.wants_more() {
            t = t.min(self.next_acquire);
        }
        for (&p, phase) in &self.parts {
            match *phase {
                Phase::Installing {
                    req: None,
                    retry_at,
                    ..
                } => t = t.min(retry_at),
                Phase::Stopping { .. } => {
                    if let Some(d) = self.writes.drained_at(p, self.config.write_timeout) {
                        t = t.min(d);
                    }
                }
                _ => {}
            }
        }
        Some(t)
    }

    /// Where `partition` stands at this instance.
    pub fn partition(&self, partition: Partition) -> PartitionState {
        self.parts
            .get(&partition)
            .map_or(PartitionState::Idle, Phase::state)
    }

    /// The epoch `partition` is held under, while a lease of it is held or
    /// being let go: what every outbox-table mutation of it is conditional
    /// on (S-L13).
    pub fn epoch(&self, partition: Partition) -> Option<Epoch> {
        self.parts.get(&partition).and_then(Phase::epoch)
    }

    /// The partitions the latest plan gives this instance (S-L18).
    pub fn share(&self) -> &BTreeSet<Partition> {
        &self.share
    }

    /// Writes of `partition` in flight.
    pub fn writes_in_flight(&self, partition: Partition) -> usize {
        self.writes.in_flight(partition)
    }

    /// The counters (S-L29).
    pub fn counters(&self) -> &LeaseCounters {
        &self.counters
    }

    /// Whether a shutdown has finished: nothing held, nothing more to send.
    pub fn is_shut_down(&self) -> bool {
        let Some(departure) = self.departure else {
            return false;
        };
        self.parts.is_empty()
            && self.strays.is_empty()
            && (departure == Departure::Rejoin || self.leave == LeaveStep::Done)
    }

    /// The health snapshot at `now` (S-L24).
    pub fn health(&self, now: Time) -> LeaseHealth {
        let now = now.max(self.now);
        let (mut writable, mut acquiring, mut stopping) = (0, 0, 0);
        let mut margin = None;
        for phase in self.parts.values() {
            match *phase {
                Phase::Writable { deadline, .. } if deadline > now => {
                    writable += 1;
                    let left = deadline - now;
                    margin = Some(margin.map_or(left, |m: std::time::Duration| m.min(left)));
                }
                Phase::Floors { .. } | Phase::Acquiring { .. } | Phase::Installing { .. } => {
                    acquiring += 1
                }
                _ => stopping += 1,
            }
        }
        LeaseHealth {
            state: self.state(writable),
            members: self.members,
            share: self.share.len(),
            writable,
            acquiring,
            stopping,
            writes_in_flight: self.writes.total(),
            margin,
            last_renewed: self.last_renewed,
            renewal_failures: self.renewal_failures,
            last_loss: self.last_loss,
            counters: self.counters,
        }
    }

    fn state(&self, writable: usize) -> LeaseState {
        if self.is_shut_down() {
            LeaseState::ShutDown
        } else if self.departure.is_some() {
            LeaseState::ShuttingDown
        } else if let (2.., Some(since)) = (self.failures, self.failing_since) {
            LeaseState::StoreUnreachable { since }
        } else if self.view_sent.is_none() {
            LeaseState::Joining
        } else if self.share.is_empty() {
            LeaseState::Standby
        } else if writable == self.share.len() {
            LeaseState::Owning
        } else {
            LeaseState::Acquiring
        }
    }

    /// Whether the share holds a partition not yet being acquired.
    pub(super) fn wants_more(&self) -> bool {
        self.departure.is_none()
            && self.view_sent.is_some()
            && self.share.iter().any(|p| !self.parts.contains_key(p))
    }

    /// Moves time to `now` and handles what is due.
    pub(super) fn advance(&mut self, now: Time) {
        self.now = self.now.max(now);
        if self.now < self.next_check {
            return;
        }
        let now = self.now;
        let timeout = self.config.request_timeout();
        let late: Vec<RequestId> = self
            .pending
            .iter()
            .filter(|(_, p)| p.sent + timeout <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            if let Some(pending) = self.pending.remove(&id) {
                self.failed(id, pending, StoreError::Unknown);
            }
        }
        let lapsed: Vec<Partition> = self
            .parts
            .iter()
            .filter(|(_, phase)| {
                matches!(phase, Phase::Writable { deadline, .. } | Phase::Installing { deadline, .. } if *deadline <= now)
            })
            .map(|(&p, _)| p)
            .collect();
        for partition in lapsed {
            self.stop(partition, StopCause::DeadlinePassed);
        }
        self.next_check = self.earliest_check();
    }

    /// The earliest deadline of a held lease or timeout of a request.
    fn earliest_check(&self) -> Time {
        let timeout = self.config.request_timeout();
        let requests = self.pending.values().map(|p| p.sent + timeout);
        let deadlines = self.parts.values().filter_map(|phase| match *phase {
            Phase::Writable { deadline, .. } | Phase::Installing { deadline, .. } => Some(deadline),
            _ => None,
        });
        requests.chain(deadlines).min().unwrap_or(Time::MAX)
    }

    /// Stops a writable or installing partition (S-L16); any other phase is
    /// left as it is. A writable one announces it.
    pub(super) fn stop(&mut self, partition: Partition, cause: StopCause) {
        let Some(phase) = self.parts.get_mut(&partition) else {
            return;
        };
        let (epoch, deadline, announced) = match *phase {
            Phase::Writable { epoch, deadline } => (epoch, deadline, true),
            Phase::Installing {
                epoch, deadline, ..
            } => (epoch, deadline, false),
            _ => return,
        };
        *phase = Phase::Stopping {
            epoch,
            deadline,
            cause,
            release: cause != StopCause::RenewalRefused,
            renewing: !cause.is_loss(),
            announced,
        };
        if announced {
            self.counters.stops[cause.index()] += 1;
            if cause.is_loss() {
                self.last_loss = Some((cause, self.now));
            }
            self.events.push_back(LeaseEvent::Stopped {
                partition,
                epoch,
                cause,
            });
        }
    }

    /// Forgets a partition that is let go, announcing it if it was
    /// writable.
    pub(super) fn let_go(&mut self, partition: Partition) {
        let Some(phase) = self.parts.remove(&partition) else {
            return;
        };
        if let Phase::Stopping {
            epoch,
            announced: true,
            ..
        }
        | Phase::Releasing {
            epoch,
            announced: true,
            ..
        } = phase
        {
            self.counters.handovers += 1;
            self.events
                .push_back(LeaseEvent::Released { partition, epoch });
        }
    }

    /// Hands out a request: records it as pending from `now`.
    pub(super) fn hand_out(
        &mut self,
        id: RequestId,
        kind: Kind,
        op: super::store::StoreOp,
    ) -> Request {
        self.next_id += 1;
        self.pending.insert(
            id,
            Pending {
                sent: self.now,
                kind,
            },
        );
        self.next_check = self
            .next_check
            .min(self.now + self.config.request_timeout());
        Request { id, op }
    }
}
