//! What the policy makes of the store's replies (S-L3, S-L5, S-L10-S-L12,
//! S-L15, S-L17).

use std::collections::{BTreeMap, BTreeSet};

use super::super::time::Time;
use super::event::{LeaseEvent, StopCause};
use super::id::{Epoch, InstanceId, Partition};
use super::phase::{Kind, Pending, Phase};
use super::plan::Plan;
use super::policy::{LeasePolicy, LeaveStep};
use super::store::{Reply, ReplyError, RequestId, StoreError};

impl LeasePolicy {
    /// The reply to request `id`: what its statement returned, or why there
    /// is none. Answer each request once.
    ///
    /// # Errors
    /// [`ReplyError::Unknown`] when no request `id` is waiting (a late
    /// reply after [`request_timeout`](super::LeaseConfig::request_timeout):
    /// a grant in it is released, so the driver may ignore this);
    /// [`ReplyError::Mismatch`] when the reply answers another operation (a
    /// driver bug: the request is taken as failed).
    pub fn handle_reply(
        &mut self,
        now: Time,
        id: RequestId,
        result: Result<Reply, StoreError>,
    ) -> Result<(), ReplyError> {
        self.advance(now);
        let Some(pending) = self.pending.remove(&id) else {
            if let Ok(Reply::Acquired { granted }) = result {
                self.strays.extend(granted);
            }
            return Err(ReplyError::Unknown(id));
        };
        let reply = match result {
            Ok(reply) if reply.answers() == pending.kind.name() => reply,
            Ok(reply) => {
                let expected = pending.kind.name();
                self.failed(id, pending, StoreError::Failed);
                return Err(ReplyError::Mismatch {
                    id,
                    expected,
                    got: reply.answers(),
                });
            }
            Err(e) => {
                self.failed(id, pending, e);
                return Ok(());
            }
        };
        self.failures = 0;
        self.failing_since = None;
        let sent = pending.sent;
        match (pending.kind, reply) {
            (Kind::Heartbeat, Reply::Members { members, owners }) => {
                self.on_members(sent, members, owners)
            }
            (Kind::Floors(ps), Reply::SinkEpochs { epochs }) => self.on_floors(id, ps, epochs),
            (Kind::Acquire(ps), Reply::Acquired { granted }) => {
                self.on_acquired(id, sent, ps, granted)
            }
            (Kind::Renew(leases), Reply::Renewed { renewed }) => {
                self.on_renewed(sent, leases, renewed)
            }
            (Kind::Install(p, e), Reply::Installed { epoch, ours }) => {
                self.on_installed(id, p, e, epoch, ours)
            }
            (Kind::Release(leases), Reply::Released) => self.on_released(id, leases),
            (Kind::Leave, Reply::Left) => self.leave = LeaveStep::Done,
            _ => unreachable!("the reply's operation was checked"),
        }
        Ok(())
    }

    /// A request that failed, came back unknown, or was given up on: the
    /// worst is assumed (a renewal did not extend, an acquire took nothing
    /// this instance will use).
    pub(super) fn failed(&mut self, id: RequestId, pending: Pending, _why: StoreError) {
        self.failures = self.failures.saturating_add(1);
        self.failing_since.get_or_insert(pending.sent);
        match pending.kind {
            Kind::Heartbeat => self.counters.heartbeat_failures += 1,
            Kind::Renew(_) => {
                self.counters.renewal_failures += 1;
                self.renewal_failures = self.renewal_failures.saturating_add(1);
            }
            Kind::Floors(ps) | Kind::Acquire(ps) => {
                for p in ps {
                    let ours = match self.parts.get(&p) {
                        Some(Phase::Floors { req }) => *req == id,
                        Some(Phase::Acquiring { req, .. }) => *req == Some(id),
                        _ => false,
                    };
                    if ours {
                        self.parts.remove(&p);
                    }
                }
            }
            Kind::Install(p, e) => {
                self.counters.install_failures += 1;
                let retry = self.now + self.config.acquire_poll;
                if let Some(Phase::Installing {
                    epoch,
                    req,
                    retry_at,
                    ..
                }) = self.parts.get_mut(&p)
                {
                    if *epoch == e && *req == Some(id) {
                        *req = None;
                        *retry_at = retry;
                    }
                }
            }
            Kind::Release(leases) => self.on_released(id, leases),
            Kind::Leave => self.leave = LeaveStep::Done,
        }
    }

    /// A heartbeat's view (S-L3): the plan from it, if it is newer than the
    /// one the share comes from (S-L18).
    fn on_members(
        &mut self,
        sent: Time,
        mut members: Vec<InstanceId>,
        owners: Vec<(Partition, InstanceId)>,
    ) {
        self.counters.heartbeats += 1;
        if self.view_sent.is_some_and(|v| v >= sent) {
            return;
        }
        self.view_sent = Some(sent);
        // This instance is a member: its heartbeat just ran.
        members.push(self.config.instance_id.clone());
        let plan = Plan::new(self.config.partitions, members, owners);
        self.members = plan.members().len();
        let share = plan.share(&self.config.instance_id);
        if share.difference(&self.share).next().is_some() {
            self.next_acquire = self.next_acquire.min(self.now);
        }
        self.share = share;
        let gone: Vec<Partition> = self
            .parts
            .keys()
            .filter(|p| !self.share.contains(p))
            .copied()
            .collect();
        for partition in gone {
            self.stop(partition, StopCause::Rebalance);
        }
    }

