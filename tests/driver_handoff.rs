//! The request path's hand-off (S-W19): many OS threads stage at once
//! while flushes and a shutdown race them, on a multi-thread runtime; every
//! stage's answer is exact and counted, each tenant keeps its staging
//! order, and a flush or shutdown covers every stage that returned before
//! it. No sleeps: the threads publish their progress through atomics.
//! Rule ids refer to docs/contract.md.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox::{Config, DropReason, LostReason, Outbox, Staged};
use support::*;

const THREADS: u32 = 4;

/// What one staging thread saw: per tenant (its own, then the shared one)
/// the items accepted in order, and its dropped and refused counts.
#[derive(Default)]
struct Seen {
    own: Vec<u32>,
    shared: Vec<u32>,
    dropped: u64,
    refused: u64,
}

/// Thread `th` stages `per` items into its own tenant and the shared
/// tenant 0, alternately, until `stop`; `progress` is how many of its
/// stages returned (published after each return).
fn stager(
    o: Outbox<TestSink>,
    th: u32,
    per: u32,
    progress: Arc<AtomicU32>,
    stop: Arc<AtomicBool>,
) -> Seen {
    let mut seen = Seen::default();
    for i in 0..per {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let item = th * per + i;
        let (tenant, list) = if i % 2 == 0 {
            (t(u128::from(th) + 1), &mut seen.own)
        } else {
            (t(0), &mut seen.shared)
        };
        match o.stage(tenant, item) {
            Staged::Accepted => list.push(item),
            Staged::Dropped(DropReason::BufferFull) => seen.dropped += 1,
            Staged::ShuttingDown => seen.refused += 1,
            other => panic!("unexpected {other:?}"),
        }
        progress.store(i + 1, Ordering::Release);
    }
    seen
}

/// Each thread's stages (of `per`) that returned before `before` (its
/// progress then) are in the store, in its staging order, at the head of
/// its tenant.
fn assert_written_before(sink: &TestSink, before: &[u32], per: u32) {
    let store = sink.store();
    for th in 0..THREADS {
        let (own, _) = accepted_prefix(before[th as usize], th, per);
        let stored = store
            .get(&t(u128::from(th) + 1))
            .cloned()
            .unwrap_or_default();
        assert!(stored.len() >= own.len());
        assert_eq!(stored[..own.len()], own[..]);
    }
}

/// The accepted items of `th` so far, per its tenants: the prefix of its
/// stages that `returned` counts (before the call that reads it).
fn accepted_prefix(seen_upto: u32, th: u32, per: u32) -> (Vec<u32>, Vec<u32>) {
    let mut own = Vec::new();
    let mut shared = Vec::new();
    for i in 0..seen_upto {
        if i % 2 == 0 {
            own.push(th * per + i);
        } else {
            shared.push(th * per + i);
        }
    }
    (own, shared)
}

/// S-W19, S-A4, S-W9, S-W14, I1: stages from 4 threads race flushes and
/// then a shutdown. Each flush covers every stage that returned before it
/// (the sink commits everything, so all are written when it answers);
/// the shutdown covers every accepted item and refuses every later stage.
#[test]
fn stages_from_many_threads_race_flushes_and_a_shutdown_exactly() {
    const PER: u32 = 40_000;
    let rt = multi_thread();
    let sink = TestSink::new("handoff");
    let o = rt.block_on(async { Outbox::new(sink.clone(), Config::default()).unwrap() });
    let progress: Vec<_> = (0..THREADS).map(|_| Arc::new(AtomicU32::new(0))).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..THREADS)
        .map(|th| {
            let (o, p, stop) = (o.clone(), Arc::clone(&progress[th as usize]), stop.clone());
            std::thread::spawn(move || stager(o, th, PER, p, stop))
        })
        .collect();

    rt.block_on(async {
        for _ in 0..20 {
            let before: Vec<u32> = progress.iter().map(|p| p.load(Ordering::Acquire)).collect();
            let r = o.flush(Duration::from_secs(60)).await;
            assert_eq!(r.pending, 0, "{r:?}");
            // Unbounded and open: every stage before the flush was
            // accepted, and is written (in order) when it answers.
            assert_written_before(&sink, &before, PER);
            tokio::task::yield_now().await;
        }
        let before: Vec<u32> = progress.iter().map(|p| p.load(Ordering::Acquire)).collect();
        let report = o.shutdown(Duration::from_secs(60)).await;
        assert!(report.unwritten.is_empty());
        assert_written_before(&sink, &before, PER);
    });
    stop.store(true, Ordering::Release);
    let seen: Vec<Seen> = handles.into_iter().map(|h| h.join().unwrap()).collect();

    let c = o.counters();
    let calls: u64 = progress
        .iter()
        .map(|p| u64::from(p.load(Ordering::Acquire)))
        .sum();
    let accepted: u64 = seen
        .iter()
        .map(|s| (s.own.len() + s.shared.len()) as u64)
        .sum();
    let refused: u64 = seen.iter().map(|s| s.refused).sum();
    assert_eq!(c.staged, calls);
    assert_eq!(c.written, accepted);
    assert_eq!(c.lost(LostReason::Shutdown), refused);
    assert_eq!(c.pending, 0);
    assert!(c.balanced(), "{c:?}");
    // I1: exactly the accepted items, each tenant in staging order.
    let store = sink.store();
    for (th, s) in seen.iter().enumerate() {
        let own = store.get(&t(th as u128 + 1)).cloned().unwrap_or_default();
        assert_eq!(own, s.own);
        let shared: Vec<u32> = store
            .get(&t(0))
            .into_iter()
            .flatten()
            .copied()
            .filter(|i| i / PER == th as u32)
            .collect();
        assert_eq!(shared, s.shared);
    }
    // After the fence nothing more is accepted.
    assert_eq!(o.stage(t(1), u32::MAX), Staged::ShuttingDown);
}

