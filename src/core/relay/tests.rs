use std::time::Duration;

use super::*;

const NOW: Time = Time::ZERO;

fn row(id: i64, xid: u64, partition: u32, tenant: &[u8]) -> Row {
    Row {
        id,
        xid,
        partition,
        tenant: tenant.to_vec(),
        item: format!("item {id}").into_bytes(),
        codec_version: 0,
        age: Duration::ZERO,
        crashes: 0,
    }
}

/// A relay owning `partitions`, each ready to read.
fn relay(config: RelayConfig, partitions: &[u32]) -> Relay {
    let mut r = Relay::new(config).unwrap();
    for &p in partitions {
        r.handle_partition_gained(NOW, p, 1);
        let Some(StoreOp::RecordCrashes { op, partition, .. }) = r.poll_op(NOW) else {
            panic!("a gained partition first records its crashes")
        };
        assert_eq!(partition, p);
        r.handle_crashes_recorded(NOW, op, Ok(Fenced::Done(0)));
    }
    r
}

fn expect_read(r: &mut Relay) -> (OpId, PageRequest) {
    match r.poll_op(NOW) {
        Some(StoreOp::ReadPage { op, request }) => (op, request),
        other => panic!("expected a read, got {other:?}"),
    }
}

fn answer(r: &mut Relay, op: OpId, partitions: Vec<Vec<Row>>, tenants: Vec<Vec<Row>>) {
    let page = Page {
        xmin: u64::MAX,
        partitions,
        tenants,
    };
    r.handle_page(NOW, op, Ok(page));
    record(r);
}

/// Answers the page's in-flight record, if it asked for one.
fn record(r: &mut Relay) {
    if let Some(StoreOp::RecordAttempts { op, .. }) = r.ops.take_record_op() {
        r.handle_attempt_recorded(NOW, op, Ok(Recorded::default()));
    }
}

/// Answers a page without answering its record.
fn answer_unrecorded(r: &mut Relay, op: OpId, partitions: Vec<Vec<Row>>) {
    let page = Page {
        xmin: u64::MAX,
        partitions,
        tenants: vec![],
    };
    r.handle_page(NOW, op, Ok(page));
}

fn delivered(r: &mut Relay) -> Vec<i64> {
    std::iter::from_fn(|| r.poll_delivery())
        .map(|row| row.id)
        .collect()
}

fn expect_removal(r: &mut Relay) -> (OpId, Removal) {
    expect_removal_at(r, NOW)
}

fn expect_removal_at(r: &mut Relay, now: Time) -> (OpId, Removal) {
    match r.poll_op(now) {
        Some(StoreOp::Remove { op, removal, .. }) => (op, removal),
        other => panic!("expected a removal, got {other:?}"),
    }
}

#[test]
fn rows_go_out_in_page_order_and_the_cursor_follows() {
    let mut r = relay(RelayConfig::new("a"), &[0]);
    let (op, req) = expect_read(&mut r);
    assert_eq!(req.partitions[0].after, None);
    answer(
        &mut r,
        op,
        vec![vec![row(1, 10, 0, b"t"), row(2, 11, 0, b"u")]],
        vec![],
    );
    assert_eq!(delivered(&mut r), [1, 2]);
    r.handle_wakeup(NOW);
    let (_, req) = expect_read(&mut r);
    assert_eq!(req.partitions[0].after, Some(Position { xid: 11, id: 2 }));
}

#[test]
fn an_idle_relay_polls_after_its_interval() {
    let mut r = relay(RelayConfig::new("a"), &[0]);
    let (op, _) = expect_read(&mut r);
    answer(&mut r, op, vec![vec![]], vec![]);
    assert!(r.poll_op(NOW).is_none());
    let at = r.poll_timeout().expect("a poll is armed");
    assert_eq!(at, NOW + DEFAULT_POLL_INTERVAL);
    r.handle_timeout(at);
    assert!(matches!(r.poll_op(at), Some(StoreOp::ReadPage { .. })));
}

