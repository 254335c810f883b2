//! D5, the journal never wedges (with S-J2, S-J3, S-J5, S-W15): after
//! deletions refused and waiting in order, failed
//! resumes whose segments are discarded, segments whose creation failed,
//! the shutdown deadline on a slow or hung disk, and seeded random faults
//! followed by a crash or a heal (`B2_SEEDS`, `B2_INLINE` run more), the
//! journal comes back, loses nothing synced and gives its disk back.
#![cfg(feature = "journal")]

mod support;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::journal::{JournalConfig, MemStorage, Storage};
use outbox::{Outbox, Staged, SyncError};
use support::gated::{build, config, Gated};
use support::{t, Act, TestSink};

const S: Duration = Duration::from_secs(1);
/// What a segment starts with: its header and the schema record naming
/// the test sink's `u32` items (S-J14), 32 + 13 + 3 bytes.
const HEADER_LEN: usize = 48;

/// Returns true to fail the call: (op, file, bytes for append, the disk).
type Policy = Box<dyn FnMut(&'static str, &str, &[u8], &MemStorage) -> bool + Send>;

/// The handle of a disk on `mem` whose faults follow a policy the test
/// sets, with a log of every mutating call and a delay on each `sync`
/// that passes (a slow or hung disk); [`storage`](Self::storage) is the
/// disk.
#[derive(Clone)]
struct Flaky {
    disk: Gated,
    policy: Arc<Mutex<Policy>>,
    log: Arc<Mutex<Vec<String>>>,
    hang: Arc<Mutex<Duration>>,
}

impl Flaky {
    fn new(mem: &MemStorage) -> Self {
        let policy: Arc<Mutex<Policy>> = Arc::new(Mutex::new(Box::new(|_, _, _, _| false)));
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let hang: Arc<Mutex<Duration>> = Arc::default();
        let (p, l, h) = (Arc::clone(&policy), Arc::clone(&log), Arc::clone(&hang));
        let gate = move |op: &'static str, name: &str, bytes: &[u8], mem: &MemStorage| {
            let fail = (p.lock().unwrap())(op, name, bytes, mem);
            l.lock().unwrap().push(format!(
                "{op} {name} {} {}",
                bytes.len(),
                if fail { "FAIL" } else { "ok" }
            ));
            if fail {
                return Err(io::Error::other(format!("injected on {op} {name}")));
            }
            let d = *h.lock().unwrap();
            if op == "sync" && !d.is_zero() {
                std::thread::sleep(d);
            }
            Ok(())
        };
        Flaky {
            disk: Gated::new(mem, Arc::new(gate)),
            policy,
            log,
            hang,
        }
    }
    /// The disk, for a journal.
    fn storage(&self) -> Gated {
        self.disk.clone()
    }
    fn set(&self, p: impl FnMut(&'static str, &str, &[u8], &MemStorage) -> bool + Send + 'static) {
        *self.policy.lock().unwrap() = Box::new(p);
    }
    fn heal(&self) {
        self.set(|_, _, _, _| false);
    }
    fn failures(&self) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.ends_with("FAIL"))
            .count()
    }
}

fn len_of(mem: &MemStorage, name: &str) -> usize {
    mem.files().get(name).map_or(0, Vec::len)
}

/// Rebuild on `mem` (sink hangs): Ok(recovered) or the build error.
fn rebuild(mem: &MemStorage) -> Result<u64, String> {
    rebuild_on(mem.clone())
}

/// Rebuild on `storage` (sink hangs), on a thread of its own:
/// Ok(recovered) or the build error.
fn rebuild_on(storage: impl Storage + 'static) -> Result<u64, String> {
    std::thread::spawn(move || {
        let sink = TestSink::new("probe");
        sink.set_all(Act::Hang);
        let rt = support::rt::current();
        rt.block_on(async {
            match Outbox::builder(sink.clone())
                .journal(config(storage, S))
                .build()
            {
                Ok(o) => {
                    let n = o.counters().recovered;
                    o.abandon();
                    Ok(n)
                }
                Err(e) => Err(format!("{e:?}")),
            }
        })
    })
    .join()
    .unwrap()
}

fn names(mem: &MemStorage) -> Vec<String> {
    mem.files().keys().cloned().collect()
}

