//! The journal through the outbox (D1-D6, S-J1..S-J8): what survives a
//! crash, recovery order and counts, done marks, a clean shutdown, faults,
//! refusals at stage, build errors. The crash is `MemStorage::crash` after
//! the crashed outbox's runtime is gone: only synced bytes survive.
#![cfg(feature = "journal")]

mod support;

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use outbox::journal::{Codec, JournalConfig, JournalError, MemStorage, Postcard};
use outbox::{BuildError, Counters, DropReason, LostReason, Outbox, Staged, SyncError, TenantId};
use support::{t, Act, TestSink};

const S: Duration = Duration::from_secs(1);

fn journal(disk: &MemStorage) -> JournalConfig {
    JournalConfig::with_storage(disk.clone())
        .sync_interval(Duration::from_millis(1))
        .segment_bytes(4_096)
        .retry_interval(Duration::from_millis(20))
}

fn build(sink: &TestSink, disk: &MemStorage) -> Outbox<TestSink> {
    Outbox::builder(sink.clone())
        .journal(journal(disk))
        .build()
        .unwrap()
}

/// Stages `n` items round-robin over `tenants`, numbered from `from`;
/// returns them per tenant in staging order.
fn stage(o: &Outbox<TestSink>, tenants: u128, from: u32, n: u32) -> BTreeMap<TenantId, Vec<u32>> {
    let mut staged: BTreeMap<TenantId, Vec<u32>> = BTreeMap::new();
    for i in from..from + n {
        let tenant = t(u128::from(i) % tenants);
        assert_eq!(o.stage(tenant, i), Staged::Accepted);
        staged.entry(tenant).or_default().push(i);
    }
    staged
}

/// Runs an outbox whose sink hangs, stages, syncs the first part, stages
/// more, and "crashes": its runtime is dropped, then unsynced bytes go.
fn crashed_run(disk: &MemStorage, synced: u32, unsynced: u32) -> BTreeMap<TenantId, Vec<u32>> {
    let sink = TestSink::new("crashed");
    sink.set_all(Act::Hang);
    let covered = support::rt::current().block_on(async {
        let o = build(&sink, disk);
        let covered = stage(&o, 5, 0, synced);
        assert_eq!(o.sync().await, Ok(()));
        stage(&o, 5, synced, unsynced);
        std::mem::forget(o);
        covered
    });
    disk.crash();
    covered
}

fn balanced(c: &Counters) {
    assert!(c.balanced(), "S-W14 with recovered items as input: {c:?}");
}

#[test]
fn what_a_sync_covered_is_written_after_a_crash_per_tenant_in_order() {
    // D1, D2, D4.
    let disk = MemStorage::new();
    let covered = crashed_run(&disk, 100, 20);
    let sink = TestSink::new("after");
    support::rt::current().block_on(async {
        let o = build(&sink, &disk);
        let c = o.counters();
        assert!(c.recovered >= 100, "{c:?}");
        assert_eq!(c.lost(LostReason::JournalUnreadable), 0);
        assert_eq!(c.staged, 0);
        balanced(&c);
        let after = stage(&o, 5, 1_000, 10);
        let report = o.flush(5 * S).await;
        assert_eq!(report.pending, 0);
        let store = sink.store();
        for (tenant, items) in &covered {
            let got = &store[tenant];
            // Everything covered, in order, first; the new items after.
            assert_eq!(&got[..items.len()], &items[..], "{tenant}");
            assert!(got.ends_with(&after[tenant]), "{tenant}");
        }
        let c = o.counters();
        assert_eq!(c.written, c.recovered + 10);
        balanced(&c);
        let report = o.shutdown(5 * S).await;
        assert_eq!(report.lost, 0);
    });
    // A clean shutdown leaves nothing pending in the journal (S-J3).
    let sink = TestSink::new("third");
    support::rt::current().block_on(async {
        let o = build(&sink, &disk);
        assert_eq!(o.counters().recovered, 0);
        o.shutdown(S).await;
    });
    let segments = disk
        .files()
        .keys()
        .filter(|n| n.starts_with("segment-"))
        .count();
    assert_eq!(
        segments,
        1,
        "D6: one empty segment left: {:?}",
        disk.files().keys()
    );
}

