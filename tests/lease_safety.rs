//! The lease policy against its world under faults (S-L4, S-L8, S-L10-
//! S-L12, S-L14, S-L15): several instances, a lease table with its own
//! clock, each instance's clock skewed in rate and stepped within
//! `max_clock_drift`, delays, lost messages and replies, a store that goes
//! down, instances cut off, paused beyond the ttl, crashed and restarted,
//! leaving and coming back, and the lease table rolled back by a failover.
//!
//! Checked at every step (`tests/lease_world`): no instance starts a write
//! under a lease the store already takes for expired, on the store's
//! clock; every write starts under the epoch installed at the sink for its
//! holder; granted epochs only grow, and an epoch is installed for one
//! holder only; committed writes of a partition never go back in epoch.
//! Then, once the faults heal, every partition is owned by exactly one
//! instance, the shares balanced, and the timing facts hold from whatever
//! the faults left: a host that joins owns its share within two renewal
//! periods of its first heartbeat, and a dead owner's partitions are owned
//! again within one ttl, one renewal period and one acquire poll.
//!
//! Cases: `OUTBOX_LEASE_CASES` (default 96) from a fixed seed
//! (`OUTBOX_LEASE_SEED` explores others); failures are kept in
//! `proptest-regressions/lease_safety.txt` and replayed first.

mod lease_world;

use std::collections::BTreeMap;
use std::time::Duration;

use lease_world::*;
use outbox::core::lease::Departure;
use outbox::core::Time;
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, RngSeed};

/// Faults happen in the first 6 s (six ttls); then 3 s healed.
const FAULTS_MS: u64 = 6_000;
const HEALED_MS: u64 = 3_000;

#[derive(Clone, Debug)]
enum Fault {
    Pause {
        host: usize,
        at: u64,
        ms: u64,
    },
    Crash {
        host: usize,
        at: u64,
        down: u64,
    },
    CutOff {
        host: usize,
        at: u64,
        ms: u64,
    },
    StoreDown {
        at: u64,
        ms: u64,
    },
    Loss {
        at: u64,
        ms: u64,
        pct: u32,
    },
    Slow {
        at: u64,
        ms: u64,
        extra: u64,
    },
    /// A clock step of up to a quarter of the drift (`host: None`: the
    /// store's).
    Step {
        host: Option<usize>,
        at: u64,
        us: i64,
    },
    Leave {
        host: usize,
        at: u64,
        back: u64,
    },
    Rollback {
        snap: u64,
        after: u64,
    },
}

fn fault() -> impl Strategy<Value = Fault> {
    let host = 0usize..5;
    let at = 0u64..FAULTS_MS;
    prop_oneof![
        3 => (host.clone(), at.clone(), 50u64..3_500).prop_map(|(host, at, ms)| Fault::Pause { host, at, ms }),
        2 => (host.clone(), at.clone(), 0u64..2_500).prop_map(|(host, at, down)| Fault::Crash { host, at, down }),
        2 => (host.clone(), at.clone(), 50u64..2_500).prop_map(|(host, at, ms)| Fault::CutOff { host, at, ms }),
        1 => (at.clone(), 50u64..2_000).prop_map(|(at, ms)| Fault::StoreDown { at, ms }),
        2 => (at.clone(), 100u64..2_000, 5u32..60).prop_map(|(at, ms, pct)| Fault::Loss { at, ms, pct }),
        1 => (at.clone(), 100u64..2_000, 5u64..250).prop_map(|(at, ms, extra)| Fault::Slow { at, ms, extra }),
        3 => (prop::option::of(host.clone()), at.clone(), -25_000i64..=25_000)
            .prop_map(|(host, at, us)| Fault::Step { host, at, us }),
        1 => (host, at.clone(), 0u64..2_000).prop_map(|(host, at, back)| Fault::Leave { host, at, back }),
        1 => (at, 100u64..1_500).prop_map(|(snap, after)| Fault::Rollback { snap, after }),
    ]
}

#[derive(Clone, Debug)]
struct Case {
    hosts: usize,
    partitions: u32,
    seed: u64,
    /// When each host starts (some join late).
    starts: Vec<u64>,
    faults: Vec<Fault>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        2usize..=5,
        prop::sample::select(vec![1u32, 2, 3, 5, 8, 16]),
        any::<u64>(),
        prop::collection::vec(0u64..3_000, 5),
        prop::collection::vec(fault(), 0..14),
    )
        .prop_map(|(hosts, partitions, seed, starts, faults)| Case {
            hosts,
            partitions,
            seed,
            starts,
            faults,
        })
}