/// Deletions refused while many segments free up; then items pending and
/// synced; crash: recovery must work and bring the synced items back.
#[tokio::test(start_paused = true)]
async fn fifo_refused_deletions_then_crash() {
    let mem = MemStorage::new();
    let disk = Flaky::new(&mem);
    disk.set(|op, _, _, _| op == "delete");
    let sink = TestSink::new("fifo");
    let o = build(&sink, disk.storage(), Duration::from_millis(100));
    for i in 0..1_000 {
        assert_eq!(o.stage(t(u128::from(i % 7)), i), Staged::Accepted);
    }
    assert_eq!(o.flush(5 * S).await.pending, 0);
    for _ in 0..5 {
        let _ = o.sync().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sink.set_all(Act::Hang);
    for i in 0..10 {
        assert_eq!(o.stage(t(1), 5_000 + i), Staged::Accepted);
    }
    assert_eq!(o.sync().await, Ok(()));
    let before = names(&mem);
    // Deletions work again for one commit's worth, then crash.
    disk.heal();
    assert_eq!(o.stage(t(2), 9_000), Staged::Accepted);
    assert_eq!(o.sync().await, Ok(()));
    std::mem::forget(o);
    mem.crash();
    let after = names(&mem);
    let r = rebuild(&mem);
    eprintln!("files before heal {before:?}\nafter {after:?}\nrebuild {r:?}");
    assert!(r.clone().unwrap() >= 11, "{r:?}");
}

/// Resumes whose segment header is durable but whose marks append fails:
/// each leaves a file. During the outage: how many files? crash: does the
/// rebuild work? After heal: are they deleted; clean shutdown: one file.
async fn resume_marks_fail(crash_during_outage: bool) {
    let mem = MemStorage::new();
    let disk = Flaky::new(&mem);
    let sink = TestSink::new("resume");
    sink.set_all(Act::Hang);
    let o = build(&sink, disk.storage(), Duration::from_millis(10));
    for i in 0..3 {
        assert_eq!(o.stage(t(1), i), Staged::Accepted);
    }
    assert_eq!(o.sync().await, Ok(()));
    // The commit carrying the marks fails (all calls), then only appends
    // of records into a fresh (header-only) segment fail.
    disk.set(|_, _, _, _| true);
    sink.set_all(Act::Ok);
    sink.release();
    assert_eq!(o.flush(5 * S).await.pending, 0);
    assert!(o.sync().await.is_err());
    disk.set(|op, name, bytes, mem| {
        op == "append" && bytes.len() != HEADER_LEN && len_of(mem, name) == HEADER_LEN
    });
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = o.sync().await;
    }
    let during = names(&mem);
    eprintln!(
        "{} failures; files during outage: {}",
        disk.failures(),
        during.len()
    );
    if crash_during_outage {
        std::mem::forget(o);
        mem.crash();
        disk.heal();
        let r = rebuild(&mem);
        eprintln!("rebuild after crash during outage: {r:?}");
        assert!(r.is_ok(), "{r:?}");
        return;
    }
    disk.heal();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(o.stage(t(1), 100), Staged::Accepted);
    assert_eq!(o.flush(5 * S).await.pending, 0);
    let _ = o.sync().await;
    let healed = names(&mem);
    eprintln!("files after heal: {healed:?}");
    let closed = o.closed();
    o.shutdown(S).await;
    drop(o);
    tokio::time::timeout(60 * S, closed).await.expect("closes");
    let end = names(&mem);
    let r = rebuild(&mem);
    eprintln!("files after clean shutdown: {end:?}; rebuild {r:?}");
    assert_eq!(r, Ok(0));
    assert!(end.len() <= 2, "{end:?}");
}

#[tokio::test(start_paused = true)]
async fn resume_marks_fail_then_heal() {
    resume_marks_fail(false).await;
}

#[tokio::test(start_paused = true)]
async fn resume_marks_fail_then_crash() {
    resume_marks_fail(true).await;
}

