//! The journal in the driver (SPEC D1-D6, S-J1..S-J8): opening it, the
//! sync barrier, done marks from the engine's events, and the journal's
//! metrics; `stage` holds the request path's part (encoding outside the
//! lock, appending under it), `commit` the group-commit task. Every
//! decision (what a round commits, when it runs, faults, retries, the
//! close) is the core's journal machine ([`Machine`]); this module feeds
//! it and carries its outputs out.
//!
//! Lock order: the outbox's lock, then the journal's. The commit task takes
//! only the journal's lock, and never while doing IO: `stage` never waits
//! for a disk (S-W1).

use std::future::Future;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};
use tokio::sync::{oneshot, Notify};

pub use crate::core::journal::SyncError;
use crate::core::journal::{self as plan, Bounds, Limits, LoneStep, Machine, Settings};
use crate::core::Event;
use crate::journal::format::{Schema, Stamp};
use crate::journal::{
    recover_judging, Codec, Committer, FsStorage, JournalConfig, JournalError, OtherVersion,
    RecoveryReport, Storage,
};
use crate::telemetry::names::LABEL_OUTBOX;

#[path = "build.rs"]
mod build;
#[path = "commit.rs"]
mod commit;
use crate::journal::stage::Inner;
pub(crate) use build::{open, spawn, Setup};

/// The journal as a stage sees it (its part of the pipeline, S-W21).
pub(crate) type Staging<K, I> = crate::journal::stage::Staging<K, I, Waiter>;
/// The journal's lock held for a stage's appends.
pub(crate) type Appender<'a, K, I> = crate::journal::stage::Appender<'a, K, I, Waiter>;

/// The journal's metrics (label `outbox`).
struct Metrics {
    bytes: Gauge,
    segments: Gauge,
    sync_latency: Histogram,
    unjournaled: Counter,
    faults: Counter,
}

/// Metric names of the journal.
pub mod names {
    /// Gauge: bytes in the journal's segment files (D6).
    pub const JOURNAL_BYTES: &str = "outbox_journal_bytes";
    /// Gauge: segment files.
    pub const JOURNAL_SEGMENTS: &str = "outbox_journal_segments";
    /// Histogram: seconds one group commit took (write, then `fdatasync`).
    pub const JOURNAL_SYNC: &str = "outbox_journal_sync_seconds";
    /// Counter: items accepted while the journal was down, held in memory
    /// only (S-J5).
    pub const ITEMS_UNJOURNALED: &str = "outbox_items_unjournaled_total";
    /// Counter: group commits that failed (each starts or prolongs an
    /// incident).
    pub const JOURNAL_FAULTS: &str = "outbox_journal_faults_total";
}

impl Metrics {
    fn register(outbox: &str) -> Self {
        let label = outbox.to_owned();
        Metrics {
            bytes: metrics::gauge!(names::JOURNAL_BYTES, LABEL_OUTBOX => label.clone()),
            segments: metrics::gauge!(names::JOURNAL_SEGMENTS, LABEL_OUTBOX => label.clone()),
            sync_latency: metrics::histogram!(names::JOURNAL_SYNC, LABEL_OUTBOX => label.clone()),
            unjournaled: metrics::counter!(names::ITEMS_UNJOURNALED, LABEL_OUTBOX => label.clone()),
            faults: metrics::counter!(names::JOURNAL_FAULTS, LABEL_OUTBOX => label),
        }
    }
}

/// A sync caller's answer.
type Waiter = oneshot::Sender<Result<(), SyncError>>;

impl<K: Ord + std::hash::Hash + Clone> Inner<K, Waiter> {
    /// Sends the machine's answers to the sync callers.
    fn answer(&mut self) {
        while let Some((tx, answer)) = self.state.poll_answer() {
            let _ = tx.send(answer);
        }
    }
}

/// The journal of one outbox.
pub(crate) struct Journal<K, I> {
    /// Its lock, the codec and the commit task's wakes: what a stage uses.
    pub(crate) staging: Staging<K, I>,
    /// The journal works again, or closed: a suspect's lone attempt
    /// waiting for it asks again (S-J17).
    pub(super) resumed: Notify,
    inline_io: bool,
    dir: String,
    name: String,
    metrics: Metrics,
}

