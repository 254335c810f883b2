//! A journal driven by hand, as the commit task drives it: the core's
//! journal machine, a committer on a storage, and a clock the test moves
//! on by a second at every round (so a retry after a fault is always
//! due). The shared set-up of the journal's format and model tests.

use std::hash::Hash;
use std::io;
use std::time::Duration;

use outbox::core::journal::{Event, Limits, Machine, Op, Seq, Settings};
use outbox::core::Time;
use outbox::journal::format::{EncodedItem, Schema};
use outbox::journal::{
    recover, Codec, Committer, JournalError, MemStorage, RecoveryReport, Storage,
};

/// The machine's settings in these tests, for segments headed by
/// `schema`: no interval, a 1 ms retry.
pub fn settings(schema: &Schema) -> Settings {
    Settings {
        sync_interval: Duration::ZERO,
        sync_bytes: usize::MAX,
        retry_interval: Duration::from_millis(1),
        sizes: schema.sizes(),
    }
}

/// Limits with `segment_bytes` and no `max_bytes`.
pub fn limits(segment_bytes: u64) -> Limits {
    Limits {
        segment_bytes,
        max_bytes: None,
    }
}

/// What a recovery brought back: the report and the items, in order.
pub struct Back<K, I> {
    pub report: RecoveryReport,
    pub items: Vec<(Seq, K, I)>,
    /// `(item, crashes)` counted (S-J17), for the life's start.
    pub crashes: Vec<(Seq, u32)>,
    /// The items poisoned (S-J17), not in `items`.
    pub poisoned: Vec<Seq>,
}

/// The machine and its committer.
pub struct Hand<K, S> {
    pub machine: Machine<K, ()>,
    pub committer: Committer<S>,
    /// The machine's events of the rounds so far, in order (the commit
    /// task logs and counts them).
    pub events: Vec<Event>,
    now: Time,
}

impl<K: Ord + Hash + Clone, S: Storage> Hand<K, S> {
    /// Recovers `storage` through `codec`; the current segment is created
    /// by the first [`round`](Self::round).
    pub fn open<I, C: Codec<K, I>>(
        mut storage: S,
        codec: &C,
        limits: Limits,
    ) -> Result<(Self, Back<K, I>), JournalError> {
        let rec = recover(&mut storage, codec, limits)?;
        let schema = Schema::new(codec.version(), codec.item_type());
        let hand = Hand {
            machine: Machine::new(rec.ledger, settings(&schema)),
            committer: Committer::new(storage, schema),
            events: Vec::new(),
            now: Time::ZERO,
        };
        let back = Back {
            report: rec.report,
            items: rec.items,
            crashes: rec.crashes,
            poisoned: rec.poisoned.iter().map(|p| p.0).collect(),
        };
        Ok((hand, back))
    }

    /// Appends an accepted item; whether it was journaled.
    pub fn append(&mut self, tenant: K, record: &EncodedItem) -> bool {
        self.machine.append(tenant, record)
    }

    /// The oldest `n` pending items of `tenant` are done.
    pub fn done(&mut self, tenant: &K, n: u64) {
        self.machine.handle_done(tenant, n);
    }

    /// Whether commits fail (S-J5).
    pub fn is_down(&self) -> bool {
        self.machine.is_down()
    }

    /// One group commit now (while down: a resume), carried out; the
    /// error that failed it, if any (a failed deletion fails nothing).
    pub fn round(&mut self) -> io::Result<()> {
        self.now = self.now + Duration::from_secs(1);
        self.machine.handle_sync(());
        let Some(mut batch) = self.machine.poll_batch(self.now) else {
            while self.machine.poll_answer().is_some() {}
            return Ok(());
        };
        let done = self.committer.commit(&mut batch);
        let deletion = matches!(batch.ops.get(done.done), Some(Op::Delete(_)));
        let error = done
            .error
            .as_ref()
            .filter(|_| !deletion)
            .map(|e| io::Error::new(e.kind(), e.to_string()));
        self.machine.handle_executed(self.now, Some(batch), done);
        while self.machine.poll_answer().is_some() {}
        self.events
            .extend(std::iter::from_fn(|| self.machine.poll_event()));
        error.map_or(Ok(()), Err)
    }
}

/// Bytes in `disk`'s segment files.
pub fn disk_bytes(disk: &MemStorage) -> u64 {
    disk.files()
        .iter()
        .filter(|(n, _)| n.starts_with("segment-"))
        .map(|(_, b)| b.len() as u64)
        .sum()
}
