//! A real crash, many times (D1, D2, D3, D5, D6): a child process stages
//! usage records for many tenants into PostgreSQL with the journal on and
//! calls `sync` now and then, printing which records each answered `sync`
//! covered; this test SIGKILLs it at moments drawn from a seed, at least 20
//! times, restarting it on the same journal each time, then lets a last
//! run settle and shut down cleanly. At the end every record covered by an
//! answered `sync` is in the table exactly once, each tenant's rows are in
//! staging order, every row was staged, and the journal holds no pending
//! item.
//!
//! Runs when `OUTBOX_TEST_POSTGRES_URL` is set (fails if it is set and the
//! server does not answer). The seed is printed; replay one with
//! `OUTBOX_JOURNAL_CRASH_SEED=<seed> cargo test --all-features --test
//! journal_durability_kill_9 -- --nocapture`. The child is this test binary run again
//! with `OUTBOX_JOURNAL_CHILD` set, on the `child` test.
#![cfg(all(feature = "journal", feature = "postgres", unix))]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use outbox::journal::{FsStorage, JournalConfig, Postcard};
use outbox::sinks::postgres::{deadpool_postgres, tokio_postgres, PostgresSink};
use outbox::sinks::Envelope;
use outbox::{Config, Outbox, TenantId};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use uuid::Uuid;

const CHILD: &str = "OUTBOX_JOURNAL_CHILD";
const KILLS: usize = 24;
const TENANTS: u64 = 40;
/// Records staged between two syncs.
const BURST: u64 = 64;

fn tenant(n: u64) -> TenantId {
    TenantId::from_u128(u128::from(n % TENANTS) + 1)
}

/// Record `n` of run `run`: its id sorts by (run, n), i.e. by staging
/// order across runs.
fn id(run: u64, n: u64) -> Uuid {
    Uuid::from_u64_pair(run, n)
}

// ----- the child --------------------------------------------------------

/// The child's side (a no-op unless `OUTBOX_JOURNAL_CHILD` is set).
#[test]
fn child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let mut parts = spec.split('|');
    let (url, table, dir, run, last) = (
        parts.next().unwrap().to_owned(),
        parts.next().unwrap().to_owned(),
        PathBuf::from(parts.next().unwrap()),
        parts.next().unwrap().parse::<u64>().unwrap(),
        parts.next().unwrap() == "last",
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(child_run(url, table, dir, run, last));
}

async fn child_run(url: String, table: String, dir: PathBuf, run: u64, last: bool) {
    let sink = PostgresSink::<Envelope>::new(pool(&url, 8), &table).unwrap();
    let config = Config::builder()
        .max_batch(100)
        .concurrency(8)
        .build()
        .unwrap();
    let outbox = Outbox::builder(sink)
        .config(config)
        .journal(
            JournalConfig::new(&dir)
                .sync_interval(Duration::from_millis(2))
                .segment_bytes(64 << 10),
        )
        .build()
        .unwrap();
    println!("READY {run} {}", outbox.counters().recovered);
    if last {
        let report = outbox.settle(Duration::from_secs(120)).await;
        assert_eq!(report.pending, 0, "the last run settles");
        let report = outbox.shutdown(Duration::from_secs(30)).await;
        assert_eq!(report.lost, 0);
        let c = outbox.counters();
        assert!(c.balanced(), "{c:?}");
        println!("DONE {} {}", c.recovered, c.written);
        return;
    }
    let mut n = 0;
    loop {
        for _ in 0..BURST {
            let record = Envelope::with_id(id(run, n), format!("{{\"run\":{run},\"n\":{n}}}"));
            let _ = outbox.stage(tenant(n), record);
            n += 1;
        }
        outbox.sync().await.expect("the journal works");
        // Every record numbered below `n` in this run is covered.
        println!("SYNCED {run} {n}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn pool(url: &str, size: usize) -> deadpool_postgres::Pool {
    let config: tokio_postgres::Config = url.parse().expect("a valid postgres URL");
    let manager = deadpool_postgres::Manager::from_config(
        config,
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    deadpool_postgres::Pool::builder(manager)
        .max_size(size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(5)))
        .build()
        .unwrap()
}

// ----- the parent -------------------------------------------------------

struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
}

fn spawn(url: &str, table: &str, dir: &Path, run: u64, last: bool) -> Running {
    let spec = format!(
        "{url}|{table}|{}|{run}|{}",
        dir.display(),
        if last { "last" } else { "go" }
    );
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, spec)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawns the child");
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Running { child, lines }
}

/// Reads the child's lines until `pred` holds for one, or `within` passes.
fn until(r: &Running, within: Duration, mut on: impl FnMut(&str) -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match r.lines.recv_timeout(left) {
            Ok(line) => {
                if on(&line) {
                    return true;
                }
            }
            Err(_) => return false,
        }
    }
}