#[test]
fn read_ahead_is_back_pressure_never_a_drop() {
    let mut r = relay(RelayConfig::new("a").read_ahead(3).tenant_share(3), &[0]);
    let (op, req) = expect_read(&mut r);
    assert_eq!(req.partitions[0].limit, 3);
    let rows: Vec<Row> = (1..=5).map(|i| row(i, 10 + i as u64, 0, b"t")).collect();
    answer(&mut r, op, vec![rows], vec![]);
    assert_eq!(delivered(&mut r), [1, 2, 3]);
    assert_eq!(r.held(), 3);
    // No room: no read, whatever wakes it.
    r.handle_wakeup(NOW);
    assert!(r.poll_op(NOW).is_none());
    r.handle_done(NOW, 1, Done::Written);
    let (op, removal) = expect_removal(&mut r);
    assert_eq!(removal.delete, [1]);
    r.handle_removed(
        NOW,
        op,
        Ok(Removed {
            deleted: vec![1],
            ..Removed::default()
        }),
    );
    // Room again: the next read starts after the last row taken (3).
    let (_, req) = expect_read(&mut r);
    assert_eq!(req.partitions[0].after, Some(Position { xid: 13, id: 3 }));
}

#[test]
fn a_saturated_tenant_is_read_past_and_caught_up_in_order() {
    let config = RelayConfig::new("a").read_ahead(100).tenant_share(2);
    let mut r = relay(config, &[0]);
    let (op, _) = expect_read(&mut r);
    let page = vec![
        row(1, 10, 0, b"a"),
        row(2, 11, 0, b"a"),
        row(3, 12, 0, b"a"),
        row(4, 13, 0, b"b"),
        row(5, 14, 0, b"a"),
        row(6, 15, 0, b"b"),
    ];
    answer(&mut r, op, vec![page], vec![]);
    // Tenant a holds its share; b is read past it (S-W8, S-T9).
    assert_eq!(delivered(&mut r), [1, 2, 4, 6]);
    for id in [1, 2] {
        r.handle_done(NOW, id, Done::Written);
    }
    let (op, removal) = expect_removal(&mut r);
    assert_eq!(removal.delete, [1, 2]);
    r.handle_removed(NOW, op, Ok(Removed::default()));
    let (op, req) = expect_read(&mut r);
    assert_eq!(req.partitions[0].after, Some(Position { xid: 15, id: 6 }));
    let catch_up = &req.tenants[0];
    assert_eq!(catch_up.tenant, b"a");
    assert_eq!(catch_up.after, Some(Position { xid: 11, id: 2 }));
    assert_eq!(catch_up.until, Position { xid: 15, id: 6 });
    // Its rows come back in order, then it rejoins the flow.
    let later_a = row(7, 16, 0, b"a");
    answer(
        &mut r,
        op,
        vec![vec![later_a]],
        vec![vec![row(3, 12, 0, b"a"), row(5, 14, 0, b"a")]],
    );
    assert_eq!(delivered(&mut r), [3, 5]);
    assert!(r.tenants.saturated.contains(b"a".as_slice()));
}