/// Hands the refused records of another codec version to `hand`, in
/// staging order (S-J14); a panic in it is contained and logged.
fn hand_other(
    hand: &(dyn Fn(crate::journal::OtherRecord) + Send + Sync),
    records: Vec<crate::journal::OtherRecord>,
    outbox: &str,
) {
    for record in records {
        if crate::driver::contain::call(|| hand(record)).is_err() {
            tracing::error!(
                outbox,
                "the journal's hand-off of a record of another codec version panicked"
            );
        }
    }
}

/// What opening a journal yields: the journal, its committer for the
/// commit task, and what the recovery found.
pub(crate) struct Opened<K, I> {
    pub(crate) journal: Arc<Journal<K, I>>,
    pub(crate) committer: Committer<Box<dyn Storage>>,
    pub(crate) items: Vec<(K, I)>,
    /// How long before the open each of `items` was staged, on the wall
    /// clock (zero when unknown or in the future, S-R3): not yet clamped
    /// to `max_item_age`.
    pub(crate) ages: Vec<Duration>,
    pub(crate) report: RecoveryReport,
    /// Items poisoned (S-J17), in staging order: to dead-letter.
    pub(crate) poisoned: Vec<(K, I)>,
    /// Per tenant, how many of its oldest `items` go alone (S-J17).
    pub(crate) alone: Vec<(K, u64)>,
    /// Per tenant, how many of its oldest `items` an earlier life
    /// attempted (S-J16).
    pub(crate) tried: Vec<(K, u64)>,
}

/// How long before `now_ms` an item stamped `staged_ms` was staged: zero
/// when unknown (0, a record of the previous format) or after `now_ms`
/// (a clock set back), S-R3.
pub(crate) fn age_at(now_ms: u64, staged_ms: u64) -> Duration {
    if staged_ms == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(now_ms.saturating_sub(staged_ms))
}

