//! The policy driven by hand, reply by reply.

use std::time::Duration;

use super::*;
use crate::core::Time;

const MS: Duration = Duration::from_millis(1);

fn ms(n: u64) -> Time {
    Time::from_millis(n)
}

fn id(s: &str) -> InstanceId {
    InstanceId::new(s).unwrap()
}

/// ttl 1 s, renew 200 ms, drift 100 ms, acquire poll 100 ms, heartbeat
/// 100 ms, grace 1 s: deadlines at send + 900 ms.
fn config(partitions: u32) -> LeaseConfigBuilder {
    LeaseConfig::builder("a")
        .incarnation(9)
        .partitions(partitions)
        .lease_ttl(1_000 * MS)
        .renew_every(200 * MS)
        .max_clock_drift(100 * MS)
        .acquire_poll(100 * MS)
        .heartbeat_every(100 * MS)
        .rejoin_grace(1_000 * MS)
}

struct Drive {
    p: LeasePolicy,
}

impl Drive {
    fn new(b: LeaseConfigBuilder) -> Drive {
        Drive {
            p: LeasePolicy::new(b.build().unwrap(), Time::ZERO),
        }
    }

    fn requests(&mut self, now: Time) -> Vec<Request> {
        std::iter::from_fn(|| self.p.poll_request(now)).collect()
    }

    fn events(&mut self) -> Vec<LeaseEvent> {
        std::iter::from_fn(|| self.p.poll_event()).collect()
    }

    fn reply(&mut self, now: Time, r: &Request, reply: Reply) {
        self.p.handle_reply(now, r.id, Ok(reply)).unwrap();
    }

    /// Heartbeat answered with `members` and no owners.
    fn heartbeat(&mut self, now: Time, members: &[&str]) {
        let rs = self.requests(now);
        let hb = only(&rs, "heartbeat");
        let members = members.iter().map(|m| id(m)).collect();
        self.reply(
            now,
            &hb,
            Reply::Members {
                members,
                owners: vec![],
            },
        );
    }

    /// From a fresh policy: alone, every partition acquired at `t`,
    /// granted `epoch`, installed; returns the events.
    fn own_all(&mut self, t: Time, epoch: u64) -> Vec<LeaseEvent> {
        self.heartbeat(t, &["a"]);
        let floors = only(&self.requests(t), "sink_epochs");
        self.reply(t, &floors, Reply::SinkEpochs { epochs: vec![] });
        let acquire = only(&self.requests(t), "acquire");
        let StoreOp::Acquire { leases, .. } = &acquire.op else {
            unreachable!()
        };
        let granted = leases.iter().map(|&(p, _)| (p, Epoch(epoch))).collect();
        self.reply(t, &acquire, Reply::Acquired { granted });
        for install in self.requests(t) {
            assert_eq!(install.op.name(), "install");
            self.reply(
                t,
                &install,
                Reply::Installed {
                    epoch: Epoch(epoch),
                    ours: true,
                },
            );
        }
        self.events()
    }
}

fn only(rs: &[Request], name: &str) -> Request {
    let found: Vec<&Request> = rs.iter().filter(|r| r.op.name() == name).collect();
    assert_eq!(found.len(), 1, "one {name} in {rs:?}");
    found[0].clone()
}

#[test]
fn the_first_request_is_a_heartbeat_and_nothing_is_acquired_before_its_reply() {
    let mut d = Drive::new(config(2));
    let rs = d.requests(Time::ZERO);
    assert_eq!(rs.len(), 1);
    assert_eq!(
        rs[0].op,
        StoreOp::Heartbeat {
            instance: id("a"),
            member_ttl: 1_000 * MS
        }
    );
    assert!(d.requests(ms(50)).is_empty(), "no view, no acquire");
    assert_eq!(d.p.health(ms(50)).state, LeaseState::Joining);
    assert_eq!(d.p.poll_timeout(), Some(ms(100)), "the next heartbeat");
}

