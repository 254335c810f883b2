//! S-J17 with real crashes: a child process journals three items (13 and
//! 14 of tenant 1 in one slice, 20 of tenant 2 in flight beside them) into
//! a sink that aborts the process whenever it is handed item 13. The test
//! restarts the child on the same journal until it exits on its own.
//! Three lives die in 13's write; the fourth dead-letters 13 under
//! `poisoned` at recovery, without writing it, and writes 14 and 20,
//! each exactly once over all lives.
//!
//! The child is this test binary run again with `OUTBOX_POISON_CHILD`
//! set, on the `child` test.
#![cfg(all(feature = "journal", unix))]

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::journal::JournalConfig;
use outbox::{Config, DeadLetters, Outbox, Sink, WriteError, Written};

const CHILD: &str = "OUTBOX_POISON_CHILD";
const POISON: u64 = 13;

/// Appends each item it writes to a file (synced before it answers), and
/// aborts the process when handed the poison item.
struct FileSink {
    out: PathBuf,
    first_life: bool,
}

impl Sink for FileSink {
    type Tenant = u64;
    type Item = u64;

    fn name(&self) -> &str {
        "file"
    }

    async fn write(&self, tenant: &u64, items: &[u64]) -> Result<Written, WriteError> {
        if items.contains(&POISON) {
            // Late enough that the write beside it has started.
            tokio::time::sleep(Duration::from_millis(100)).await;
            std::process::abort();
        }
        if self.first_life {
            // Still in flight when the poison item's write aborts.
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.out)
            .unwrap();
        for item in items {
            writeln!(f, "{tenant} {item}").unwrap();
        }
        f.sync_data().unwrap();
        Ok(Written::ALL)
    }
}

/// The child's side (a no-op unless `OUTBOX_POISON_CHILD` is set).
#[test]
fn child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let mut parts = spec.split('|');
    let dir = PathBuf::from(parts.next().unwrap());
    let out = PathBuf::from(parts.next().unwrap());
    let first_life = parts.next().unwrap() == "first";
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let letters = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&letters);
        let o = Outbox::builder(FileSink { out, first_life })
            .config(Config::builder().concurrency(4).build().unwrap())
            .journal(JournalConfig::new(&dir).sync_interval(Duration::from_millis(1)))
            .dead_letters(DeadLetters::callback(
                move |d: outbox::DeadLetter<u64, u64>| {
                    seen.lock().unwrap().push(format!(
                        "dead {} {:?} {}",
                        d.tenant,
                        d.items,
                        d.reason.as_str()
                    ));
                },
            ))
            .build()
            .unwrap();
        if first_life {
            for (tenant, item) in [(1, POISON), (1, 14), (2, 20)] {
                assert_eq!(o.stage(tenant, item), outbox::Staged::Accepted);
            }
            assert_eq!(o.sync().await, Ok(()));
        }
        let _ = o.settle(Duration::from_secs(20)).await;
        let _ = o.shutdown(Duration::from_secs(20)).await;
        for line in letters.lock().unwrap().iter() {
            println!("{line}");
        }
    });
}

#[test]
fn s_j17_a_poison_item_that_aborts_the_process_is_dead_lettered_after_three_lives() {
    let root = std::env::temp_dir().join(format!("outbox-poison-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let (dir, out) = (root.join("journal"), root.join("written"));
    let mut aborted = 0;
    let mut last = String::new();
    for life in 1..=6 {
        let kind = if life == 1 { "first" } else { "later" };
        let spec = format!("{}|{}|{kind}", dir.display(), out.display());
        let output = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child", "--nocapture", "--test-threads=1"])
            .env(CHILD, spec)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .output()
            .unwrap();
        if output.status.signal() == Some(libc_sigabrt()) {
            aborted += 1;
            continue;
        }
        assert!(output.status.success(), "life {life}: {:?}", output.status);
        last = String::from_utf8_lossy(&output.stdout).into_owned();
        break;
    }
    assert_eq!(aborted, 3, "three lives die in the poison item's write");
    // The test harness prints its own words before the child's on a line.
    let dead: Vec<&str> = last
        .lines()
        .filter_map(|l| l.find("dead ").map(|i| &l[i..]))
        .collect();
    assert_eq!(dead, ["dead 1 [13] poisoned"], "{last}");
    let written = std::fs::read_to_string(&out).unwrap();
    let mut lines: Vec<&str> = written.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["1 14", "2 20"], "each healthy item exactly once");
    std::fs::remove_dir_all(&root).unwrap();
}

/// SIGABRT's number (6 on every unix this runs on).
fn libc_sigabrt() -> i32 {
    6
}
