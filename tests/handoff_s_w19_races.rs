//! Races (a review's attacks) on the chunked intake (S-W19) and on `try_stage`'s
//! weighing before the lock (S-R5, S-B5). No sleeps as synchronisation:
//! threads publish progress through atomics; the only waits are bounded
//! polling loops that assert (a lost wake-up shows as a loop that times
//! out with items still unwritten).
//! Rule ids refer to docs/contract.md.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use outbox::{Config, DropReason, Outbox, StageError, Staged};
use support::*;
use tokio::runtime::Runtime;

/// A runtime driven by a thread of its own (a current-thread one, or a
/// multi-thread one whose `block_on` thread idles), so that the stagers
/// and observers can be other OS threads.
struct Driven {
    rt: Arc<Runtime>,
    stop: tokio::sync::oneshot::Sender<()>,
    driver: std::thread::JoinHandle<Option<()>>,
}

impl Driven {
    fn new(current_thread: bool) -> Driven {
        let rt = Arc::new(if current_thread {
            support::rt::current()
        } else {
            multi_thread()
        });
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let driver = {
            let rt = Arc::clone(&rt);
            std::thread::spawn(move || rt.block_on(async { stop_rx.await.ok() }))
        };
        Driven { rt, stop, driver }
    }

    /// An outbox on `sink` with the default config, built in the runtime.
    fn outbox(&self, sink: &TestSink) -> Outbox<TestSink> {
        let _g = self.rt.enter();
        Outbox::new(sink.clone(), Config::default()).unwrap()
    }

    fn stop(self) {
        self.stop.send(()).unwrap();
        self.driver.join().unwrap();
    }
}

/// Waits (bounded, real time) until the sink holds `total` items, without
/// calling the outbox: nothing but the stages' own wake-ups may move the
/// writer. Panics with what is missing if it never gets there.
fn await_store_without_calls(sink: &TestSink, total: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n: usize = sink.store().values().map(Vec::len).sum();
        if n == total {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: lost wake-up? the sink holds {n} of {total} items and nothing wakes the writer"
        );
        std::thread::yield_now();
    }
}

/// Waits (bounded) until the writer joined the writes of `n` items: the
/// store holds an item once the sink committed it, the counters once the
/// writer took the write's outcome.
fn await_written(o: &Outbox<TestSink>, n: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while o.counters().written < n {
        assert!(Instant::now() < deadline, "{what}: writes never joined");
        std::thread::yield_now();
    }
}

/// Per tenant, the accepted items in staging order: the store must be
/// exactly that (S-A4, I1).
fn assert_store_is(sink: &TestSink, accepted: &[Vec<u32>], tenants: u32, what: &str) {
    let store = sink.store();
    for tn in 0..tenants {
        let want: Vec<u32> = accepted
            .iter()
            .flat_map(|per| per.iter().copied())
            .filter(|i| i % tenants == tn)
            .collect();
        let mut got = store.get(&t(u128::from(tn))).cloned().unwrap_or_default();
        // Each stager's items go to every tenant; within a tenant the order
        // is per stager (two stagers interleave arbitrarily).
        let mut got_by_stager: Vec<Vec<u32>> = vec![Vec::new(); accepted.len()];
        for i in got.drain(..) {
            got_by_stager[(i / 1_000_000) as usize].push(i);
        }
        for (s, per) in accepted.iter().enumerate() {
            let want_s: Vec<u32> = per.iter().copied().filter(|i| i % tenants == tn).collect();
            assert_eq!(
                got_by_stager[s], want_s,
                "{what}: tenant {tn}, stager {s}: order or content differs"
            );
        }
        assert_eq!(
            want.len(),
            got_by_stager.iter().map(Vec::len).sum::<usize>(),
            "{what}"
        );
    }
}

/// Tenants of a round; an item's tenant is `item % TENANTS`.
const TENANTS: u32 = 5;