/// S-J5: "A segment file that cannot be deleted does not stop the
/// journal". Deletions are refused (a lost permission); one header sync of
/// a new segment fails once (a transient EIO). Does the journal come back?
#[tokio::test(start_paused = true)]
async fn refused_deletions_plus_one_failed_creation() {
    let mem = MemStorage::new();
    let disk = Flaky::new(&mem);
    let sink = TestSink::new("unheaded");
    sink.set_all(Act::Hang);
    let o = build(&sink, disk.storage(), Duration::from_millis(100));
    assert_eq!(o.stage(t(1), 0), Staged::Accepted);
    assert_eq!(o.sync().await, Ok(()));
    let mut once = true;
    disk.set(move |op, name, _, mem| {
        if op == "delete" {
            return true;
        }
        if op == "sync" && once && len_of(mem, name) == HEADER_LEN && mem.files().len() > 1 {
            once = false;
            return true;
        }
        false
    });
    // Enough to roll to a new segment.
    for i in 1..200 {
        assert_eq!(o.stage(t(1), i), Staged::Accepted);
    }
    let first = o.sync().await;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = o.sync().await;
    }
    assert_eq!(o.stage(t(1), 5_000), Staged::Accepted);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = o.sync().await;
    eprintln!("first {first:?}; later sync {r:?}; files {:?}", names(&mem));
    let log = disk.log.lock().unwrap().clone();
    eprintln!("last calls: {:?}", &log[log.len().saturating_sub(6)..]);
    o.abandon();
    assert!(!matches!(r, Err(SyncError::Failed(_))), "{r:?}");
    assert!(matches!(r, Ok(()) | Err(SyncError::Down { .. })), "{r:?}");
    // Items 0..200 are in memory only while down: Down{..}; the new item
    // after 3 s of healthy writes should be journaled once the journal
    // resumes (only deletes fail).
    assert_eq!(
        r,
        Err(SyncError::Down { undurable: 199 }),
        "journal never resumed?"
    );
}

/// S-W15 with a down journal that has marks to redo: shutdown(200 ms) with
/// retry_interval 1 s answers by its deadline; closed() resolves.
#[tokio::test(start_paused = true)]
async fn shutdown_deadline_with_a_down_journal() {
    let mem = MemStorage::new();
    let disk = Flaky::new(&mem);
    let sink = TestSink::new("sd");
    sink.set_all(Act::Hang);
    let o = build(&sink, disk.storage(), S);
    for i in 0..3 {
        assert_eq!(o.stage(t(1), i), Staged::Accepted);
    }
    assert_eq!(o.sync().await, Ok(()));
    disk.set(|_, _, _, _| true);
    sink.set_all(Act::Ok);
    sink.release();
    assert_eq!(o.flush(5 * S).await.pending, 0);
    assert!(o.sync().await.is_err());
    let began = tokio::time::Instant::now();
    let rep = o.shutdown(Duration::from_millis(200)).await;
    let took = began.elapsed();
    let closed = o.closed();
    drop(o);
    tokio::time::timeout(60 * S, closed).await.expect("closes");
    let closed_at = began.elapsed();
    eprintln!(
        "shutdown took {took:?} (lost {}); closed after {closed_at:?}",
        rep.lost
    );
    assert!(took <= Duration::from_millis(250), "{took:?}");
    disk.heal();
    let r = rebuild(&mem);
    assert_eq!(r, Ok(3), "marks never written: 3 staged again");
}

/// A disk whose sync hangs 3 s (real) while the outbox shuts down with a
/// 200 ms deadline, commit off the runtime (no inline_io), on `rt`: the
/// answer comes by the deadline (S-W15), and `closed()` resolves once the
/// sync returns (S-W16).
fn hung_sync_at_shutdown_on(rt: tokio::runtime::Runtime) {
    rt.block_on(async {
        let mem = MemStorage::new();
        let disk = Flaky::new(&mem);
        let sink = TestSink::new("hang");
        let o = Outbox::builder(sink.clone())
            .journal(
                JournalConfig::with_storage(disk.storage())
                    .sync_interval(Duration::from_millis(1))
                    .retry_interval(S),
            )
            .build()
            .unwrap();
        for i in 0..3 {
            assert_eq!(o.stage(t(1), i), Staged::Accepted);
        }
        assert_eq!(o.flush(5 * S).await.pending, 0);
        *disk.hang.lock().unwrap() = Duration::from_secs(3);
        assert_eq!(o.stage(t(1), 3), Staged::Accepted);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let began = std::time::Instant::now();
        let rep = o.shutdown(Duration::from_millis(200)).await;
        let took = began.elapsed();
        *disk.hang.lock().unwrap() = Duration::ZERO;
        let closed = o.closed();
        drop(o);
        let c = tokio::time::timeout(Duration::from_secs(20), closed).await;
        eprintln!(
            "shutdown {took:?} lost {}; closed {:?} after {:?}",
            rep.lost,
            c.is_ok(),
            began.elapsed()
        );
        assert!(took < Duration::from_millis(800), "{took:?}");
        assert!(c.is_ok());
    });
}

