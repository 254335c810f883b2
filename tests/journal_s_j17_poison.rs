//! S-J17 in the driver: an item whose write takes the process down, life
//! after life (a crash simulated by forgetting the outbox in mid-write and
//! cutting the in-memory disk to what was synced). After its third crash
//! the next recovery dead-letters it under `poisoned`; the item behind it
//! in its slice and the one in flight beside it are written, once. An
//! item that failed and was waiting for its retry at a crash is not
//! counted (its attempt's end is on disk), and a suspect backing off
//! holds no other tenant back. A suspect written just before the journal
//! fails is not counted for the crash of a write started after it: that
//! write waits for the journal, and the commit of its attempt marks
//! carries the suspect's done mark.
#![cfg(all(feature = "journal", feature = "testkit"))]

mod support;

use std::time::Duration;

use outbox::journal::{JournalConfig, MemStorage};
use outbox::{Config, DeadLetters, DeadReason, DropReason, LostReason, Outbox, Staged};
use support::{t, Act, TestSink};

const POISON: u32 = 13;

fn journal(disk: &MemStorage) -> JournalConfig {
    JournalConfig::with_storage(disk.clone())
        .sync_interval(Duration::from_millis(1))
        .inline_io(true)
}

fn config() -> Config {
    Config::builder()
        .concurrency(4)
        .dead_letters(true)
        .build()
        .unwrap()
}

/// Steps the paused clock until `sink` saw `n` attempts in all.
async fn until_attempts(sink: &TestSink, n: usize) {
    for _ in 0..2_000 {
        if sink.attempts().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{} attempts, not {n}", sink.attempts().len());
}

/// One life that crashes once `crashing` attempts are in flight (every
/// write hangs on tenant 1, tenant 2's too in the first life); returns the
/// attempts it saw.
/// The process dies: its runtime is never dropped (nothing of it runs
/// again), its disk loses what was not synced.
fn die(rt: tokio::runtime::Runtime, disk: &MemStorage) {
    std::mem::forget(rt);
    disk.crash();
}

/// Every attempt the sink saw, as (tenant, items).
fn attempts_of(sink: &TestSink) -> Vec<(u128, Vec<u32>)> {
    sink.attempts()
        .into_iter()
        .map(|a| (a.tenant.as_uuid().as_u128(), a.items))
        .collect()
}

fn crashing_life(disk: &MemStorage, first: bool, crashing: usize) -> Vec<(u128, Vec<u32>)> {
    let rt = support::rt::paused();
    let sink = TestSink::new("crashing");
    sink.set(t(1), Act::Hang);
    sink.set(t(2), if first { Act::Hang } else { Act::Ok });
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(journal(disk))
            .build()
            .unwrap();
        if first {
            for i in [POISON, 14] {
                assert_eq!(o.stage(t(1), i), Staged::Accepted);
            }
            assert_eq!(o.stage(t(2), 20), Staged::Accepted);
            assert_eq!(o.sync().await, Ok(()));
        }
        until_attempts(&sink, crashing).await;
        // Time for anything else to start, which it must not.
        tokio::time::sleep(Duration::from_millis(50)).await;
        std::mem::forget(o);
    });
    die(rt, disk);
    attempts_of(&sink)
}

