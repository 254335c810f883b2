//! Scenarios of docs/scenarios.md replayed through
//! `stage_many` (S-W20), and the journal with runs, as a user would write
//! them from the README alone.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use outbox::{Config, DropReason, LostReason, Outbox, Staged, TenantId};
use support::*;

#[cfg(feature = "journal")]
/// Scenario 12 through a run: capacity 4, max_batch 1, sink blocked; a run
/// of 32 gets 4 accepted then 28 dropped under buffer_full, in order.
#[tokio::test(start_paused = true)]
async fn newcomer_s12_stalled_sink_drops_a_runs_tail() {
    let sink = TestSink::new("nc12");
    sink.set_all(Act::Hang);
    let config = Config::builder().capacity(4).max_batch(1).build().unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    let out = o.stage_many_outcomes((0..32u32).map(|i| (t(1), i)));
    assert_eq!(out.len(), 32);
    assert_eq!(&out[..4], [Staged::Accepted; 4]);
    assert!(out[4..]
        .iter()
        .all(|s| *s == Staged::Dropped(DropReason::BufferFull)));
    let c = o.counters();
    assert_eq!(c.dropped(DropReason::BufferFull), 28);
    assert_eq!(c.pending, 4);
    assert!(c.balanced(), "{c:?}");
    assert!(sink.store().is_empty());
    let r = o.shutdown(100 * MS).await;
    assert_eq!(r.lost, 4);
}

/// Scenario 9 through a run: the fence is up; a run of 3 is refused whole
/// and counted lost, pending unchanged; the hang released, nothing lost.
#[tokio::test(start_paused = true)]
async fn newcomer_s09_fence_refuses_a_run() {
    let sink = TestSink::new("nc09");
    let o = Outbox::new(sink.clone(), Config::default()).unwrap();
    sink.script(t(1), [Act::Hang]);
    assert_eq!(o.stage_many([(t(1), 1)]).accepted, 1);
    sink.until_attempts(t(1), 1).await;
    assert_eq!(o.stage_many([(t(1), 2)]).accepted, 1);
    let shutdown = o.shutdown(Duration::from_secs(10));
    let tally = o.stage_many([(t(1), 3), (t(2), 4), (t(1), 5)]);
    assert_eq!(
        (tally.accepted, tally.dropped, tally.shutting_down),
        (0, 0, 3)
    );
    assert_eq!(o.counters().lost(LostReason::Shutdown), 3);
    assert_eq!(o.pending(), 2);
    sink.release();
    let r = shutdown.await;
    assert_eq!(r.lost, 0);
    assert_eq!(r.written, 2);
    assert_eq!(sink.stored(t(1)), [1, 2]);
    assert!(sink.stored(t(2)).is_empty());
}

/// Scenario 21 through runs: per-tenant capacity; T1 failing fills its
/// own quota; runs for T2..T5 mixed into the same run never see a drop.
#[tokio::test(start_paused = true)]
async fn newcomer_s21_flood_in_a_run_does_not_hurt_the_trickle() {
    let sink = TestSink::new("nc21");
    sink.set(t(1), Act::Fail);
    let config = Config::builder().tenant_capacity(10).build().unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    for round in 0..20u32 {
        let mut run: Vec<(TenantId, u32)> = (0..10).map(|i| (t(1), round * 10 + i)).collect();
        run.push((t(2 + u128::from(round % 4)), 1_000 + round));
        let out = o.stage_many_outcomes(run);
        assert_eq!(*out.last().unwrap(), Staged::Accepted, "round {round}");
        tokio::task::yield_now().await;
    }
    let c = o.counters();
    assert_eq!(c.dropped(DropReason::TenantFull), 190);
    assert_eq!(c.dropped(DropReason::BufferFull), 0);
    let r = o.settle(Duration::from_secs(1)).await;
    assert_eq!(r.pending, 10);
    for n in 2..=5 {
        assert_eq!(sink.stored(t(n)).len(), 5);
        assert!(sink.stored(t(n)).windows(2).all(|w| w[0] < w[1]));
    }
    let _ = o.abandon();
}