const NAMES: [&str; 6] = ["h0", "h1", "h2", "h3", "h4", "h5"];

/// Schedules the case's starts and faults; clock steps are kept at least
/// 2.5 ttls apart per clock, so no ttl window holds two (the drift budget,
/// S-L7). Returns the world and when the last fault ends.
fn world(c: &Case, setup: Setup) -> (World, Time) {
    // One more host than the case's: the joiner of the timing checks.
    let mut w = World::new(setup, &NAMES[..=c.hosts]);
    for h in 0..c.hosts {
        w.at(
            ms(c.starts[h].min(if h == 0 { 0 } else { 3_000 })),
            Action::Start(h),
        );
    }
    let mut last_step: BTreeMap<Option<usize>, u64> = BTreeMap::new();
    let mut end = 0u64;
    for f in &c.faults {
        let h = |h: usize| h % c.hosts;
        match *f {
            Fault::Pause { host, at, ms: d } => {
                w.at(ms(at), Action::Pause(h(host), Duration::from_millis(d)));
                end = end.max(at + d);
            }
            Fault::Crash { host, at, down } => {
                w.at(ms(at), Action::Crash(h(host)));
                w.at(ms(at + down), Action::Start(h(host)));
                end = end.max(at + down);
            }
            Fault::CutOff { host, at, ms: d } => {
                w.at(ms(at), Action::CutOff(h(host), Duration::from_millis(d)));
                end = end.max(at + d);
            }
            Fault::StoreDown { at, ms: d } => {
                w.at(ms(at), Action::StoreDown(Duration::from_millis(d)));
                end = end.max(at + d);
            }
            Fault::Loss { at, ms: d, pct } => {
                w.at(ms(at), Action::Loss(pct));
                w.at(ms(at + d), Action::Loss(0));
                end = end.max(at + d);
            }
            Fault::Slow { at, ms: d, extra } => {
                w.at(ms(at), Action::Slow(Duration::from_millis(extra)));
                w.at(ms(at + d), Action::Slow(Duration::ZERO));
                end = end.max(at + d);
            }
            Fault::Step { host, at, us } => {
                let clock = host.map(h);
                let spaced = last_step.get(&clock).is_none_or(|&t| at >= t + 2_500);
                if spaced {
                    last_step.insert(clock, at);
                    w.at(ms(at), Action::Step(clock, i128::from(us) * 1_000));
                }
            }
            Fault::Leave { host, at, back } => {
                w.at(ms(at), Action::Shutdown(h(host), Departure::Leave));
                w.at(ms(at + back), Action::Start(h(host)));
                end = end.max(at + back);
            }
            Fault::Rollback { snap, after } => {
                w.at(ms(snap), Action::Snapshot);
                w.at(ms(snap + after), Action::Rollback);
                end = end.max(snap + after);
            }
        }
    }
    (w, ms(end.max(3_000)))
}

/// Runs a case: faults, then healed; returns the world.
fn run(c: &Case, setup: Setup) -> World {
    let (mut w, end) = world(c, setup);
    w.run_until(end);
    // Heal: links and store fine; every host up (a crashed or left one is
    // started again, a shut-down one too), but the joiner.
    w.loss = 0;
    w.slow = Duration::ZERO;
    for h in 0..c.hosts {
        if !w.hosts[h].up() {
            w.at(end, Action::Start(h));
        }
    }
    let healed = end.max(
        w.hosts
            .iter()
            .map(|h| h.paused_until)
            .max()
            .unwrap_or(Time::ZERO),
    );
    w.run_until(healed);
    // Every lease of a run that died has expired within a ttl, every
    // membership settled within the grace, the plan then followed within
    // two renewal periods.
    let s = w.setup.clone();
    let bound = healed + s.ttl + s.grace + 2 * s.renew + s.acquire_poll;
    let converged = w.run_while(bound, |w| w.converged().is_ok());
    if converged.is_none() {
        let why = w.converged().unwrap_err();
        w.violations.push(format!(
            "not converged {bound} after the heal at {healed}: {why}"
        ));
    }
    w.run_until(w.t + Duration::from_millis(HEALED_MS));
    w
}

