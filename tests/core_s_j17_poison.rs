//! S-J17, the core's policy: how a recovery counts the crashes that cut
//! each item's attempts across lives, which items it poisons, and how the
//! engine writes the suspects: alone, one item per write, with nothing
//! else in flight.
#![cfg(all(feature = "journal", feature = "testkit"))]

use std::time::Duration;

use outbox::core::journal::{
    plan, Head, Limits, Lives, Machine, Note, Op, SegmentFile, Settings, Sizes,
};
use outbox::core::{
    Config, DeadReason, Durable, Engine, Event, Failure, LostReason, Outcome, Time, Write,
};

/// One sealed segment holding `items` (sequence, tenant) and `lives`.
fn segment(items: &[(u64, u32)], lives: Lives) -> SegmentFile<u32, u64> {
    SegmentFile {
        id: 1,
        head: Head::Valid {
            id: 1,
            first: 1,
            v1: false,
        },
        torn: false,
        len: 100,
        valid_end: 100,
        skipped: 0,
        items: items.iter().map(|&(s, t)| (s, t, s * 10)).collect(),
        undecodable: Vec::new(),
        other: Vec::new(),
        marks: Vec::new(),
        seal: Some(items.len() as u64 + 1),
        lives,
    }
}

fn limits() -> Limits {
    Limits::new(Some(4_096), None).unwrap()
}

#[test]
fn s_j17_only_the_item_cut_in_every_life_is_poisoned_and_the_suspects_go_alone() {
    // Tenant 1 holds 1 (cut in lives 1, 2 and 3), 2 (cut in life 1, in
    // the same slice) and 3 (never tried); tenant 2 holds 4 (cut in life
    // 1, beside it). Life 2 and 3 started with life records; life 5
    // closed cleanly after marking 3.
    let lives = Lives {
        attempts: vec![(1, 1), (1, 2), (1, 4), (2, 1), (3, 1), (5, 3)],
        starts: vec![
            (2, vec![(1, 1), (2, 1), (4, 1)]),
            (3, vec![(1, 2), (2, 1), (4, 1)]),
        ],
        clean: vec![5],
        ..Lives::default()
    };
    // Tenant 3's item 5 was never tried.
    let files = vec![segment(&[(1, 1), (2, 1), (3, 1), (4, 2), (5, 3)], lives)];
    let (r, _) = plan(files, 17).unwrap().finish(limits(), 48, 3);
    let seqs = |v: &[(u64, u32, u64)]| v.iter().map(|x| x.0).collect::<Vec<_>>();
    assert_eq!(seqs(&r.poisoned), [1], "cut in three lives");
    assert_eq!(seqs(&r.items), [2, 3, 4, 5]);
    assert_eq!(r.crashes, [(2, 1), (4, 1)]);
    // Tenant 1's items up to its last suspect go alone; 3 goes after; a
    // tenant with no suspect is not named.
    assert_eq!(r.alone, [(1, 1), (2, 1)]);

    // Under a bound of 4 crashes, 1 is only a suspect, with 3.
    let lives = Lives {
        attempts: vec![(3, 1)],
        starts: vec![(3, vec![(1, 2)])],
        clean: vec![],
        ..Lives::default()
    };
    let (r, _) = plan(vec![segment(&[(1, 1)], lives)], 17)
        .unwrap()
        .finish(limits(), 48, 4);
    assert!(r.poisoned.is_empty());
    assert_eq!(r.crashes, [(1, 3)]);
}

#[test]
fn s_j17_a_clean_close_cuts_nothing() {
    let lives = Lives {
        attempts: vec![(1, 1)],
        starts: Vec::new(),
        clean: vec![1],
        ..Lives::default()
    };
    let (r, _) = plan(vec![segment(&[(1, 1)], lives)], 17)
        .unwrap()
        .finish(limits(), 48, 1);
    assert!(r.poisoned.is_empty() && r.crashes.is_empty() && r.alone.is_empty());
}

fn durable(tenant: u32, item: u32) -> Durable<u32, u32> {
    Durable {
        tenant,
        item,
        age: Duration::ZERO,
        key: None,
    }
}