/// One round: `stagers` OS threads stage bursts while an observer thread
/// hammers control calls that take the hand-offs in by chunks (S-W19);
/// then, with no call at all, the writer must write everything. Returns
/// each stager's accepted items, in staging order.
fn round(o: &Outbox<TestSink>, sink: &TestSink, round: u32, what: &str) -> Vec<Vec<u32>> {
    const STAGERS: u32 = 2;
    let per = 300 + (round * 97) % 900;
    let start: usize = sink.store().values().map(Vec::len).sum();
    let barrier = Arc::new(Barrier::new(STAGERS as usize + 1));
    let done = Arc::new(AtomicBool::new(false));
    let observer = {
        let (o, barrier, done) = (o.clone(), Arc::clone(&barrier), Arc::clone(&done));
        std::thread::spawn(move || {
            barrier.wait();
            let mut k = 0u64;
            while !done.load(Ordering::Acquire) {
                match k % 3 {
                    0 => drop(o.pending()),
                    1 => drop(o.counters()),
                    _ => drop(o.health()),
                }
                k += 1;
            }
        })
    };
    let stagers: Vec<_> = (0..STAGERS)
        .map(|s| {
            let (o, barrier) = (o.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut accepted = Vec::new();
                barrier.wait();
                for i in 0..per {
                    let item = s * 1_000_000 + round * 2_000 + i;
                    let item = item - item % TENANTS + (i % TENANTS);
                    // Keep the tenant = item % TENANTS.
                    match o.stage(t(u128::from(item % TENANTS)), item) {
                        Staged::Accepted => accepted.push(item),
                        other => panic!("unexpected {other:?}"),
                    }
                }
                accepted
            })
        })
        .collect();
    let accepted: Vec<Vec<u32>> = stagers.into_iter().map(|h| h.join().unwrap()).collect();
    done.store(true, Ordering::Release);
    observer.join().unwrap();
    let total: usize = accepted.iter().map(Vec::len).sum();
    await_store_without_calls(sink, start + total, what);
    accepted
}

fn hunt(rt: &Runtime, config: Config, weigher: bool, rounds: u32, what: &str) {
    let sink = TestSink::new(what);
    let o = rt.block_on(async {
        let b = Outbox::builder(sink.clone()).config(config);
        let b = if weigher {
            b.weigher(|i: &u32| u64::from(i % 7) + 1)
        } else {
            b
        };
        b.build().unwrap()
    });
    let mut all: Vec<Vec<u32>> = vec![Vec::new(); 2];
    let mut expect = 0usize;
    for r in 0..rounds {
        let before: usize = sink.store().values().map(Vec::len).sum();
        for (all, accepted) in all.iter_mut().zip(round(&o, &sink, r, what)) {
            all.extend(accepted);
        }
        let after: usize = sink.store().values().map(Vec::len).sum();
        assert!(after > before, "{what}: round {r} wrote nothing");
        expect = after;
    }
    // The store holds an item as soon as the sink committed it; the
    // writer counts it written when it joins the write.
    await_written(&o, expect as u64, what);
    let c = o.counters();
    assert_eq!(c.written as usize, expect, "{what}: {c:?}");
    assert_eq!(c.pending, 0, "{what}: {c:?}");
    assert!(c.balanced(), "{what}: {c:?}");
    assert_store_is(&sink, &all, TENANTS, what);
    let r = rt.block_on(async { o.shutdown(Duration::from_secs(5)).await });
    assert_eq!(r.lost, 0, "{what}");
}

/// S-W19: stages from OS threads race control calls from another thread,
/// whose intakes receive by chunks with the writer's waker; on a
/// multi-thread runtime the writer never misses a wake-up (plain lane).
#[test]
fn no_lost_wakeup_plain_lane_multi_thread() {
    let rt = multi_thread();
    hunt(&rt, Config::default(), false, 60, "plain-mt");
}

/// As above on the full lane (capacity_bytes and a weigher: the weight
/// travels; linger: the stamp travels).
#[test]
fn no_lost_wakeup_full_lane_multi_thread() {
    let rt = multi_thread();
    let config = Config::builder()
        .capacity_bytes(1 << 40)
        .linger(Duration::from_micros(200))
        .build()
        .unwrap();
    hunt(&rt, config, true, 60, "full-mt");
}

/// A current-thread runtime driven by its own thread; the stagers and the
/// observer are other OS threads.
#[test]
fn no_lost_wakeup_current_thread() {
    let rt = Driven::new(true);
    // Build inside the runtime from this thread.
    let sink = TestSink::new("ct");
    let o = rt.outbox(&sink);
    let mut all: Vec<Vec<u32>> = vec![Vec::new(); 2];
    for r in 0..60 {
        for (all, accepted) in all.iter_mut().zip(round(&o, &sink, r, "ct")) {
            all.extend(accepted);
        }
    }
    assert_store_is(&sink, &all, TENANTS, "ct");
    let stored: usize = sink.store().values().map(Vec::len).sum();
    await_written(&o, stored as u64, "ct");
    let c = o.counters();
    assert_eq!(c.pending, 0, "{c:?}");
    assert!(c.balanced());
    let _ = o.abandon();
    rt.stop();
}