#[test]
fn s_j17_a_poison_item_is_dead_lettered_after_three_crashes_and_its_neighbours_are_written() {
    let disk = MemStorage::new();
    // Life 1: 13 and 14 in one slice, 20 beside them; the process dies.
    let first = crashing_life(&disk, true, 2);
    assert_eq!(first.len(), 2, "{first:?}");
    // Lives 2 and 3: the suspects go alone, 13 first (its tenant's
    // oldest), and nothing starts beside it before the crash.
    for life in [2, 3] {
        let seen = crashing_life(&disk, false, 1);
        assert_eq!(seen, [(1, vec![POISON])], "life {life}");
    }
    // Life 4: 13 is poisoned at recovery; 14 and 20 are written, once.
    let rt = support::rt::paused();
    let sink = TestSink::new("last");
    sink.set_all(Act::Ok);
    let (letters, mut rx) = DeadLetters::channel(8);
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(journal(&disk))
            .dead_letters(letters)
            .build()
            .unwrap();
        let c = o.counters();
        assert_eq!((c.recovered, c.lost(LostReason::Poisoned)), (3, 1), "{c:?}");
        let letter = rx.recv().await.unwrap();
        assert_eq!(
            (letter.tenant, letter.items, letter.reason, letter.attempted),
            (t(1), vec![POISON], DeadReason::Poisoned, true)
        );
        let _ = o.settle(Duration::from_secs(10)).await;
        assert_eq!(sink.stored(t(1)), [14]);
        assert_eq!(sink.stored(t(2)), [20]);
        let _ = o.shutdown(Duration::from_secs(10)).await;
    });
    // Nothing comes back, even after a crash: the poisoned item's mark
    // is on disk.
    drop(rt);
    disk.crash();
    let rt = support::rt::paused();
    let sink = TestSink::new("after");
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(journal(&disk))
            .build()
            .unwrap();
        assert_eq!(o.counters().recovered, 0);
        let _ = o.shutdown(Duration::from_secs(1)).await;
    });
}

/// The item whose datastore is down: every attempt fails at once.
const DOWN: u32 = 30;

/// One life of a datastore outage (tenant 3's writes fail at once and
/// back off for a second; tenant 1's hang): the process dies half a
/// second in, while 30 waits for its retry and 13 is in flight (after
/// the first life: the suspect's, alone). Returns 30's attempts.
fn outage_life(disk: &MemStorage, first: bool) -> usize {
    let rt = support::rt::paused();
    let sink = TestSink::new("outage");
    sink.set(t(1), Act::Hang);
    sink.set(t(3), Act::Fail);
    let config = Config::builder()
        .concurrency(4)
        .initial_backoff(Duration::from_secs(1))
        .max_backoff(Duration::from_secs(1))
        .jitter(0.0)
        .build()
        .unwrap();
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config)
            .journal(journal(disk))
            .build()
            .unwrap();
        if first {
            assert_eq!(o.stage(t(3), DOWN), Staged::Accepted);
            assert_eq!(o.stage(t(1), POISON), Staged::Accepted);
            assert_eq!(o.sync().await, Ok(()));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        std::mem::forget(o);
    });
    die(rt, disk);
    sink.attempts()
        .into_iter()
        .filter(|a| a.items == [DOWN])
        .count()
}

#[test]
fn s_j17_items_waiting_for_their_retry_at_three_crashes_are_not_poisoned() {
    // A pod killed three times while its datastore is down: 30's write
    // failed and waited for its retry at each crash (its attempt's end is
    // on disk), so no crash counts against it; 13 was in flight at each
    // (alone after the first), so each does.
    let disk = MemStorage::new();
    for life in 1..=3 {
        let attempts = outage_life(&disk, life == 1);
        assert!(attempts >= 1, "life {life}: 30 tried {attempts} times");
    }
    let rt = support::rt::paused();
    let sink = TestSink::new("back");
    sink.set_all(Act::Ok);
    let (letters, mut rx) = DeadLetters::channel(8);
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(journal(&disk))
            .dead_letters(letters)
            .build()
            .unwrap();
        let c = o.counters();
        assert_eq!((c.recovered, c.lost(LostReason::Poisoned)), (2, 1), "{c:?}");
        let letter = rx.recv().await.unwrap();
        assert_eq!(
            (letter.tenant, letter.items, letter.reason),
            (t(1), vec![POISON], DeadReason::Poisoned)
        );
        let _ = o.settle(Duration::from_secs(10)).await;
        assert_eq!(sink.stored(t(3)), [DOWN], "written, not poisoned");
        let _ = o.shutdown(Duration::from_secs(10)).await;
    });
}