#[test]
fn hung_sync_at_shutdown_multi_thread() {
    hung_sync_at_shutdown_on(support::rt::multi_thread(2));
}

#[test]
fn hung_sync_at_shutdown_current_thread() {
    hung_sync_at_shutdown_on(support::rt::current());
}

/// S-J5 "a long outage never fills the journal" / D6: the failed commit
/// carried the marks of 2,000 items; then only syncs of non-fresh files
/// fail, so each retry creates its segment (header synced), appends the
/// ~16 KB of redo marks, and fails on the sync of an older segment. Each
/// failed retry's file stays until a retry works: disk use grows per
/// retry, past `max_bytes`, uncounted.
#[tokio::test(start_paused = true)]
async fn failed_resumes_pile_up_files_with_redo_marks() {
    let mem = MemStorage::new();
    let disk = Flaky::new(&mem);
    let sink = TestSink::new("pile");
    sink.set_all(Act::Hang);
    let o = Outbox::builder(sink.clone())
        .journal(config(disk.storage(), Duration::from_millis(100)).max_bytes(Some(1 << 20)))
        .build()
        .unwrap();
    for i in 0..2_000 {
        assert_eq!(o.stage(t(u128::from(i % 50)), i), Staged::Accepted);
    }
    assert_eq!(o.sync().await, Ok(()));
    disk.set(|_, _, _, _| true);
    sink.set_all(Act::Ok);
    sink.release();
    assert_eq!(o.flush(5 * S).await.pending, 0);
    assert!(o.sync().await.is_err());
    disk.set(|op, name, _, mem| op == "sync" && len_of(mem, name) > HEADER_LEN);
    for _ in 0..60 {
        tokio::time::sleep(S).await;
        let _ = o.sync().await;
    }
    let files = mem.files();
    let bytes: usize = files.values().map(Vec::len).sum();
    let r = o.stage(t(1), 9_999);
    eprintln!(
        "{} failures; {} files, {bytes} bytes on disk (max_bytes {}); stage {r:?}",
        disk.failures(),
        files.len(),
        1 << 20
    );
    o.abandon();
    assert!(
        bytes <= 1 << 20,
        "{} files, {bytes} bytes on disk",
        files.len()
    );
}

/// Recovery on a disk that refuses deletions, with the last segment torn
/// (a crash while creating it): does the build still work (S-J5: a file
/// that cannot be deleted does not stop the journal)?
#[test]
fn rebuild_with_torn_last_segment_and_refused_deletions() {
    let mem = MemStorage::new();
    // A healthy journal with one pending item, then a crash mid-create.
    let rt = support::rt::current();
    rt.block_on(async {
        let sink = TestSink::new("torn");
        sink.set_all(Act::Hang);
        let o = build(&sink, mem.clone(), S);
        assert_eq!(o.stage(t(1), 1), Staged::Accepted);
        assert_eq!(o.sync().await, Ok(()));
        std::mem::forget(o);
    });
    mem.crash();
    mem.put("segment-00000000000000ff.journal", vec![]);
    let disk = Flaky::new(&mem);
    disk.set(|op, _, _, _| op == "delete");
    let r = rebuild_on(disk.storage());
    eprintln!("rebuild: {r:?}");
    assert_eq!(r, Ok(1));
}