#[test]
fn s_j17_suspects_are_written_alone_one_item_per_write_with_nothing_else_in_flight() {
    let config = Config::builder()
        .concurrency(4)
        .max_slices_per_write(4)
        .dead_letters(true)
        .build()
        .unwrap();
    let mut e: Engine<u32, u32> = Engine::new(config).unwrap();
    let t0 = Time::ZERO;
    let items = [(1, 10), (1, 11), (1, 12), (2, 20), (3, 30)];
    let _ = e.stage_durable(t0, items.map(|(t, i)| durable(t, i)), 0);
    e.write_alone(1, 2);
    e.write_alone(2, 1);
    e.recover_poisoned(t0, 4, vec![40]);
    // Each group is started and ended before the next poll.
    let mut groups = Vec::new();
    while let Some(group) = e.poll_group(t0) {
        let lone = group
            .iter()
            .any(|w| w.items.iter().any(|i| [10, 11, 20].contains(i)));
        if lone {
            assert!(
                e.poll_group(t0).is_none(),
                "nothing starts beside a suspect"
            );
        }
        groups.push(
            group
                .iter()
                .map(|w| (w.tenant, w.items.clone()))
                .collect::<Vec<_>>(),
        );
        for w in group {
            e.finish(t0, w, Outcome::WRITTEN).unwrap();
        }
    }
    for item in [10, 11, 20] {
        let g = groups
            .iter()
            .find(|g| g.iter().any(|(_, i)| i.contains(&item)));
        let g = g.expect("written");
        assert_eq!(g.len(), 1, "{item} in a group of its own: {groups:?}");
        assert_eq!(g[0].1, [item], "{item} alone in its write: {groups:?}");
    }
    let of_1: Vec<u32> = groups
        .iter()
        .flatten()
        .filter(|(t, _)| *t == 1)
        .flat_map(|(_, i)| i.clone())
        .collect();
    assert_eq!(of_1, [10, 11, 12], "in staging order");
    let c = e.counters().clone();
    assert_eq!((c.recovered, c.lost(LostReason::Poisoned)), (6, 1));
    let letters: Vec<_> = std::iter::from_fn(|| e.poll_event())
        .filter_map(|ev| match ev {
            Event::DeadLetter(d) => Some((d.tenant, d.items, d.reason, d.attempted)),
            _ => None,
        })
        .collect();
    assert_eq!(letters, [(4, vec![40], DeadReason::Poisoned, true)]);
}

#[test]
fn s_j17_a_suspect_waits_for_the_writes_in_flight_before_it() {
    let config = Config::builder().concurrency(4).build().unwrap();
    let mut e: Engine<u32, u32> = Engine::new(config).unwrap();
    let t0 = Time::ZERO;
    let _ = e.stage(t0, 9, 90);
    let first = e.poll_write(t0).unwrap();
    let _ = e.stage_durable(t0, [durable(1, 10), durable(1, 11)], 0);
    e.write_alone(1, 1);
    assert!(e.poll_write(t0).is_none(), "9's write is in flight");
    e.finish(t0, first, Outcome::WRITTEN).unwrap();
    let w = e.poll_write(t0).unwrap();
    assert_eq!(w.items, [10]);
    assert!(e.poll_write(t0).is_none());
}

#[test]
fn s_j17_a_suspect_that_keeps_failing_holds_no_other_tenant_back_and_retries_alone() {
    // S-W8: tenant 1's suspect fails every attempt, without end (no
    // `max_attempts`); tenants 2 and 3 stage an item after each write, for
    // a minute. Each write takes 10 ms. The suspect's attempts each start
    // with nothing in flight and nothing starts beside them; while it
    // waits for its retry, the others are written.
    let config = Config::builder().concurrency(4).build().unwrap();
    let mut e: Engine<u32, u32> = Engine::new(config).unwrap();
    let t0 = Time::ZERO;
    let items = [(1, 10), (2, 20), (3, 30)];
    let _ = e.stage_durable(t0, items.map(|(t, i)| durable(t, i)), 0);
    e.write_alone(1, 1);
    let took = Duration::from_millis(10);
    let busy_until = t0 + Duration::from_secs(60);
    let mut now = t0;
    let mut flying: Vec<(Time, Write<u32, u32>)> = Vec::new();
    let mut suspect_attempts = 0;
    let mut healthy_written: Vec<(u32, Time)> = Vec::new();
    while now < t0 + Duration::from_secs(600) {
        while let Some(group) = e.poll_group(now) {
            for w in group {
                assert!(
                    flying.iter().all(|(_, f)| f.tenant != 1),
                    "tenant {} started beside the suspect's attempt at {now}",
                    w.tenant
                );
                if w.tenant == 1 {
                    assert!(flying.is_empty(), "attempt {} not alone", w.attempt);
                    suspect_attempts += 1;
                }
                flying.push((now + took, w));
            }
        }
        let next = flying.iter().map(|(at, _)| *at).min();
        let Some(next) = [next, e.poll_timeout()].into_iter().flatten().min() else {
            break;
        };
        now = next.max(now);
        let (due, rest) = flying.into_iter().partition(|(at, _)| *at <= now);
        flying = rest;
        for (_, w) in due {
            let tenant = w.tenant;
            let outcome = if tenant == 1 {
                Outcome::Failed(Failure::Error)
            } else {
                Outcome::WRITTEN
            };
            e.finish(now, w, outcome).unwrap();
            if tenant != 1 {
                healthy_written.push((tenant, now));
                if now < busy_until {
                    let _ = e.stage(now, tenant, tenant * 10);
                }
            }
        }
    }
    let first = |t: u32| healthy_written.iter().find(|(x, _)| *x == t).map(|w| w.1);
    for t in [2, 3] {
        let at = first(t).unwrap_or_else(|| panic!("tenant {t} never written"));
        assert!(
            at <= t0 + Duration::from_secs(1),
            "tenant {t} first written at {at}"
        );
    }
    assert!(healthy_written.len() > 1_000, "{}", healthy_written.len());
    // Its retries are not starved by the others' steady load either.
    assert!(suspect_attempts >= 10, "{suspect_attempts} attempts");
    assert_eq!(e.counters().written, healthy_written.len() as u64);
}