#[test]
fn dead_letters_handed_back_at_shutdown_are_not_recovered() {
    // S-J3: the caller owns what the shutdown handed back.
    let disk = MemStorage::new();
    let sink = TestSink::new("hang");
    sink.set_all(Act::Hang);
    support::rt::current().block_on(async {
        let o = build(&sink, &disk);
        stage(&o, 3, 0, 9);
        let report = o.shutdown(Duration::from_millis(20)).await;
        assert_eq!(report.lost, 9);
        let back: usize = report.unwritten.iter().map(|r| r.items.len()).sum();
        assert_eq!(back, 9, "in flight and waiting, all handed back");
    });
    disk.crash();
    let sink = TestSink::new("after");
    support::rt::current().block_on(async {
        let o = build(&sink, &disk);
        assert_eq!(o.counters().recovered, 0, "{:?}", o.counters());
        o.shutdown(S).await;
    });
}

#[test]
fn recovered_items_ignore_capacity_and_come_before_new_stages() {
    // D2, D4: a recovery is never refused by a capacity; later stages are.
    let disk = MemStorage::new();
    crashed_run(&disk, 30, 0);
    let sink = TestSink::new("after");
    sink.set_all(Act::Hang);
    support::rt::current().block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(outbox::Config::builder().capacity(10).build().unwrap())
            .journal(journal(&disk))
            .build()
            .unwrap();
        let c = o.counters();
        assert_eq!((c.recovered, c.pending), (30, 30));
        assert_eq!(o.stage(t(1), 99), Staged::Dropped(DropReason::BufferFull));
        balanced(&o.counters());
        o.abandon();
    });
}