/// S-W19 with a spent cooperative budget: an observer task on the runtime
/// spends its budget before each control call (its intake's chunk gets
/// nothing and the fallback receives one by one); stages from OS threads
/// must still all be written with no further call.
#[test]
fn observer_task_with_spent_budget_no_lost_wakeup() {
    let rt = multi_thread();
    let sink = TestSink::new("budget-mt");
    let o = rt.block_on(async { Outbox::new(sink.clone(), Config::default()).unwrap() });
    for r in 0..40u32 {
        let done = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU64::new(0));
        let observer = {
            let (o, done, calls) = (o.clone(), Arc::clone(&done), Arc::clone(&calls));
            rt.spawn(async move {
                loop {
                    if done.load(Ordering::Acquire) && calls.load(Ordering::Relaxed) > 0 {
                        break;
                    }
                    spend_coop_budget().await;
                    let c = o.counters();
                    assert!(c.balanced());
                    calls.fetch_add(1, Ordering::Relaxed);
                    // Yield so the budget refills.
                    tokio::task::yield_now().await;
                }
            })
        };
        let per = 2_000u32;
        let stagers: Vec<_> = (0..2u32)
            .map(|s| {
                let o = o.clone();
                std::thread::spawn(move || {
                    for i in 0..per {
                        let item = s * 1_000_000 + r * 10_000 + i;
                        assert_eq!(o.stage(t(u128::from(i % 3)), item), Staged::Accepted);
                    }
                })
            })
            .collect();
        for h in stagers {
            h.join().unwrap();
        }
        done.store(true, Ordering::Release);
        rt.block_on(observer).unwrap();
        assert!(calls.load(Ordering::Relaxed) > 0);
        await_store_without_calls(&sink, ((r + 1) * 2 * per) as usize, "budget-mt");
    }
    for (tenant, items) in sink.store() {
        for s in 0..2u32 {
            let mine: Vec<u32> = items
                .iter()
                .copied()
                .filter(|i| i / 1_000_000 == s)
                .collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "{tenant:?} {s}");
        }
    }
    let _ = o.abandon();
}

/// The capacity reservations and the engine's `admitted` share stay exact
/// across chunks (full lane, capacity_bytes): a held sink fills the byte
/// capacity with one burst much larger than CHUNK; after it settles, the
/// same capacity is available again, to the byte (no leak, no double
/// count), for several rounds.
#[test]
fn byte_capacity_exact_across_chunks_and_rounds() {
    let rt = multi_thread();
    rt.block_on(async {
        const CAP: u64 = 10_000;
        let sink = TestSink::new("bytes");
        sink.set_all(Act::Hang);
        let o = Outbox::builder(sink.clone())
            .config(Config::builder().capacity_bytes(CAP).build().unwrap())
            .weigher(|i: &u32| u64::from(i % 5) + 1)
            .build()
            .unwrap();
        let mut next = 0u32;
        for round in 0..5 {
            // Fill: 3 of each 5 weights sum to 15 per 5 items (1..=5).
            let mut bytes = 0u64;
            let mut accepted = 0u64;
            loop {
                let w = u64::from(next % 5) + 1;
                match o.stage(t(u128::from(next % 4)), next) {
                    Staged::Accepted => {
                        bytes += w;
                        accepted += 1;
                    }
                    Staged::Dropped(DropReason::BufferFull) => {
                        assert!(bytes + w > CAP, "round {round}: refused at {bytes} + {w}");
                        break;
                    }
                    other => panic!("{other:?}"),
                }
                next += 1;
                // A control call every so often: intakes in chunks of
                // various sizes while the burst is in flight.
                if next % 777 == 0 {
                    let _ = o.pending();
                }
            }
            next += 1;
            assert!(bytes <= CAP);
            assert!(accepted > 256 * 2, "bursts span chunks");
            sink.set_all(Act::Ok);
            sink.release();
            let r = o.settle(Duration::from_secs(10)).await;
            assert_eq!((r.pending, r.lost, r.dropped), (0, 0, 0), "{r:?}");
            assert_eq!(o.pending(), 0);
            sink.set_all(Act::Hang);
        }
        let c = o.counters();
        assert!(c.balanced(), "{c:?}");
        let _ = o.abandon();
    });
}

