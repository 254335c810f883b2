//! Writes gated by the lease (S-T37): the lease policy, shared by the
//! lease task (which runs its store calls) and the writer (which asks it
//! before every write). A write of a relayed tenant starts only when
//! [`LeasePolicy::begin_write`] grants it (the partition held, its epoch
//! installed at the sink, `now` before the lease's deadline with the drift
//! margin, S-L8), and carries the grant's epoch to the sink (S-E8); its
//! grant goes back to the policy when the write ends, so a release never
//! races a write in flight (S-L17). A write not granted never reaches the
//! sink: it ends failed by
//! [`Failure::StaleEpoch`](crate::core::Failure::StaleEpoch), so the engine
//! hands its items and its tenant's waiting ones over (S-E7; the
//! rows stay in the table for the partition's owner).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::lease::{Epoch, LeasePolicy, NotWritable, Partition, WriteGrant};
use crate::core::Time;

/// A lease clock: the policy's time for the time elapsed on the
/// runtime's clock since the gate was made (non-decreasing). The
/// simulation's hook to skew one host's lease clock (S-L7).
pub(crate) type LeaseClock = Arc<dyn Fn(Duration) -> Duration + Send + Sync>;

/// The lease policy once the lease task made it, and the clock both
/// sides read it with.
pub(crate) struct Gate {
    policy: Mutex<Option<LeasePolicy>>,
    origin: Instant,
    clock: Option<LeaseClock>,
    /// Wakes the lease task after the writer changed the policy (a write
    /// ended, a stale epoch): a release may be due.
    pub(crate) changed: Notify,
}

impl Gate {
    /// A gate with no policy yet: nothing is granted until the lease task
    /// installs one.
    pub(crate) fn new(clock: Option<LeaseClock>) -> Self {
        Gate {
            policy: Mutex::new(None),
            origin: Instant::now(),
            clock,
            changed: Notify::new(),
        }
    }

    /// The policy's clock: time since the gate was made (through the
    /// lease clock, if one is set).
    pub(crate) fn now(&self) -> Time {
        let elapsed = self.origin.elapsed();
        Time::from_elapsed(self.clock.as_ref().map_or(elapsed, |c| c(elapsed)))
    }

    /// The instant of the policy's time `at`. With a lease clock: now plus
    /// the policy time still to go (a skewed clock's timer may fire a
    /// little early or late; the policy re-checks its own time).
    pub(crate) fn instant(&self, at: Time) -> Instant {
        if self.clock.is_some() {
            let ahead = at.elapsed().saturating_sub(self.now().elapsed());
            return crate::driver::deadline(Instant::now(), ahead);
        }
        crate::driver::deadline(self.origin, at.elapsed())
    }

    /// Hands the gate the lease task's policy.
    pub(crate) fn install(&self, policy: LeasePolicy) {
        *self.lock() = Some(policy);
    }

    fn lock(&self) -> MutexGuard<'_, Option<LeasePolicy>> {
        self.policy.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the policy; `None` before it is installed.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut LeasePolicy, Time) -> R) -> Option<R> {
        let now = self.now();
        self.lock().as_mut().map(|policy| f(policy, now))
    }

    /// Leave to start one write of `partition` now (S-L8).
    pub(crate) fn begin(&self, partition: u32) -> Result<WriteGrant, NotWritable> {
        self.with(|policy, now| policy.begin_write(now, Partition(partition)))
            .unwrap_or(Err(NotWritable::NotHeld))
    }

    /// A granted write ended; `stale`: it came back `stale_epoch`, so its
    /// partition is lost (S-L15).
    pub(crate) fn end(&self, grant: WriteGrant, stale: bool) {
        let (partition, epoch): (Partition, Epoch) = (grant.partition, grant.epoch);
        self.with(|policy, now| {
            if stale {
                policy.handle_stale_epoch(now, partition, epoch);
            }
            policy.end_write(now, grant);
        });
        self.changed.notify_one();
    }
}

#[cfg(all(test, feature = "testkit"))]
mod tests {
    use super::*;
    use crate::core::lease::LeaseConfig;

    /// S-T37: before the lease task installs its policy, and for a
    /// partition the policy does not hold, no write is granted.
    #[test]
    fn nothing_is_granted_without_a_held_partition() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _in = rt.enter();
        let gate = Gate::new(None);
        assert_eq!(gate.begin(0), Err(NotWritable::NotHeld));
        let config = LeaseConfig::builder("a").partitions(2).build().unwrap();
        gate.install(LeasePolicy::new(config, Time::ZERO));
        assert_eq!(gate.begin(1), Err(NotWritable::NotHeld));
    }
}