#[test]
fn the_acquire_asks_for_an_epoch_above_the_sinks_and_installs_it_before_any_write() {
    // S-L10, S-L12.
    let mut d = Drive::new(config(2));
    d.heartbeat(Time::ZERO, &["a"]);
    let floors = only(&d.requests(Time::ZERO), "sink_epochs");
    assert_eq!(
        floors.op,
        StoreOp::SinkEpochs {
            partitions: vec![Partition(0), Partition(1)]
        }
    );
    assert_eq!(d.p.partition(Partition(0)), PartitionState::Acquiring);
    d.reply(
        ms(1),
        &floors,
        Reply::SinkEpochs {
            epochs: vec![(Partition(1), Epoch(7))],
        },
    );
    let acquire = only(&d.requests(ms(1)), "acquire");
    let StoreOp::Acquire { leases, ttl, .. } = &acquire.op else {
        unreachable!()
    };
    assert_eq!(*ttl, 1_000 * MS);
    assert_eq!(
        leases,
        &[(Partition(0), Epoch(0)), (Partition(1), Epoch(7))]
    );
    d.reply(
        ms(2),
        &acquire,
        Reply::Acquired {
            granted: vec![(Partition(0), Epoch(3)), (Partition(1), Epoch(8))],
        },
    );
    assert_eq!(
        d.p.begin_write(ms(2), Partition(1)),
        Err(NotWritable::Installing)
    );
    assert_eq!(d.p.epoch(Partition(1)), Some(Epoch(8)));
    let installs = d.requests(ms(2));
    assert_eq!(installs.len(), 2);
    let StoreOp::Install {
        partition,
        epoch,
        holder,
    } = &installs[1].op
    else {
        unreachable!()
    };
    assert_eq!((*partition, *epoch), (Partition(1), Epoch(8)));
    assert_eq!((holder.instance.as_str(), holder.incarnation), ("a", 9));
    d.reply(
        ms(3),
        &installs[1],
        Reply::Installed {
            epoch: Epoch(8),
            ours: true,
        },
    );
    assert_eq!(
        d.events(),
        [LeaseEvent::Writable {
            partition: Partition(1),
            epoch: Epoch(8)
        }]
    );
    let grant = d.p.begin_write(ms(3), Partition(1)).unwrap();
    assert_eq!(grant.epoch, Epoch(8));
    assert_eq!(
        d.p.begin_write(ms(3), Partition(0)),
        Err(NotWritable::Installing)
    );
    assert_eq!(
        d.p.begin_write(ms(3), Partition(5)),
        Err(NotWritable::NotHeld)
    );
    assert!(d.p.end_write(ms(4), grant));
}

#[test]
fn a_grant_at_or_below_its_floor_is_never_used() {
    // S-L10: a store that broke the epoch rule does not make the policy
    // reuse an epoch.
    let mut d = Drive::new(config(1));
    d.heartbeat(Time::ZERO, &["a"]);
    let floors = only(&d.requests(Time::ZERO), "sink_epochs");
    let epochs = vec![(Partition(0), Epoch(5))];
    d.reply(Time::ZERO, &floors, Reply::SinkEpochs { epochs });
    let acquire = only(&d.requests(Time::ZERO), "acquire");
    let granted = vec![(Partition(0), Epoch(5))];
    d.reply(Time::ZERO, &acquire, Reply::Acquired { granted });
    let release = only(&d.requests(Time::ZERO), "release");
    assert_eq!(
        release.op,
        StoreOp::Release {
            instance: id("a"),
            leases: vec![(Partition(0), Epoch(5))]
        }
    );
    assert_eq!(d.p.partition(Partition(0)), PartitionState::Idle);
}

#[test]
fn the_deadline_runs_from_the_send_of_the_request_that_succeeded() {
    // S-L4: acquired by a request sent at 0 and answered at 300 ms: the
    // deadline is 0 + 1 s - 100 ms, whenever the reply came.
    let mut d = Drive::new(config(1));
    d.heartbeat(Time::ZERO, &["a"]);
    let floors = only(&d.requests(Time::ZERO), "sink_epochs");
    d.reply(Time::ZERO, &floors, Reply::SinkEpochs { epochs: vec![] });
    let acquire = only(&d.requests(Time::ZERO), "acquire");
    let granted = vec![(Partition(0), Epoch(1))];
    d.reply(ms(150), &acquire, Reply::Acquired { granted });
    let install = only(&d.requests(ms(150)), "install");
    let installed = Reply::Installed {
        epoch: Epoch(1),
        ours: true,
    };
    d.reply(ms(160), &install, installed);
    assert_eq!(
        d.p.partition(Partition(0)),
        PartitionState::Writable {
            epoch: Epoch(1),
            deadline: ms(900)
        }
    );
    // The first renewal goes one period after the acquire was sent.
    let rs = d.requests(ms(200));
    let renew = only(&rs, "renew");
    assert_eq!(
        renew.op,
        StoreOp::Renew {
            instance: id("a"),
            ttl: 1_000 * MS,
            leases: vec![(Partition(0), Epoch(1))]
        }
    );
    d.reply(
        ms(290),
        &renew,
        Reply::Renewed {
            renewed: vec![Partition(0)],
        },
    );
    assert_eq!(
        d.p.partition(Partition(0)),
        PartitionState::Writable {
            epoch: Epoch(1),
            deadline: ms(1_100)
        },
        "200 ms + 1 s - 100 ms: the reply's time does not count"
    );
    assert_eq!(d.p.health(ms(300)).margin, Some(800 * MS));
    assert_eq!(d.p.health(ms(300)).last_renewed, Some(ms(200)));
}