/// One life in which tenant 1's datastore is down (its writes fail at
/// once and back off for a second) and tenant 2 stages `item`: the
/// process dies half a second in. Returns tenant 2's stored items.
fn suspect_down_life(disk: &MemStorage, item: u32) -> Vec<u32> {
    let rt = support::rt::paused();
    let sink = TestSink::new("suspect down");
    sink.set(t(1), Act::Fail);
    sink.set(t(2), Act::Ok);
    let config = Config::builder()
        .concurrency(4)
        .initial_backoff(Duration::from_secs(1))
        .max_backoff(Duration::from_secs(1))
        .jitter(0.0)
        .build()
        .unwrap();
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config)
            .journal(journal(disk))
            .build()
            .unwrap();
        assert_eq!(o.stage(t(2), item), Staged::Accepted);
        tokio::time::sleep(Duration::from_millis(500)).await;
        std::mem::forget(o);
    });
    die(rt, disk);
    sink.stored(t(2))
}

#[test]
fn s_j17_a_suspect_backing_off_holds_no_one_back_and_its_backoffs_count_no_crash() {
    // 40 is cut once (in flight at the first crash): a suspect, written
    // alone. Then its datastore is down for three lives, each killed while
    // 40 waits for its retry: tenant 2's item of each life is written
    // meanwhile (S-W8), and no crash counts against 40, which is written
    // once the datastore is back.
    let disk = MemStorage::new();
    let rt = support::rt::paused();
    let sink = TestSink::new("first");
    sink.set(t(1), Act::Hang);
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(journal(&disk))
            .build()
            .unwrap();
        assert_eq!(o.stage(t(1), 40), Staged::Accepted);
        assert_eq!(o.sync().await, Ok(()));
        until_attempts(&sink, 1).await;
        std::mem::forget(o);
    });
    die(rt, &disk);
    for item in [51, 52, 53] {
        let stored = suspect_down_life(&disk, item);
        assert_eq!(stored, [item], "written while the suspect backs off");
    }
    let rt = support::rt::paused();
    let sink = TestSink::new("back");
    sink.set_all(Act::Ok);
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(journal(&disk))
            .build()
            .unwrap();
        let c = o.counters();
        assert_eq!((c.recovered, c.lost(LostReason::Poisoned)), (1, 0), "{c:?}");
        let _ = o.settle(Duration::from_secs(10)).await;
        assert_eq!(sink.stored(t(1)), [40]);
        let _ = o.shutdown(Duration::from_secs(10)).await;
    });
}

/// A journal at a small bound: 3 KiB segments, 8 KiB in all (4 KiB ones
/// are above half of what the standing reserves leave, a build error).
fn bounded(disk: &MemStorage) -> JournalConfig {
    journal(disk).segment_bytes(3_072).max_bytes(Some(8_192))
}

/// One life at the small bound that crashes once the poison item's
/// write is in flight (every write hangs). The first stages the poison
/// item and a neighbour on tenant 1, then tenant 2's items until the
/// journal is full; returns the attempts it saw and, in the first life,
/// tenant 2's accepted items.
fn crashing_bounded_life(disk: &MemStorage, first: bool) -> (Vec<(u128, Vec<u32>)>, Vec<u32>) {
    let rt = support::rt::paused();
    let sink = TestSink::new("bounded");
    sink.set_all(Act::Hang);
    let mut accepted = Vec::new();
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(bounded(disk))
            .build()
            .unwrap();
        if first {
            for i in [POISON, 14] {
                assert_eq!(o.stage(t(1), i), Staged::Accepted);
            }
            for i in 100..10_000 {
                match o.stage(t(2), i) {
                    Staged::Accepted => accepted.push(i),
                    Staged::Dropped(DropReason::JournalFull) => break,
                    other => panic!("{other:?}"),
                }
            }
            assert!(accepted.len() > 50, "{}", accepted.len());
            assert_eq!(o.sync().await, Ok(()));
        }
        for _ in 0..2_000 {
            if sink.attempts().iter().any(|a| a.items.contains(&POISON)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        std::mem::forget(o);
    });
    die(rt, disk);
    let seen = attempts_of(&sink);
    (seen, accepted)
}

