//! S-C10: the engine's intake decides the same whatever the chunking. The
//! same items, fed to two engines one by one and in chunks of drawn sizes
//! (1-512) through `stage_batch`, with the same inputs in between (writes
//! polled and finished, time moved, flushes, settles, a shutdown), give
//! identical writes, events, timeouts, counters and intake summaries.

use std::time::Duration;

use outbox::core::{Config, Engine, Event, Failure, Handoff, Intake, Outcome, Time, Write};
use proptest::prelude::*;

type Eng = Engine<u32, u64>;

/// One input between runs of stages.
#[derive(Clone, Debug)]
enum Step {
    /// `n` items over tenants drawn from `0..tenants`, in `chunks`
    /// (drawn sizes, 1-512) for the chunked engine; `spread_us` apart in
    /// staging time (stamps move the clock inside a chunk).
    Stage {
        n: u16,
        tenants: u32,
        seed: u64,
        chunks: Vec<u16>,
        spread_us: u16,
    },
    Poll,
    Finish {
        pick: u8,
        outcome: u8,
    },
    Advance {
        ms: u16,
    },
    Wait {
        kind: u8,
        deadline_ms: u16,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (
            1..1_500u16,
            prop_oneof![Just(1u32), 1..8u32, 1..600u32],
            any::<u64>(),
            prop::collection::vec(1..=512u16, 1..8),
            prop_oneof![Just(0u16), 0..300u16],
        )
            .prop_map(|(n, tenants, seed, chunks, spread_us)| Step::Stage {
                n,
                tenants,
                seed,
                chunks,
                spread_us
            }),
        3 => Just(Step::Poll),
        4 => (any::<u8>(), 0..6u8).prop_map(|(pick, outcome)| Step::Finish { pick, outcome }),
        2 => (0..50u16).prop_map(|ms| Step::Advance { ms }),
        1 => (0..3u8, 0..100u16).prop_map(|(kind, deadline_ms)| Step::Wait { kind, deadline_ms }),
    ]
}

/// A config drawn over what the intake reads: linger, batch limits,
/// item ages, weights, fan-in.
fn config() -> impl Strategy<Value = (Config, bool, bool)> {
    (
        1..5usize,
        1..5usize,
        prop::option::of(1..20usize),
        prop::option::of(0..5u64),
        prop::option::of(1..30u64),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(conc, slices, max_batch, linger, age, weighs, stamped)| {
            let mut b = Config::builder()
                .concurrency(conc)
                .max_slices_per_write(slices)
                .initial_backoff(Duration::from_millis(2))
                .max_backoff(Duration::from_millis(8))
                .seed(7);
            if let Some(m) = max_batch {
                b = b.max_batch(m);
                if weighs {
                    b = b.max_batch_bytes(m as u64 * 40);
                }
            }
            if let Some(ms) = linger {
                b = b.linger(Duration::from_millis(ms));
            }
            if let Some(ms) = age {
                // An age limit is never below the linger (a config error).
                b = b.max_item_age(Duration::from_millis(ms + linger.unwrap_or(0)));
            }
            (b.build().expect("a valid config"), weighs, stamped)
        })
}

/// One engine under test and what it said.
struct Side {
    engine: Eng,
    in_flight: Vec<Write<u32, u64>>,
    /// Everything observable, in order.
    log: Vec<String>,
}

impl Side {
    fn new(config: &Config, weighs: bool) -> Self {
        let engine = if weighs {
            Engine::with_weigher(config.clone(), Box::new(|i: &u64| i % 97 + 1)).unwrap()
        } else {
            Engine::new(config.clone()).unwrap()
        };
        Side {
            engine,
            in_flight: Vec::new(),
            log: Vec::new(),
        }
    }

    fn intake(&mut self, chunk: Vec<Handoff<u32, u64>>) -> Intake {
        self.engine.stage_batch(chunk)
    }

    /// A full drain, as the driver's loop does.
    fn drain(&mut self, now: Time) {
        while let Some(group) = self.engine.poll_group(now) {
            for w in group {
                self.log
                    .push(format!("write {} {} {:?}", w.id, w.tenant, w.items));
                self.in_flight.push(w);
            }
        }
        while let Some(ev) = self.engine.poll_event() {
            let cancel = matches!(ev, Event::CancelInFlight);
            self.log.push(format!("{ev:?}"));
            if cancel {
                for w in std::mem::take(&mut self.in_flight) {
                    let back = self
                        .engine
                        .finish(now, w, Outcome::Failed(Failure::Cancelled));
                    self.log
                        .push(format!("cancelled {:?}", back.map(|v| v.len())));
                }
            }
        }
        let released = self.engine.take_released();
        self.log.push(format!(
            "timeout {:?} released {} pending {} bytes {} tenants {} counters {:?}",
            self.engine.poll_timeout(),
            released.len(),
            self.engine.pending(),
            self.engine.pending_bytes(),
            self.engine.tenants(),
            self.engine.counters()
        ));
    }
}

/// The items of one run of stages: (tenant, item, stamp offset in µs).
fn items(n: u16, tenants: u32, seed: u64, spread_us: u16, next: &mut u64) -> Vec<(u32, u64, u64)> {
    let mut x = seed | 1;
    (0..u64::from(n))
        .map(|k| {
            // xorshift: a reproducible spread of tenants.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *next += 1;
            (
                (x % u64::from(tenants)) as u32,
                *next,
                k * u64::from(spread_us),
            )
        })
        .collect()
}