/// Scenario 17 / ordering: runs interleaving tenants, with retries; each
/// tenant's store is exactly its staging order.
#[tokio::test(start_paused = true)]
async fn newcomer_s17_runs_keep_each_tenants_order_through_retries() {
    let sink = TestSink::new("nc17");
    sink.script(t(1), [Act::Fail, Act::Fail]);
    sink.script(t(3), [Act::Panic]);
    let config = Config::builder().max_batch(3).build().unwrap();
    let o = Outbox::new(sink.clone(), config).unwrap();
    let mut expected: BTreeMap<TenantId, Vec<u32>> = BTreeMap::new();
    let mut n = 0u32;
    for _ in 0..10 {
        let run: Vec<(TenantId, u32)> = (0..7)
            .map(|_| {
                n += 1;
                (t(u128::from(n % 4)), n)
            })
            .collect();
        for (k, v) in &run {
            expected.entry(*k).or_default().push(*v);
        }
        let tally = o.stage_many(run);
        assert_eq!(tally.accepted, 7);
        // and a plain stage in between
        n += 1;
        assert_eq!(o.stage(t(1), n), Staged::Accepted);
        expected.entry(t(1)).or_default().push(n);
        tokio::time::sleep(10 * MS).await;
    }
    assert_eq!(o.settle(Duration::from_secs(10)).await.pending, 0);
    assert_eq!(sink.store(), expected);
    assert!(o.counters().balanced());
}

#[cfg(feature = "journal")]
mod journaled {
    use super::*;
    use outbox::journal::{JournalConfig, MemStorage};

    fn journal(disk: &MemStorage) -> JournalConfig {
        JournalConfig::with_storage(disk.clone())
    }

    fn build(sink: &TestSink, disk: &MemStorage, config: Config) -> Outbox<TestSink> {
        Outbox::builder(sink.clone())
            .config(config)
            .journal(journal(disk))
            .build()
            .unwrap()
    }

    /// The README's promise with runs: several tenants staged through
    /// `stage_many`, `sync` answered, crash; after the restart every
    /// covered item is written once, per tenant in order, and recovered
    /// is counted (D1, D2, D4).
    #[test]
    fn newcomer_stage_many_sync_crash_recovers_in_order() {
        let disk = MemStorage::new();
        let sink = TestSink::new("nc-crash");
        sink.set_all(Act::Hang);
        let mut covered: BTreeMap<TenantId, Vec<u32>> = BTreeMap::new();
        support::rt::current().block_on(async {
            let o = build(&sink, &disk, Config::default());
            for r in 0..5u32 {
                let run: Vec<(TenantId, u32)> = (0..40)
                    .map(|i| (t(u128::from(i % 6)), r * 100 + i))
                    .collect();
                for (k, v) in &run {
                    covered.entry(*k).or_default().push(*v);
                }
                let tally = o.stage_many(run);
                assert_eq!(
                    (tally.accepted, tally.dropped, tally.shutting_down),
                    (40, 0, 0)
                );
            }
            assert_eq!(o.sync().await, Ok(()));
            // unsynced extra, may be lost
            let _ = o.stage_many((0..10).map(|i| (t(9), 9_000 + i)));
            std::mem::forget(o);
        });
        disk.crash();
        let sink2 = TestSink::new("nc-after");
        support::rt::current().block_on(async {
            let o = build(&sink2, &disk, Config::default());
            let c = o.counters();
            assert!(c.recovered >= 200 && c.recovered <= 210, "{c:?}");
            assert_eq!(c.lost(LostReason::JournalUnreadable), 0);
            let tally = o.stage_many((0..6).map(|i| (t(i), 50_000 + i as u32)));
            assert_eq!(tally.accepted, 6);
            let r = o.flush(Duration::from_secs(5)).await;
            assert_eq!(r.pending, 0);
            let store = sink2.store();
            for (tenant, items) in &covered {
                let got = &store[tenant];
                assert_eq!(&got[..items.len()], &items[..], "{tenant}");
                assert_eq!(got.len(), items.len() + 1, "{tenant}: {got:?}");
            }
            if let Some(extra) = store.get(&t(9)) {
                let want: Vec<u32> = (9_000..9_010).collect();
                assert!(
                    want.starts_with(extra),
                    "D2/D3 for the unsynced run: {extra:?}"
                );
            }
            let c = o.counters();
            assert!(c.balanced(), "{c:?}");
            let r = o.shutdown(Duration::from_secs(5)).await;
            assert_eq!(r.lost, 0);
        });
        // A clean shutdown leaves nothing to recover.
        let sink3 = TestSink::new("nc-third");
        support::rt::current().block_on(async {
            let o = build(&sink3, &disk, Config::default());
            assert_eq!(o.counters().recovered, 0);
            o.shutdown(Duration::from_secs(1)).await;
        });
    }

