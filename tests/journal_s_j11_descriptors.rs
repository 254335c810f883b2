//! S-J11, descriptors (issue 25): the journal holds at most 8 file
//! descriptors whatever the segment count. During an outage with small
//! segments, 167 segments once held 180 open descriptors, and under a limit
//! of 96 `sync` answered `Err(Down { .. })` on EMFILE.
//!
//! The test runs this binary again as a child under `RLIMIT_NOFILE` 32: a
//! journal on the real file system with the smallest segments and a sink
//! that never answers (no segment is ever deleted) grows past 100
//! segments; every `sync` must answer `Ok`, and the process must never
//! hold more than 8 descriptors beyond what it held before the build.
#![cfg(all(feature = "journal", unix))]

mod support;

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use outbox::journal::JournalConfig;
use outbox::Outbox;
use support::{t, Act, TestSink};

const CHILD: &str = "OUTBOX_FD_CHILD";

/// Descriptors this process holds now.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

/// The child's side (a no-op unless `OUTBOX_FD_CHILD` is set).
#[test]
fn child() {
    let Ok(dir) = std::env::var(CHILD) else {
        return;
    };
    let rt = support::rt::current();
    rt.block_on(async {
        let sink = TestSink::new("fds");
        sink.set_all(Act::Hang);
        let before = open_fds();
        let o = Outbox::builder(sink)
            .journal(
                JournalConfig::new(&dir)
                    .segment_bytes(128)
                    .sync_interval(Duration::from_millis(1)),
            )
            .build()
            .unwrap();
        let mut most = 0;
        for i in 0..2_000u32 {
            assert_eq!(o.stage(t(u128::from(i % 5)), i), outbox::Staged::Accepted);
            if i % 20 == 19 {
                assert_eq!(o.sync().await, Ok(()), "item {i}");
                most = most.max(open_fds().saturating_sub(before));
            }
        }
        let segments = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("segment-"))
            })
            .count();
        assert!(segments > 100, "{segments} segments");
        assert!(most <= 8, "the journal held {most} descriptors");
        println!("fds-ok {segments} segments, at most {most} descriptors");
        o.abandon();
    });
}

#[test]
fn at_most_8_descriptors_whatever_the_segment_count_under_rlimit_nofile_32() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("outbox-fds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, &dir);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the
    // child between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 32,
                rlim_max: 32,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("runs the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success() && stdout.contains("fds-ok"),
        "the child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