/// A sealed segment `id` from `first` to `end` holding `items`
/// (sequence, tenant), the done marks `marks` and `lives`, of `len` bytes.
fn file(
    id: u64,
    (first, end): (u64, u64),
    items: &[(u64, u32)],
    marks: &[u64],
    lives: Lives,
    len: u64,
) -> SegmentFile<u32, u64> {
    SegmentFile {
        id,
        head: Head::Valid {
            id,
            first,
            v1: false,
        },
        torn: false,
        len,
        valid_end: len,
        skipped: 0,
        items: items.iter().map(|&(s, t)| (s, t, s * 10)).collect(),
        undecodable: Vec::new(),
        other: Vec::new(),
        marks: marks.to_vec(),
        seal: Some(end),
        lives,
    }
}

/// The first batch of the life that recovers `files` under a bound of
/// 2,048 bytes with segments of 256 (S-J10, S-J17).
fn first_batch(files: Vec<SegmentFile<u32, u64>>) -> Vec<Op> {
    let sizes = Sizes {
        header: 48,
        seal: 17,
        done: 9,
        mark: 8,
        marks_per_record: 8_192,
    };
    let limits = Limits {
        segment_bytes: 256,
        max_bytes: Some(2_048),
    };
    let (r, ledger) = plan(files, sizes.seal)
        .unwrap()
        .finish(limits, sizes.header, 3);
    let settings = Settings {
        sync_interval: Duration::from_millis(1),
        sync_bytes: 1,
        retry_interval: Duration::from_millis(1),
        sizes,
    };
    let mut m: Machine<u32, ()> = Machine::new(ledger, settings);
    let seqs = r.items.iter().map(|x| x.0).collect();
    m.start_life(r.crashes, seqs);
    m.handle_wake(Time::ZERO);
    m.poll_batch(Time::ZERO).expect("a first commit").ops
}

/// Crash seed 960183: at the bound, the life record of a life did not
/// fit, and the life deleted the segment holding the latest life record
/// and the last attempt mark anyway, so the poison item's count fell
/// back by the crashes they counted, every other life, forever.
#[test]
fn s_j17_a_life_whose_record_does_not_fit_keeps_the_records_its_counts_come_from() {
    // Segment 1 holds poison item 1; segment 2, of life 2, its life
    // record (1 crash) and the attempt mark the crash of life 2 cut.
    let lives = Lives {
        attempts: vec![(2, 1)],
        starts: vec![(2, vec![(1, 1)])],
        ..Lives::default()
    };
    let files = vec![
        file(1, (1, 2), &[(1, 1)], &[], Lives::default(), 1_800),
        file(2, (2, 2), &[], &[], lives, 100),
    ];
    let ops = first_batch(files);
    assert!(
        !ops.iter().any(|op| matches!(
            op,
            Op::Note {
                note: Note::Life { .. },
                ..
            }
        )),
        "no room for the life record: {ops:?}"
    );
    assert!(
        !ops.contains(&Op::Delete(2)),
        "the records counting 2 crashes stay until a life record carries them: {ops:?}"
    );
}