fn config() -> ProptestConfig {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    ProptestConfig {
        cases: var("OUTBOX_LEASE_CASES").map_or(96, |n| n.min(u64::from(u32::MAX)) as u32),
        rng_seed: RngSeed::Fixed(var("OUTBOX_LEASE_SEED").unwrap_or(0x1ea5_e5af)),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/lease_safety.txt",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn no_write_starts_under_an_expired_lease_and_epochs_only_grow(c in case()) {
        let w = run(&c, Setup::fast(c.partitions, c.seed));
        prop_assert!(w.violations.is_empty(), "{:#?}", w.violations);
        prop_assert!(w.commits > 0);
    }
}

/// The checks have teeth: a policy that judges its leases without the
/// drift margin (configured with 1 ns while the clocks drift by up to
/// 100 ms) starts writes the store takes for expired, once its renewals
/// stop getting through and its clock runs slow.
#[test]
fn a_lease_judged_without_the_drift_margin_is_caught() {
    let mut caught = 0;
    for seed in 0..20 {
        let mut setup = Setup::fast(4, seed);
        setup.assumed_drift = Duration::from_nanos(1);
        setup.write_gap = (MS, 2 * MS);
        let ppm = setup.max_ppm() as i64;
        let mut w = World::new(setup, &NAMES[..2]);
        w.at(Time::ZERO, Action::Start(0));
        w.at(ms(10), Action::Start(1));
        w.run_until(ms(1_500));
        w.skew(0, -ppm);
        w.skew(1, -ppm);
        w.at(ms(1_500), Action::Step(None, 25_000_000));
        w.at(ms(1_600), Action::CutOff(0, 2_000 * MS));
        w.at(ms(1_600), Action::CutOff(1, 2_000 * MS));
        w.run_until(ms(4_000));
        if w.violations.iter().any(|v| v.contains("takes for expired")) {
            caught += 1;
        }
    }
    assert!(caught >= 15, "caught in {caught} of 20 seeds");
}

/// The same scenario with the margin: clean.
#[test]
fn with_the_drift_margin_the_same_scenario_is_clean() {
    for seed in 0..20 {
        let mut setup = Setup::fast(4, seed);
        setup.write_gap = (MS, 2 * MS);
        let ppm = setup.max_ppm() as i64;
        let mut w = World::new(setup, &NAMES[..2]);
        w.at(Time::ZERO, Action::Start(0));
        w.at(ms(10), Action::Start(1));
        w.run_until(ms(1_500));
        w.skew(0, -ppm);
        w.skew(1, -ppm);
        w.at(ms(1_500), Action::Step(None, 25_000_000));
        w.at(ms(1_600), Action::CutOff(0, 2_000 * MS));
        w.at(ms(1_600), Action::CutOff(1, 2_000 * MS));
        w.run_until(ms(4_000));
        assert_eq!(w.violations, Vec::<String>::new(), "seed {seed}");
        assert!(w.writes_started > 500);
    }
}

/// A database failover rolls the lease table back (S-L11): epochs may be
/// handed out again by it, but the sink's install keeps each to one holder,
/// no write starts under an epoch not installed for its holder, and the
/// fleet owns every partition again.
#[test]
fn a_rolled_back_lease_table_never_lets_two_holders_write_one_epoch() {
    for seed in 0..30 {
        let mut w = World::new(Setup::fast(8, seed), &NAMES[..4]);
        for h in 0..3 {
            w.at(ms(h as u64 * 10), Action::Start(h));
        }
        w.at(ms(600), Action::Snapshot);
        w.at(ms(700), Action::Start(3));
        w.at(ms(1_300), Action::Crash(seed as usize % 3));
        w.at(ms(2_600 + seed * 10), Action::Rollback);
        w.run_until(ms(2_600 + seed * 10));
        assert!(w.rolled_back.is_some());
        let s = w.setup.clone();
        let restart = w.t;
        w.at(restart, Action::Start(seed as usize % 3));
        let bound = restart + s.ttl + s.grace + 2 * s.renew + s.acquire_poll;
        let t = w.run_while(bound, |w| w.converged().is_ok());
        assert!(t.is_some(), "seed {seed}: {:?}", w.converged());
        w.run_until(w.t + 500 * MS);
        assert_eq!(w.violations, Vec::<String>::new(), "seed {seed}");
    }
}

