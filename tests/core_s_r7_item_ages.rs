//! S-R7: with a `max_item_age`, every pending item yields one age sample as
//! it settles, by outcome, exact (its staging time to the settle), a
//! durable item's given age included; items refused at the stage yield
//! none; without a `max_item_age` nothing is sampled.

use std::time::Duration;

use outbox::core::{
    Config, DropReason, Durable, Engine, ErrorPolicy, Failure, ItemAge, ItemOutcome, LostReason,
    Outcome, Time,
};

fn secs(s: u64) -> Time {
    Time::from_millis(s * 1_000)
}

fn engine(config: outbox::core::ConfigBuilder) -> Engine<u32, u32> {
    Engine::new(config.linger(Duration::ZERO).build().unwrap()).unwrap()
}

fn aged() -> outbox::core::ConfigBuilder {
    Config::builder().max_item_age(Duration::from_secs(60))
}

fn ages(e: &mut Engine<u32, u32>) -> Vec<(ItemOutcome, u64)> {
    e.drain_item_ages()
        .map(|ItemAge { outcome, age }| (outcome, age.as_secs()))
        .collect()
}

#[test]
fn written_items_are_sampled_from_their_own_staging_time() {
    let mut e = engine(aged().max_batch(10));
    let _ = e.stage(secs(0), 1, 10);
    let _ = e.stage(secs(1), 1, 11);
    let w = e.poll_write(secs(2)).unwrap();
    assert_eq!(w.items, [10, 11]);
    e.finish(secs(5), w, Outcome::WRITTEN).unwrap();
    assert_eq!(
        ages(&mut e),
        [(ItemOutcome::Written, 5), (ItemOutcome::Written, 4)]
    );
    // Drained: nothing twice.
    assert!(ages(&mut e).is_empty());
}

#[test]
fn a_retried_slice_is_aged_when_it_finally_settles_and_discards_are_lost() {
    let mut e = engine(aged().max_batch(10));
    let _ = e.stage(secs(0), 1, 10);
    let _ = e.stage(secs(0), 1, 11);
    let w = e.poll_write(secs(0)).unwrap();
    e.finish(secs(1), w, Outcome::Failed(Failure::Error))
        .unwrap();
    assert!(ages(&mut e).is_empty(), "a retried slice has not settled");
    e.handle_timeout(secs(30));
    let w = e.poll_write(secs(30)).expect("the retry");
    e.finish(secs(31), w, Outcome::Written { discarded: 1 })
        .unwrap();
    assert_eq!(
        ages(&mut e),
        [
            (ItemOutcome::Written, 31),
            (ItemOutcome::Lost(LostReason::Discarded), 31)
        ]
    );
}

#[test]
fn given_up_items_are_sampled_under_their_reason() {
    // Rejected terminally.
    let mut e = engine(aged());
    let _ = e.stage(secs(0), 1, 10);
    let w = e.poll_write(secs(2)).unwrap();
    e.finish(secs(3), w, Outcome::Failed(Failure::Rejected))
        .unwrap();
    assert_eq!(ages(&mut e), [(ItemOutcome::Lost(LostReason::Terminal), 3)]);

    // Dropped under the `drop` error policy.
    let mut e = engine(aged().error_policy(ErrorPolicy::Drop));
    let _ = e.stage(secs(0), 1, 10);
    let w = e.poll_write(secs(0)).unwrap();
    e.finish(secs(4), w, Outcome::Failed(Failure::Error))
        .unwrap();
    assert_eq!(
        ages(&mut e),
        [(ItemOutcome::Dropped(DropReason::SinkError), 4)]
    );

    // Expired by the age timer while a retry backs off (S-R3).
    let mut e = engine(aged().max_attempts(100));
    let _ = e.stage(secs(0), 1, 10);
    let w = e.poll_write(secs(0)).unwrap();
    e.finish(secs(1), w, Outcome::Failed(Failure::Error))
        .unwrap();
    e.handle_timeout(secs(61));
    let got = ages(&mut e);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, ItemOutcome::Lost(LostReason::Expired));
    assert!(got[0].1 >= 60, "{got:?}");

    // Lost with the write's task (S-W13), and under a stale epoch with no
    // outbox table to hand the items to (S-E7): each under its own name.
    for (failure, reason) in [
        (Failure::TaskLost, LostReason::JoinFailed),
        (Failure::StaleEpoch, LostReason::StaleEpoch),
    ] {
        let mut e = engine(aged());
        let _ = e.stage(secs(0), 1, 10);
        let w = e.poll_write(secs(0)).unwrap();
        e.finish(secs(6), w, Outcome::Failed(failure)).unwrap();
        assert_eq!(
            ages(&mut e),
            [(ItemOutcome::Lost(reason), 6)],
            "{failure:?}"
        );
    }

    // Handed over after a stale epoch: the write's and the waiting ones.
    let mut e = engine(aged().max_batch(1)).with_outbox_table();
    let _ = e.stage(secs(0), 1, 10);
    let w = e.poll_write(secs(0)).unwrap();
    let _ = e.stage(secs(2), 1, 11);
    e.finish(secs(7), w, Outcome::Failed(Failure::StaleEpoch))
        .unwrap();
    assert_eq!(
        ages(&mut e),
        [(ItemOutcome::HandedOver, 7), (ItemOutcome::HandedOver, 5)]
    );
}

#[test]
fn a_shutdown_deadline_samples_the_in_flight_and_the_waiting_items() {
    let mut e = engine(aged().max_batch(1));
    let _ = e.stage(secs(0), 1, 10);
    let _ = e.stage(secs(1), 1, 11);
    let w = e.poll_write(secs(1)).unwrap();
    let _ = e.shutdown(secs(2), secs(4));
    e.handle_timeout(secs(4));
    let got = ages(&mut e);
    assert_eq!(
        got,
        [
            (ItemOutcome::Lost(LostReason::Deadline), 4),
            (ItemOutcome::Lost(LostReason::Deadline), 3)
        ],
    );
    // The given-up write coming back settles nothing again.
    e.finish(secs(5), w, Outcome::Failed(Failure::Cancelled))
        .unwrap();
    assert!(ages(&mut e).is_empty());
}

#[test]
fn a_durable_items_age_counts_and_refusals_yield_none() {
    let mut e = engine(aged().capacity(1));
    let durable = Durable {
        tenant: 1,
        item: 10,
        age: Duration::from_secs(20),
        key: None,
    };
    let _ = e.stage_durable(secs(100), [durable], 0);
    // Refused at the stage (the capacity holds one): never pending.
    let _ = e.stage(secs(100), 2, 20);
    let w = e.poll_write(secs(100)).unwrap();
    e.finish(secs(101), w, Outcome::WRITTEN).unwrap();
    assert_eq!(ages(&mut e), [(ItemOutcome::Written, 21)]);
    assert_eq!(e.counters().dropped_total(), 1);
}

#[test]
fn without_a_max_item_age_nothing_is_sampled() {
    let mut e = engine(Config::builder());
    let _ = e.stage(secs(0), 1, 10);
    let w = e.poll_write(secs(0)).unwrap();
    e.finish(secs(3), w, Outcome::WRITTEN).unwrap();
    assert_eq!(e.counters().written, 1);
    assert!(ages(&mut e).is_empty());
}