/// Life 2's records (item 1 cut, item 2 tried) and life 3's (item 1 cut
/// again): the lives of the fold tests.
fn two_lives() -> (Lives, Lives) {
    let old = Lives {
        attempts: vec![(2, 1), (2, 2)],
        starts: vec![(2, vec![(1, 1)])],
        ..Lives::default()
    };
    let last = Lives {
        attempts: vec![(3, 1)],
        starts: vec![(3, vec![(1, 1)])],
        ..Lives::default()
    };
    (old, last)
}

/// Crash seed 960183: a segment kept only for its done marks of a
/// segment of pending items held an earlier life's life record and lone
/// attempt marks, written in the standing reserve: kept for good, they
/// left the next lives too little of it for their own records.
#[test]
fn s_j17_at_the_bound_a_segment_kept_for_its_marks_is_folded_into_the_new_life() {
    // Segment 1 holds poison item 1 (tenant 1) and item 2 (tenant 2),
    // done: its mark is in segment 2, with life 2's records. Segment 3
    // holds life 3's record and attempt mark: 1 was cut twice.
    let (old, last) = two_lives();
    let files = vec![
        file(1, (1, 3), &[(1, 1), (2, 2)], &[], Lives::default(), 1_500),
        file(2, (3, 3), &[], &[2], old, 100),
        file(3, (3, 3), &[], &[], last, 100),
    ];
    let ops = first_batch(files);
    assert!(
        ops.contains(&Op::Note {
            id: 4,
            note: Note::Life {
                life: 4,
                counts: vec![(1, 2)]
            }
        }),
        "{ops:?}"
    );
    assert!(
        ops.contains(&Op::Marks {
            id: 4,
            seqs: vec![2]
        }),
        "segment 2's mark is written again: {ops:?}"
    );
    assert!(
        ops.contains(&Op::Delete(2)) && ops.contains(&Op::Delete(3)),
        "{ops:?}"
    );
}

/// The files of the fold test above, segment 1 of `len` bytes: segment 2
/// is kept only for its done mark of item 2 and holds life 2's records.
fn kept_for_its_marks(len: u64) -> Vec<Op> {
    let (old, last) = two_lives();
    first_batch(vec![
        file(1, (1, 3), &[(1, 1), (2, 2)], &[], Lives::default(), len),
        file(2, (3, 3), &[], &[2], old, 100),
        file(3, (3, 3), &[], &[], last, 100),
    ])
}

#[test]
fn s_j17_a_segment_kept_for_its_marks_is_folded_only_past_the_bound() {
    // With segment 1 of 1,370 bytes the files and the standing reserves
    // come to exactly 2,048 bytes once life 4's record is in: at the
    // bound, not past it, so segment 2 stays; one byte more and it is
    // folded (its mark written again, the segment deleted).
    let folded = |ops: &[Op]| {
        ops.contains(&Op::Marks {
            id: 4,
            seqs: vec![2],
        }) && ops.contains(&Op::Delete(2))
    };
    let life = |ops: &[Op]| {
        ops.iter().any(|op| {
            matches!(
                op,
                Op::Note {
                    note: Note::Life { .. },
                    ..
                }
            )
        })
    };
    for len in [200, 1_370] {
        let ops = kept_for_its_marks(len);
        assert!(life(&ops) && !folded(&ops), "{len} bytes: {ops:?}");
        assert!(!ops.contains(&Op::Delete(2)), "{len} bytes: {ops:?}");
    }
    let ops = kept_for_its_marks(1_371);
    assert!(life(&ops) && folded(&ops), "{ops:?}");
}

#[test]
fn s_j17_a_segment_holding_pending_items_is_never_folded() {
    // Past the bound, as above, but segment 2 also holds item 3, pending:
    // it stays for the item, and its mark of item 2 is not written again.
    let (old, last) = two_lives();
    let ops = first_batch(vec![
        file(1, (1, 3), &[(1, 1), (2, 2)], &[], Lives::default(), 1_500),
        file(2, (3, 4), &[(3, 3)], &[2], old, 100),
        file(3, (4, 4), &[], &[], last, 100),
    ]);
    let life = ops.iter().any(|op| {
        matches!(
            op,
            Op::Note {
                note: Note::Life { .. },
                ..
            }
        )
    });
    assert!(life, "life 4's record is in, so a fold was asked: {ops:?}");
    assert!(
        !ops.iter()
            .any(|op| matches!(op, Op::Marks { seqs, .. } if seqs.contains(&2))),
        "{ops:?}"
    );
    assert!(!ops.contains(&Op::Delete(2)), "{ops:?}");
}