#[test]
fn no_write_starts_at_or_after_the_deadline_even_without_a_timeout_call() {
    // S-L8.
    let mut d = Drive::new(config(1));
    d.own_all(Time::ZERO, 1);
    assert!(d.p.begin_write(ms(899), Partition(0)).is_ok());
    assert_eq!(
        d.p.begin_write(ms(900), Partition(0)),
        Err(NotWritable::Stopped(StopCause::DeadlinePassed))
    );
    let events = d.events();
    assert_eq!(
        events,
        [LeaseEvent::Stopped {
            partition: Partition(0),
            epoch: Epoch(1),
            cause: StopCause::DeadlinePassed
        }]
    );
    let h = d.p.health(ms(900));
    assert_eq!(h.last_loss, Some((StopCause::DeadlinePassed, ms(900))));
    assert_eq!(h.counters.lost(), 1);
    assert_eq!(h.writes_in_flight, 1);
}

#[test]
fn renewals_cover_every_held_lease_in_one_statement_each_period() {
    // S-L5, S-L6.
    let mut d = Drive::new(config(3));
    d.own_all(Time::ZERO, 4);
    for t in [200, 400, 600] {
        let rs = d.requests(ms(t));
        let renew = only(&rs, "renew");
        let StoreOp::Renew { leases, .. } = &renew.op else {
            unreachable!()
        };
        assert_eq!(leases.len(), 3);
        let renewed = leases.iter().map(|&(p, _)| p).collect();
        d.reply(ms(t + 5), &renew, Reply::Renewed { renewed });
        for r in d.requests(ms(t + 5)) {
            let members = vec![id("a")];
            d.reply(
                ms(t + 5),
                &r,
                Reply::Members {
                    members,
                    owners: vec![],
                },
            );
        }
    }
    assert_eq!(d.p.counters().renewals, 3);
    assert!(
        d.p.begin_write(ms(1_450), Partition(2)).is_ok(),
        "600 + 900"
    );
    assert!(d.p.begin_write(ms(1_500), Partition(2)).is_err());
}

#[test]
fn a_refused_renewal_loses_the_partition_without_a_release() {
    // S-L15.
    let mut d = Drive::new(config(2));
    d.own_all(Time::ZERO, 1);
    let renew = only(&d.requests(ms(200)), "renew");
    d.reply(
        ms(201),
        &renew,
        Reply::Renewed {
            renewed: vec![Partition(1)],
        },
    );
    assert_eq!(
        d.events(),
        [LeaseEvent::Stopped {
            partition: Partition(0),
            epoch: Epoch(1),
            cause: StopCause::RenewalRefused
        }]
    );
    assert_eq!(
        d.p.begin_write(ms(201), Partition(0)),
        Err(NotWritable::Stopped(StopCause::RenewalRefused))
    );
    let rs = d.requests(ms(201));
    assert!(rs.iter().all(|r| r.op.name() != "release"), "{rs:?}");
    assert_eq!(
        d.events(),
        [LeaseEvent::Released {
            partition: Partition(0),
            epoch: Epoch(1)
        }]
    );
    assert_eq!(d.p.counters().renewals_refused, 1);
    assert_eq!(d.p.counters().stopped(StopCause::RenewalRefused), 1);
}

