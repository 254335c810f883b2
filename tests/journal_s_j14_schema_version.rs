//! S-J14, S-J15 (issue 25): schema identity. The codec carries a version
//! (default 0) written with every record, the item type's name beside it;
//! a recovery that meets another version refuses those records, never
//! decoding them (counted under `other_version`, handed over if asked) or
//! fails the build, as configured; a journal of the previous format
//! recovers, its records at version 0.
#![cfg(feature = "journal")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::journal::format::{self, Schema};
use outbox::journal::{
    inspect, JournalConfig, JournalError, MemStorage, OtherRecord, OtherVersion, Postcard,
    RawBytes, Versioned,
};
use outbox::{BuildError, LostReason, Outbox, Staged};
use support::{t, Act, TestSink};

const S: Duration = Duration::from_secs(1);

fn journal(disk: &MemStorage) -> JournalConfig {
    JournalConfig::with_storage(disk.clone())
        .sync_interval(Duration::from_millis(1))
        .segment_bytes(4_096)
}

/// Stages `items` of tenant 1 under codec version `version`, syncs them,
/// and crashes (the sink hangs: nothing is written).
fn crashed_run(disk: &MemStorage, version: u32, items: std::ops::Range<u32>) {
    let sink = TestSink::new("before");
    sink.set_all(Act::Hang);
    support::rt::current().block_on(async {
        let o = Outbox::builder(sink.clone())
            .journal_with_codec(journal(disk), Versioned::new(Postcard, version))
            .build()
            .unwrap();
        for i in items {
            assert_eq!(o.stage(t(1), i), Staged::Accepted);
        }
        assert_eq!(o.sync().await, Ok(()));
        std::mem::forget(o);
    });
    disk.crash();
}

#[test]
fn records_of_another_version_are_refused_counted_and_never_decoded() {
    // Version 1 items are pending; an outbox of version 2 refuses them
    // (they would decode as u32 alike: only the version tells them apart)
    // and writes its own.
    let disk = MemStorage::new();
    crashed_run(&disk, 1, 0..5);
    let sink = TestSink::new("after");
    support::rt::current().block_on(async {
        let o = Outbox::builder(sink.clone())
            .journal_with_codec(journal(&disk), Versioned::new(Postcard, 2))
            .build()
            .unwrap();
        let c = o.counters();
        assert_eq!(c.lost(LostReason::OtherVersion), 5, "{c:?}");
        assert_eq!(c.lost(LostReason::JournalUnreadable), 0);
        assert_eq!(c.pending, 0, "nothing of version 1 staged again");
        assert!(c.balanced(), "{c:?}");
        assert_eq!(o.stage(t(1), 100), Staged::Accepted);
        assert_eq!(o.flush(5 * S).await.pending, 0);
        assert_eq!(sink.store().get(&t(1)).cloned(), Some(vec![100]));
        o.shutdown(S).await;
    });
    // The clean shutdown deleted the refused records' segments: the next
    // life counts nothing again.
    let sink = TestSink::new("third");
    support::rt::current().block_on(async {
        let o = Outbox::builder(sink.clone())
            .journal_with_codec(journal(&disk), Versioned::new(Postcard, 2))
            .build()
            .unwrap();
        assert_eq!(o.counters().lost(LostReason::OtherVersion), 0);
        o.shutdown(S).await;
    });
}

#[test]
fn the_same_version_recovers_and_the_default_is_zero() {
    let disk = MemStorage::new();
    crashed_run(&disk, 0, 0..4);
    let sink = TestSink::new("after");
    support::rt::current().block_on(async {
        // `journal` (Postcard, version 0) reads what version 0 wrote.
        let o = Outbox::builder(sink.clone())
            .journal(journal(&disk))
            .build()
            .unwrap();
        let c = o.counters();
        assert_eq!((c.recovered, c.lost(LostReason::OtherVersion)), (4, 0));
        assert_eq!(o.flush(5 * S).await.pending, 0);
        assert_eq!(sink.store().get(&t(1)).cloned(), Some(vec![0, 1, 2, 3]));
        o.shutdown(S).await;
    });
}

#[test]
fn refused_records_are_handed_over_as_their_bytes_if_asked() {
    let disk = MemStorage::new();
    crashed_run(&disk, 7, 10..13);
    let handed: Arc<Mutex<Vec<OtherRecord>>> = Arc::default();
    let seen = Arc::clone(&handed);
    let sink = TestSink::new("after");
    support::rt::current().block_on(async {
        let config =
            journal(&disk).other_version(OtherVersion::hand(move |r| seen.lock().unwrap().push(r)));
        let o = Outbox::builder(sink.clone())
            .journal(config)
            .build()
            .unwrap();
        assert_eq!(o.counters().lost(LostReason::OtherVersion), 3);
        o.shutdown(S).await;
    });
    let handed = handed.lock().unwrap().clone();
    let items: Vec<u32> = handed
        .iter()
        .map(|r| postcard::from_bytes(&r.item).unwrap())
        .collect();
    assert_eq!(
        items,
        [10, 11, 12],
        "in staging order, the older type decodes them"
    );
    assert!(handed.iter().all(|r| r.version == 7));
    let tenant: outbox::TenantId = postcard::from_bytes(&handed[0].tenant).unwrap();
    assert_eq!(tenant, t(1));
}

