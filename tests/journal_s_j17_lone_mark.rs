//! S-J17 in the journal machine: a suspect's lone attempt never starts
//! without its attempt mark on disk, nor does any attempt while the last
//! lone one's end waits for the disk. On a journal that is down it waits
//! for a resume, and the commit of its mark carries the done mark of the
//! suspect written before it (crash seed 920252: that done mark used to
//! wait for the disk while the next suspect, started at once and
//! unmarked, took the process down, so the crash was counted against the
//! one already written).
#![cfg(all(feature = "journal", feature = "testkit"))]

mod support;

use std::io;

use outbox::core::journal::{LoneStep, Seq};
use outbox::journal::format::EncodedItem;
use outbox::journal::{recover, Codec, MemStorage, Postcard};
use support::hand::{limits, Hand};

fn record(tenant: u8, item: u64) -> EncodedItem {
    EncodedItem::new(
        |b| Codec::<u8, u64>::encode_tenant(&Postcard, &tenant, b),
        |b| Codec::<u8, u64>::encode_item(&Postcard, &item, b),
    )
    .unwrap()
}

/// After a crash now: the items recovered and the crashes counted.
fn after_crash(disk: &MemStorage) -> (Vec<u64>, Vec<(Seq, u32)>) {
    disk.crash();
    let rec = recover::<u8, u64, _, _>(&mut disk.clone(), &Postcard, limits(10_000)).unwrap();
    let items = rec.items.iter().map(|(_, _, item)| *item).collect();
    (items, rec.crashes)
}

#[test]
fn s_j17_a_lone_attempt_waits_for_a_journal_that_is_down_and_marks_itself_anew() {
    let disk = MemStorage::new();
    let (mut hand, _) =
        Hand::<u8, _>::open::<u64, _>(disk.clone(), &Postcard, limits(10_000)).unwrap();
    for item in [60, 13] {
        assert!(hand.append(1, &record(1, item)));
    }
    hand.round().unwrap();
    // 60's lone attempt: its mark's commit, then it starts.
    let mut marked = None;
    let m = &mut hand.machine;
    assert_eq!(
        m.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Commit
    );
    hand.round().unwrap();
    let m = &mut hand.machine;
    assert_eq!(
        m.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Start
    );
    m.handle_lone_started(&1);
    assert!(!m.lone_end_waits(), "in flight: nothing else starts anyway");
    // It is written; the commit of its done mark fails. Until it is on
    // disk, every attempt (another tenant's too) waits for its marks.
    hand.done(&1, 1);
    assert!(hand.machine.lone_end_waits());
    disk.fail(Some(io::ErrorKind::Other));
    assert!(hand.round().is_err() && hand.is_down());
    assert!(hand.machine.lone_end_waits());
    // 13's lone attempt waits for the journal.
    let mut marked = None;
    let m = &mut hand.machine;
    assert_eq!(
        m.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Down
    );
    disk.fail(None);
    hand.round().unwrap();
    assert!(!hand.is_down(), "resumed");
    let m = &mut hand.machine;
    assert_eq!(
        m.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Commit
    );
    // The commit of its mark fails: it is taken anew after the resume.
    disk.fail(Some(io::ErrorKind::Other));
    assert!(hand.round().is_err());
    let m = &mut hand.machine;
    assert_eq!(
        m.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Down
    );
    disk.fail(None);
    hand.round().unwrap();
    let m = &mut hand.machine;
    assert_eq!(
        m.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Commit
    );
    hand.round().unwrap();
    let m = &mut hand.machine;
    assert_eq!(
        m.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Start
    );
    assert!(!m.lone_end_waits(), "60's done mark is on disk");
    // The process dies during 13's attempt: counted against it alone.
    let (items, crashes) = after_crash(&disk);
    assert_eq!(items, [13], "60's done mark is on disk");
    assert_eq!(crashes, [(2, 1)]);
}
