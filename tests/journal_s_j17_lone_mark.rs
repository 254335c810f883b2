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
use support::hand::{disk_bytes, limits, Hand};

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

/// S-J17: a lone attempt asked about late, after the commit of its marks
/// failed and the journal came back and committed again, takes its marks
/// anew: the failed round lost them, and the rounds that worked since (a
/// resume carries no attempt marks) did not write them.
#[test]
fn s_j17_a_lone_attempt_asked_after_its_marks_commit_failed_marks_itself_anew() {
    let disk = MemStorage::new();
    let (mut hand, _) =
        Hand::<u8, _>::open::<u64, _>(disk.clone(), &Postcard, limits(10_000)).unwrap();
    assert!(hand.append(1, &record(1, 60)));
    hand.round().unwrap();
    let mut marked = None;
    assert_eq!(
        hand.machine.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Commit
    );
    disk.fail(Some(io::ErrorKind::Other));
    assert!(hand.round().is_err() && hand.is_down());
    disk.fail(None);
    hand.round().unwrap();
    assert!(!hand.is_down(), "resumed");
    hand.round().unwrap();
    // Asked only now: its round is older than a commit that worked, but
    // it failed.
    assert_eq!(
        hand.machine.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Commit
    );
    hand.round().unwrap();
    assert_eq!(
        hand.machine.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Start
    );
    hand.machine.handle_lone_started(&1);
    let (items, crashes) = after_crash(&disk);
    assert_eq!((items, crashes), (vec![60], vec![(1, 1)]), "counted");
}

/// S-J17: a lone attempt asked about again before the commit of its
/// marks ran still waits for that commit.
#[test]
fn s_j17_a_lone_attempt_asked_again_before_its_commit_still_waits() {
    let (mut hand, _) =
        Hand::<u8, _>::open::<u64, _>(MemStorage::new(), &Postcard, limits(10_000)).unwrap();
    assert!(hand.append(1, &record(1, 60)));
    hand.round().unwrap();
    hand.round().unwrap();
    let mut marked = None;
    assert_eq!(
        hand.machine.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Commit
    );
    assert_ne!(
        hand.machine.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Start,
        "its marks are not on disk yet"
    );
    hand.round().unwrap();
    assert_eq!(
        hand.machine.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Start
    );
}

/// D1: a sync called while a commit is out waits for the next one, which
/// carries what was staged after that commit was taken.
#[test]
fn d1_a_sync_during_a_commit_waits_for_the_next() {
    use outbox::core::Time;
    let (mut hand, _) =
        Hand::<u8, _>::open::<u64, _>(MemStorage::new(), &Postcard, limits(10_000)).unwrap();
    hand.round().unwrap();
    let now = Time::ZERO + std::time::Duration::from_secs(60);
    let m = &mut hand.machine;
    m.handle_sync(());
    let mut batch = m.poll_batch(now).expect("a sync makes a round due");
    assert!(hand.append(1, &record(1, 60)), "staged while it is out");
    hand.machine.handle_sync(());
    let done = hand.committer.commit(&mut batch);
    hand.machine.handle_executed(now, Some(batch), done);
    let answered = std::iter::from_fn(|| hand.machine.poll_answer()).count();
    assert_eq!(answered, 1, "only the sync the round started after");
    hand.round().unwrap();
}

/// S-J17: once the writer is done, a closing journal starts a lone
/// attempt at once (an abandoned write's, at the shutdown's deadline): it
/// takes no marks for it, so its last round waits for no new sync.
#[test]
fn s_j17_a_closing_journal_takes_no_marks_for_a_lone_attempt() {
    let (mut hand, _) =
        Hand::<u8, _>::open::<u64, _>(MemStorage::new(), &Postcard, limits(10_000)).unwrap();
    assert!(hand.append(1, &record(1, 60)));
    hand.round().unwrap();
    hand.machine.handle_close();
    let mut marked = None;
    assert_eq!(
        hand.machine.handle_lone_attempt(&[(1, 1)], &mut marked),
        LoneStep::Start
    );
    assert_eq!(marked, None);
    assert!(
        hand.machine.handle_attempt(&1, 1),
        "its mark was not taken: an attempt now would take it"
    );
}

/// S-J17: an attempt waits for a commit only when it has attempt marks
/// to write: not for a tenant with nothing journaled, nor for an attempt
/// whose items are marked already.
#[test]
fn s_j17_an_attempt_waits_for_a_commit_only_when_it_has_marks_to_write() {
    let (mut hand, _) =
        Hand::<u8, _>::open::<u64, _>(MemStorage::new(), &Postcard, limits(10_000)).unwrap();
    assert!(hand.append(1, &record(1, 60)));
    hand.round().unwrap();
    let m = &mut hand.machine;
    assert!(!m.handle_attempt(&2, 1), "tenant 2 has nothing journaled");
    assert!(m.handle_attempt(&1, 1), "tenant 1's item needs its mark");
    assert!(!m.handle_attempt(&1, 1), "its mark waits already");
    hand.round().unwrap();
    assert!(!hand.machine.handle_attempt(&1, 1), "its mark is on disk");
}

/// S-J10, S-J17: a new life's record is counted at the bytes its first
/// commit writes, so the machine's buffered bytes (which start a commit
/// at `sync_bytes`) match the disk.
#[test]
fn s_j17_a_new_lifes_record_is_buffered_at_the_bytes_it_takes() {
    let disk = MemStorage::new();
    let (mut hand, _) =
        Hand::<u8, _>::open::<u64, _>(disk.clone(), &Postcard, limits(10_000)).unwrap();
    for item in [60, 13] {
        assert!(hand.append(1, &record(1, item)));
    }
    hand.round().unwrap();
    assert!(hand.machine.handle_attempt(&1, 1));
    hand.round().unwrap();
    drop(hand);
    disk.crash();
    let (mut hand, back) =
        Hand::<u8, _>::open::<u64, _>(disk.clone(), &Postcard, limits(10_000)).unwrap();
    let recovered: Vec<u64> = back.items.iter().map(|x| x.0).collect();
    assert_eq!(recovered.len(), 2);
    assert_eq!(back.crashes.len(), 1, "60's attempt was cut");
    let before = hand.machine.buffered();
    hand.machine.start_life(back.crashes, recovered);
    let buffered = hand.machine.buffered();
    assert!(buffered > before, "the life record is buffered");
    let on_disk = disk_bytes(&disk);
    hand.round().unwrap();
    assert_eq!(
        disk_bytes(&disk) - on_disk,
        buffered as u64,
        "the first commit writes what was counted"
    );
}

/// S-J17: a clean close with an attempted item still pending (its write
/// failed and waits for a retry) records that no crash cut it, so the
/// next start counts no crash against it.
#[test]
fn s_j17_a_clean_close_counts_no_crash_against_an_attempted_item() {
    let disk = MemStorage::new();
    let (mut hand, _) =
        Hand::<u8, _>::open::<u64, _>(disk.clone(), &Postcard, limits(10_000)).unwrap();
    assert!(hand.append(1, &record(1, 60)));
    hand.round().unwrap();
    assert!(hand.machine.handle_attempt(&1, 1));
    hand.round().unwrap();
    hand.machine.handle_close();
    while !hand.machine.is_closed() {
        hand.round().unwrap();
    }
    drop(hand);
    let (_, back) = Hand::<u8, _>::open::<u64, _>(disk.clone(), &Postcard, limits(10_000)).unwrap();
    assert_eq!(back.items.len(), 1, "60 is still pending");
    assert_eq!(back.crashes, [], "closed cleanly: no crash cut it");
}
