//! The lease policy's timing facts (S-L21-S-L24), each proven in the
//! deterministic world of `tests/lease_world` over many seeds: clocks
//! skewed in rate within `max_clock_drift` (S-L7), links of 1-3 ms each
//! way, writes of 1-30 ms in flight all along, and no fault but the one
//! each test names. Times are the world's real time, which is the store's
//! clock here.

mod lease_world;

use std::collections::{BTreeMap, BTreeSet};

use lease_world::*;
use outbox::core::lease::{
    Departure, LeaseEvent, LeaseState, Partition, PartitionState, StopCause,
};
use outbox::core::Time;

const NAMES: [&str; 4] = ["relay-a", "relay-b", "relay-c", "relay-d"];

/// Three hosts started 10 ms apart and run until their shares are
/// writable (it takes well under 2 s).
fn three(partitions: u32, seed: u64) -> World {
    let mut w = World::new(Setup::fast(partitions, seed), &NAMES);
    for h in 0..3 {
        w.at(ms(h as u64 * 10), Action::Start(h));
    }
    let settled = w.run_while(ms(2_000), |w| w.converged().is_ok());
    assert!(settled.is_some(), "seed {seed}: {:?}", w.converged());
    w
}

fn writers(w: &World) -> BTreeMap<Partition, usize> {
    (0..w.setup.partitions)
        .map(Partition)
        .map(|p| (p, w.writer_of(p)[0]))
        .collect()
}

fn clean(w: &World, seed: u64) {
    assert_eq!(w.violations, Vec::<String>::new(), "seed {seed}");
    assert!(w.commits > 0, "seed {seed}: the world wrote");
}

#[test]
fn a_joining_instance_owns_its_share_within_two_renewal_periods_of_its_first_heartbeat() {
    // S-L22, and S-L19: only the joiner's share moves.
    for seed in 0..40 {
        let partitions = [8, 16, 64][seed as usize % 3];
        let mut w = three(partitions, seed);
        let before = writers(&w);
        let join = w.t + 50 * MS;
        w.at(join, Action::Start(3));
        w.run_until(join);
        let first = w.hosts[3].first_heartbeat.expect("heartbeat at start");
        let bound = first + 2 * w.setup.renew;
        let owned = w.run_while(bound + 2 * w.setup.renew, |w| {
            w.hosts[3]
                .policy
                .as_ref()
                .is_some_and(|p| !p.share().is_empty())
                && w.writable(3) == *w.hosts[3].policy.as_ref().unwrap().share()
        });
        let owned = owned.expect("the joiner owns its share");
        assert!(
            owned <= bound,
            "seed {seed}: owned at {owned}, first heartbeat {first}"
        );
        w.run_while(owned + 500 * MS, |w| w.converged().is_ok())
            .unwrap_or_else(|| panic!("seed {seed}: {:?}", w.converged()));
        let share = w.writable(3);
        assert_eq!(share.len(), partitions as usize / 4, "seed {seed}");
        let after = writers(&w);
        let moved: BTreeSet<Partition> = before
            .iter()
            .filter(|(p, h)| after[p] != **h)
            .map(|(p, _)| *p)
            .collect();
        assert_eq!(moved, share, "seed {seed}: only the joiner's share moved");
        clean(&w, seed);
    }
}

#[test]
fn a_dead_owners_partitions_are_owned_again_within_ttl_plus_renewal_plus_acquire_poll() {
    // S-L23, and S-L19: only the dead owner's partitions move.
    for seed in 0..40 {
        let partitions = [8, 16, 64][seed as usize % 3];
        let mut w = three(partitions, seed);
        let before = writers(&w);
        let dead = 1 + (seed as usize % 2);
        let orphans = w.writable(dead);
        let crash = w.t + 37 * MS;
        w.at(crash, Action::Crash(dead));
        w.run_until(crash);
        let s = w.setup.clone();
        let bound = crash + s.ttl + s.renew + s.acquire_poll;
        let owned = w.run_while(bound + s.ttl, |w| {
            orphans.iter().all(|&p| w.writer_of(p).len() == 1)
        });
        let owned = owned.expect("the orphans are owned again");
        assert!(owned <= bound, "seed {seed}: owned {owned}, crash {crash}");
        assert!(
            owned >= crash + (s.ttl - s.drift),
            "not before the dead lease could expire"
        );
        w.run_while(owned + 500 * MS, |w| w.converged().is_ok())
            .unwrap_or_else(|| panic!("seed {seed}: {:?}", w.converged()));
        let after = writers(&w);
        for (p, h) in &before {
            if *h != dead {
                assert_eq!(after[p], *h, "seed {seed}: {p} moved off a live owner");
            }
        }
        clean(&w, seed);
    }
}