/// A pause longer than the ttl (S-L9): the paused owner's partitions are
/// taken over while its writes are open; when it wakes, those writes are
/// refused at the sink (`stale_epoch`), its leases stop at their passed
/// deadlines, and it starts no write until it holds a partition again.
#[test]
fn an_owner_paused_beyond_the_ttl_is_fenced_at_the_sink_and_starts_nothing_on_waking() {
    let mut fenced = 0;
    for seed in 0..20 {
        let mut setup = Setup::fast(8, seed);
        setup.write_len = (20 * MS, 60 * MS);
        let mut w = World::new(setup, &NAMES[..3]);
        for h in 0..3 {
            w.at(ms(h as u64 * 10), Action::Start(h));
        }
        w.run_while(ms(2_000), |w| w.converged().is_ok())
            .expect("converged");
        let pause = w.t + 3 * MS;
        w.run_until(pause);
        let open = w.writes_in_flight(0);
        w.at(pause, Action::Pause(0, 2_500 * MS));
        let wake = pause + 2_500 * MS;
        let (from, stale) = (w.log.len(), w.stale);
        w.run_until(wake + 20 * MS);
        fenced += usize::from(w.stale > stale);
        assert!(
            w.stale - stale <= open as u64,
            "seed {seed}: only the open writes"
        );
        // On waking, no write starts before a Writable event for it again.
        let mut writable = std::collections::BTreeSet::new();
        for r in w.log[from..]
            .iter()
            .filter(|r| !matches!(r, Record::Write { t, .. } if *t < wake))
        {
            match r {
                Record::Event {
                    host: 0,
                    event: outbox::core::lease::LeaseEvent::Writable { partition, .. },
                    ..
                } => {
                    writable.insert(*partition);
                }
                Record::Write {
                    host: 0,
                    partition,
                    t,
                    ..
                } => {
                    assert!(
                        writable.contains(partition),
                        "seed {seed}: {partition} written at {t} on waking"
                    );
                }
                _ => {}
            }
        }
        let s = w.setup.clone();
        let bound = w.t + s.ttl + s.grace + 2 * s.renew;
        w.run_while(bound, |w| w.converged().is_ok())
            .unwrap_or_else(|| panic!("seed {seed}: {:?}", w.converged()));
        assert_eq!(w.violations, Vec::<String>::new(), "seed {seed}");
    }
    assert!(fenced >= 15, "open writes fenced in {fenced} of 20 seeds");
}

/// The fault world reaches what it checks: over the proptest's first 48
/// cases, pauses beyond the ttl with writes open, writes fenced at the
/// sink, every way of losing a partition but a superseded install (which
/// needs a rolled-back table and a racing install), rebalances and
/// handovers. Prints the totals.
#[test]
fn the_fault_world_reaches_what_it_checks() {
    use outbox::core::lease::StopCause;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::new_with_rng(
        config(),
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let (mut pauses, mut open, mut stale, mut handovers, mut writes) = (0, 0, 0, 0, 0);
    let mut stops = BTreeMap::new();
    for _ in 0..48 {
        let c = case().new_tree(&mut runner).unwrap().current();
        let w = run(&c, Setup::fast(c.partitions, c.seed));
        assert!(w.violations.is_empty(), "{:#?}", w.violations);
        pauses += w.long_pauses;
        open += w.long_pauses_with_writes_open;
        stale += w.stale;
        handovers += w.handovers();
        writes += w.writes_started;
        for cause in [
            StopCause::Rebalance,
            StopCause::Shutdown,
            StopCause::DeadlinePassed,
            StopCause::RenewalRefused,
            StopCause::StaleEpoch,
        ] {
            *stops.entry(cause).or_insert(0) += w.stops(cause);
        }
    }
    eprintln!(
        "48 cases: {writes} writes, {pauses} pauses beyond the ttl ({open} with writes open), {stale} writes fenced stale_epoch, {handovers} handovers, stops {stops:?}"
    );
    assert!(
        open >= 5 && stale >= 5 && handovers >= 100,
        "{open} {stale} {handovers}"
    );
    assert!(stops.values().all(|&n| n >= 3), "{stops:?}");
}