#[test]
fn removals_go_in_delivery_order_one_at_a_time_and_retry_alike() {
    let mut r = relay(RelayConfig::new("a"), &[0]);
    let (op, _) = expect_read(&mut r);
    let rows = vec![
        row(1, 10, 0, b"t"),
        row(2, 10, 0, b"t"),
        row(3, 11, 0, b"t"),
    ];
    answer(&mut r, op, vec![rows], vec![]);
    delivered(&mut r);
    // 2 ends before 1: nothing is removable until 1 ends (a suffix stays).
    r.handle_done(NOW, 2, Done::Written);
    assert!(r.poll_op(NOW).is_none());
    r.handle_done(NOW, 1, Done::Written);
    let (op, first) = expect_removal(&mut r);
    assert_eq!(first.delete, [1, 2]);
    r.handle_done(
        NOW,
        3,
        Done::GivenUp {
            reason: DeadReason::Terminal,
            attempts: 4,
        },
    );
    assert!(r.poll_op(NOW).is_none(), "one removal in flight");
    let failure = StoreError::new(StoreErrorKind::Unknown, None, "reply lost");
    r.handle_removed(NOW, op, Err(failure));
    assert!(r.poll_op(NOW).is_none(), "after a backoff");
    let at = r.poll_timeout().unwrap();
    assert_eq!(at, NOW + Duration::from_millis(100));
    r.handle_timeout(at);
    let (op, again) = expect_removal_at(&mut r, at);
    assert_eq!(again, first, "the same removal, nothing newer before it");
    r.handle_removed(at, op, Ok(Removed::default()));
    let (_, next) = expect_removal_at(&mut r, at);
    assert_eq!(
        next.dead,
        [DeadLetterRow {
            id: 3,
            reason: DeadReason::Terminal,
            attempts: 4
        }]
    );
}

#[test]
fn a_handed_over_row_keeps_every_later_row_of_its_tenant() {
    let mut r = relay(RelayConfig::new("a"), &[0]);
    let (op, _) = expect_read(&mut r);
    answer(
        &mut r,
        op,
        vec![vec![row(1, 10, 0, b"t"), row(2, 11, 0, b"t")]],
        vec![],
    );
    delivered(&mut r);
    r.handle_done(NOW, 1, Done::HandedOver);
    r.handle_done(NOW, 2, Done::Written);
    // No row leaves: 1 and 2 stay; their record is dropped (a hand-over is
    // no crash, S-T17).
    let (_, removal) = expect_removal(&mut r);
    assert!(removal.delete.is_empty() && removal.dead.is_empty());
    assert_eq!(removal.records, [1]);
    assert_eq!((r.held(), r.open()), (0, 0));
}

#[test]
fn poisoned_rows_are_dead_lettered_and_suspects_go_alone() {
    let mut r = relay(RelayConfig::new("a"), &[0, 1]);
    let (op, _) = expect_read(&mut r);
    let mut poison = row(1, 10, 0, b"p");
    poison.crashes = DEFAULT_MAX_CRASH_ATTEMPTS;
    let mut suspect = row(2, 11, 0, b"s");
    suspect.crashes = 1;
    let healthy = row(3, 12, 0, b"h");
    answer(
        &mut r,
        op,
        vec![vec![poison, suspect, healthy], vec![row(4, 13, 1, b"x")]],
        vec![],
    );
    assert_eq!(delivered(&mut r), [2], "the suspect alone");
    assert!(std::iter::from_fn(|| r.poll_event()).any(|e| e == RelayEvent::Quarantined { id: 2 }));
    let (rop, removal) = expect_removal(&mut r);
    assert_eq!(removal.dead[0].reason, DeadReason::Poisoned);
    r.handle_removed(NOW, rop, Ok(Removed::default()));
    r.handle_wakeup(NOW);
    assert!(
        r.poll_op(NOW).is_none(),
        "no read while the suspect is alone"
    );
    r.handle_done(NOW, 2, Done::Written);
    let (rop, removal) = expect_removal(&mut r);
    assert_eq!(removal.delete, [2]);
    r.handle_removed(NOW, rop, Ok(Removed::default()));
    let (_, req) = expect_read(&mut r);
    assert_eq!(req.partitions[0].after, Some(Position { xid: 11, id: 2 }));
    assert_eq!(req.partitions[1].after, None, "partition 1 was not taken");
}