impl<K, I> Journal<K, I>
where
    K: Ord + std::hash::Hash + Clone + Send + 'static,
    I: Send + 'static,
{
    /// Opens the journal of `config` (blocking file IO: this runs once, at
    /// build) and reads it back.
    ///
    /// # Errors
    /// [`JournalError`]: the directory is unusable, locked, or holds a
    /// foreign file.
    pub(crate) fn open(
        config: JournalConfig,
        codec: Box<dyn Codec<K, I>>,
        outbox: &str,
    ) -> Result<Opened<K, I>, JournalError> {
        let sizes = Schema::new(codec.version(), codec.item_type()).sizes();
        let limits = limits_of(&config, sizes.standing())?;
        let dir = config.dir.display().to_string();
        let mut storage: Box<dyn Storage> = match config.storage {
            Some(s) => s,
            None => Box::new(fs_storage(&config.dir, &dir)?),
        };
        let recovered = recover_judging(
            &mut storage,
            &*codec,
            limits,
            &config.other_version,
            config.max_crash_attempts,
        )?;
        if let OtherVersion::Hand(hand) = &config.other_version {
            hand_other(hand, recovered.other, outbox);
        }
        let report = recovered.report;
        let schema = Schema::new(codec.version(), codec.item_type());
        let now_ms = config.wall_clock.unix_ms();
        let ages = (recovered.staged_ms.iter())
            .map(|&staged| age_at(now_ms, staged))
            .collect();
        let seqs: Vec<u64> = recovered.items.iter().map(|(s, _, _)| *s).collect();
        let items = recovered
            .items
            .into_iter()
            .map(|(_, k, i)| (k, i))
            .collect();
        let poisoned = (recovered.poisoned.into_iter())
            .map(|(_, k, i)| (k, i))
            .collect();
        let metrics = Metrics::register(outbox);
        let settings = Settings {
            sync_interval: config.sync_interval,
            sync_bytes: config.sync_bytes,
            retry_interval: config.retry_interval,
            sizes: schema.sizes(),
        };
        let stamp = Stamp {
            version: schema.version,
            staged_ms: 0,
        };
        let mut state = Machine::new(recovered.ledger, settings);
        state.start_life(recovered.crashes, seqs);
        let sizes = (
            config.sync_bytes,
            config.max_buffered_bytes.max(config.sync_bytes),
        );
        let unjournaled = metrics.unjournaled.clone();
        let stamps = (stamp, config.wall_clock);
        let journal = Journal {
            staging: Staging::new(state, codec, stamps, sizes, unjournaled),
            resumed: Notify::new(),
            inline_io: config.inline_io,
            dir,
            name: outbox.to_owned(),
            metrics,
        };
        journal.export(&journal.lock());
        Ok(Opened {
            journal: Arc::new(journal),
            committer: Committer::new(storage, schema),
            items,
            ages,
            report,
            poisoned,
            alone: recovered.alone,
            tried: recovered.tried,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner<K, Waiter>> {
        self.staging.lock()
    }

    /// Under the outbox's lock, with the engine's events, in order: marks
    /// the items they end done (S-J3), and the attempts that came back
    /// failed to be retried ended (S-J17).
    pub(crate) fn mark_done<'a>(&self, events: impl IntoIterator<Item = &'a Event<K, I>>)
    where
        K: 'a,
        I: 'a,
    {
        if crate::journal::canary::on(crate::journal::canary::EARLY_MARK) {
            // The canary marks at the first attempt's start instead.
            return;
        }
        // The journal's lock is taken at the first event that marks
        // something, not for every drain: the writer drains after each
        // hand-off it is woken for, and taking the lock for nothing there
        // made every `stage` (which holds it across its hand-off, D2)
        // contend with the writer's empty drains.
        let mut g = None;
        for event in events {
            if let Some((tenant, n)) = plan::done_by(event) {
                let g = g.get_or_insert_with(|| self.lock());
                g.state.handle_done(tenant, n);
            } else if let Some((tenant, n)) = plan::ended_by(event) {
                // Rides the next commit, waited for by nobody (S-J17).
                let g = g.get_or_insert_with(|| self.lock());
                g.state.handle_ended(tenant, n);
            }
        }
        let any = g.is_some();
        drop(g);
        if any {
            self.staging.soon.notify_one();
        }
    }

    /// The `early_mark` canary (issue 13): `tenant`'s oldest `n` items are
    /// marked done as their first attempt starts, before the write.
    fn mark_early(&self, tenant: &K, n: u64) {
        self.lock().state.handle_done(tenant, n);
        self.staging.soon.notify_one();
    }

    /// A group of writes starts (S-J17): an attempt of journaled items
    /// needs their attempt marks on disk first, so the
    /// gate returned waits for the next group commit (whatever it
    /// answers: a journal that fails lets the write go at once), except
    /// a suspect's `lone` attempt, and any while the last lone one's end
    /// waits for the disk: those wait until their marks are on disk, the
    /// journal down or not. `None`: nothing to wait for. Under
    /// the `early_mark` canary, each first attempt's items are marked
    /// done now instead (issue 13).
    pub(crate) fn on_spawn(
        self: &Arc<Self>,
        group: &[crate::core::Write<K, I>],
        lone: bool,
    ) -> Option<super::Gate> {
        if crate::journal::canary::on(crate::journal::canary::EARLY_MARK) {
            for write in group.iter().filter(|w| w.attempt == 1) {
                self.mark_early(&write.tenant, write.items.len() as u64);
            }
            return None;
        }
        let mut g = self.lock();
        if lone || g.state.lone_end_waits() {
            drop(g);
            let writes = group
                .iter()
                .map(|w| (w.tenant.clone(), w.items.len() as u64))
                .collect();
            let lone = lone.then(|| group[0].tenant.clone());
            return Some(Box::pin(Arc::clone(self).lone_gate(writes, lone)));
        }
        let mut wait = false;
        for write in group {
            wait |= g
                .state
                .handle_attempt(&write.tenant, write.items.len() as u64);
        }
        if !wait {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        g.state.handle_sync(tx);
        g.answer();
        drop(g);
        self.staging.now.notify_one();
        Some(Box::pin(async move {
            let _ = rx.await;
        }))
    }

    /// Waits until the attempt marks of `writes` (`(tenant, n)`) are on
    /// disk (S-J17): a suspect's lone attempt (of tenant `lone`), or any
    /// while the end of the last lone one waits for the disk. While the
    /// journal is down, it waits for it to work again, then for the
    /// commit of its marks, taken anew if that one fails. Else a crash
    /// during it would go uncounted, and be counted against the suspect
    /// whose done mark is still waiting for the disk.
    async fn lone_gate(self: Arc<Self>, writes: Vec<(K, u64)>, lone: Option<K>) {
        let mut marked = None;
        loop {
            // Registered before the machine is asked: no resume is missed.
            let resumed = self.resumed.notified();
            tokio::pin!(resumed);
            resumed.as_mut().enable();
            let rx = {
                let mut g = self.lock();
                match g.state.handle_lone_attempt(&writes, &mut marked) {
                    LoneStep::Start => {
                        if let Some(tenant) = &lone {
                            g.state.handle_lone_started(tenant);
                        }
                        return;
                    }
                    LoneStep::Down => None,
                    LoneStep::Commit => {
                        let (tx, rx) = oneshot::channel();
                        g.state.handle_sync(tx);
                        g.answer();
                        Some(rx)
                    }
                }
            };
            match rx {
                Some(rx) => {
                    self.staging.now.notify_one();
                    let _ = rx.await;
                }
                None => resumed.await,
            }
        }
    }

    /// Runs `then` (the shutdown's answer) once the journal's last marks
    /// are on disk (S-J3), or at `deadline` if the disk is slower (S-W15),
    /// on `runtime`; logs a warning when they are not durable.
    pub(crate) fn after_sync(
        &self,
        runtime: &tokio::runtime::Handle,
        deadline: Option<tokio::time::Instant>,
        name: String,
        then: impl FnOnce() + Send + 'static,
    ) {
        let synced = self.sync();
        drop(runtime.spawn(async move {
            let synced = match deadline {
                Some(at) => tokio::time::timeout_at(at, synced).await.ok(),
                None => Some(synced.await),
            };
            match synced {
                Some(Ok(())) => {}
                Some(Err(e)) => tracing::warn!(outbox = %name, error = %e, "shutdown: the journal's last marks are not durable; a restart may write some items again"),
                None => tracing::warn!(outbox = %name, "shutdown: the deadline came before the journal's last marks were on disk; a restart may write some items again"),
            }
            then();
        }));
    }

    /// A durability barrier (D1): answers once every item staged before
    /// the call, and every done mark taken before it, is on disk; or why
    /// not. Registered at the call.
    pub(crate) fn sync(&self) -> impl Future<Output = Result<(), SyncError>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let mut g = self.lock();
        g.state.handle_sync(tx);
        g.answer();
        drop(g);
        self.staging.now.notify_one();
        async move { rx.await.unwrap_or(Err(SyncError::Closed)) }
    }

    /// The writer is done: commit what is left, then stop.
    pub(crate) fn close(&self) {
        self.lock().state.handle_close();
        self.staging.now.notify_one();
    }

    fn export(&self, g: &Inner<K, Waiter>) {
        let ledger = g.state.ledger();
        self.metrics.bytes.set(g.state.disk_bytes() as f64);
        self.metrics.segments.set(ledger.segments() as f64);
    }
}

/// The journal's byte limits, `standing` bytes of `max_bytes` kept free,
/// or the build error naming the values it refuses (S-J10).
fn limits_of(config: &JournalConfig, standing: u64) -> Result<Limits, JournalError> {
    Limits::reserving(config.segment_bytes, config.max_bytes, standing).map_err(|b| match b {
        Bounds::SegmentAboveHalf {
            segment_bytes,
            max_bytes,
            largest,
        } => JournalError::Bounds {
            segment_bytes: Some(segment_bytes),
            max_bytes,
            limit: largest,
        },
        Bounds::MaxTooSmall {
            max_bytes,
            smallest,
        } => JournalError::Bounds {
            segment_bytes: None,
            max_bytes,
            limit: smallest,
        },
    })
}

/// The journal's directory on the real filesystem (`shown`: its name in
/// errors).
fn fs_storage(dir: &std::path::Path, shown: &str) -> Result<FsStorage, JournalError> {
    FsStorage::new(dir).map_err(|source| JournalError::Io {
        op: "open",
        file: shown.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Append;
    use std::io;
    use std::time::Duration;

    use crate::journal::{MemStorage, Postcard};

    type J = Journal<u64, u64>;

    fn open(disk: &MemStorage) -> Opened<u64, u64> {
        let config = JournalConfig::with_storage(disk.clone())
            .sync_interval(Duration::from_millis(5))
            .retry_interval(Duration::from_millis(100));
        J::open(config, Box::new(Postcard), "test").unwrap()
    }

    /// Encodes and appends one record: whether it had room (and went in).
    fn append(j: &J, tenant: u64, item: u64) -> bool {
        let mut run = None;
        let i = j.staging.encode_into(&mut run, &tenant, &item).unwrap();
        (j.staging).appending(run.as_ref(), |a| {
            a.append_if(i, |room| (room.then_some(tenant), room))
        })
    }

    fn stage(j: &J, tenant: u64, item: u64) {
        assert!(append(j, tenant, item));
    }

    fn recovered(disk: &MemStorage) -> Vec<(u64, u64)> {
        let copy = MemStorage::new();
        for (name, bytes) in disk.files() {
            if name != crate::journal::LOCK_FILE {
                copy.put(&name, bytes);
            }
        }
        copy.crash();
        open(&copy).items
    }

    #[tokio::test]
    async fn a_sync_answers_once_what_came_before_it_is_on_disk() {
        // D1: what an answered sync covered survives a crash.
        let disk = MemStorage::new();
        let opened = open(&disk);
        let j = Arc::clone(&opened.journal);
        let task = tokio::spawn(Arc::clone(&j).run(opened.committer));
        for i in 0..10 {
            stage(&j, i % 3, i);
        }
        assert_eq!(j.sync().await, Ok(()));
        let mut want: Vec<(u64, u64)> = (0..10).map(|i| (i % 3, i)).collect();
        assert_eq!(recovered(&disk), want);
        // Marks: tenant 0's two oldest are done; a sync makes that durable.
        j.lock().state.handle_done(&0, 2);
        assert_eq!(j.sync().await, Ok(()));
        want.retain(|&(t, i)| !(t == 0 && i < 4));
        assert_eq!(recovered(&disk), want);
        j.close();
        task.await.unwrap();
        assert_eq!(j.sync().await, Err(SyncError::Closed));
    }

    #[tokio::test]
    async fn a_group_commit_runs_within_the_sync_interval_without_a_sync() {
        let disk = MemStorage::new();
        let opened = open(&disk);
        let j = Arc::clone(&opened.journal);
        let task = tokio::spawn(Arc::clone(&j).run(opened.committer));
        stage(&j, 1, 1);
        // Real time: the commit task runs on the blocking pool.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while recovered(&disk).is_empty() {
            assert!(std::time::Instant::now() < deadline, "never committed");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        j.close();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_clean_close_leaves_one_empty_segment() {
        // D6: nothing pending at close, every older segment goes.
        let disk = MemStorage::new();
        let opened = open(&disk);
        let j = Arc::clone(&opened.journal);
        let task = tokio::spawn(Arc::clone(&j).run(opened.committer));
        for i in 0..5 {
            stage(&j, 1, i);
        }
        assert_eq!(j.sync().await, Ok(()));
        j.lock().state.handle_done(&1, 5);
        j.close();
        task.await.unwrap();
        let files = disk.files();
        let segments: Vec<_> = files
            .iter()
            .filter(|(n, _)| n.starts_with("segment-"))
            .collect();
        assert_eq!(segments.len(), 1, "{:?}", files.keys());
        let head = Schema::new(0, std::any::type_name::<u32>()).head_len();
        assert_eq!(segments[0].1.len(), head);
        assert!(recovered(&disk).is_empty());
    }

    #[tokio::test]
    async fn a_failing_disk_holds_items_in_memory_and_says_so_until_it_works() {
        // S-J5: a commit fails; syncs say why; items staged meanwhile are
        // unjournaled; a retry after `retry_interval` resumes journaling;
        // a sync answers Ok again once no undurable item is pending.
        let disk = MemStorage::new();
        let opened = open(&disk);
        let j = Arc::clone(&opened.journal);
        let task = tokio::spawn(Arc::clone(&j).run(opened.committer));
        stage(&j, 1, 1);
        assert_eq!(j.sync().await, Ok(()));
        disk.fail(Some(io::ErrorKind::StorageFull));
        stage(&j, 1, 2);
        assert_eq!(
            j.sync().await,
            Err(SyncError::Failed(io::ErrorKind::StorageFull))
        );
        stage(&j, 1, 3);
        assert_eq!(j.sync().await, Err(SyncError::Down { undurable: 2 }));
        disk.fail(None);
        tokio::time::sleep(Duration::from_millis(150)).await;
        stage(&j, 1, 4);
        // Resumed: 4 is journaled, but 2 and 3 are pending in memory only.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let r = j.sync().await;
            if r == Err(SyncError::Down { undurable: 2 }) && !j.lock().state.is_down() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "never resumed: {r:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        j.lock().state.handle_done(&1, 3);
        assert_eq!(j.sync().await, Ok(()));
        assert_eq!(recovered(&disk), [(1, 4)]);
        j.close();
        task.await.unwrap();
    }

    #[test]
    fn a_codec_that_fails_or_panics_refuses_the_item() {
        struct Bad;
        impl Codec<u64, u64> for Bad {
            fn encode_tenant(&self, _: &u64, _: &mut Vec<u8>) -> Result<(), crate::BoxError> {
                Ok(())
            }
            fn decode_tenant(&self, _: &[u8]) -> Result<u64, crate::BoxError> {
                Ok(0)
            }
            fn encode_item(&self, item: &u64, _: &mut Vec<u8>) -> Result<(), crate::BoxError> {
                match item {
                    0 => Err("cannot".into()),
                    1 => panic!("codec bug"),
                    _ => Ok(()),
                }
            }
            fn decode_item(&self, _: &[u8]) -> Result<u64, crate::BoxError> {
                Ok(0)
            }
        }
        let config = JournalConfig::with_storage(MemStorage::new());
        let j = J::open(config, Box::new(Bad), "test").unwrap().journal;
        let mut run = None;
        assert_eq!(j.staging.encode_into(&mut run, &1, &0), None);
        assert_eq!(j.staging.encode_into(&mut run, &1, &1), None);
        assert_eq!(j.staging.encode_into(&mut run, &1, &2), Some(0));
    }

    #[test]
    fn max_bytes_refuses_at_stage_and_leaves_room_for_the_marks() {
        // S-J4, S-J10.
        let config = JournalConfig::with_storage(MemStorage::new()).max_bytes(Some(1_000));
        let j = J::open(config, Box::new(Postcard), "test").unwrap().journal;
        let mut accepted = 0;
        while append(&j, 1, 7) {
            accepted += 1;
        }
        // 35-byte records (8 frame, 1 kind, 8 seq, 8 staging time, 4
        // version, 4 tenant length, 1 tenant, 1 item (postcard varints))
        // in 250-byte segments (a quarter of the bound) headed by 48 bytes
        // (the header, the schema record naming `u32`): the marks of
        // every accepted item, each in a done record of its own, the
        // current segment's seal, two rolls and S-J17's lone reserve
        // still fit.
        use crate::journal::format::{DONE_OVERHEAD, MARK_LEN, SEAL_LEN};
        let schema = Schema::new(0, std::any::type_name::<u32>());
        let head = schema.head_len();
        let lone = schema.sizes().lone_reserve() as usize;
        let g = j.lock();
        let bytes = g.state.disk_bytes() as usize;
        let to_free =
            accepted * (DONE_OVERHEAD + MARK_LEN) + SEAL_LEN + 2 * (head + SEAL_LEN) + lone;
        assert!(bytes + to_free <= 1_000, "{bytes} + {to_free}");
        assert!(accepted >= 5, "{accepted} accepted");
    }

    #[test]
    fn a_slow_disk_cannot_make_the_buffer_grow_past_its_bound() {
        // S-B8: nothing commits (no task runs), so records pile up.
        let config = JournalConfig::with_storage(MemStorage::new())
            .sync_bytes(100)
            .max_buffered_bytes(1_000);
        let j = J::open(config, Box::new(Postcard), "test").unwrap().journal;
        let mut accepted = 0;
        while append(&j, 1, 7) {
            accepted += 1;
        }
        assert!(j.lock().state.buffered() <= 1_000);
        let head = Schema::new(0, std::any::type_name::<u32>()).head_len();
        assert_eq!(accepted, (1_000 - head) / 35, "the header waits too");
    }

    #[tokio::test]
    async fn inline_io_commits_on_the_task_itself() {
        let disk = MemStorage::new();
        let config = JournalConfig::with_storage(disk.clone()).inline_io(true);
        let opened = J::open(config, Box::new(Postcard), "test").unwrap();
        let j = Arc::clone(&opened.journal);
        let task = tokio::spawn(Arc::clone(&j).run(opened.committer));
        stage(&j, 3, 9);
        assert_eq!(j.sync().await, Ok(()));
        assert_eq!(recovered(&disk), [(3, 9)]);
        j.close();
        task.await.unwrap();
    }

    #[test]
    fn a_second_journal_on_one_directory_is_refused() {
        let dir = std::env::temp_dir().join(format!("outbox-journal-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = J::open(JournalConfig::new(&dir), Box::new(Postcard), "a").unwrap();
        let err = J::open(JournalConfig::new(&dir), Box::new(Postcard), "b")
            .err()
            .unwrap();
        assert!(matches!(err, JournalError::Locked(_)), "{err}");
        drop(first);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