#[test]
fn a_stale_epoch_write_loses_the_partition_and_a_release_waits_for_its_writes() {
    // S-L15, S-L17.
    let mut d = Drive::new(config(1).write_timeout(300 * MS));
    d.own_all(Time::ZERO, 2);
    let a = d.p.begin_write(ms(10), Partition(0)).unwrap();
    let b = d.p.begin_write(ms(20), Partition(0)).unwrap();
    d.p.handle_stale_epoch(ms(30), Partition(0), Epoch(1));
    assert!(
        d.events().is_empty(),
        "an older epoch's write changes nothing"
    );
    d.p.handle_stale_epoch(ms(30), Partition(0), Epoch(2));
    assert_eq!(
        d.events(),
        [LeaseEvent::Stopped {
            partition: Partition(0),
            epoch: Epoch(2),
            cause: StopCause::StaleEpoch
        }]
    );
    assert!(d.p.end_write(ms(40), a));
    assert!(d.requests(ms(40)).iter().all(|r| r.op.name() != "release"));
    assert_eq!(d.p.writes_in_flight(Partition(0)), 1);
    // b started at 20 ms: it stops holding the release up at 320 ms.
    assert!(d.p.poll_timeout().unwrap() <= ms(320));
    assert!(d.requests(ms(319)).iter().all(|r| r.op.name() != "release"));
    let release = only(&d.requests(ms(320)), "release");
    d.reply(ms(321), &release, Reply::Released);
    assert_eq!(
        d.events(),
        [LeaseEvent::Released {
            partition: Partition(0),
            epoch: Epoch(2)
        }]
    );
    assert!(!d.p.end_write(ms(400), b) || d.p.writes_in_flight(Partition(0)) == 0);
    assert_eq!(d.p.counters().stale_epoch_writes, 2);
}

#[test]
fn without_a_write_timeout_a_release_waits_for_every_write() {
    let mut d = Drive::new(config(1));
    d.own_all(Time::ZERO, 1);
    let w = d.p.begin_write(ms(10), Partition(0)).unwrap();
    d.p.shutdown(ms(20), Departure::Rejoin);
    assert_eq!(d.p.health(ms(20)).state, LeaseState::ShuttingDown);
    let rs = d.requests(ms(5_000));
    assert!(rs.iter().all(|r| r.op.name() != "release"), "{rs:?}");
    d.p.end_write(ms(5_000), w);
    let release = only(&d.requests(ms(5_000)), "release");
    d.reply(ms(5_001), &release, Reply::Released);
    assert!(d.p.is_shut_down());
    assert_eq!(d.p.poll_request(ms(6_000)), None);
    assert_eq!(d.p.poll_timeout(), None);
    assert_eq!(d.p.health(ms(6_000)).state, LeaseState::ShutDown);
}

#[test]
fn a_superseded_install_is_released_without_becoming_writable() {
    // S-L11.
    for (epoch, ours) in [(Epoch(4), false), (Epoch(5), true)] {
        let mut d = Drive::new(config(1));
        d.heartbeat(Time::ZERO, &["a"]);
        let floors = only(&d.requests(Time::ZERO), "sink_epochs");
        d.reply(Time::ZERO, &floors, Reply::SinkEpochs { epochs: vec![] });
        let acquire = only(&d.requests(Time::ZERO), "acquire");
        let granted = vec![(Partition(0), Epoch(4))];
        d.reply(Time::ZERO, &acquire, Reply::Acquired { granted });
        let install = only(&d.requests(Time::ZERO), "install");
        d.reply(ms(1), &install, Reply::Installed { epoch, ours });
        assert!(d.events().is_empty());
        assert_eq!(
            d.p.begin_write(ms(1), Partition(0)),
            Err(NotWritable::Stopped(StopCause::Superseded))
        );
        let release = only(&d.requests(ms(1)), "release");
        d.reply(ms(2), &release, Reply::Released);
        assert!(d.events().is_empty(), "never writable, nothing handed over");
        // It is tried again at the next acquire poll.
        let floors = only(&d.requests(ms(100)), "sink_epochs");
        assert_eq!(floors.op.name(), "sink_epochs");
    }
}