/// The same where the torn segment is the very one the rebuilt journal
/// creates next: its first commit finds it, writes its header again in
/// place, and the journal works after one retry; a later rebuild reads
/// every file.
#[tokio::test(start_paused = true)]
async fn a_torn_segment_left_by_recovery_is_headed_again_by_the_first_commit() {
    let mem = MemStorage::new();
    let sink = TestSink::new("torn-next");
    sink.set_all(Act::Hang);
    let o = build(&sink, mem.clone(), S);
    assert_eq!(o.stage(t(1), 1), Staged::Accepted);
    assert_eq!(o.sync().await, Ok(()));
    std::mem::forget(o);
    mem.crash();
    let mut ids: Vec<String> = names(&mem);
    ids.sort();
    let last = ids.last().expect("a segment").clone();
    let n =
        u64::from_str_radix(&last["segment-".len()..last.len() - ".journal".len()], 16).unwrap();
    mem.put(&format!("segment-{:016x}.journal", n + 1), vec![]);
    let disk = Flaky::new(&mem);
    disk.set(|op, _, _, _| op == "delete");
    let o = build(&sink, disk.storage(), Duration::from_millis(100));
    assert_eq!(o.counters().recovered, 1);
    assert_eq!(o.stage(t(1), 2), Staged::Accepted);
    let mut answer = o.sync().await;
    for _ in 0..20 {
        if answer == Ok(()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        answer = o.sync().await;
    }
    assert!(
        matches!(answer, Ok(()) | Err(SyncError::Down { .. })),
        "{answer:?}"
    );
    assert_eq!(o.stage(t(1), 3), Staged::Accepted);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        o.sync().await,
        Err(SyncError::Down { undurable: 1 }),
        "only item 2, staged before the retry, is in memory only"
    );
    o.abandon();
    let closed = o.closed();
    drop(o);
    tokio::time::timeout(60 * S, closed).await.expect("closes");
    assert_eq!(rebuild(&mem).map(|_| ()), Ok(()), "every file reads back");
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn chance(&mut self, per_mille: u64) -> bool {
        self.next() % 1000 < per_mille
    }
}

/// Rebuild on `mem` with a healthy sink; the items of tenant 1 written.
fn rebuild_and_write(mem: &MemStorage) -> Result<Vec<u32>, String> {
    let mem = mem.clone();
    std::thread::spawn(move || {
        let sink = TestSink::new("probe-w");
        let rt = support::rt::paused();
        rt.block_on(async {
            match Outbox::builder(sink.clone())
                .journal(config(mem.clone(), S))
                .build()
            {
                Ok(o) => {
                    let _ = o.flush(60 * S).await;
                    o.abandon();
                    Ok(sink.stored(t(1)))
                }
                Err(e) => Err(format!("{e:?}")),
            }
        })
    })
    .join()
    .unwrap()
}

/// A disk on `mem` whose calls fail at random (drawn from `seed`) in the
/// mode set through the returned handle: 0 none, 1 deletes, 2 syncs, 3
/// appends of records to a fresh segment, 4 everything, 5 syncs of files
/// longer than a header.
fn seeded_faults(mem: &MemStorage, seed: u64) -> (Flaky, Arc<Mutex<u64>>) {
    let disk = Flaky::new(mem);
    let rng = Mutex::new(Lcg(seed));
    let mode = Arc::new(Mutex::new(0u64));
    let m = Arc::clone(&mode);
    disk.set(move |op, name, bytes, mem| {
        let mut r = rng.lock().unwrap();
        match *m.lock().unwrap() {
            1 => op == "delete" && r.chance(700),
            2 => op == "sync" && r.chance(300),
            3 => {
                op == "append"
                    && bytes.len() != HEADER_LEN
                    && len_of(mem, name) == HEADER_LEN
                    && r.chance(600)
            }
            4 => r.chance(150),
            5 => op == "sync" && len_of(mem, name) > HEADER_LEN && r.chance(500),
            _ => false,
        }
    });
    (disk, mode)
}