// ----- try_stage weighs before the lock (S-R5, S-B5) -----------------------

/// A weigher: panics on multiples of 11 (contained: weight 0, clamped to
/// 1), huge on multiples of 13 (clamped to MAX_WEIGHT), else i % 9.
fn tricky_weight(i: &u32) -> u64 {
    if i % 11 == 0 {
        panic!("weigher bomb");
    }
    if i % 13 == 0 {
        return u64::MAX;
    }
    u64::from(i % 9)
}

/// `try_stage` on the locked path (tenant_capacity) decides exactly as
/// `stage` on a twin outbox: the same reason for each refusal, the item
/// handed back, refusals uncounted (S-R5) while `stage` counts them.
#[test]
fn try_stage_decides_as_stage_with_every_capacity() {
    quiet_sink_panics();
    let rt = multi_thread();
    rt.block_on(async {
        for (cap, bytes, tcap) in [
            (Some(50usize), Some(200u64), Some(7usize)),
            (None, Some(60), Some(3)),
            (Some(20), None, Some(2)),
            (None, Some(u64::MAX / 2), Some(5)),
        ] {
            let mk = |name: &str| {
                let sink = TestSink::new(name);
                sink.set_all(Act::Hang);
                let mut c = Config::builder();
                if let Some(cap) = cap {
                    c = c.capacity(cap);
                }
                if let Some(b) = bytes {
                    c = c.capacity_bytes(b);
                }
                if let Some(tc) = tcap {
                    c = c.tenant_capacity(tc);
                }
                let o = Outbox::builder(sink.clone())
                    .config(c.build().unwrap())
                    .weigher(tricky_weight)
                    .build()
                    .unwrap();
                (sink, o)
            };
            let (s1, a) = mk("twin-try");
            let (s2, b) = mk("twin-stage");
            let mut refused = 0u64;
            for i in 1..400u32 {
                let tenant = t(u128::from(i % 6));
                let x = a.try_stage(tenant, i);
                let y = b.stage(tenant, i);
                match (x, y) {
                    (Ok(()), Staged::Accepted) => {}
                    (Err(StageError::Full { reason, item }), Staged::Dropped(r2)) => {
                        assert_eq!(reason, r2, "item {i}");
                        assert_eq!(item, i, "the item is handed back");
                        refused += 1;
                    }
                    (x, y) => panic!(
                        "item {i} ({cap:?} {bytes:?} {tcap:?}): try_stage {x:?} vs stage {y:?}"
                    ),
                }
            }
            assert!(refused > 0, "the capacities were reached");
            let (ca, cb) = (a.counters(), b.counters());
            assert_eq!(ca.pending, cb.pending);
            assert_eq!(ca.staged + refused, cb.staged, "refusals are uncounted");
            assert_eq!(ca.dropped_total(), 0);
            // After a shutdown begins both refuse: try_stage hands back.
            let _ = a.abandon();
            let _ = b.abandon();
            match a.try_stage(t(1), 5) {
                Err(StageError::ShuttingDown(5)) => {}
                other => panic!("{other:?}"),
            }
            assert_eq!(b.stage(t(1), 5), Staged::ShuttingDown);
            drop((s1, s2));
        }
    });
}

/// S-W19, the narrowest window: one stage from one thread while another
/// thread spins on a control call, so the intake often runs between the
/// stage's count and its push (the chunk finds nothing and leaves a waker
/// with the channel; the fallback finds nothing either). That waker must
/// be the writer's: the item is then written with no further call. Each
/// round waits (bounded) for the item without calling the outbox.
#[test]
fn single_stage_racing_a_spinning_intake_is_written() {
    const ROUNDS: u32 = 3_000;
    for current_thread in [false, true] {
        let rt = Driven::new(current_thread);
        let sink = TestSink::new("narrow");
        let o = rt.outbox(&sink);
        let start = Arc::new(Barrier::new(2));
        let staged = Arc::new(AtomicBool::new(false));
        let spinner = {
            let (o, start, staged) = (o.clone(), Arc::clone(&start), Arc::clone(&staged));
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    start.wait();
                    while !staged.load(Ordering::Acquire) {
                        let _ = o.pending();
                    }
                    start.wait();
                }
            })
        };
        for r in 0..ROUNDS {
            staged.store(false, Ordering::Release);
            start.wait();
            assert_eq!(o.stage(t(u128::from(r % 3)), r), Staged::Accepted);
            staged.store(true, Ordering::Release);
            start.wait(); // the spinner made its last call
            await_store_without_calls(&sink, r as usize + 1, "narrow");
        }
        spinner.join().unwrap();
        await_written(&o, u64::from(ROUNDS), "narrow");
        let c = o.counters();
        assert_eq!((c.written, c.pending), (u64::from(ROUNDS), 0));
        let _ = o.abandon();
        rt.stop();
    }
}