#[test]
fn a_failed_install_is_retried_and_the_lease_renewed_meanwhile() {
    let mut d = Drive::new(config(1));
    d.heartbeat(Time::ZERO, &["a"]);
    let floors = only(&d.requests(Time::ZERO), "sink_epochs");
    d.reply(Time::ZERO, &floors, Reply::SinkEpochs { epochs: vec![] });
    let acquire = only(&d.requests(Time::ZERO), "acquire");
    let granted = vec![(Partition(0), Epoch(1))];
    d.reply(Time::ZERO, &acquire, Reply::Acquired { granted });
    let install = only(&d.requests(Time::ZERO), "install");
    // A zombie holds the sink's epoch row: the lock_timeout fails it.
    d.p.handle_reply(ms(50), install.id, Err(StoreError::Failed))
        .unwrap();
    assert!(d.requests(ms(149)).iter().all(|r| r.op.name() != "install"));
    let rs = d.requests(ms(150));
    let again = only(&rs, "install");
    assert!(rs.iter().all(|r| r.op.name() != "renew"));
    let renew = only(&d.requests(ms(200)), "renew");
    d.reply(
        ms(201),
        &renew,
        Reply::Renewed {
            renewed: vec![Partition(0)],
        },
    );
    d.reply(
        ms(202),
        &again,
        Reply::Installed {
            epoch: Epoch(1),
            ours: true,
        },
    );
    assert_eq!(
        d.p.partition(Partition(0)),
        PartitionState::Writable {
            epoch: Epoch(1),
            deadline: ms(1_100)
        }
    );
    assert_eq!(d.p.counters().install_failures, 1);
}

#[test]
fn a_rebalance_stops_the_partition_then_releases_it_keeping_it_renewed_meanwhile() {
    // S-L17, S-L19.
    let mut d = Drive::new(config(2));
    d.own_all(Time::ZERO, 1);
    let w = d.p.begin_write(ms(10), Partition(0)).unwrap();
    // b joins: the plan gives it one of the two partitions.
    let rs = d.requests(ms(100));
    let hb = only(&rs, "heartbeat");
    let owners = vec![(Partition(0), id("a")), (Partition(1), id("a"))];
    let members = vec![id("a"), id("b")];
    d.reply(ms(101), &hb, Reply::Members { members, owners });
    let plan = Plan::new(
        2,
        [id("a"), id("b")],
        [(Partition(0), id("a")), (Partition(1), id("a"))],
    );
    let given: Vec<Partition> = plan.share(&id("b")).into_iter().collect();
    assert_eq!(given.len(), 1);
    let gone = given[0];
    assert_eq!(d.p.share(), &plan.share(&id("a")));
    assert_eq!(
        d.events(),
        [LeaseEvent::Stopped {
            partition: gone,
            epoch: Epoch(1),
            cause: StopCause::Rebalance
        }]
    );
    assert!(d.p.begin_write(ms(101), gone).is_err());
    if gone == Partition(0) {
        // Its write in flight holds the release up; the lease is renewed.
        let renew = only(&d.requests(ms(200)), "renew");
        let StoreOp::Renew { leases, .. } = &renew.op else {
            unreachable!()
        };
        assert!(leases.contains(&(Partition(0), Epoch(1))));
        d.p.end_write(ms(210), w);
    } else {
        d.p.end_write(ms(101), w);
    }
    let release = only(&d.requests(ms(210)), "release");
    assert_eq!(
        release.op,
        StoreOp::Release {
            instance: id("a"),
            leases: vec![(gone, Epoch(1))]
        }
    );
    d.reply(ms(211), &release, Reply::Released);
    assert_eq!(
        d.events(),
        [LeaseEvent::Released {
            partition: gone,
            epoch: Epoch(1)
        }]
    );
    assert_eq!(d.p.counters().handovers, 1);
    assert_eq!(d.p.counters().lost(), 0);
}

#[test]
fn a_leaving_shutdown_deletes_the_heartbeat_row_after_every_release() {
    // S-L28.
    let mut d = Drive::new(config(2));
    d.own_all(Time::ZERO, 1);
    d.p.shutdown(ms(10), Departure::Leave);
    assert_eq!(d.events().len(), 2);
    let release = only(&d.requests(ms(10)), "release");
    assert!(
        d.requests(ms(10)).is_empty(),
        "no leave before the release is answered"
    );
    d.reply(ms(11), &release, Reply::Released);
    let leave = only(&d.requests(ms(11)), "leave");
    assert!(!d.p.is_shut_down());
    d.reply(ms(12), &leave, Reply::Left);
    assert!(d.p.is_shut_down());
    assert_eq!(d.events().len(), 2, "two Released");
}