#[test]
fn a_suspect_waits_for_open_rows_then_is_read_first() {
    let mut r = relay(RelayConfig::new("a"), &[0, 1]);
    let (op, _) = expect_read(&mut r);
    let mut suspect = row(2, 11, 1, b"s");
    suspect.crashes = 2;
    answer(
        &mut r,
        op,
        vec![
            vec![row(1, 10, 0, b"h")],
            vec![suspect, row(3, 12, 1, b"z")],
        ],
        vec![],
    );
    assert_eq!(delivered(&mut r), [1]);
    r.handle_wakeup(NOW);
    assert!(r.poll_op(NOW).is_none(), "draining: row 1 is open");
    r.handle_done(NOW, 1, Done::Written);
    let (rop, removal) = expect_removal(&mut r);
    assert_eq!(removal.records, [1]);
    assert!(
        r.poll_op(NOW).is_none(),
        "draining: row 1's record is live until its removal commits"
    );
    r.handle_removed(NOW, rop, Ok(Removed::default()));
    let (op, req) = expect_read(&mut r);
    assert_eq!(req.partitions.len(), 1, "only where the suspect is");
    assert_eq!(req.partitions[0].partition, 1);
    let mut suspect = row(2, 11, 1, b"s");
    suspect.crashes = 2;
    answer(&mut r, op, vec![vec![suspect, row(3, 12, 1, b"z")]], vec![]);
    assert_eq!(delivered(&mut r), [2]);
}

/// S-T18: a suspect met in a partition that is then lost (released in a
/// rebalance) no longer holds up the reads of the partitions still owned.
/// (Found by tests/table_processes.rs: a late joiner that gave a dead
/// owner's partition back read nothing again.)
#[test]
fn a_suspect_of_a_lost_partition_stops_holding_up_reads() {
    let mut r = relay(RelayConfig::new("a"), &[0, 1]);
    let (op, _) = expect_read(&mut r);
    let mut suspect = row(2, 11, 1, b"s");
    suspect.crashes = 1;
    answer(
        &mut r,
        op,
        vec![vec![row(1, 10, 0, b"h")], vec![suspect]],
        vec![],
    );
    assert_eq!(delivered(&mut r), [1]);
    r.handle_partition_lost(NOW, 1);
    r.handle_done(NOW, 1, Done::Written);
    let (_, _removal) = expect_removal(&mut r);
    let (op, req) = expect_read(&mut r);
    assert_eq!(req.partitions.len(), 1);
    assert_eq!(req.partitions[0].partition, 0, "partition 0 is read again");
    answer(&mut r, op, vec![vec![row(3, 12, 0, b"h")]], vec![]);
    assert_eq!(delivered(&mut r), [3]);
}

#[test]
fn unknown_versions_stay_and_hold_their_tenant_retired_ones_are_dead_lettered() {
    let config = RelayConfig::new("a")
        .known_versions([1])
        .retired_versions([0]);
    let mut r = relay(config, &[0]);
    let (op, _) = expect_read(&mut r);
    let mut newer = row(1, 10, 0, b"n");
    newer.codec_version = 2;
    let mut after_newer = row(2, 11, 0, b"n");
    after_newer.codec_version = 1;
    let mut other = row(3, 12, 0, b"o");
    other.codec_version = 1;
    let retired = row(4, 13, 0, b"r");
    answer(
        &mut r,
        op,
        vec![vec![newer, after_newer, other, retired]],
        vec![],
    );
    assert_eq!(delivered(&mut r), [3]);
    let events: Vec<RelayEvent> = std::iter::from_fn(|| r.poll_event()).collect();
    assert!(events.contains(&RelayEvent::UnknownVersion {
        id: 1,
        partition: 0,
        version: 2
    }));
    let (_, removal) = expect_removal(&mut r);
    assert_eq!(removal.dead[0].id, 4);
    assert_eq!(removal.dead[0].reason, DeadReason::RetiredVersion);
    assert!(!removal.delete.contains(&1) && !removal.delete.contains(&2));
}