#[test]
fn another_version_fails_the_build_if_configured_and_changes_nothing() {
    let disk = MemStorage::new();
    crashed_run(&disk, 1, 0..3);
    let before = disk.files();
    let sink = TestSink::new("after");
    let err = support::rt::current().block_on(async {
        let built = Outbox::builder(sink.clone())
            .journal(journal(&disk).other_version(OtherVersion::Fail))
            .build();
        match built {
            Ok(_) => panic!("built over items of another version"),
            Err(e) => e,
        }
    });
    match &err {
        BuildError::Journal(JournalError::OtherVersion {
            version,
            expected,
            items,
            ..
        }) => assert_eq!((*version, *expected, *items), (1, 0, 3)),
        other => panic!("{other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("codec version 1") && text.contains("version 0"),
        "{text}"
    );
    let mut after = disk.files();
    after.remove("LOCK");
    let mut before = before;
    before.remove("LOCK");
    assert_eq!(after, before, "nothing cut, sealed or deleted");
    // The older build still recovers them.
    let sink = TestSink::new("older");
    support::rt::current().block_on(async {
        let o = Outbox::builder(sink.clone())
            .journal_with_codec(journal(&disk), Versioned::new(Postcard, 1))
            .build()
            .unwrap();
        assert_eq!(o.counters().recovered, 3);
        o.shutdown(S).await;
    });
}

/// A version 1 item record (kind 1: sequence · tenant length · tenant ·
/// item), as the previous format wrote it.
fn v1_item(seq: u64, tenant: &[u8], item: &[u8]) -> Vec<u8> {
    let mut body = vec![1u8];
    body.extend_from_slice(&seq.to_le_bytes());
    body.extend_from_slice(&(tenant.len() as u32).to_le_bytes());
    body.extend_from_slice(tenant);
    body.extend_from_slice(item);
    framed(&body)
}

fn framed(body: &[u8]) -> Vec<u8> {
    let len = (body.len() as u32).to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len), body);
    let mut out = len.to_vec();
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(body);
    out
}

#[test]
fn a_journal_of_the_previous_format_recovers_at_version_zero() {
    // S-J15: upgrading with items pending is never a build error.
    let disk = MemStorage::new();
    let tenant = postcard::to_allocvec(&t(3)).unwrap();
    let mut seg = format::header_of(format::V1, 1, 1).to_vec();
    for (seq, item) in [(1u64, 40u32), (2, 41), (3, 42)] {
        seg.extend(v1_item(
            seq,
            &tenant,
            &postcard::to_allocvec(&item).unwrap(),
        ));
    }
    disk.put(&format::segment_name(1), seg);
    let sink = TestSink::new("upgraded");
    support::rt::current().block_on(async {
        let o = Outbox::builder(sink.clone())
            .journal(journal(&disk))
            .build()
            .unwrap();
        let c = o.counters();
        assert_eq!(
            (c.recovered, c.lost(LostReason::OtherVersion)),
            (3, 0),
            "{c:?}"
        );
        assert_eq!(o.flush(5 * S).await.pending, 0);
        assert_eq!(sink.store().get(&t(3)).cloned(), Some(vec![40, 41, 42]));
        o.shutdown(S).await;
    });
    // A codec of another version refuses them: they are of version 0.
    let disk2 = MemStorage::new();
    let mut seg = format::header_of(format::V1, 1, 1).to_vec();
    seg.extend(v1_item(1, &tenant, &postcard::to_allocvec(&5u32).unwrap()));
    disk2.put(&format::segment_name(1), seg);
    support::rt::current().block_on(async {
        let o = Outbox::builder(TestSink::new("v1"))
            .journal_with_codec(journal(&disk2), Versioned::new(Postcard, 1))
            .build()
            .unwrap();
        assert_eq!(o.counters().lost(LostReason::OtherVersion), 1);
        o.shutdown(S).await;
    });
}

#[test]
fn the_inspector_shows_the_version_and_the_type_name_of_each_segment() {
    let dir = std::env::temp_dir().join(format!("outbox-s-j14-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    support::rt::current().block_on(async {
        let sink = TestSink::new("fs");
        sink.set_all(Act::Hang);
        let o = Outbox::builder(sink)
            .journal_with_codec(JournalConfig::new(&dir), Versioned::new(Postcard, 4))
            .build()
            .unwrap();
        for i in 0..3 {
            assert_eq!(o.stage(t(2), i), Staged::Accepted);
        }
        assert_eq!(o.sync().await, Ok(()));
        std::mem::forget(o);
    });
    let r = inspect(&dir, &RawBytes).unwrap();
    let seg = r.segments.last().unwrap();
    assert_eq!(seg.schema, Some((4, "u32".to_owned())), "{seg:?}");
    assert_eq!(seg.item_versions, [4]);
    // RawBytes is of version 0: the items are shown as their bytes.
    assert!(r.pending.is_empty());
    assert_eq!(r.other.len(), 3);
    assert!(r.other.iter().all(|(_, o)| o.version == 4));
    let r = inspect(&dir, &Versioned::new(RawBytes, 4)).unwrap();
    assert_eq!((r.pending.len(), r.other.len()), (3, 0));
    let want = Schema::new(4, "u32").head_len();
    assert!(seg.bytes as usize > want);
    let _ = std::fs::remove_dir_all(&dir);
}