/// S-A1, S-W19: with a capacity and a sink that holds every write, threads
/// racing for the last slots get exactly `capacity` of them; every other
/// stage is dropped under `buffer_full` and counted, and once the writes
/// commit the room comes back.
#[test]
fn the_capacity_reservation_is_exact_under_contention() {
    const CAP: usize = 1_000;
    const PER: u32 = 5_000;
    let rt = multi_thread();
    let sink = TestSink::new("handoff-cap");
    sink.set_all(Act::Hang);
    let o = rt.block_on(async {
        let config = Config::builder().capacity(CAP).build().unwrap();
        Outbox::new(sink.clone(), config).unwrap()
    });
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..THREADS)
        .map(|th| {
            let (o, stop) = (o.clone(), stop.clone());
            let p = Arc::new(AtomicU32::new(0));
            std::thread::spawn(move || stager(o, th, PER, p, stop))
        })
        .collect();
    let seen: Vec<Seen> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let accepted: usize = seen.iter().map(|s| s.own.len() + s.shared.len()).sum();
    let dropped: u64 = seen.iter().map(|s| s.dropped).sum();
    assert_eq!(accepted, CAP);
    let c = o.counters();
    assert_eq!(c.staged, u64::from(THREADS * PER));
    assert_eq!(c.pending, CAP as u64);
    assert_eq!(c.dropped(DropReason::BufferFull), dropped);
    assert!(c.balanced(), "{c:?}");

    sink.set_all(Act::Ok);
    sink.release();
    rt.block_on(async {
        let r = o.settle(Duration::from_secs(60)).await;
        assert_eq!(r.pending, 0);
        // The room is back: the reservations of the settled items were
        // given back (the writes hang again, so none frees room early).
        sink.set_all(Act::Hang);
        for i in 0..CAP as u32 {
            assert_eq!(o.stage(t(9), i), Staged::Accepted);
        }
        assert_eq!(o.stage(t(9), 0), Staged::Dropped(DropReason::BufferFull));
        sink.set_all(Act::Ok);
        sink.release();
        let _ = o.shutdown(Duration::from_secs(60)).await;
    });
    let c = o.counters();
    assert!(c.balanced(), "{c:?}");
    assert_eq!(c.written, 2 * CAP as u64);
}

/// S-W19: a counter read takes in every stage that returned before it,
/// even from a task whose cooperative budget is spent (tokio then refuses
/// to receive from a channel by polling it; the intake receives in chunks
/// by polling, so it must fall back to receiving one by one).
#[test]
fn a_counter_read_from_a_task_with_its_budget_spent_takes_in_every_stage() {
    let rt = support::rt::current();
    rt.block_on(async {
        let o = Outbox::new(TestSink::new("budget"), Config::default()).unwrap();
        spend_coop_budget().await;
        for i in 0..10 {
            assert_eq!(o.stage(t(u128::from(i % 3)), i), Staged::Accepted);
        }
        let c = o.counters();
        assert_eq!((c.staged, c.pending), (10, 10), "every stage taken in");
        assert!(c.balanced());
        let _ = o.abandon();
    });
}