#[test]
fn records_covered_by_a_sync_survive_kill_9_exactly_once_in_order() {
    let Some(url) = common::servers::url(common::postgres::VAR, "journal_crash") else {
        return;
    };
    let seed = std::env::var("OUTBOX_JOURNAL_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("journal_crash: seed {seed} (replay: OUTBOX_JOURNAL_CRASH_SEED={seed})");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let table = common::servers::unique_name("journal_crash");
    let dir = std::env::temp_dir().join(&table);
    let _ = std::fs::remove_dir_all(&dir);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let admin = rt.block_on(async {
        let config: tokio_postgres::Config = url.parse().expect("a valid URL");
        let (client, conn) = config
            .connect(tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{}={url} is set but the server does not answer: {e}",
                    common::postgres::VAR
                )
            });
        tokio::spawn(conn);
        let sink = PostgresSink::<Envelope>::new(pool(&url, 1), &table).unwrap();
        sink.create_table().await.unwrap();
        client
    });

    // covered[run] = every record numbered below it was covered by a sync.
    let mut covered: BTreeMap<u64, u64> = BTreeMap::new();
    let mut recovered_total = 0u64;
    for run in 0..KILLS as u64 {
        let mut r = spawn(&url, &table, &dir, run, false);
        let ready = until(&r, Duration::from_secs(60), |l| {
            if let Some(rest) = after(l, "READY ") {
                let n: u64 = rest.split(' ').nth(1).unwrap().parse().unwrap();
                recovered_total += n;
                true
            } else {
                false
            }
        });
        assert!(ready, "seed {seed}: run {run} never got ready");
        // The kill moment, drawn from the seed: 5 to 250 ms after ready.
        let wait = Duration::from_millis(5 + rng.next_u64() % 245);
        let _ = until(&r, wait, |l| {
            record_sync(l, &mut covered);
            false
        });
        // SIGKILL: no destructor, no flush, no shutdown.
        r.child.kill().unwrap();
        r.child.wait().unwrap();
        while let Ok(l) = r.lines.try_recv() {
            record_sync(&l, &mut covered);
        }
    }
    let runs_with_sync = covered.len();
    let last = spawn(&url, &table, &dir, KILLS as u64, true);
    let mut done = None;
    let ok = until(&last, Duration::from_secs(180), |l| {
        if let Some(rest) = after(l, "DONE ") {
            done = Some(rest.to_owned());
            true
        } else {
            false
        }
    });
    let mut last = last;
    let status = last.child.wait().unwrap();
    assert!(
        ok && status.success(),
        "seed {seed}: the last run failed ({status})"
    );

    // D1, D2, D3 in the table.
    let rows = rt.block_on(async {
        admin
            .query(
                &format!("SELECT tenant, item_id FROM \"{table}\" ORDER BY tenant, seq"),
                &[],
            )
            .await
            .unwrap()
    });
    let mut per_tenant: BTreeMap<Uuid, Vec<Uuid>> = BTreeMap::new();
    for row in &rows {
        per_tenant.entry(row.get(0)).or_default().push(row.get(1));
    }
    let mut present = BTreeSet::new();
    for (t, ids) in &per_tenant {
        for w in ids.windows(2) {
            assert!(
                w[0] < w[1],
                "seed {seed}: D2: tenant {t} has {} before {}",
                w[0],
                w[1]
            );
        }
        for item in ids {
            let (run, n) = item.as_u64_pair();
            assert!(
                run <= KILLS as u64,
                "seed {seed}: D3: {item} was never staged"
            );
            assert_eq!(
                tenant(n).0,
                *t,
                "seed {seed}: D3: {item} under another tenant"
            );
            present.insert(*item);
        }
    }
    let mut covered_count = 0;
    for (&run, &upto) in &covered {
        for n in 0..upto {
            covered_count += 1;
            assert!(
                present.contains(&id(run, n)),
                "seed {seed}: D1: record {n} of run {run} was covered by a sync and is missing"
            );
        }
    }
    // D6: a clean shutdown left no pending item.
    let mut storage = FsStorage::new(&dir).unwrap();
    let rec = outbox::journal::recover::<TenantId, Envelope, _, _>(
        &mut storage,
        &Postcard,
        outbox::core::journal::Limits {
            segment_bytes: 1 << 20,
            max_bytes: None,
        },
    )
    .unwrap();
    assert_eq!(
        (rec.report.recovered, rec.report.unreadable),
        (0, 0),
        "seed {seed}: {:?}",
        rec.report
    );
    drop(storage);
    eprintln!(
        "journal_crash: seed {seed}: {KILLS} kills, {runs_with_sync} runs with an answered sync, \
         {covered_count} covered records all present once, {} rows in {} tenants in order, \
         {recovered_total} items recovered over the restarts; last run: {}",
        rows.len(),
        per_tenant.len(),
        done.unwrap_or_default()
    );
    assert!(
        runs_with_sync >= KILLS / 2,
        "seed {seed}: too few syncs answered to prove anything"
    );
    rt.block_on(async {
        admin
            .execute(&format!("DROP TABLE \"{table}\""), &[])
            .await
            .unwrap();
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// What follows `tag` in a line of the child (the test harness may print
/// `test child ... ` before its first line).
fn after<'a>(line: &'a str, tag: &str) -> Option<&'a str> {
    line.find(tag).map(|at| &line[at + tag.len()..])
}

fn record_sync(line: &str, covered: &mut BTreeMap<u64, u64>) {
    if let Some(rest) = after(line, "SYNCED ") {
        let mut p = rest.split(' ');
        let run: u64 = p.next().unwrap().parse().unwrap();
        let n: u64 = p.next().unwrap().parse().unwrap();
        let e = covered.entry(run).or_default();
        *e = (*e).max(n);
    }
}
