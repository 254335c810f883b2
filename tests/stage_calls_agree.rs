//! S-W21, the one staging pipeline: every user call gives the outcome
//! `stage` gives, or hands back exactly the item `stage` would have
//! refused, uncounted (S-R5). Checked as a property over outboxes with
//! and without `capacity`, `capacity_bytes`, `tenant_capacity`, a linger,
//! a journal (with room, full for large items, refusing some items, or on
//! a disk that is down), before and after the shutdown's fence.
//!
//! Each call runs on its own outbox, built and filled the same way on
//! tokio's paused clock, whose sink hangs every write: nothing settles,
//! so the state the probe meets is the same for every call. The outcome
//! `stage` gives is the reference; `try_stage` and `stage_wait` must hand
//! back the item with the error that names the same refusal (a
//! `stage_wait` whose timeout is zero answers `TimedOut` for a full
//! capacity or journal), and leave the counters as if the probe had never
//! been staged; `stage_many` and `stage_many_outcomes` of the probe alone
//! must count what `stage` counts.
//! Rule ids refer to docs/contract.md.
#![cfg(all(feature = "journal", feature = "testkit"))]

mod support;

use std::time::Duration;

use outbox::journal::{JournalConfig, MemStorage};
use outbox::{Config, Counters, DropReason, LostReason, Outbox, StageError, Staged, StagedMany};
use proptest::prelude::*;
use support::codec::Picky;
use support::{t, Act, TestSink};

/// How the outbox journals.
#[derive(Clone, Copy, Debug)]
enum Journal {
    Off,
    /// Room for small items; items above 100 are padded past the buffer
    /// (full for them), items divisible by 13 cannot be encoded.
    On,
    /// As `On`, on a disk that fails every operation (S-J5).
    DiskDown,
}

#[derive(Clone, Debug)]
struct Case {
    capacity: Option<usize>,
    capacity_bytes: Option<u64>,
    tenant_capacity: Option<usize>,
    linger: bool,
    journal: Journal,
    /// Staged with `stage` before the probe: (tenant, item).
    before: Vec<(u8, u32)>,
    /// A shutdown began before the probe.
    fenced: bool,
    probe: (u8, u32),
}

/// The five calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Stage,
    TryStage,
    StageWait,
    StageMany,
    StageManyOutcomes,
}

/// What a call did with the probe: the `Staged` it answered, or the error
/// it handed back with the item.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Staged(Staged),
    Back(StageError<u32>),
    Tally(StagedMany),
}

fn case() -> impl Strategy<Value = Case> {
    let item = prop_oneof![1u32..40, 100u32..140];
    (
        (
            prop::option::of(1usize..6),
            prop::option::of(4u64..24),
            prop::option::of(1usize..4),
            any::<bool>(),
            prop_oneof![
                Just(Journal::Off),
                Just(Journal::On),
                Just(Journal::DiskDown)
            ],
        ),
        prop::collection::vec((0u8..3, item.clone()), 0..8),
        any::<bool>(),
        (0u8..3, item),
    )
        .prop_map(
            |(
                (capacity, capacity_bytes, tenant_capacity, linger, journal),
                before,
                fenced,
                probe,
            )| {
                Case {
                    capacity,
                    capacity_bytes,
                    tenant_capacity,
                    linger,
                    journal,
                    before,
                    fenced,
                    probe,
                }
            },
        )
}

fn build(case: &Case, sink: &TestSink) -> Outbox<TestSink> {
    let mut config = Config::builder();
    if let Some(n) = case.capacity {
        config = config.capacity(n);
    }
    if let Some(bytes) = case.capacity_bytes {
        config = config.capacity_bytes(bytes);
    }
    if let Some(n) = case.tenant_capacity {
        config = config.tenant_capacity(n);
    }
    if case.linger {
        config = config.linger(Duration::from_secs(60));
    }
    let builder = Outbox::builder(sink.clone())
        .config(config.build().unwrap())
        .weigher(|i: &u32| u64::from(i % 5 + 1));
    let storage = MemStorage::new();
    let journal = JournalConfig::with_storage(storage.clone())
        .sync_bytes(64)
        .max_buffered_bytes(128)
        .inline_io(true);
    let codec = Picky {
        refuse: |i| i % 13 == 0,
        panic: |_| false,
        pad: |i| if i > 100 { 200 } else { 0 },
    };
    match case.journal {
        Journal::Off => builder.build().unwrap(),
        Journal::On | Journal::DiskDown => {
            let outbox = builder.journal_with_codec(journal, codec).build().unwrap();
            if matches!(case.journal, Journal::DiskDown) {
                storage.fail(Some(std::io::ErrorKind::Other));
            }
            outbox
        }
    }
}

/// Staged, pending, dropped by reason, lost by reason.
type Tally = (u64, u64, Vec<u64>, Vec<u64>);