#[test]
fn s_j17_a_poisoned_item_leaves_its_tenants_queue() {
    // Item 1 is poisoned (cut in three lives): done at once, its mark
    // waiting; tenant 1's oldest pending item is 2 now, so the next done
    // item of tenant 1 marks 2, not 1 again.
    let lives = Lives {
        attempts: vec![(1, 1), (2, 1), (3, 1)],
        starts: vec![(2, vec![(1, 1)]), (3, vec![(1, 2)])],
        ..Lives::default()
    };
    let files = vec![segment(&[(1, 1), (2, 1), (3, 1)], lives)];
    let (r, mut ledger) = plan(files, 17).unwrap().finish(limits(), 48, 3);
    assert_eq!(r.poisoned.iter().map(|x| x.0).collect::<Vec<_>>(), [1]);
    assert_eq!(ledger.mark_done(&1, 1), 1);
    assert_eq!(ledger.take_marks(), [1, 2]);
}

#[test]
fn s_j16_a_recovery_names_per_tenant_the_oldest_items_an_earlier_life_attempted() {
    // Life 1 marked 1 (tenant 1) and 4 (tenant 2) and closed cleanly: no
    // crash counts, no suspect, but the store may hold both. Tenant 1's
    // 2 and 3 and tenant 3's 5 were never tried.
    let lives = Lives {
        attempts: vec![(1, 1), (1, 4)],
        clean: vec![1],
        ..Lives::default()
    };
    let files = vec![segment(&[(1, 1), (2, 1), (3, 1), (4, 2), (5, 3)], lives)];
    let (r, _) = plan(files, 17).unwrap().finish(limits(), 48, 3);
    assert!(r.alone.is_empty(), "{:?}", r.alone);
    assert_eq!(r.tried, [(1, 1), (2, 1)]);
}

#[test]
fn s_j16_items_an_earlier_life_attempted_say_attempted_when_given_up() {
    // Tenant 1's oldest item (10) was attempted in an earlier life, 11
    // not; tenant 2's 20 never; tenant 3's 30 was, and is still pending
    // at the shutdown.
    let config = Config::builder()
        .dead_letters(true)
        .max_item_age(Duration::from_millis(100))
        .build()
        .unwrap();
    let mut e: Engine<u32, u32> = Engine::new(config).unwrap();
    let t0 = Time::ZERO;
    let items = [(1, 10), (1, 11), (2, 20)];
    let _ = e.stage_durable(t0, items.map(|(t, i)| durable(t, i)), 0);
    e.tried_before(1, 1);
    // Past the age before any write: both tenants expire from the backlog.
    let t1 = t0 + Duration::from_millis(150);
    assert!(e.poll_write(t1).is_none());
    let _ = e.stage_durable(t1, [durable(3, 30)], 0);
    e.tried_before(3, 1);
    let sd = e.shutdown(t1, t1);
    let mut letters = Vec::new();
    let mut report = None;
    while let Some(ev) = e.poll_event() {
        match ev {
            Event::DeadLetter(d) => letters.push((d.tenant, d.items, d.reason, d.attempted)),
            Event::ShutdownDone { id, report: r } if id == sd => report = Some(r),
            _ => {}
        }
    }
    letters.sort();
    assert_eq!(
        letters,
        [
            (1, vec![10, 11], DeadReason::Expired, true),
            (2, vec![20], DeadReason::Expired, false),
        ]
    );
    let runs: Vec<_> = report
        .expect("answered")
        .unwritten
        .into_iter()
        .map(|u| (u.tenant, u.items, u.attempted))
        .collect();
    assert_eq!(runs, [(3, vec![30], true)]);
}

#[test]
fn s_j16_a_suspect_known_only_from_a_life_record_is_named_tried() {
    // The marks of life 1 are gone with their segment; life 4's record
    // still counts two crashes against item 1.
    let lives = Lives {
        starts: vec![(4, vec![(1, 2)])],
        ..Lives::default()
    };
    let files = vec![segment(&[(1, 1), (2, 1)], lives)];
    let (r, _) = plan(files, 17).unwrap().finish(limits(), 48, 3);
    assert_eq!(r.alone, [(1, 1)]);
    assert_eq!(r.tried, [(1, 1)]);
}