/// Each partition's owners, in order, from the log's `Writable` events
/// since record `from`, starting with its writer then.
fn owner_changes(
    w: &World,
    from: usize,
    start: &BTreeMap<Partition, usize>,
) -> BTreeMap<Partition, Vec<String>> {
    let mut owners: BTreeMap<Partition, Vec<String>> = start
        .iter()
        .map(|(p, h)| (*p, vec![w.hosts[*h].name.clone()]))
        .collect();
    for r in &w.log[from..] {
        if let Record::Event {
            host,
            event: LeaseEvent::Writable { partition, .. },
            ..
        } = r
        {
            let names = owners.entry(*partition).or_default();
            let name = &w.hosts[*host].name;
            if names.last() != Some(name) {
                names.push(name.clone());
            }
        }
    }
    owners
}

#[test]
fn a_rolling_deploy_moves_each_partition_at_most_once() {
    // S-L21: each instance shuts down (rejoining) and comes back under its
    // id 300 ms later, one after the other.
    for seed in 0..30 {
        let partitions = [8, 16, 64][seed as usize % 3];
        let mut w = three(partitions, seed);
        let (from, start) = (w.log.len(), writers(&w));
        for h in 0..3 {
            let stop = w.t + 20 * MS;
            w.at(stop, Action::Shutdown(h, Departure::Rejoin));
            w.at(stop + 300 * MS, Action::Start(h));
            w.run_until(stop + 300 * MS);
            let back = w.run_while(w.t + w.setup.ttl, |w| w.converged().is_ok());
            assert!(back.is_some(), "seed {seed}: {:?}", w.converged());
            assert!(
                back.unwrap() <= stop + 300 * MS + 2 * w.setup.renew,
                "seed {seed}: the restarted instance took its partitions back at once"
            );
        }
        for (p, owners) in owner_changes(&w, from, &start) {
            assert!(owners.len() <= 2, "seed {seed}: {p} went {owners:?}");
            assert_eq!(
                owners.len(),
                1,
                "seed {seed}: {p} went {owners:?}: no move at all"
            );
        }
        clean(&w, seed);
    }
}

#[test]
fn an_instance_restarting_within_rejoin_grace_gets_its_partitions_back_without_a_rebalance() {
    // S-L21: killed (no release) and restarted under its id within the
    // grace, it waits out its old leases; no other instance takes them.
    for seed in 0..30 {
        let mut w = three(16, seed);
        let (from, start) = (w.log.len(), writers(&w));
        let victim = seed as usize % 3;
        let held = w.writable(victim);
        let crash = w.t + 11 * MS;
        w.at(crash, Action::Crash(victim));
        w.at(crash + 400 * MS, Action::Start(victim));
        let s = w.setup.clone();
        let bound = crash + s.ttl + s.acquire_poll + s.renew;
        let back = w.run_while(bound + s.ttl, |w| w.writable(victim) == held);
        assert!(
            back.is_some_and(|t| t <= bound),
            "seed {seed}: back {back:?}"
        );
        for (p, owners) in owner_changes(&w, from, &start) {
            assert_eq!(owners.len(), 1, "seed {seed}: {p} went {owners:?}");
        }
        w.converged().unwrap();
        clean(&w, seed);
    }
}