    /// The sink's epochs (S-L10): the partitions still wanted go on to
    /// their acquire, each with its floor.
    fn on_floors(&mut self, id: RequestId, ps: Vec<Partition>, epochs: Vec<(Partition, Epoch)>) {
        let floors: BTreeMap<Partition, Epoch> = epochs.into_iter().collect();
        for p in ps {
            if self.parts.get(&p) != Some(&Phase::Floors { req: id }) {
                continue;
            }
            if self.departure.is_none() && self.share.contains(&p) {
                let floor = floors.get(&p).copied().unwrap_or(Epoch::NONE);
                self.parts.insert(p, Phase::Acquiring { req: None, floor });
            } else {
                self.parts.remove(&p);
            }
        }
    }

    /// The leases granted (S-L10): each is held from the instant its
    /// acquire was sent (S-L4) and goes on to its install (S-L12). A grant
    /// nothing wants any more, or whose epoch is not above its floor, is
    /// released unused.
    fn on_acquired(
        &mut self,
        id: RequestId,
        sent: Time,
        ps: Vec<Partition>,
        granted: Vec<(Partition, Epoch)>,
    ) {
        self.counters.acquired += granted.len() as u64;
        let mut granted: BTreeMap<Partition, Epoch> = granted.into_iter().collect();
        let deadline = sent + self.config.lifetime();
        for p in ps {
            let floor = match self.parts.get(&p) {
                Some(&Phase::Acquiring {
                    req: Some(r),
                    floor,
                }) if r == id => floor,
                _ => continue,
            };
            self.parts.remove(&p);
            let Some(epoch) = granted.remove(&p) else {
                continue;
            };
            if epoch <= floor || self.departure.is_some() || !self.share.contains(&p) {
                self.strays.push((p, epoch));
                continue;
            }
            let installing = Phase::Installing {
                epoch,
                deadline,
                req: None,
                retry_at: self.now,
            };
            self.parts.insert(p, installing);
            self.next_check = self.next_check.min(deadline);
            let first_renewal = sent + self.config.renew_every;
            self.next_renewal = Some(
                self.next_renewal
                    .map_or(first_renewal, |r| r.min(first_renewal)),
            );
        }
        // Granted but not (or no longer) asked for by this request.
        self.strays.extend(granted);
    }

    /// A renewal's reply (S-L5): each renewed lease's deadline moves to
    /// the renewal's send plus `lease_ttl` minus `max_clock_drift` (S-L4);
    /// a refused one is lost (S-L15).
    fn on_renewed(&mut self, sent: Time, leases: Vec<(Partition, Epoch)>, renewed: Vec<Partition>) {
        self.counters.renewals += 1;
        self.renewal_failures = 0;
        self.last_renewed = Some(self.last_renewed.map_or(sent, |t| t.max(sent)));
        let renewed: BTreeSet<Partition> = renewed.into_iter().collect();
        let until = sent + self.config.lifetime();
        for (p, e) in leases {
            let Some(phase) = self.parts.get_mut(&p) else {
                continue;
            };
            if phase.epoch() != Some(e) {
                continue;
            }
            if renewed.contains(&p) {
                if let Phase::Installing { deadline, .. }
                | Phase::Writable { deadline, .. }
                | Phase::Stopping {
                    deadline,
                    renewing: true,
                    ..
                } = phase
                {
                    *deadline = (*deadline).max(until);
                }
                continue;
            }
            self.counters.renewals_refused += 1;
            if let Phase::Stopping {
                release, renewing, ..
            } = phase
            {
                *release = false;
                *renewing = false;
            }
            self.stop(p, StopCause::RenewalRefused);
        }
    }

    /// An install's reply (S-L11, S-L12): the partition becomes writable if
    /// the sink holds this epoch for this holder; it is superseded if the
    /// sink holds a newer one or this one for another holder.
    fn on_installed(&mut self, id: RequestId, p: Partition, e: Epoch, current: Epoch, ours: bool) {
        let Some(Phase::Installing {
            epoch,
            deadline,
            req,
            retry_at,
        }) = self.parts.get_mut(&p)
        else {
            return;
        };
        if *epoch != e || *req != Some(id) {
            return;
        }
        if current == e && ours {
            let deadline = *deadline;
            self.parts.insert(p, Phase::Writable { epoch: e, deadline });
            self.events.push_back(LeaseEvent::Writable {
                partition: p,
                epoch: e,
            });
        } else if current >= e {
            self.stop(p, StopCause::Superseded);
        } else {
            // The sink kept an older epoch: the install did not take.
            self.counters.install_failures += 1;
            *req = None;
            *retry_at = self.now + self.config.acquire_poll;
        }
    }

    /// A release answered, failed or given up on: the partitions are let
    /// go either way (an unreleased lease lapses within the ttl).
    fn on_released(&mut self, id: RequestId, leases: Vec<(Partition, Epoch)>) {
        for (p, e) in leases {
            if matches!(self.parts.get(&p), Some(&Phase::Releasing { epoch, req, .. }) if epoch == e && req == id)
            {
                self.let_go(p);
            }
        }
    }
}