#[test]
fn a_late_grant_is_released_and_an_unanswered_request_given_up() {
    // S-L2, S-L10.
    let mut d = Drive::new(config(1));
    d.heartbeat(Time::ZERO, &["a"]);
    let floors = only(&d.requests(Time::ZERO), "sink_epochs");
    d.reply(Time::ZERO, &floors, Reply::SinkEpochs { epochs: vec![] });
    let acquire = only(&d.requests(Time::ZERO), "acquire");
    // No reply within the request timeout (one renewal period).
    assert!(d.p.poll_timeout().unwrap() <= ms(200));
    d.p.handle_timeout(ms(200));
    assert_eq!(d.p.partition(Partition(0)), PartitionState::Idle);
    let late = d.p.handle_reply(
        ms(250),
        acquire.id,
        Ok(Reply::Acquired {
            granted: vec![(Partition(0), Epoch(1))],
        }),
    );
    assert_eq!(late, Err(ReplyError::Unknown(acquire.id)));
    let rs = d.requests(ms(250));
    let release = only(&rs, "release");
    let StoreOp::Release { leases, .. } = &release.op else {
        unreachable!()
    };
    assert_eq!(leases, &[(Partition(0), Epoch(1))]);
}

#[test]
fn a_reply_of_the_wrong_operation_is_refused_and_taken_as_a_failure() {
    let mut d = Drive::new(config(1));
    let hb = only(&d.requests(Time::ZERO), "heartbeat");
    let err =
        d.p.handle_reply(ms(1), hb.id, Ok(Reply::Released))
            .unwrap_err();
    assert_eq!(
        err,
        ReplyError::Mismatch {
            id: hb.id,
            expected: "heartbeat",
            got: "release"
        }
    );
    assert!(err.to_string().contains("heartbeat"));
    assert_eq!(d.p.counters().heartbeat_failures, 1);
    assert_eq!(
        d.p.handle_reply(ms(1), hb.id, Ok(Reply::Left)),
        Err(ReplyError::Unknown(hb.id)),
        "answered once"
    );
}

#[test]
fn while_the_store_is_unreachable_leases_stop_at_their_deadline_and_health_says_why() {
    // S-L24.
    let mut d = Drive::new(config(2));
    d.own_all(Time::ZERO, 1);
    let mut t = 0;
    while t < 1_000 {
        t += 10;
        for r in d.requests(ms(t)) {
            d.p.handle_reply(ms(t), r.id, Err(StoreError::Failed))
                .unwrap();
        }
    }
    let h = d.p.health(ms(1_000));
    assert_eq!(h.state, LeaseState::StoreUnreachable { since: ms(100) });
    assert_eq!(h.writable, 0);
    assert_eq!(h.last_loss, Some((StopCause::DeadlinePassed, ms(900))));
    assert!(h.renewal_failures >= 4, "{h:?}");
    let stops: Vec<LeaseEvent> = d
        .events()
        .into_iter()
        .filter(|e| matches!(e, LeaseEvent::Stopped { .. }))
        .collect();
    assert_eq!(stops.len(), 2);
}

#[test]
fn an_older_view_does_not_overwrite_a_newer_one() {
    let mut d = Drive::new(config(4));
    let first = only(&d.requests(Time::ZERO), "heartbeat");
    let second = only(&d.requests(ms(100)), "heartbeat");
    let members = vec![id("a"), id("b")];
    d.reply(
        ms(101),
        &second,
        Reply::Members {
            members,
            owners: vec![],
        },
    );
    let two = d.p.share().clone();
    assert_eq!(two.len(), 2);
    let members = vec![id("a")];
    d.reply(
        ms(102),
        &first,
        Reply::Members {
            members,
            owners: vec![],
        },
    );
    assert_eq!(d.p.share(), &two, "the older view came last and is ignored");
    assert_eq!(d.p.health(ms(102)).members, 2);
}

#[test]
fn time_never_runs_backwards() {
    let mut d = Drive::new(config(1));
    d.own_all(ms(0), 1);
    d.p.handle_timeout(ms(950));
    assert!(
        d.p.begin_write(ms(10), Partition(0)).is_err(),
        "950 ms was seen"
    );
}

#[test]
fn more_members_than_partitions_stand_by() {
    let mut d = Drive::new(config(1));
    let hb = only(&d.requests(Time::ZERO), "heartbeat");
    let members = vec![id("a"), id("b")];
    let owners = vec![(Partition(0), id("b"))];
    d.reply(ms(1), &hb, Reply::Members { members, owners });
    assert!(d.p.share().is_empty());
    assert_eq!(d.p.health(ms(1)).state, LeaseState::Standby);
    assert!(d.requests(ms(1)).is_empty());
}