#[test]
fn while_the_store_is_unreachable_every_instance_stops_starting_writes_at_its_lease_deadline() {
    // S-L24, S-L8.
    for seed in 0..30 {
        let mut w = three(16, seed);
        // A few renewals first, in some seeds.
        let down = w.t + [23, 250, 610][seed as usize % 3] * MS;
        w.at(down, Action::StoreDown(3_000 * MS));
        let held: Vec<usize> = (0..3).map(|h| w.writable(h).len()).collect();
        // Each lease's deadline as its host last computed it.
        let mut deadlines: BTreeMap<(usize, Partition), Time> = BTreeMap::new();
        w.run_while(down + w.setup.ttl + 50 * MS, |w| {
            for h in 0..3 {
                for p in w.writable(h) {
                    let state = w.hosts[h].policy.as_ref().unwrap().partition(p);
                    if let PartitionState::Writable { deadline, .. } = state {
                        deadlines.insert((h, p), deadline);
                    }
                }
            }
            false
        });
        for h in 0..3 {
            let name = w.hosts[h].name.clone();
            let health = w.hosts[h].policy.as_ref().unwrap().health(w.local(h));
            assert!(
                matches!(health.state, LeaseState::StoreUnreachable { .. }),
                "seed {seed} {name}: {health:?}"
            );
            assert_eq!(health.writable, 0);
            assert_eq!(
                health.last_loss.map(|l| l.0),
                Some(StopCause::DeadlinePassed)
            );
            let stops: Vec<(Time, Partition)> = w
                .log
                .iter()
                .filter_map(|r| match r {
                    Record::Event {
                        t,
                        host,
                        event:
                            LeaseEvent::Stopped {
                                partition,
                                cause: StopCause::DeadlinePassed,
                                ..
                            },
                    } if *host == h => Some((*t, *partition)),
                    _ => None,
                })
                .collect();
            assert_eq!(
                stops.len(),
                held[h],
                "seed {seed} {name}: each held lease stopped"
            );
            for &(t, p) in &stops {
                // It stopped at the deadline it had computed, not before,
                // and no write of it started after.
                let at = w.hosts[h].clock.real_at(Time::ZERO, deadlines[&(h, p)]);
                assert!(
                    t >= at,
                    "seed {seed} {name}: {p} stopped before its deadline"
                );
                assert!(
                    t <= at + MS,
                    "seed {seed} {name}: {p} stopped late ({t} vs {at})"
                );
                let late_write = w.log.iter().any(|r| {
                    matches!(r, Record::Write { t: wt, host, partition, .. }
                        if *host == h && *partition == p && *wt >= at)
                });
                assert!(
                    !late_write,
                    "seed {seed} {name}: a write of {p} after its deadline"
                );
                // The last renewal that succeeded ran before the outage, so
                // the store's expiry is at most one ttl after it began.
                assert!(at < down + w.setup.ttl, "seed {seed} {name}: {p}");
            }
        }
        // The store comes back: every partition is owned again.
        w.run_until(down + 3_000 * MS);
        let s = w.setup.clone();
        let bound = w.t + s.ttl + s.renew + s.acquire_poll;
        let back = w.run_while(bound, |w| w.converged().is_ok());
        assert!(back.is_some(), "seed {seed}: {:?}", w.converged());
        clean(&w, seed);
    }
}

#[test]
fn instances_beyond_the_partitions_stand_by_and_take_over_from_a_dead_owner() {
    // S-L18, S-L23.
    for seed in 0..10 {
        let mut w = World::new(Setup::fast(2, seed), &NAMES);
        for h in 0..4 {
            w.at(ms(h as u64 * 10), Action::Start(h));
        }
        w.run_while(ms(2_000), |w| w.converged().is_ok())
            .expect("converged");
        let standing: Vec<usize> = (0..4).filter(|&h| w.writable(h).is_empty()).collect();
        assert_eq!(standing.len(), 2, "seed {seed}");
        for &h in &standing {
            let health = w.hosts[h].policy.as_ref().unwrap().health(w.local(h));
            assert_eq!(health.state, LeaseState::Standby);
        }
        let owner = (0..4).find(|h| !standing.contains(h)).unwrap();
        let crash = w.t + 5 * MS;
        w.at(crash, Action::Crash(owner));
        w.run_until(crash);
        let s = w.setup.clone();
        let bound = crash + s.ttl + s.renew + s.acquire_poll;
        let t = w.run_while(bound, |w| w.converged().is_ok());
        assert!(t.is_some(), "seed {seed}: {:?}", w.converged());
        assert!(standing.iter().any(|&h| !w.writable(h).is_empty()));
        clean(&w, seed);
    }
}

#[test]
fn a_leaving_instance_hands_its_partitions_over_at_the_others_next_heartbeat() {
    // S-L28: no wait for the grace.
    for seed in 0..10 {
        let mut w = three(16, seed);
        let leave = w.t + 5 * MS;
        w.at(leave, Action::Shutdown(2, Departure::Leave));
        let s = w.setup.clone();
        let bound = leave + s.heartbeat + s.acquire_poll + 100 * MS;
        let t = w.run_while(bound, |w| w.converged().is_ok() && !w.hosts[2].up());
        assert!(t.is_some(), "seed {seed}: {:?}", w.converged());
        let state = w.hosts[2].policy.as_ref().unwrap().partition(Partition(0));
        assert_eq!(state, PartitionState::Idle);
        assert!(w.hosts[2].policy.as_ref().unwrap().is_shut_down());
        clean(&w, seed);
    }
}