#[test]
fn s_j17_a_poison_item_in_a_journal_at_a_small_bound_is_dead_lettered_after_three_lives() {
    // S-J10, S-J17 (crash seeds 900143 and five more): the journal is at
    // its bound, so no full attempt record fits; the standing reserve
    // still takes one mark of the write cut in the first life and the
    // lone suspect's marks and life records after, so the poison item
    // is counted each life instead of looping forever.
    let disk = MemStorage::new();
    let (first, neighbours) = crashing_bounded_life(&disk, true);
    assert!(first.iter().any(|(_, items)| items.contains(&POISON)));
    for life in [2, 3] {
        let (seen, _) = crashing_bounded_life(&disk, false);
        assert_eq!(seen, [(1, vec![POISON])], "life {life}: the suspect alone");
    }
    let rt = support::rt::paused();
    let sink = TestSink::new("last");
    sink.set_all(Act::Ok);
    let (letters, mut rx) = DeadLetters::channel(8);
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(bounded(&disk))
            .dead_letters(letters)
            .build()
            .unwrap();
        let c = o.counters();
        assert_eq!(c.lost(LostReason::Poisoned), 1, "{c:?}");
        let letter = rx.recv().await.unwrap();
        assert_eq!(
            (letter.items, letter.reason, letter.attempted),
            (vec![POISON], DeadReason::Poisoned, true)
        );
        let _ = o.settle(Duration::from_secs(10)).await;
        assert_eq!(sink.stored(t(1)), [14]);
        assert_eq!(sink.stored(t(2)), neighbours);
        let _ = o.shutdown(Duration::from_secs(10)).await;
    });
}

/// The healthy item cut beside the poison one in the first life.
const HEALTHY: u32 = 60;

/// A life in which the journal fails (EIO) while the suspect `HEALTHY`'s
/// lone write is in flight, its attempt mark already on disk, and works
/// again only after it is written: the poison suspect behind it waits
/// for the journal, so the commit of its attempt mark carries
/// `HEALTHY`'s done mark, and the crash during it counts against it
/// alone. Returns the attempts seen.
fn journal_down_life(disk: &MemStorage) -> Vec<(u128, Vec<u32>)> {
    let rt = support::rt::paused();
    let sink = TestSink::new("journal down");
    sink.script(t(1), [Act::Hang, Act::Hang]);
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(journal(disk).retry_interval(Duration::from_millis(100)))
            .build()
            .unwrap();
        until_attempts(&sink, 1).await;
        disk.fail(Some(std::io::ErrorKind::Other));
        // A record for the commit to fail on (it goes behind the suspects).
        assert_eq!(o.stage(t(1), 99), Staged::Accepted);
        assert!(o.sync().await.is_err(), "the journal is down");
        // `HEALTHY` is written; its done mark waits for the disk.
        sink.release();
        tokio::time::sleep(Duration::from_millis(20)).await;
        disk.fail(None);
        until_attempts(&sink, 2).await;
        std::mem::forget(o);
    });
    die(rt, disk);
    attempts_of(&sink)
}