/// Random faults per call (modes: deletes only, syncs only, appends to
/// fresh files only, everything), tenant 1 hangs (its items must survive
/// a crash once a sync answered Ok), tenant 2 is written (marks and
/// deletions). Then a crash; the rebuild must work and bring back every
/// tenant-1 item an Ok sync covered.
#[test]
fn random_faults_then_crash_loses_nothing_synced() {
    let seeds: u64 = std::env::var("B2_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    let mut bad = Vec::new();
    let mut total_covered = 0;
    let mut total_fail = 0;
    for seed in 0..seeds {
        let mem = MemStorage::new();
        let (disk, mode) = seeded_faults(&mem, seed * 7919 + 1);
        let rt = support::rt::paused();
        let mut r = Lcg(seed ^ 0xdead_beef);
        let covered: Vec<u32> = rt.block_on(async {
            let sink = TestSink::new("rand");
            sink.set(t(1), Act::Hang);
            let o = Outbox::builder(sink.clone())
                .journal(
                    JournalConfig::with_storage(disk.storage())
                        .sync_interval(Duration::from_millis(1))
                        .segment_bytes(1_024)
                        .retry_interval(Duration::from_millis(1 + r.next() % 50))
                        .inline_io(std::env::var("B2_INLINE").map_or(true, |v| v == "1")),
                )
                .build()
                .unwrap();
            let mut covered = Vec::new();
            let mut staged1 = Vec::new();
            let mut n = 0u32;
            for _step in 0..(20 + r.next() % 60) {
                *mode.lock().unwrap() = if r.chance(400) { 0 } else { 1 + r.next() % 5 };
                for _ in 0..(r.next() % 20) {
                    n += 1;
                    let tenant = if r.chance(200) { 1 } else { 2 };
                    if o.stage(t(tenant), n) == Staged::Accepted && tenant == 1 {
                        staged1.push(n);
                    }
                }
                tokio::time::sleep(Duration::from_millis(r.next() % 30)).await;
                if r.chance(500) && o.sync().await == Ok(()) {
                    covered.append(&mut staged1);
                }
            }
            std::mem::forget(o);
            covered
        });
        drop(rt);
        total_covered += covered.len();
        total_fail += disk.failures();
        mem.crash();
        *mode.lock().unwrap() = 0;
        match rebuild_and_write(&mem) {
            Err(e) => bad.push(format!("seed {seed}: rebuild error {e}")),
            Ok(stored) => {
                let missing: Vec<u32> = covered
                    .iter()
                    .copied()
                    .filter(|x| !stored.contains(x))
                    .collect();
                if !missing.is_empty() {
                    bad.push(format!(
                        "seed {seed}: lost {missing:?} (covered {})",
                        covered.len()
                    ));
                }
            }
        }
    }
    eprintln!("{seeds} seeds; {total_covered} covered items; {total_fail} failed calls");
    assert!(bad.is_empty(), "{bad:#?}");
}

/// D6 / `outbox_journal_bytes` after outages whose resumes failed in
/// several ways, then a heal: does the gauge match the files on disk?
#[test]
fn journal_bytes_gauge_matches_disk_after_outages() {
    let mem = MemStorage::new();
    let disk = Flaky::new(&mem);
    let ((disk_bytes, files), snap) = support::with_metrics(|| {
        let mem = mem.clone();
        let disk = disk.clone();
        async move {
            let sink = TestSink::new("gauge");
            let o = Outbox::builder(sink.clone())
                .journal(config(disk.storage(), Duration::from_millis(10)).segment_bytes(1_024))
                .build()
                .unwrap();
            let mut n = 0;
            for round in 0..6u32 {
                sink.set(t(1), Act::Hang);
                for _ in 0..200 {
                    n += 1;
                    let _ = o.stage(t(u128::from(n % 5)), n);
                }
                let _ = o.sync().await;
                match round % 3 {
                    0 => disk.set(|_, _, _, _| true),
                    1 => disk.set(|op, name, bytes, mem| {
                        op == "append"
                            && bytes.len() != HEADER_LEN
                            && len_of(mem, name) == HEADER_LEN
                    }),
                    _ => {
                        disk.set(|op, name, _, mem| op == "sync" && len_of(mem, name) > HEADER_LEN)
                    }
                }
                sink.set_all(Act::Ok);
                sink.set(t(1), Act::Ok);
                sink.release();
                for _ in 0..20 {
                    n += 1;
                    let _ = o.stage(t(u128::from(n % 5)), n);
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    let _ = o.sync().await;
                }
                disk.heal();
                let _ = o.flush(10 * S).await;
                for _ in 0..10 {
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    let _ = o.sync().await;
                }
            }
            let p1 = o.flush(10 * S).await.pending;
            let p2 = o.flush(600 * S).await.pending;
            eprintln!(
                "pending after heal: {p1}, then {p2}; counters {:?}",
                o.counters()
            );
            for _ in 0..5 {
                n += 1;
                let _ = o.stage(t(2), n);
                let _ = o.flush(S).await;
                let _ = o.sync().await;
            }
            let files = mem.files();
            let bytes: usize = files.values().map(Vec::len).sum();
            let names: Vec<(String, usize)> =
                files.into_iter().map(|(k, v)| (k, v.len())).collect();
            o.abandon();
            (bytes, names)
        }
    });
    let m = support::snapshot(&snap);
    let gauge = m
        .iter()
        .find(|((name, _, _), _)| name == "outbox_journal_bytes")
        .map(|(_, v)| format!("{v:?}"));
    eprintln!("disk {disk_bytes} bytes in {files:?}; gauge {gauge:?}");
    let g: f64 = gauge
        .as_deref()
        .and_then(|s| {
            s.trim_start_matches("Gauge(")
                .trim_end_matches(')')
                .parse()
                .ok()
        })
        .unwrap_or(-1.0);
    assert!(
        (g - disk_bytes as f64).abs() < 2_000.0,
        "gauge {g} vs disk {disk_bytes}"
    );
}

/// Random faults (as above), then the disk heals, every item is written
/// and the outbox shuts down cleanly: D6 says one empty segment is left;
/// a rebuild stages nothing again.
#[test]
fn random_faults_then_heal_and_clean_shutdown() {
    let seeds: u64 = std::env::var("B2_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    let mut bad = Vec::new();
    for seed in 0..seeds {
        let mem = MemStorage::new();
        let (disk, mode) = seeded_faults(&mem, seed * 104_729 + 3);
        let rt = support::rt::paused();
        let mut r = Lcg(seed ^ 0x5eed);
        let (pending, closed_ok) = rt.block_on(async {
            let sink = TestSink::new("rand2");
            sink.set(t(1), Act::Hang);
            let o = Outbox::builder(sink.clone())
                .journal(
                    JournalConfig::with_storage(disk.storage())
                        .sync_interval(Duration::from_millis(1))
                        .segment_bytes(1_024)
                        .max_bytes(Some(16 << 10))
                        .retry_interval(Duration::from_millis(1 + r.next() % 50))
                        .inline_io(std::env::var("B2_INLINE").map_or(true, |v| v == "1")),
                )
                .build()
                .unwrap();
            let mut n = 0u32;
            for _step in 0..(20 + r.next() % 60) {
                *mode.lock().unwrap() = if r.chance(400) { 0 } else { 1 + r.next() % 5 };
                for _ in 0..(r.next() % 20) {
                    n += 1;
                    let tenant = if r.chance(200) { 1 } else { 2 };
                    let _ = o.stage(t(tenant), n);
                }
                tokio::time::sleep(Duration::from_millis(r.next() % 30)).await;
                if r.chance(500) {
                    let _ = o.sync().await;
                }
            }
            *mode.lock().unwrap() = 0;
            sink.set(t(1), Act::Ok);
            sink.release();
            tokio::time::sleep(S).await;
            let pending = o.flush(60 * S).await.pending;
            let _ = o.sync().await;
            let _ = o.sync().await;
            let after = o.stage(t(2), 1_000_000);
            let pending = if after == Staged::Accepted {
                pending
            } else {
                1_000_000 + pending
            };
            let _ = o.flush(60 * S).await;
            let closed = o.closed();
            o.shutdown(10 * S).await;
            drop(o);
            let c = tokio::time::timeout(60 * S, closed).await.is_ok();
            (pending, c)
        });
        drop(rt);
        let files = names(&mem);
        let again = rebuild(&mem);
        if pending != 0 || !closed_ok || files.len() != 1 || again != Ok(0) {
            bad.push(format!(
                "seed {seed}: pending {pending}, closed {closed_ok}, files {files:?}, rebuild {again:?}"
            ));
        }
    }
    assert!(bad.is_empty(), "{} bad: {bad:#?}", bad.len());
}

/// S-J5 "retries five more times": a close on a flapping disk (each retry
/// works, the next round fails again) gives up after five retries in
/// total, not five in a row (`Faults::worked` does not reset the count),
/// so a flapping disk cannot hold the close for ever either.
#[test]
fn closing_failures_count_in_total_so_a_flapping_disk_cannot_hold_the_close() {
    use outbox::core::journal::{Faults, Next};
    use outbox::core::Time;
    let mut f = Faults::new(Duration::from_millis(100));
    let mut now = Time::ZERO;
    let mut outcomes = Vec::new();
    for _ in 0..6 {
        f.failed(now);
        let n = f.next(true);
        outcomes.push(n);
        if n == Next::GiveUp {
            break;
        }
        now = now + Duration::from_millis(100);
        assert!(f.worked());
        assert_eq!(f.next(true), Next::Again);
    }
    // As documented (`CLOSING_RETRIES`): five retries, then the sixth
    // failure since the close began gives up, rounds that worked between
    // them included.
    assert_eq!(outcomes.len(), 6, "{outcomes:?}");
    assert_eq!(outcomes.last(), Some(&Next::GiveUp), "{outcomes:?}");
}