    /// Runs refused at the fence are never journaled: a crash during the
    /// shutdown brings back the pending items only, never the refused
    /// ones (D3).
    #[test]
    fn newcomer_refused_runs_are_not_recovered_after_a_crash() {
        let disk = MemStorage::new();
        let sink = TestSink::new("nc-fence");
        sink.set_all(Act::Hang);
        support::rt::current().block_on(async {
            let o = build(&sink, &disk, Config::default());
            assert_eq!(o.stage_many((0..4).map(|i| (t(1), i))).accepted, 4);
            assert_eq!(o.sync().await, Ok(()));
            let shutdown = o.shutdown(Duration::from_secs(60));
            let tally = o.stage_many((10..14).map(|i| (t(2), i)));
            assert_eq!(tally.shutting_down, 4);
            // give the journal task time to commit anything it would
            tokio::time::sleep(Duration::from_millis(50)).await;
            std::mem::forget(shutdown);
            std::mem::forget(o);
        });
        disk.crash();
        let sink2 = TestSink::new("nc-fence-after");
        support::rt::current().block_on(async {
            let o = build(&sink2, &disk, Config::default());
            assert_eq!(o.counters().recovered, 4, "{:?}", o.counters());
            assert_eq!(o.flush(Duration::from_secs(5)).await.pending, 0);
            assert_eq!(sink2.stored(t(1)), [0, 1, 2, 3]);
            assert!(sink2.stored(t(2)).is_empty(), "D3: refused items came back");
            o.shutdown(Duration::from_secs(1)).await;
        });
    }

    /// Scenario 24 with the journal: every tenant in backoff; shutdown
    /// returns at its deadline; what it handed back is not recovered next
    /// time (S-J3).
    #[test]
    fn newcomer_s24_shutdown_in_backoff_with_journal() {
        let disk = MemStorage::new();
        let sink = TestSink::new("nc24");
        sink.set_all(Act::Fail);
        support::rt::current().block_on(async {
            let config = Config::builder()
                .initial_backoff(Duration::from_secs(1))
                .max_backoff(Duration::from_secs(60))
                .build()
                .unwrap();
            let o = build(&sink, &disk, config);
            let run: Vec<(TenantId, u32)> = (1..=5u128)
                .flat_map(|k| (0..k as u32).map(move |i| (t(k), i)))
                .collect();
            assert_eq!(o.stage_many(run).accepted, 15);
            sink.until(|s| s.attempts().len() >= 5).await;
            let start = std::time::Instant::now();
            let r = o.shutdown(Duration::from_secs(2)).await;
            let took = start.elapsed();
            assert!(took < Duration::from_millis(2_500), "{took:?}");
            assert_eq!(r.lost, 15);
            let back: usize = r.unwritten.iter().map(|r| r.items.len()).sum();
            assert_eq!(back, 15);
        });
        let sink2 = TestSink::new("nc24-after");
        support::rt::current().block_on(async {
            let o = build(&sink2, &disk, Config::default());
            assert_eq!(o.counters().recovered, 0, "{:?}", o.counters());
            o.shutdown(Duration::from_secs(1)).await;
        });
    }

    /// Capacity with the journal and runs: items a capacity drops are not
    /// journaled; after a crash only accepted ones come back.
    #[test]
    fn newcomer_capacity_drops_in_a_run_are_not_recovered() {
        let disk = MemStorage::new();
        let sink = TestSink::new("nc-cap");
        sink.set_all(Act::Hang);
        support::rt::current().block_on(async {
            let config = Config::builder().capacity(5).build().unwrap();
            let o = build(&sink, &disk, config);
            let out = o.stage_many_outcomes((0..12).map(|i| (t(u128::from(i % 2)), i)));
            let accepted: Vec<u32> = (0..12)
                .zip(&out)
                .filter(|(_, s)| **s == Staged::Accepted)
                .map(|(i, _)| i)
                .collect();
            assert_eq!(accepted, [0, 1, 2, 3, 4]);
            assert_eq!(o.sync().await, Ok(()));
            std::mem::forget(o);
        });
        disk.crash();
        let sink2 = TestSink::new("nc-cap-after");
        support::rt::current().block_on(async {
            let o = build(&sink2, &disk, Config::default());
            assert_eq!(o.counters().recovered, 5);
            assert_eq!(o.flush(Duration::from_secs(5)).await.pending, 0);
            assert_eq!(sink2.stored(t(0)), [0, 2, 4]);
            assert_eq!(sink2.stored(t(1)), [1, 3]);
            o.shutdown(Duration::from_secs(1)).await;
        });
    }
}