#[test]
fn s_j17_a_suspect_written_before_a_journal_outage_is_not_poisoned_by_the_crash_after_it() {
    // Crash seed 920252. Life 1: `HEALTHY` and the poison item in one
    // slice; the process dies. Life 2: `HEALTHY` goes alone and is
    // written, but the journal is down from its write until after the
    // poison item's lone attempt started. Life 3: the poison item alone
    // again. Only the poison item is cut in three lives.
    let disk = MemStorage::new();
    let rt = support::rt::paused();
    let sink = TestSink::new("first");
    sink.set(t(1), Act::Hang);
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(journal(&disk))
            .build()
            .unwrap();
        for i in [HEALTHY, POISON] {
            assert_eq!(o.stage(t(1), i), Staged::Accepted);
        }
        assert_eq!(o.sync().await, Ok(()));
        until_attempts(&sink, 1).await;
        std::mem::forget(o);
    });
    die(rt, &disk);
    let seen = journal_down_life(&disk);
    assert_eq!(seen, [(1, vec![HEALTHY]), (1, vec![POISON])]);
    let seen = crashing_life(&disk, false, 1);
    assert_eq!(
        seen,
        [(1, vec![POISON])],
        "`HEALTHY`'s done mark is on disk"
    );
    let rt = support::rt::paused();
    let sink = TestSink::new("last");
    sink.set_all(Act::Ok);
    let (letters, mut rx) = DeadLetters::channel(8);
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(journal(&disk))
            .dead_letters(letters)
            .build()
            .unwrap();
        let c = o.counters();
        assert_eq!((c.recovered, c.lost(LostReason::Poisoned)), (1, 1), "{c:?}");
        let letter = rx.recv().await.unwrap();
        assert_eq!(
            (letter.items, letter.reason),
            (vec![POISON], DeadReason::Poisoned)
        );
        let _ = o.shutdown(Duration::from_secs(10)).await;
    });
}

#[test]
fn s_j17_another_tenants_write_waits_for_the_journal_while_a_suspects_done_mark_does() {
    // Crash seed 930101. Life 1: `HEALTHY` is cut, a suspect. Life 2: it
    // goes alone and is written, but the journal fails (EIO) before its
    // done mark is on disk; tenant 2's write waits for the journal (not
    // only a suspect's would), so the commit of its attempt mark carries
    // `HEALTHY`'s done mark before the crash during it.
    let disk = MemStorage::new();
    let rt = support::rt::paused();
    let sink = TestSink::new("first");
    sink.set(t(1), Act::Hang);
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(journal(&disk))
            .build()
            .unwrap();
        assert_eq!(o.stage(t(1), HEALTHY), Staged::Accepted);
        assert_eq!(o.sync().await, Ok(()));
        until_attempts(&sink, 1).await;
        std::mem::forget(o);
    });
    die(rt, &disk);
    let rt = support::rt::paused();
    let sink = TestSink::new("journal down");
    sink.set(t(1), Act::Hang);
    sink.set(t(2), Act::Hang);
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(journal(&disk).retry_interval(Duration::from_millis(100)))
            .build()
            .unwrap();
        until_attempts(&sink, 1).await;
        assert_eq!(o.stage(t(2), 70), Staged::Accepted);
        assert_eq!(o.sync().await, Ok(()));
        disk.fail(Some(std::io::ErrorKind::Other));
        assert_eq!(o.stage(t(2), 71), Staged::Accepted);
        assert!(o.sync().await.is_err(), "the journal is down");
        // `HEALTHY` is written; its done mark waits for the disk.
        sink.release();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(sink.attempts().len(), 1, "tenant 2 waits for the journal");
        disk.fail(None);
        until_attempts(&sink, 2).await;
        std::mem::forget(o);
    });
    die(rt, &disk);
    let rt = support::rt::paused();
    let sink = TestSink::new("last");
    sink.set_all(Act::Ok);
    rt.block_on(async {
        let o = Outbox::builder(sink.clone())
            .config(config())
            .journal(journal(&disk))
            .build()
            .unwrap();
        assert_eq!(
            o.counters().recovered,
            1,
            "`HEALTHY`'s done mark is on disk"
        );
        let _ = o.settle(Duration::from_secs(10)).await;
        assert_eq!(sink.stored(t(1)), Vec::<u32>::new());
        assert_eq!(sink.stored(t(2)), [70]);
        let _ = o.shutdown(Duration::from_secs(10)).await;
    });
}