/// The counters a probe's outcome moves (attempts are left out: a
/// `stage_wait` yields, and the writer may start a hanging write then).
fn tally(c: &Counters) -> Tally {
    (
        c.staged,
        c.pending,
        DropReason::ALL.iter().map(|&r| c.dropped(r)).collect(),
        LostReason::ALL.iter().map(|&r| c.lost(r)).collect(),
    )
}

/// Builds the case's outbox, stages what comes before the probe, then
/// the probe with `call` (none: the probe is not staged at all).
fn run(case: &Case, call: Option<Call>) -> (Option<Answer>, Tally) {
    support::rt::paused().block_on(async {
        let sink = TestSink::new("stage_calls_agree");
        sink.set_all(Act::Hang);
        let outbox = build(case, &sink);
        for &(tenant, item) in &case.before {
            let _ = outbox.stage(t(u128::from(tenant)), item);
        }
        if case.fenced {
            drop(outbox.shutdown(Duration::from_secs(60)));
        }
        let (tenant, item) = (t(u128::from(case.probe.0)), case.probe.1);
        let answer = match call {
            None => None,
            Some(Call::Stage) => Some(Answer::Staged(outbox.stage(tenant, item))),
            Some(Call::TryStage) => Some(match outbox.try_stage(tenant, item) {
                Ok(()) => Answer::Staged(Staged::Accepted),
                Err(e) => Answer::Back(e),
            }),
            // Zero timeout: the first try decides, or it times out.
            Some(Call::StageWait) => Some(
                match outbox.stage_wait(tenant, item, Duration::ZERO).await {
                    Ok(()) => Answer::Staged(Staged::Accepted),
                    Err(e) => Answer::Back(e),
                },
            ),
            Some(Call::StageMany) => Some(Answer::Tally(outbox.stage_many([(tenant, item)]))),
            Some(Call::StageManyOutcomes) => {
                let outcomes = outbox.stage_many_outcomes([(tenant, item)]);
                assert_eq!(outcomes.len(), 1);
                Some(Answer::Staged(outcomes[0]))
            }
        };
        let counters = tally(&outbox.counters());
        sink.release();
        (answer, counters)
    })
}

/// The error `try_stage` must hand back where `stage` answered `staged`.
fn handed_back(staged: Staged, item: u32) -> Option<StageError<u32>> {
    match staged {
        Staged::Accepted => None,
        Staged::ShuttingDown => Some(StageError::ShuttingDown(item)),
        Staged::Dropped(DropReason::EncodeFailed) => Some(StageError::EncodeFailed(item)),
        Staged::Dropped(reason) => Some(StageError::Full { reason, item }),
        other => panic!("an outcome this test does not know: {other:?}"),
    }
}

fn check(case: &Case) -> Result<(), TestCaseError> {
    let (stage, counted) = run(case, Some(Call::Stage));
    let Some(Answer::Staged(staged)) = stage else {
        unreachable!("stage answers a Staged");
    };
    let (_, uncounted) = run(case, None);
    let item = case.probe.1;
    let mut tally = StagedMany::default();
    match staged {
        Staged::Accepted => tally.accepted = 1,
        Staged::Dropped(_) => tally.dropped = 1,
        Staged::ShuttingDown => tally.shutting_down = 1,
        other => panic!("an outcome this test does not know: {other:?}"),
    }
    let expected = [Answer::Tally(tally), Answer::Staged(staged)];
    for (call, expected) in [Call::StageMany, Call::StageManyOutcomes]
        .into_iter()
        .zip(expected)
    {
        let (answer, counters) = run(case, Some(call));
        prop_assert_eq!(answer, Some(expected), "{:?}", call);
        prop_assert_eq!(&counters, &counted, "{:?}: counters", call);
    }
    let (answer, counters) = run(case, Some(Call::TryStage));
    match handed_back(staged, item) {
        None => {
            prop_assert_eq!(answer, Some(Answer::Staged(Staged::Accepted)));
            prop_assert_eq!(&counters, &counted);
        }
        Some(back) => {
            prop_assert_eq!(answer, Some(Answer::Back(back)), "try_stage");
            prop_assert_eq!(&counters, &uncounted, "try_stage counts nothing");
        }
    }
    let (answer, counters) = run(case, Some(Call::StageWait));
    match handed_back(staged, item) {
        None => {
            prop_assert_eq!(answer, Some(Answer::Staged(Staged::Accepted)));
            prop_assert_eq!(&counters, &counted);
        }
        Some(back) => {
            // A full capacity or journal is waited for: zero time here.
            let back = match back {
                StageError::Full { item, .. } => StageError::TimedOut(item),
                other => other,
            };
            prop_assert_eq!(answer, Some(Answer::Back(back)), "stage_wait");
            prop_assert_eq!(&counters, &uncounted, "stage_wait counts nothing");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn s_w21_every_stage_call_agrees_with_stage(case in case()) {
        check(&case)?;
    }
}