fn handoff(
    (tenant, item, offset): (u32, u64, u64),
    now: Time,
    weighs: bool,
    stamped: bool,
) -> Handoff<u32, u64> {
    Handoff {
        tenant,
        item,
        // The request path weighed it (as with `capacity_bytes`), or the
        // engine does at intake.
        weight: (weighs && item % 2 == 0).then_some(item % 97 + 1),
        at: stamped.then(|| now + Duration::from_micros(offset)),
        refusal: None,
    }
}

fn outcome(o: u8) -> Outcome {
    match o {
        0 | 1 => Outcome::Written { discarded: 0 },
        2 => Outcome::Failed(Failure::Error),
        3 => Outcome::Failed(Failure::Rejected),
        4 => Outcome::Failed(Failure::Timeout),
        _ => Outcome::Written { discarded: 1 },
    }
}

/// Runs `steps` on both engines; returns their logs.
fn run(config: &Config, weighs: bool, stamped: bool, steps: &[Step]) -> (Vec<String>, Vec<String>) {
    let mut one = Side::new(config, weighs);
    let mut chunked = Side::new(config, weighs);
    let mut now = Time::ZERO;
    let mut next = 0u64;
    for step in steps {
        match step {
            Step::Stage {
                n,
                tenants,
                seed,
                chunks,
                spread_us,
            } => {
                let run = items(*n, *tenants, *seed, *spread_us, &mut next);
                let last = run.last().map_or(0, |r| r.2);
                let mut single = Intake::default();
                for &it in &run {
                    let got = one.intake(vec![handoff(it, now, weighs, stamped)]);
                    single = add(single, got);
                }
                let mut whole = Intake::default();
                let mut rest = run.as_slice();
                for size in chunks.iter().cycle() {
                    if rest.is_empty() {
                        break;
                    }
                    let (chunk, tail) = rest.split_at(usize::from(*size).min(rest.len()));
                    rest = tail;
                    let chunk = chunk
                        .iter()
                        .map(|&it| handoff(it, now, weighs, stamped))
                        .collect();
                    whole = add(whole, chunked.intake(chunk));
                }
                one.log.push(format!("intake {single:?}"));
                chunked.log.push(format!("intake {whole:?}"));
                if stamped {
                    now = now + Duration::from_micros(last);
                }
            }
            Step::Poll => {}
            Step::Finish { pick, outcome: o } => {
                for side in [&mut one, &mut chunked] {
                    if side.in_flight.is_empty() {
                        continue;
                    }
                    let w = side
                        .in_flight
                        .remove(usize::from(*pick) % side.in_flight.len());
                    let back = side.engine.finish(now, w, outcome(*o));
                    side.log
                        .push(format!("finished {:?}", back.map(|v| v.len())));
                }
            }
            Step::Advance { ms } => {
                now = now + Duration::from_millis(u64::from(*ms));
                one.engine.handle_timeout(now);
                chunked.engine.handle_timeout(now);
            }
            Step::Wait { kind, deadline_ms } => {
                let deadline = now + Duration::from_millis(u64::from(*deadline_ms));
                for side in [&mut one, &mut chunked] {
                    let id = match kind {
                        0 => side.engine.flush(now, deadline),
                        1 => side.engine.settle(now, deadline),
                        _ => side.engine.shutdown(now, deadline),
                    };
                    side.log.push(format!("wait {id:?}"));
                }
            }
        }
        one.drain(now);
        chunked.drain(now);
    }
    (one.log, chunked.log)
}

/// Two intake summaries of consecutive chunks, as one.
fn add(a: Intake, b: Intake) -> Intake {
    Intake {
        accepted: a.accepted + b.accepted,
        accepted_bytes: a.accepted_bytes.saturating_add(b.accepted_bytes),
        refused: a.refused + b.refused,
        refused_bytes: a.refused_bytes.saturating_add(b.refused_bytes),
        counted: a.counted + b.counted,
        wake: a.wake | b.wake,
        log: a.log | b.log,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// S-C10: one by one and in drawn chunks, the same event streams.
    #[test]
    fn s_c10_chunks_decide_as_one_by_one(
        (config, weighs, stamped) in config(),
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let (one, chunked) = run(&config, weighs, stamped, &steps);
        prop_assert_eq!(one.len(), chunked.len());
        for (k, (a, b)) in one.iter().zip(&chunked).enumerate() {
            prop_assert_eq!(a, b, "first difference at line {}", k);
        }
    }
}

/// S-C10 at the scale the drain bench runs: 100,000 items over 20,000
/// tenants, in the hand-off's chunks of 256, against one by one.
#[test]
fn s_c10_many_tenants_in_chunks_of_256() {
    let config = Config::builder().concurrency(4).build().unwrap();
    let steps: Vec<Step> = (0..10)
        .flat_map(|k| {
            [
                Step::Stage {
                    n: 10_000,
                    tenants: 20_000,
                    seed: k,
                    chunks: vec![256],
                    spread_us: 0,
                },
                Step::Finish {
                    pick: 0,
                    outcome: 0,
                },
                Step::Finish {
                    pick: 1,
                    outcome: 2,
                },
            ]
        })
        .collect();
    let (one, chunked) = run(&config, false, false, &steps);
    assert_eq!(one, chunked);
}
