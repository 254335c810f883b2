//! Which store operation the policy asks for next (S-L3, S-L5, S-L10,
//! S-L12, S-L17).

use super::super::time::Time;
use super::id::{Epoch, Holder, Partition};
use super::phase::{Kind, Phase};
use super::policy::{Departure, LeasePolicy, LeaveStep};
use super::store::{Request, RequestId, StoreOp};

type Built = Option<(Kind, StoreOp)>;

impl LeasePolicy {
    /// The next store operation to send, if one is due at `now`. Send it at
    /// once: its deadline arithmetic takes `now` as its send instant
    /// (S-L4). In order: the heartbeat, the renewal of every held lease,
    /// an epoch install, the release of every drained partition, the
    /// acquire of partitions whose sink epochs were read, the read of the
    /// sink epochs of partitions to acquire, and last a leaving shutdown's
    /// delete of the heartbeat row.
    pub fn poll_request(&mut self, now: Time) -> Option<Request> {
        self.advance(now);
        if self.is_shut_down() {
            return None;
        }
        let now = self.now;
        let id = RequestId(self.next_id);
        let (kind, op) = self
            .heartbeat_due(now)
            .or_else(|| self.renewal_due(now))
            .or_else(|| self.install_due(now, id))
            .or_else(|| self.release_due(now, id))
            .or_else(|| self.acquire_due(id))
            .or_else(|| self.floors_due(now, id))
            .or_else(|| self.leave_due())?;
        Some(self.hand_out(id, kind, op))
    }

    fn heartbeat_due(&mut self, now: Time) -> Built {
        if now < self.next_heartbeat {
            return None;
        }
        self.next_heartbeat = now + self.config.heartbeat_every;
        let op = StoreOp::Heartbeat {
            instance: self.config.instance_id.clone(),
            member_ttl: self.config.rejoin_grace,
        };
        Some((Kind::Heartbeat, op))
    }

    /// Every held lease at once, `renew_every` after the last renewal
    /// (S-L6).
    fn renewal_due(&mut self, now: Time) -> Built {
        if self.next_renewal? > now {
            return None;
        }
        let leases: Vec<(Partition, Epoch)> = self
            .parts
            .iter()
            .filter_map(|(&p, phase)| phase.renewable(now).map(|e| (p, e)))
            .collect();
        if leases.is_empty() {
            self.next_renewal = None;
            return None;
        }
        self.next_renewal = Some(now + self.config.renew_every);
        let op = StoreOp::Renew {
            instance: self.config.instance_id.clone(),
            ttl: self.config.lease_ttl,
            leases: leases.clone(),
        };
        Some((Kind::Renew(leases), op))
    }

    fn install_due(&mut self, now: Time, id: RequestId) -> Built {
        let (&partition, phase) = self.parts.iter_mut().find(|(_, phase)| {
            matches!(phase, Phase::Installing { req: None, retry_at, .. } if *retry_at <= now)
        })?;
        let Phase::Installing { epoch, req, .. } = phase else {
            return None;
        };
        *req = Some(id);
        let epoch = *epoch;
        let op = StoreOp::Install {
            partition,
            epoch,
            holder: Holder {
                instance: self.config.instance_id.clone(),
                incarnation: self.config.incarnation,
            },
        };
        Some((Kind::Install(partition, epoch), op))
    }

    /// Every stopped partition whose writes have drained (S-L17), and every
    /// stray grant, in one statement. A drained partition that needs no
    /// release is let go here.
    fn release_due(&mut self, now: Time, id: RequestId) -> Built {
        let timeout = self.config.write_timeout;
        let drained: Vec<Partition> = self
            .parts
            .iter()
            .filter(|(&p, phase)| {
                matches!(phase, Phase::Stopping { .. })
                    && self.writes.drained_at(p, timeout).is_some_and(|t| t <= now)
            })
            .map(|(&p, _)| p)
            .collect();
        let mut leases = std::mem::take(&mut self.strays);
        for partition in drained {
            let Some(&Phase::Stopping {
                epoch,
                cause,
                release,
                announced,
                ..
            }) = self.parts.get(&partition)
            else {
                continue;
            };
            if release {
                leases.push((partition, epoch));
                let releasing = Phase::Releasing {
                    epoch,
                    cause,
                    req: id,
                    announced,
                };
                self.parts.insert(partition, releasing);
            } else {
                self.let_go(partition);
            }
        }
        if leases.is_empty() {
            return None;
        }
        self.counters.releases += leases.len() as u64;
        let op = StoreOp::Release {
            instance: self.config.instance_id.clone(),
            leases: leases.clone(),
        };
        Some((Kind::Release(leases), op))
    }

    /// The partitions whose sink epochs came back, in one acquire (S-L10).
    fn acquire_due(&mut self, id: RequestId) -> Built {
        let mut leases = Vec::new();
        for (&p, phase) in self.parts.iter_mut() {
            if let Phase::Acquiring {
                req: req @ None,
                floor,
            } = phase
            {
                *req = Some(id);
                leases.push((p, *floor));
            }
        }
        if leases.is_empty() {
            return None;
        }
        self.counters.acquires += 1;
        let partitions = leases.iter().map(|&(p, _)| p).collect();
        let op = StoreOp::Acquire {
            instance: self.config.instance_id.clone(),
            ttl: self.config.lease_ttl,
            leases,
        };
        Some((Kind::Acquire(partitions), op))
    }

    /// The share's partitions not held: first their sink epochs (S-L10),
    /// every `acquire_poll`, or at once when the plan gives more.
    fn floors_due(&mut self, now: Time, id: RequestId) -> Built {
        if now < self.next_acquire || !self.wants_more() {
            return None;
        }
        self.next_acquire = now + self.config.acquire_poll;
        let wanted: Vec<Partition> = self
            .share
            .iter()
            .filter(|p| !self.parts.contains_key(p))
            .copied()
            .collect();
        for &p in &wanted {
            self.parts.insert(p, Phase::Floors { req: id });
        }
        let op = StoreOp::SinkEpochs {
            partitions: wanted.clone(),
        };
        Some((Kind::Floors(wanted), op))
    }

    fn leave_due(&mut self) -> Built {
        let leaving = self.departure == Some(Departure::Leave)
            && self.parts.is_empty()
            && self.strays.is_empty()
            && self.leave == LeaveStep::NotSent;
        if !leaving {
            return None;
        }
        self.leave = LeaveStep::Sent;
        let op = StoreOp::Leave {
            instance: self.config.instance_id.clone(),
        };
        Some((Kind::Leave, op))
    }
}