#[test]
fn a_failing_disk_keeps_items_in_memory_counted_and_sync_says_so() {
    // S-J5: items are accepted and written; syncs fail while any pending
    // item is on no disk; the journal resumes after the fault.
    let disk = MemStorage::new();
    let sink = TestSink::new("sink");
    support::rt::current().block_on(async {
        let o = build(&sink, &disk);
        stage(&o, 2, 0, 4);
        assert_eq!(o.sync().await, Ok(()));
        sink.set_all(Act::Hang);
        disk.fail(Some(io::ErrorKind::PermissionDenied));
        stage(&o, 2, 4, 4);
        assert_eq!(
            o.sync().await,
            Err(SyncError::Failed(io::ErrorKind::PermissionDenied))
        );
        assert_eq!(o.stage(t(0), 8), Staged::Accepted);
        assert!(matches!(o.sync().await, Err(SyncError::Down { .. })));
        disk.fail(None);
        sink.set_all(Act::Ok);
        sink.release();
        assert_eq!(o.flush(5 * S).await.pending, 0);
        // Resumed, and nothing undurable pending any more.
        let deadline = std::time::Instant::now() + 5 * S;
        while o.sync().await.is_err() {
            assert!(std::time::Instant::now() < deadline, "never resumed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(sink.store()[&t(0)], [0, 2, 4, 6, 8]);
        balanced(&o.counters());
        o.shutdown(S).await;
    });
}

#[test]
fn an_item_the_codec_cannot_encode_is_dropped_and_counted() {
    // S-J8.
    struct OddFails;
    impl Codec<TenantId, u32> for OddFails {
        fn encode_tenant(&self, t: &TenantId, out: &mut Vec<u8>) -> Result<(), outbox::BoxError> {
            out.extend_from_slice(t.0.as_bytes());
            Ok(())
        }
        fn decode_tenant(&self, b: &[u8]) -> Result<TenantId, outbox::BoxError> {
            Ok(TenantId(uuid::Uuid::from_slice(b)?))
        }
        fn encode_item(&self, i: &u32, out: &mut Vec<u8>) -> Result<(), outbox::BoxError> {
            if i % 2 == 1 {
                return Err("odd".into());
            }
            out.extend_from_slice(&i.to_le_bytes());
            Ok(())
        }
        fn decode_item(&self, b: &[u8]) -> Result<u32, outbox::BoxError> {
            Ok(u32::from_le_bytes(b.try_into()?))
        }
    }
    let disk = MemStorage::new();
    let sink = TestSink::new("sink");
    support::rt::current().block_on(async {
        let o = Outbox::builder(sink.clone())
            .journal_with_codec(journal(&disk), OddFails)
            .build()
            .unwrap();
        assert_eq!(o.stage(t(1), 2), Staged::Accepted);
        assert_eq!(o.stage(t(1), 3), Staged::Dropped(DropReason::EncodeFailed));
        o.flush(S).await;
        let c = o.counters();
        assert_eq!((c.written, c.dropped(DropReason::EncodeFailed)), (1, 1));
        balanced(&c);
        o.shutdown(S).await;
    });
}

#[test]
fn a_codec_that_panics_at_recovery_loses_only_the_records_it_panics_on() {
    // S-J7, S-J8, D4: a panic decoding a record makes that record
    // unreadable, counted; the build and every other record go on.
    struct PanicsOnOdd;
    impl Codec<TenantId, u32> for PanicsOnOdd {
        fn encode_tenant(&self, t: &TenantId, out: &mut Vec<u8>) -> Result<(), outbox::BoxError> {
            Codec::<TenantId, u32>::encode_tenant(&Postcard, t, out)
        }
        fn decode_tenant(&self, b: &[u8]) -> Result<TenantId, outbox::BoxError> {
            Codec::<TenantId, u32>::decode_tenant(&Postcard, b)
        }
        fn encode_item(&self, i: &u32, out: &mut Vec<u8>) -> Result<(), outbox::BoxError> {
            Codec::<TenantId, u32>::encode_item(&Postcard, i, out)
        }
        fn decode_item(&self, b: &[u8]) -> Result<u32, outbox::BoxError> {
            let i = Codec::<TenantId, u32>::decode_item(&Postcard, b)?;
            assert!(i % 2 == 0, "the codec panics on item {i}");
            Ok(i)
        }
    }
    let disk = MemStorage::new();
    let covered = crashed_run(&disk, 10, 0);
    let evens: BTreeMap<TenantId, Vec<u32>> = covered
        .into_iter()
        .map(|(t, items)| (t, items.into_iter().filter(|i| i % 2 == 0).collect()))
        .collect();
    let sink = TestSink::new("after");
    support::rt::current().block_on(async {
        let o = Outbox::builder(sink.clone())
            .journal_with_codec(journal(&disk), PanicsOnOdd)
            .build()
            .expect("a codec that panics does not fail the build");
        let c = o.counters();
        assert_eq!(
            (
                c.recovered,
                c.lost(LostReason::JournalUnreadable),
                c.pending
            ),
            (10, 5, 5),
            "{c:?}"
        );
        o.flush(S).await;
        assert_eq!(sink.store(), evens);
        balanced(&o.counters());
        o.shutdown(S).await;
    });
}

#[test]
fn a_full_journal_drops_at_stage() {
    // S-J4.
    let disk = MemStorage::new();
    let sink = TestSink::new("sink");
    sink.set_all(Act::Hang);
    support::rt::current().block_on(async {
        let o = Outbox::builder(sink.clone())
            .journal(journal(&disk).segment_bytes(300).max_bytes(Some(1_000)))
            .build()
            .unwrap();
        let staged: Vec<Staged> = (0..20).map(|i| o.stage(t(1), i)).collect();
        let full = staged
            .iter()
            .filter(|s| **s == Staged::Dropped(DropReason::JournalFull))
            .count();
        assert!(full > 0 && full < 20, "{staged:?}");
        assert_eq!(o.counters().dropped(DropReason::JournalFull), full as u64);
        balanced(&o.counters());
        o.abandon();
    });
}

#[test]
fn build_refuses_a_locked_or_foreign_journal() {
    // S-J6, S-J7.
    let disk = MemStorage::new();
    let sink = TestSink::new("sink");
    support::rt::current().block_on(async {
        let first = build(&sink, &disk);
        let second = Outbox::builder(sink.clone())
            .journal(journal(&disk))
            .build();
        assert!(matches!(
            second,
            Err(BuildError::Journal(JournalError::Locked(_)))
        ));
        first.shutdown(S).await;
    });
    let dir = std::env::temp_dir().join(format!("outbox-journal-foreign-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("README"), b"not a journal").unwrap();
    support::rt::current().block_on(async {
        let r = Outbox::builder(sink.clone())
            .journal(JournalConfig::new(&dir))
            .build();
        let Err(err) = r else {
            panic!("a foreign file is refused")
        };
        assert!(err.to_string().contains("README"), "{err}");
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sync_without_a_journal_says_so() {
    let sink = TestSink::new("sink");
    support::rt::current().block_on(async {
        let o = Outbox::builder(sink).build().unwrap();
        assert_eq!(o.sync().await, Err(SyncError::NoJournal));
    });
}