#[test]
fn a_stale_fence_drops_the_partition() {
    let mut r = relay(RelayConfig::new("a"), &[0, 1]);
    let (op, _) = expect_read(&mut r);
    answer(
        &mut r,
        op,
        vec![vec![row(1, 10, 0, b"t")], vec![row(2, 11, 1, b"u")]],
        vec![],
    );
    delivered(&mut r);
    r.handle_done(NOW, 1, Done::Written);
    r.handle_done(NOW, 2, Done::Written);
    let (op, removal) = expect_removal(&mut r);
    assert_eq!(removal.delete, [1, 2]);
    r.handle_removed(
        NOW,
        op,
        Ok(Removed {
            deleted: vec![2],
            dead: vec![],
            stale: vec![0],
        }),
    );
    let events: Vec<RelayEvent> = std::iter::from_fn(|| r.poll_event()).collect();
    assert!(events.contains(&RelayEvent::PartitionStale { partition: 0 }));
    assert_eq!(r.partitions().map(|(p, _)| p).collect::<Vec<_>>(), [1]);
    assert_eq!(r.held(), 0);
}

/// S-T17: a page's rows, of many tenants and partitions, are recorded in
/// one call (one record per partition) before any reaches the engine.
#[test]
fn a_page_is_recorded_in_one_call_before_its_rows_go_out() {
    let mut r = relay(RelayConfig::new("a"), &[0, 1]);
    let (op, _) = expect_read(&mut r);
    let p0: Vec<Row> = (1..=6)
        .map(|i| row(i, 10 + i as u64, 0, &[b't', (i % 3) as u8]))
        .collect();
    let p1 = vec![row(7, 20, 1, b"u"), row(8, 21, 1, b"v")];
    answer_unrecorded(&mut r, op, vec![p0, p1]);
    assert!(r.poll_delivery().is_none(), "nothing before the record");
    let Some(StoreOp::RecordAttempts { op, fence, records }) = r.poll_op(NOW) else {
        panic!("the page's record goes first")
    };
    assert_eq!(fence.epochs, [(0, 1), (1, 1)]);
    assert_eq!(
        records,
        [
            InFlight {
                partition: 0,
                ids: vec![1, 2, 3, 4, 5, 6]
            },
            InFlight {
                partition: 1,
                ids: vec![7, 8]
            },
        ]
    );
    assert!(
        !matches!(r.poll_op(NOW), Some(StoreOp::RecordAttempts { .. })),
        "one call"
    );
    r.handle_attempt_recorded(NOW, op, Ok(Recorded::default()));
    assert_eq!(delivered(&mut r), [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(r.records(), 2);
}

/// S-T17: a record lives until the last of its rows is settled, and goes
/// with the removal of that row.
#[test]
fn a_record_goes_with_its_last_row() {
    let mut r = relay(RelayConfig::new("a"), &[0]);
    let (op, _) = expect_read(&mut r);
    answer(
        &mut r,
        op,
        vec![vec![row(1, 10, 0, b"t"), row(2, 11, 0, b"u")]],
        vec![],
    );
    assert_eq!(delivered(&mut r), [1, 2]);
    r.handle_done(NOW, 1, Done::Written);
    let (op, removal) = expect_removal(&mut r);
    assert_eq!(
        (removal.delete.as_slice(), removal.records.len()),
        (&[1][..], 0)
    );
    r.handle_removed(NOW, op, Ok(Removed::default()));
    assert_eq!(r.records(), 1, "row 2 is still in flight");
    r.handle_done(NOW, 2, Done::Written);
    let (op, removal) = expect_removal(&mut r);
    assert_eq!(removal.delete, [2]);
    assert_eq!(removal.records, [1]);
    r.handle_removed(NOW, op, Ok(Removed::default()));
    assert_eq!(r.records(), 0);
}

/// S-T17, S-T5: a later page's rows wait for an earlier page's record; a
/// stale partition's rows never go out; a failed record goes again.
#[test]
fn records_release_pages_in_order_and_drop_stale_partitions() {
    let mut r = relay(RelayConfig::new("a"), &[0, 1]);
    let (op, _) = expect_read(&mut r);
    answer_unrecorded(&mut r, op, vec![vec![row(1, 10, 0, b"t")], vec![]]);
    let Some(StoreOp::RecordAttempts { op: first, .. }) = r.poll_op(NOW) else {
        panic!()
    };
    r.handle_wakeup(NOW);
    let (op, _) = expect_read(&mut r);
    answer_unrecorded(
        &mut r,
        op,
        vec![vec![row(2, 11, 0, b"t")], vec![row(3, 12, 1, b"u")]],
    );
    let Some(StoreOp::RecordAttempts { op: second, .. }) = r.poll_op(NOW) else {
        panic!()
    };
    let stale = Recorded { stale: vec![1] };
    r.handle_attempt_recorded(NOW, second, Ok(stale));
    assert!(r.poll_delivery().is_none(), "the first page goes first");
    assert!(std::iter::from_fn(|| r.poll_event())
        .any(|e| e == RelayEvent::PartitionStale { partition: 1 }));
    let failure = StoreError::new(StoreErrorKind::Unknown, None, "reply lost");
    r.handle_attempt_recorded(NOW, first, Err(failure));
    let at = r.poll_timeout().unwrap();
    r.handle_timeout(at);
    let Some(StoreOp::RecordAttempts {
        op: again, records, ..
    }) = r.poll_op(at)
    else {
        panic!("the same record again")
    };
    assert_eq!(records[0].ids, [1]);
    r.handle_attempt_recorded(at, again, Ok(Recorded::default()));
    assert_eq!(delivered(&mut r), [1, 2], "row 3's partition is stale");
}

/// S-T18: `max_crash_attempts` 0 is taken as 1, as the journal takes it
/// (S-J17), whether set through the setter or the field: a row with one
/// crash is poisoned, a row with none is delivered, never every row
/// poisoned.
#[test]
fn max_crash_attempts_zero_is_taken_as_one() {
    assert_eq!(
        RelayConfig::new("a")
            .max_crash_attempts(0)
            .max_crash_attempts,
        1
    );
    let mut config = RelayConfig::new("a");
    config.max_crash_attempts = 0;
    let mut r = relay(config, &[0]);
    let (op, _) = expect_read(&mut r);
    let mut crashed = row(1, 10, 0, b"p");
    crashed.crashes = 1;
    answer(&mut r, op, vec![vec![crashed, row(2, 11, 0, b"h")]], vec![]);
    assert_eq!(delivered(&mut r), [2], "the row without a crash goes");
    let (_, removal) = expect_removal(&mut r);
    assert_eq!(removal.dead.len(), 1);
    assert_eq!(
        (removal.dead[0].id, removal.dead[0].reason),
        (1, DeadReason::Poisoned)
    );
}

#[test]
fn bad_configs_are_refused() {
    let ok = RelayConfig::new("a");
    assert!(Relay::new(ok.clone()).is_ok());
    assert_eq!(
        Relay::new(RelayConfig::new("")).unwrap_err(),
        RelayConfigError::EmptyOwner
    );
    assert_eq!(
        Relay::new(ok.clone().read_ahead(0)).unwrap_err(),
        RelayConfigError::Zero
    );
    assert_eq!(
        Relay::new(ok.clone().read_ahead(10).tenant_share(11)).unwrap_err(),
        RelayConfigError::ShareAboveReadAhead
    );
    assert_eq!(
        Relay::new(ok.clone().known_versions([])).unwrap_err(),
        RelayConfigError::NoKnownVersion
    );
    assert_eq!(
        Relay::new(ok.retired_versions([0])).unwrap_err(),
        RelayConfigError::KnownAndRetired(0)
    );
}

/// S-T39: a partition lost while the engine holds its rows, then gained
/// again, neither counts crashes nor reads until the engine ended them;
/// then it starts from its oldest row.
#[test]
fn a_partition_gained_again_waits_for_its_old_rows_to_end() {
    let mut r = relay(RelayConfig::new("a"), &[0, 1]);
    let (op, _) = expect_read(&mut r);
    answer(
        &mut r,
        op,
        vec![vec![row(1, 10, 0, b"t"), row(2, 11, 0, b"t")], vec![]],
        vec![],
    );
    assert_eq!(delivered(&mut r), [1, 2]);
    r.handle_partition_lost(NOW, 0);
    r.handle_partition_gained(NOW, 0, 2);
    assert_eq!(r.orphans(), 2);
    // Only partition 1 is read meanwhile: no crash count for 0, no read.
    r.handle_wakeup(NOW);
    let (op, req) = expect_read(&mut r);
    assert_eq!(
        req.partitions
            .iter()
            .map(|p| p.partition)
            .collect::<Vec<_>>(),
        [1]
    );
    answer(&mut r, op, vec![vec![]], vec![]);
    assert_eq!(r.poll_op(NOW), None);
    r.handle_done(NOW, 1, Done::Written);
    assert_eq!(r.poll_op(NOW), None, "row 2 is still in the engine");
    r.handle_done(NOW, 2, Done::HandedOver);
    assert_eq!(r.orphans(), 0);
    let Some(StoreOp::RecordCrashes {
        op,
        partition,
        fence,
    }) = r.poll_op(NOW)
    else {
        panic!("the partition starts once its old rows ended")
    };
    assert_eq!((partition, fence.epochs.as_slice()), (0, &[(0, 2)][..]));
    r.handle_crashes_recorded(NOW, op, Ok(Fenced::Done(0)));
    let (op, req) = expect_read(&mut r);
    let read0 = req.partitions.iter().find(|p| p.partition == 0).unwrap();
    assert_eq!(read0.after, None, "from its oldest row");
    answer(
        &mut r,
        op,
        vec![vec![row(1, 10, 0, b"t"), row(2, 11, 0, b"t")], vec![]],
        vec![],
    );
    assert_eq!(
        delivered(&mut r),
        [1, 2],
        "delivered once more, under epoch 2"
    );
    // Removals carry nothing of the old epoch's rows.
    assert_eq!(r.held(), 2);
}

/// S-T39: rows still waiting for their in-flight record at a loss never
/// reached the engine, so a partition gained again does not wait for them.
#[test]
fn rows_waiting_for_their_record_at_a_loss_hold_nothing_up() {
    let mut r = relay(RelayConfig::new("a"), &[0]);
    let (op, _) = expect_read(&mut r);
    answer_unrecorded(&mut r, op, vec![vec![row(1, 10, 0, b"t")]]);
    assert!(delivered(&mut r).is_empty(), "not before its record");
    r.handle_partition_lost(NOW, 0);
    r.handle_partition_gained(NOW, 0, 2);
    assert_eq!(r.orphans(), 0);
    let starts = std::iter::from_fn(|| r.poll_op(NOW))
        .any(|op| matches!(op, StoreOp::RecordCrashes { partition: 0, .. }));
    assert!(starts, "the partition starts at once");
}

/// S-T18, S-W8: a suspect that keeps failing holds no other tenant back.
/// Once its attempt came back to be retried, its in-flight record is
/// dropped and the others' rows are read and delivered; its tenant's
/// later rows and another suspect wait in the table. Its retry writes its
/// record again (after the drop, never before it) and stops the reads
/// until it comes back; once it ends, the tenants deferred behind it
/// catch up from where they stopped.
#[test]
fn a_suspect_waiting_for_its_retry_holds_no_other_tenant_back() {
    let mut r = relay(RelayConfig::new("a"), &[0]);
    let (op, _) = expect_read(&mut r);
    let mut suspect = row(1, 10, 0, b"s");
    suspect.crashes = 1;
    answer(
        &mut r,
        op,
        vec![vec![suspect, row(2, 11, 0, b"s"), row(3, 12, 0, b"h")]],
        vec![],
    );
    assert_eq!(delivered(&mut r), [1], "the suspect alone");
    r.handle_wakeup(NOW);
    assert!(r.poll_op(NOW).is_none(), "no read while its attempt is out");

    // Its attempt came back; it waits for its retry.
    r.handle_suspect_back(NOW, 1);
    let (drop_op, removal) = expect_removal(&mut r);
    assert_eq!(removal.records, [1], "its record is dropped");
    assert!(removal.delete.is_empty() && removal.dead.is_empty());
    let (op, req) = expect_read(&mut r);
    assert_eq!(req.partitions[0].after, Some(Position { xid: 10, id: 1 }));
    let mut other = row(4, 13, 0, b"x");
    other.crashes = 1;
    answer(
        &mut r,
        op,
        vec![vec![
            row(2, 11, 0, b"s"),
            row(3, 12, 0, b"h"),
            other,
            row(5, 14, 0, b"x"),
            row(6, 15, 0, b"h"),
        ]],
        vec![],
    );
    assert_eq!(
        delivered(&mut r),
        [3, 6],
        "the others' rows go; the suspect's tenant and another suspect wait"
    );

    // Its retry is due before the drop committed: the record waits for it.
    r.handle_suspect_retry(NOW, 1);
    assert!(
        r.ops.take_record_op().is_none(),
        "not before the drop of its last record"
    );
    r.handle_removed(NOW, drop_op, Ok(Removed::default()));
    let Some(StoreOp::RecordAttempts { op, records, .. }) = r.ops.take_record_op() else {
        panic!("the retry's record")
    };
    assert_eq!(
        records,
        [InFlight {
            partition: 0,
            ids: vec![1]
        }]
    );
    assert!(std::iter::from_fn(|| r.poll_event())
        .all(|e| !matches!(e, RelayEvent::SuspectRetry { .. })));
    r.handle_attempt_recorded(NOW, op, Ok(Recorded::default()));
    assert!(std::iter::from_fn(|| r.poll_event()).any(|e| e
        == RelayEvent::SuspectRetry {
            id: 1,
            recorded: true
        }));
    r.handle_wakeup(NOW);
    assert!(r.poll_op(NOW).is_none(), "no read while its retry is out");

    // It comes back again: the others go on meanwhile.
    r.handle_suspect_back(NOW, 1);
    let (drop_op, removal) = expect_removal(&mut r);
    assert_eq!(removal.records, [1]);
    r.handle_removed(NOW, drop_op, Ok(Removed::default()));
    r.handle_done(NOW, 3, Done::Written);
    let (rop, removal) = expect_removal(&mut r);
    assert_eq!(removal.delete, [3]);
    r.handle_removed(NOW, rop, Ok(Removed::default()));
    let (op, _) = expect_read(&mut r);
    answer(&mut r, op, vec![vec![row(7, 16, 0, b"h")]], vec![]);
    assert_eq!(delivered(&mut r), [7]);

    // A retry of a row that is not the waiting suspect is refused.
    r.handle_suspect_retry(NOW, 7);
    assert!(std::iter::from_fn(|| r.poll_event()).any(|e| e
        == RelayEvent::SuspectRetry {
            id: 7,
            recorded: false
        }));

    // The suspect is written: the deferred tenants catch up in order.
    r.handle_suspect_retry(NOW, 1);
    let Some(StoreOp::RecordAttempts { op, .. }) = r.ops.take_record_op() else {
        panic!("the retry's record")
    };
    r.handle_attempt_recorded(NOW, op, Ok(Recorded::default()));
    r.handle_done(NOW, 1, Done::Written);
    let (rop, removal) = expect_removal(&mut r);
    assert_eq!((removal.delete, removal.records), (vec![1], vec![1]));
    r.handle_removed(NOW, rop, Ok(Removed::default()));
    let (_, req) = expect_read(&mut r);
    let mut catch_up: Vec<(Vec<u8>, Option<Position>)> = req
        .tenants
        .iter()
        .map(|t| (t.tenant.clone(), t.after))
        .collect();
    catch_up.sort();
    assert_eq!(
        catch_up,
        [
            (b"s".to_vec(), Some(Position { xid: 10, id: 1 })),
            (b"x".to_vec(), None)
        ]
    );
}