/// S-W9, S-W19 on the full lane (weights and stamps travel): stages from
/// two threads race a shutdown. Every stage told `Accepted` is written, in
/// its tenant's order; every later one is `Refused`; nothing accepted is
/// refused after the fact; the byte reservations balance (the debug
/// asserts of the intake check each chunk).
#[test]
fn full_lane_stages_race_a_shutdown_exactly() {
    for round in 0..30u32 {
        let rt = multi_thread();
        let sink = TestSink::new("full-shutdown");
        let o = rt.block_on(async {
            Outbox::builder(sink.clone())
                .config(
                    Config::builder()
                        .capacity_bytes(1 << 40)
                        .linger(Duration::from_micros(100))
                        .build()
                        .unwrap(),
                )
                .weigher(|i: &u32| u64::from(i % 7) + 1)
                .build()
                .unwrap()
        });
        let progress = Arc::new(AtomicU64::new(0));
        let stagers: Vec<_> = (0..2u32)
            .map(|s| {
                let (o, progress) = (o.clone(), Arc::clone(&progress));
                std::thread::spawn(move || {
                    let mut accepted = Vec::new();
                    let mut refused = 0u32;
                    for i in 0..200_000u32 {
                        let item = s * 1_000_000 + i;
                        match o.stage(t(u128::from(i % 4)), item) {
                            Staged::Accepted => {
                                assert_eq!(refused, 0, "accepted after a refusal");
                                accepted.push(item);
                            }
                            Staged::ShuttingDown => {
                                refused += 1;
                                if refused > 100 {
                                    break;
                                }
                            }
                            other => panic!("{other:?}"),
                        }
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                    accepted
                })
            })
            .collect();
        // Shut down once some stages returned (more each round).
        let want = 1_000 + u64::from(round) * 700;
        let deadline = Instant::now() + Duration::from_secs(20);
        while progress.load(Ordering::Relaxed) < want {
            assert!(Instant::now() < deadline);
            std::thread::yield_now();
        }
        let r = rt.block_on(o.shutdown(Duration::from_secs(20)));
        let accepted: Vec<Vec<u32>> = stagers.into_iter().map(|h| h.join().unwrap()).collect();
        let total: u64 = accepted.iter().map(|a| a.len() as u64).sum();
        assert_eq!((r.lost, r.pending), (0, 0), "round {round}: {r:?}");
        let c = o.counters();
        assert_eq!(c.written, total, "round {round}: {c:?}");
        assert!(c.balanced(), "{c:?}");
        let store = sink.store();
        for tn in 0..4u32 {
            let got = store.get(&t(u128::from(tn))).cloned().unwrap_or_default();
            for (s, acc) in accepted.iter().enumerate() {
                let want: Vec<u32> = acc.iter().copied().filter(|i| i % 4 == tn).collect();
                let mine: Vec<u32> = got
                    .iter()
                    .copied()
                    .filter(|i| (i / 1_000_000) as usize == s)
                    .collect();
                assert_eq!(mine, want, "round {round}: tenant {tn} stager {s}");
            }
        }
    }
}

/// As `try_stage_decides_as_stage_with_every_capacity`, with the
/// journal on (the journal's admission comes first, then the engine's;
/// weighing now happens before both): the same decisions, refusals handed
/// back uncounted, and what was accepted is what the journal recovers.
#[cfg(feature = "journal")]
#[test]
fn journaled_try_stage_decides_as_stage() {
    use outbox::journal::{JournalConfig, MemStorage};
    quiet_sink_panics();
    let rt = support::rt::current();
    rt.block_on(async {
        let mk = |name: &str, disk: &MemStorage| {
            let sink = TestSink::new(name);
            sink.set_all(Act::Hang);
            let c = Config::builder()
                .capacity(40)
                .capacity_bytes(150)
                .tenant_capacity(9);
            let o = Outbox::builder(sink.clone())
                .config(c.build().unwrap())
                .weigher(tricky_weight)
                .journal(
                    JournalConfig::with_storage(disk.clone())
                        .sync_interval(Duration::from_millis(1)),
                )
                .build()
                .unwrap();
            (sink, o)
        };
        let (da, db) = (MemStorage::new(), MemStorage::new());
        let (_sa, a) = mk("jtwin-try", &da);
        let (_sb, b) = mk("jtwin-stage", &db);
        let mut refused = 0u64;
        for i in 1..300u32 {
            let tenant = t(u128::from(i % 5));
            match (a.try_stage(tenant, i), b.stage(tenant, i)) {
                (Ok(()), Staged::Accepted) => {}
                (Err(StageError::Full { reason, item }), Staged::Dropped(r2)) => {
                    assert_eq!((reason, item), (r2, i));
                    refused += 1;
                }
                (x, y) => panic!("item {i}: try_stage {x:?} vs stage {y:?}"),
            }
        }
        assert!(refused > 0);
        let (ca, cb) = (a.counters(), b.counters());
        assert_eq!(ca.pending, cb.pending);
        assert_eq!(ca.staged + refused, cb.staged);
        assert_eq!(ca.dropped_total(), 0);
        assert!(ca.balanced() && cb.balanced());
        a.sync().await.unwrap();
        b.sync().await.unwrap();
        let _ = a.abandon();
        let _ = b.abandon();
    });
}

#[test]
fn a_runtime_dropped_under_a_stream_of_stages_stops_the_writer() {
    // A review's attack on the hand-off under a lock: stages from three
    // threads outpace the writer's intake, and the runtime is dropped
    // while they go on. The writer's round takes in at most
    // `WRITER_INTAKE` hand-offs, so it yields to the runtime between
    // rounds and the runtime's shutdown stops it (S-W19); its drop puts
    // the fence up and counts what it held (S-W9, S-W16). An intake of
    // everything queued per round grew with each round here, and the drop
    // never returned.
    let rt = support::rt::multi_thread(2);
    let sink = TestSink::new("dropped");
    let o = {
        let _g = rt.enter();
        Outbox::new(sink.clone(), Config::default()).unwrap()
    };
    let go = Arc::new(AtomicBool::new(true));
    let started = Arc::new(Barrier::new(4));
    // Progress published by the stagers: the outbox itself is not called
    // while they go (any other holder of the engine takes in everything).
    let progress = Arc::new(AtomicU64::new(0));
    let tid = t;
    let stagers: Vec<_> = (0..3u32)
        .map(|t| {
            let (o, go, started) = (o.clone(), Arc::clone(&go), Arc::clone(&started));
            let progress = Arc::clone(&progress);
            std::thread::spawn(move || {
                let (mut accepted, mut refused, mut i) = (0u64, 0u64, 0u32);
                started.wait();
                while go.load(Ordering::Relaxed) {
                    if i % 1024 == 0 {
                        progress.fetch_add(1024, Ordering::Relaxed);
                    }
                    match o.stage(tid(u128::from(t)), i) {
                        Staged::Accepted => accepted += 1,
                        Staged::ShuttingDown => refused += 1,
                        other => panic!("{other:?}"),
                    }
                    i = i.wrapping_add(1);
                }
                (accepted, refused)
            })
        })
        .collect();
    started.wait();
    // Let the stream build up: the writer busy, the queue growing.
    let deadline = Instant::now() + Duration::from_secs(10);
    while progress.load(Ordering::Relaxed) < 30_000 && Instant::now() < deadline {
        std::thread::yield_now();
    }
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let dropper = std::thread::spawn(move || {
        drop(rt);
        let _ = done_tx.send(());
    });
    let dropped = done_rx.recv_timeout(Duration::from_secs(60));
    go.store(false, Ordering::Relaxed);
    assert!(dropped.is_ok(), "the runtime's drop did not return in 60 s");
    dropper.join().unwrap();
    let (accepted, refused) = stagers
        .into_iter()
        .map(|h| h.join().unwrap())
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let c = o.counters();
    assert_eq!(c.staged, accepted + refused);
    assert!(c.balanced(), "{c:?}");
    assert_eq!(o.stage(tid(9), 9), Staged::ShuttingDown, "the fence is up");
}
