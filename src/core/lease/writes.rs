//! The writes in flight, per partition: what a release waits for
//! (S-L17).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use super::super::time::Time;
use super::id::{Epoch, Partition};

/// Leave to start one write for one partition, from
/// [`LeasePolicy::begin_write`](super::LeasePolicy::begin_write): hand it
/// back to [`end_write`](super::LeasePolicy::end_write) when the write has
/// ended and its rows are deleted or dead-lettered (or those statements
/// failed), so that a release never races them (S-L17).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "hand the grant back to end_write when the write ends"]
pub struct WriteGrant {
    /// The partition.
    pub partition: Partition,
    /// The epoch the write carries to the sink, and that every outbox-table
    /// mutation it leads to is conditional on (S-L13, S-L14).
    pub epoch: Epoch,
    id: u64,
}

impl fmt::Display for WriteGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "write {} of {} under {}",
            self.id, self.partition, self.epoch
        )
    }
}

/// The writes in flight. A write's id grows with its start, so each
/// partition's last id is its newest write.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    next: u64,
    started: BTreeMap<u64, Time>,
    by_partition: BTreeMap<Partition, BTreeSet<u64>>,
}

impl Writes {
    pub(crate) fn begin(&mut self, now: Time, partition: Partition, epoch: Epoch) -> WriteGrant {
        let id = self.next;
        self.next += 1;
        self.started.insert(id, now);
        self.by_partition.entry(partition).or_default().insert(id);
        WriteGrant {
            partition,
            epoch,
            id,
        }
    }

    /// Whether the grant was in flight.
    pub(crate) fn end(&mut self, grant: &WriteGrant) -> bool {
        if self.started.remove(&grant.id).is_none() {
            return false;
        }
        if let Some(ids) = self.by_partition.get_mut(&grant.partition) {
            ids.remove(&grant.id);
            if ids.is_empty() {
                self.by_partition.remove(&grant.partition);
            }
        }
        true
    }

    pub(crate) fn in_flight(&self, partition: Partition) -> usize {
        self.by_partition.get(&partition).map_or(0, BTreeSet::len)
    }

    pub(crate) fn total(&self) -> usize {
        self.started.len()
    }

    /// When the partition's writes stop holding up its release: now if
    /// none is in flight, when the newest passes `timeout` if there is one,
    /// never (`None`) otherwise.
    pub(crate) fn drained_at(
        &self,
        partition: Partition,
        timeout: Option<Duration>,
    ) -> Option<Time> {
        let Some(newest) = self.by_partition.get(&partition).and_then(|s| s.last()) else {
            return Some(Time::ZERO);
        };
        timeout.map(|t| self.started[newest] + t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_drains_when_its_newest_write_ends_or_times_out() {
        let mut w = Writes::default();
        let p = Partition(2);
        assert_eq!(w.drained_at(p, None), Some(Time::ZERO));
        let a = w.begin(Time::from_millis(10), p, Epoch(1));
        let b = w.begin(Time::from_millis(20), p, Epoch(1));
        let other = w.begin(Time::from_millis(30), Partition(3), Epoch(4));
        assert_eq!((w.in_flight(p), w.total()), (2, 3));
        assert_eq!(w.drained_at(p, None), None);
        let t = Duration::from_millis(100);
        assert_eq!(w.drained_at(p, Some(t)), Some(Time::from_millis(120)));
        assert!(w.end(&b));
        assert!(!w.end(&b), "ended once");
        assert_eq!(w.drained_at(p, Some(t)), Some(Time::from_millis(110)));
        assert!(w.end(&a));
        assert_eq!(w.drained_at(p, None), Some(Time::ZERO));
        assert_eq!(w.in_flight(Partition(3)), 1);
        assert!(other.to_string().contains("p3 under e4"));
    }
}
