//! One run of the fleet world: draws the setup and the faults, builds the
//! turmoil simulation (a host per application instance; the store's
//! database shared by the links), steps it while applying the schedule
//! and advancing the store's clock, heals everything at the end of the
//! faulty phase, waits for ownership and the drain (S-FW6), and runs the
//! end checks.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use outbox::core::{Counters, Time};
use outbox::table::model::{Model, ModelConfig};
use rand::{Rng, RngCore};

use super::book::{self, Book, SharedBook};
use super::check;
use super::clock::Skew;
use super::faults::{Fault, Peer, Schedule};
use super::host::{self, HostPlan};
use super::lanes::FleetLanes;
use super::link::{Links, SharedLinks};
use super::Setup;
use crate::draw::rng;
use crate::world::{self, RunOptions, RunResult};

/// Turmoil's tick and the store clock's step.
pub const TICK: Duration = Duration::from_millis(2);

/// How long the drain may take after every partition is owned.
pub const DRAIN_BOUND: Duration = Duration::from_secs(20);

/// Fault and control kinds, in report order.
pub const FAULT_KINDS: [&str; 26] = [
    "crash",
    "restart",
    "store_restart",
    "join",
    "leave",
    "repeat",
    "repeat_older_than_ttl",
    "partition",
    "partition_datastore",
    "pause",
    "long_pause",
    "slow_link",
    "lost_reply",
    "handover",
    "late_write_start",
    "write_without_epoch",
    "skewed_host",
    "clock_stall",
    "clock_jump",
    "rejected",
    "dead_letter",
    "stale_write",
    "pause_at_write",
    "pause_at_dead_letter",
    "refused_repeat",
    "poisoned_after_write",
];

/// Runs `seed` in the fleet world; a panic becomes a failure.
pub fn run(seed: u64, opts: &RunOptions) -> RunResult {
    world::catching_panics(seed, || run_inner(seed, opts))
}

fn draw_setup(seed: u64, opts: &RunOptions) -> (Setup, Schedule, u64, u64) {
    let mut r = rng(seed);
    let ms = Duration::from_millis;
    let ttl = ms(r.random_range(1_500..=4_000));
    let renew = ttl / 4;
    let setup = Setup {
        seed,
        hosts: r.random_range(3..=5),
        partitions: r.random_range(2..=8),
        tenants: r.random_range(2..=16),
        stagers: r.random_range(1..=2),
        stage_gap: ms(r.random_range(50..=400)),
        phase: Duration::from_secs(opts.net_secs.max(1)).min(Duration::from_secs(3_600)),
        ttl,
        renew,
        drift: ttl / 10,
        acquire_poll: ms(
            r.random_range(renew.as_millis() as u64 / 6..=renew.as_millis() as u64 * 2 / 3)
        ),
        heartbeat: renew / 3,
        grace: ttl,
        poll: ms(r.random_range(100..=500)),
        skews: Vec::new(),
        poison_per_mille: 0,
        write_timeout: Duration::from_secs(2),
        idle_timeout: ModelConfig::default().idle_in_transaction_timeout,
        join_at: Vec::new(),
        leave: None,
        repeat_window: None,
    };
    let mut schedule = Schedule::draw(&mut r, &setup);
    let turmoil_seed = r.next_u64();
    let link_seed = r.next_u64();
    // Drawn apart, so the faults of a seed stay what they were.
    let mut more = rng(seed ^ 0x5eed_c10c_0000_0000);
    let within = !super::canary::on("skew_beyond_bound");
    let skews = (0..setup.hosts)
        .map(|_| Skew::draw(&mut more, &setup, within))
        .collect();
    let mut setup = setup;
    setup.skews = skews;
    setup.poison_per_mille = if more.random_range(0..4) == 0 {
        0
    } else {
        more.random_range(2..=15)
    };
    if more.random_range(0..2) == 1 {
        setup.write_timeout = setup.ttl * 3 + Duration::from_secs(1);
    }
    if more.random_range(0..2) == 1 {
        setup.idle_timeout = Duration::from_secs(60);
    }
    draw_membership(&mut more, &mut setup);
    schedule.draw_store_restarts(&mut more, &setup);
    schedule.draw_partition_peers(&mut more);
    (setup, schedule, turmoil_seed, link_seed)
}

/// The seed's joins, leave and the datastore's repeat window (drawn after
/// the faults: the joiner, a host more, has none of its own).
fn draw_membership(more: &mut crate::draw::SimRng, setup: &mut Setup) {
    let phase_ms = setup.phase.as_millis().max(6) as u64;
    setup.join_at = vec![Duration::ZERO; setup.hosts];
    if more.random_range(0..2) == 1 {
        let at = more.random_range(phase_ms / 6..=phase_ms * 2 / 3);
        setup.join_at.push(Duration::from_millis(at));
        setup.hosts += 1;
    }
    if setup.hosts >= 4 && more.random_range(0..2) == 1 {
        let h = more.random_range(0..setup.hosts);
        let at = more.random_range(phase_ms / 3..=phase_ms * 5 / 6);
        let at = Duration::from_millis(at).max(setup.join_at[h] + setup.ttl);
        setup.leave = Some((h, at));
    }
    if more.random_range(0..2) == 1 {
        let lo = REPEAT_WINDOW_TTLS.0 * setup.ttl.as_millis() as u64;
        let hi = REPEAT_WINDOW_TTLS.1 * setup.ttl.as_millis() as u64;
        setup.repeat_window = Some(Duration::from_millis(more.random_range(lo..=hi)));
    }
}

/// The datastore's repeat window, drawn in lease ttls.
pub const REPEAT_WINDOW_TTLS: (u64, u64) = (8, 40);

/// Per-host depth of overlapping faults of one kind: the fault applies
/// from 0 to 1 and lifts from 1 to 0.
#[derive(Default)]
struct Depth(Vec<u32>);

impl Depth {
    fn up(&mut self, h: usize) -> bool {
        self.0[h] += 1;
        self.0[h] == 1
    }
    fn down(&mut self, h: usize) -> bool {
        if self.0[h] == 0 {
            return false;
        }
        self.0[h] -= 1;
        self.0[h] == 0
    }
}

struct Run {
    sim: turmoil::Sim<'static>,
    model: Model,
    links: SharedLinks,
    book: SharedBook,
    setup: Setup,
    crashed: Depth,
    /// By peer.
    cut: [Depth; 2],
    paused: Depth,
    owners: BTreeMap<u32, (Option<String>, u64)>,
    /// With a trace: each partition's live lease now `(host, epoch, since)`,
    /// and the spans closed.
    leases: Option<LeaseWatch>,
    healed_at: Duration,
}

/// A lease held: `(host, partition, epoch, from, to)`.
type LeaseSpan = (usize, u32, u64, Duration, Duration);

/// Each partition's live lease now `(host, epoch, since)`, and the spans
/// closed.
type LeaseWatch = (BTreeMap<u32, (usize, u64, Duration)>, Vec<LeaseSpan>);

fn run_inner(seed: u64, opts: &RunOptions) -> RunResult {
    let (setup, schedule, turmoil_seed, link_seed) = draw_setup(seed, opts);
    if let Err(e) = host::lease_config(&setup, 0, 0).build() {
        panic!("the fleet drew lease settings the policy refuses: {e}");
    }
    let line = format!(
        "{setup:?} | {} fault events, lost replies {}/1000",
        schedule.events.len(),
        schedule.lose_per_mille
    );
    let model = Model::new(ModelConfig {
        partitions: setup.partitions,
        idle_in_transaction_timeout: setup.idle_timeout,
        ..ModelConfig::default()
    });
    let links: SharedLinks = Arc::new(Mutex::new(Links {
        cut: vec![[false; 2]; setup.hosts],
        paused: vec![false; setup.hosts],
        armed: vec![None; setup.hosts],
        frozen_until: vec![Duration::ZERO; setup.hosts],
        latency: vec![Duration::from_millis(1); setup.hosts],
        store_down_until: Duration::ZERO,
        lose_per_mille: schedule.lose_per_mille,
        rng: rng(link_seed),
        lost: 0,
    }));
    let book: SharedBook = Arc::new(Mutex::new(Book::new(opts.trace)));
    {
        let mut b = book::lock(&book);
        for k in FAULT_KINDS {
            b.faults.insert(k, 0);
        }
        b.faults.insert("long_pause", schedule.long_pauses);
        for skew in &setup.skews {
            *b.faults.entry("skewed_host").or_default() += u64::from(!skew.is_none());
            *b.faults.entry("clock_stall").or_default() += skew.stalls.len() as u64;
            *b.faults.entry("clock_jump").or_default() += skew.jumps.len() as u64;
        }
    }
    let mut sim = turmoil::Builder::new()
        .rng_seed(turmoil_seed)
        .epoch(UNIX_EPOCH)
        .tick_duration(TICK)
        .simulation_duration(Duration::from_secs(365 * 24 * 3600))
        .build();
    for h in 0..setup.hosts {
        let plan = HostPlan {
            host: h,
            setup: setup.clone(),
            model: model.clone(),
            links: Arc::clone(&links),
            book: Arc::clone(&book),
            starts: Arc::new(AtomicU64::new(0)),
        };
        sim.host(host::instance(h).as_str(), move || host::run(plan.clone()));
    }
    let mut run = Run {
        sim,
        model,
        links,
        book,
        crashed: Depth(vec![0; setup.hosts]),
        cut: [Depth(vec![0; setup.hosts]), Depth(vec![0; setup.hosts])],
        paused: Depth(vec![0; setup.hosts]),
        setup,
        owners: BTreeMap::new(),
        leases: opts.trace.then(Default::default),
        healed_at: Duration::ZERO,
    };
    let steps = run.faulty_phase(&schedule);
    let steps = steps + run.healed_phase();
    let end = Time::from_elapsed(run.sim.elapsed());
    let lost = run.links.lock().unwrap_or_else(|e| e.into_inner()).lost;
    {
        // While the hosts still run: what their sessions and listeners hold.
        let mut b = book::lock(&run.book);
        if b.failure.is_none() {
            check::settled(&mut b, &run.model, run.setup.hosts, run.setup.partitions);
        }
    }
    {
        // The simulation drops the hosts' tasks in an order of tokio's
        // global task ids, which differ between two runs of a seed in one
        // process: a stager's open transaction ends here first.
        let mut b = book::lock(&run.book);
        let open = b.open_all();
        b.roll_back(&run.model, open);
    }
    drop(run.sim);
    let mut b = book::lock(&run.book);
    *b.faults.entry("lost_reply").or_default() += lost;
    if b.failure.is_none() {
        check::end(&mut b, &run.model);
    }

    let mut counters = Counters::default();
    counters.staged = b.rows.len() as u64;
    counters.written = b.delivered.len() as u64;
    counters.writes = b.accepted_writes;
    RunResult {
        seed,
        steps,
        items: b.rows.len() as u64,
        counters,
        faults: b.faults.clone(),
        failure: b.failure.clone(),
        trace_hash: b.hash(),
        trace: b.trace.take().unwrap_or_default(),
        timeline: lanes(
            &Shown {
                leases: &run.leases,
                setup: &run.setup,
                model: &run.model,
                healed_at: run.healed_at,
            },
            &mut b,
        ),
        setup: line,
        end,
    }
}

/// What the picture needs of a run whose simulation has ended.
struct Shown<'a> {
    leases: &'a Option<LeaseWatch>,
    setup: &'a Setup,
    model: &'a Model,
    healed_at: Duration,
}

/// The run's picture, with a trace.
fn lanes(run: &Shown<'_>, b: &mut Book) -> Option<crate::timeline::Timeline> {
    let events = b.events.take()?;
    let (live, mut spans) = run.leases.clone()?;
    let end = run.model.now();
    for (p, (h, e, from)) in live {
        spans.push((h, p, e, from, end));
    }
    let lanes = FleetLanes {
        hosts: run.setup.hosts,
        partitions: run.setup.partitions,
        leases: spans,
        healed_at: run.healed_at,
        end,
        ..FleetLanes::default()
    }
    .build(&events, &run.setup.join_at);
    Some(crate::timeline::Timeline {
        end: Time::from_elapsed(end),
        fleet: Some(lanes),
        ..crate::timeline::Timeline::default()
    })
}

/// The trace's name of a cut (`true`) or mend of a host's link to `peer`.
fn cut_note(peer: Peer, cut: bool) -> &'static str {
    match (peer, cut) {
        (Peer::Store, true) => "cut",
        (Peer::Store, false) => "mend",
        (Peer::Datastore, true) => "cut_datastore",
        (Peer::Datastore, false) => "mend_datastore",
    }
}

impl Run {
    fn step(&mut self) -> bool {
        if let Err(e) = self.sim.step() {
            book::lock(&self.book).fail("panic", format!("the simulation stopped: {e}"));
            return false;
        }
        self.model.advance(TICK);
        let mut b = book::lock(&self.book);
        b.now = self.model.now();
        b.step += 1;
        let step = b.step;
        drop(b);
        if step.is_multiple_of(8) {
            self.watch_owners();
        }
        book::lock(&self.book).failure.is_none()
    }

    /// Counts handovers: a partition's lease taken by another owner.
    fn watch_owners(&mut self) {
        let rows = super::lease_rows(&self.model);
        if let Some((live, spans)) = self.leases.as_mut() {
            let now = self.model.now();
            for row in &rows {
                let holder = row
                    .owner
                    .as_deref()
                    .and_then(|o| o.strip_prefix('h')?.parse::<usize>().ok())
                    .filter(|_| !row.expires_in.is_zero());
                let now_held = holder.map(|h| (h, row.epoch));
                let was = live.get(&row.partition).map(|&(h, e, _)| (h, e));
                if was != now_held {
                    if let Some((h, e, from)) = live.remove(&row.partition) {
                        spans.push((h, row.partition, e, from, now));
                    }
                    if let Some((h, e)) = now_held {
                        live.insert(row.partition, (h, e, now));
                    }
                }
            }
        }
        let mut b = book::lock(&self.book);
        for row in rows {
            let seen = self.owners.entry(row.partition).or_insert((None, 0));
            if row.epoch != seen.1 {
                if seen.0.is_some() && seen.0 != row.owner {
                    b.count("handover");
                }
                b.note("epoch", u64::from(row.partition), row.epoch, 0);
                *seen = (row.owner.clone(), row.epoch);
            }
        }
    }

    fn apply(&mut self, fault: Fault) {
        let mut b = book::lock(&self.book);
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        let name = |h: usize| host::instance(h);
        match fault {
            Fault::Crash(h) if self.crashed.up(h) => {
                b.count("crash");
                b.note("crash", h as u64, 0, 0);
                // A freeze at a write is the process's: it ends with it
                // (the next incarnation starts unfrozen).
                links.frozen_until[h] = Duration::ZERO;
                // Its connections close: the server rolls its stagers'
                // transactions back, oldest first.
                let open = b.open_of(h);
                b.roll_back(&self.model, open);
                drop((b, links));
                // Not under the book's lock: the host's open transactions
                // end (into the book) as its tasks drop.
                self.sim.crash(name(h).as_str());
            }
            Fault::Restart(h) if self.crashed.down(h) => {
                b.count("restart");
                b.note("restart", h as u64, 0, 0);
                drop((b, links));
                self.sim.bounce(name(h).as_str());
            }
            Fault::Cut(h, peer) if self.cut[peer as usize].up(h) => {
                b.count("partition");
                if peer == Peer::Datastore {
                    b.count("partition_datastore");
                }
                b.note(cut_note(peer, true), h as u64, 0, 0);
                links.cut[h][peer as usize] = true;
            }
            Fault::Mend(h, peer) if self.cut[peer as usize].down(h) => {
                b.note(cut_note(peer, false), h as u64, 0, 0);
                links.cut[h][peer as usize] = false;
            }
            Fault::Pause(h) if self.paused.up(h) => {
                b.count("pause");
                b.note("pause", h as u64, 0, 0);
                links.paused[h] = true;
            }
            Fault::Resume(h) if self.paused.down(h) => {
                b.note("resume", h as u64, 0, 0);
                links.paused[h] = false;
            }
            Fault::PauseAt(h, len, at_dead) => {
                b.count("pause");
                b.note("arm", h as u64, len.as_millis() as u64, u64::from(at_dead));
                links.armed[h] = Some((len, at_dead));
            }
            Fault::Latency(h, d) => {
                if d > Duration::from_millis(1) {
                    b.count("slow_link");
                }
                b.note("latency", h as u64, d.as_millis() as u64, 0);
                links.latency[h] = d;
            }
            Fault::StoreRestart(down) => {
                b.count("store_restart");
                b.note("store_restart", down.as_millis() as u64, 0, 0);
                links.store_down_until = self.model.now() + down;
                self.model.restart();
                // Every stager's transaction ends with its session.
                let open = b.open_all();
                b.roll_back(&self.model, open);
            }
            _ => {}
        }
    }

    fn faulty_phase(&mut self, schedule: &Schedule) -> u64 {
        let mut steps = 0;
        let mut next = 0;
        while self.model.now() < self.setup.phase {
            while next < schedule.events.len() && schedule.events[next].0 <= self.model.now() {
                self.apply(schedule.events[next].1);
                next += 1;
            }
            steps += 1;
            if !self.step() {
                break;
            }
        }
        steps
    }

    /// Heals every fault, then runs until every partition is owned and
    /// the table drained (S-FW6), within their bounds.
    fn healed_phase(&mut self) -> u64 {
        if book::lock(&self.book).failure.is_some() {
            return 0;
        }
        for h in 0..self.setup.hosts {
            {
                let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
                links.cut[h] = [false; 2];
                links.paused[h] = false;
                links.armed[h] = None;
                links.frozen_until[h] = Duration::ZERO;
                links.latency[h] = Duration::from_millis(1);
                links.store_down_until = Duration::ZERO;
                links.lose_per_mille = 0;
            }
            if self.crashed.0[h] > 0 {
                self.crashed.0[h] = 0;
                self.sim.bounce(host::instance(h).as_str());
            }
        }
        let healed = self.model.now();
        self.healed_at = healed;
        let s = &self.setup;
        let own_bound = s.ttl + s.renew + s.acquire_poll;
        let mut owned_at = None;
        let mut steps = 0;
        loop {
            steps += 1;
            if !self.step() {
                return steps;
            }
            let now = self.model.now();
            if owned_at.is_none()
                && super::lease_rows(&self.model)
                    .iter()
                    .all(|r| !r.expires_in.is_zero())
            {
                owned_at = Some(now);
            }
            if owned_at.is_none() && now > healed + own_bound {
                let rows = super::lease_rows(&self.model);
                book::lock(&self.book).fail(
                    "S-FW6",
                    format!(
                        "{:?} after the heal some partition is still unowned: {rows:?}",
                        own_bound
                    ),
                );
                return steps;
            }
            if let Some(at) = owned_at {
                if check::drained(&book::lock(&self.book), &self.model) {
                    return steps;
                }
                if now > at + DRAIN_BOUND {
                    let left = self.model.rows();
                    let mut by_partition = BTreeMap::<u32, (usize, i64)>::new();
                    for r in &left {
                        let e = by_partition.entry(r.partition).or_insert((0, r.id));
                        e.0 += 1;
                    }
                    let leases = super::lease_rows(&self.model);
                    let epochs = super::now(outbox::table::Store::sink_epochs(&self.model.store()))
                        .unwrap_or_default();
                    let epochs: Vec<(u32, u64)> =
                        epochs.iter().map(|e| (e.partition, e.epoch)).collect();
                    book::lock(&self.book).fail(
                        "S-FW6",
                        format!(
                            "the table is not drained {DRAIN_BOUND:?} after every partition was owned \
                             ({} rows left; by partition (rows, first id): {by_partition:?}; sink epochs {epochs:?}; leases {leases:?})",
                            left.len()
                        ),
                    );
                    return steps;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The draws the issue asks for: store restarts, a late join and a
    /// leave, and the datastore's repeat window in about half the seeds.
    #[test]
    fn seeds_draw_store_restarts_joins_leaves_and_a_repeat_window_in_half() {
        let opts = RunOptions {
            net_secs: 30,
            ..RunOptions::default()
        };
        let n = 400;
        let (mut windows, mut joins, mut leaves, mut restarts) = (0, 0, 0, 0);
        for seed in 0..n {
            let (setup, schedule, _, _) = draw_setup(seed, &opts);
            windows += u64::from(setup.repeat_window.is_some());
            joins += u64::from(setup.join_at.iter().any(|j| !j.is_zero()));
            leaves += u64::from(setup.leave.is_some());
            let r = schedule.events.iter();
            restarts += u64::from(r.filter(|e| matches!(e.1, Fault::StoreRestart(_))).count() > 0);
            assert!(setup.hosts >= 3 && setup.join_at.len() == setup.hosts);
            if let Some((h, at)) = setup.leave {
                assert!(setup.hosts >= 4 && at >= setup.join_at[h] + setup.ttl);
            }
        }
        let half = (n * 2 / 5)..=(n * 3 / 5);
        assert!(
            half.contains(&windows),
            "{windows} of {n} seeds draw a window"
        );
        assert!(half.contains(&joins), "{joins} of {n} seeds draw a join");
        assert!(leaves > n / 5, "{leaves} of {n} seeds draw a leave");
        assert!(
            restarts > n / 2,
            "{restarts} of {n} seeds draw a store restart"
        );
    }

    /// Partitions cut a host from the store, from the datastore, or both,
    /// each drawn in some seeds, and every cut is mended later.
    #[test]
    fn partitions_cut_a_host_from_the_store_the_datastore_or_both() {
        let opts = RunOptions {
            net_secs: 30,
            ..RunOptions::default()
        };
        let (mut store, mut data) = (0, 0);
        for seed in 0..200 {
            let (setup, schedule, _, _) = draw_setup(seed, &opts);
            let mut depth = BTreeMap::<(usize, Peer), i64>::new();
            for (_, f) in &schedule.events {
                match *f {
                    Fault::Cut(h, p) => *depth.entry((h, p)).or_default() += 1,
                    Fault::Mend(h, p) => {
                        let d = depth.entry((h, p)).or_default();
                        *d -= 1;
                        assert!(*d >= 0, "seed {seed}: a mend before its cut");
                    }
                    _ => {}
                }
            }
            assert!(
                depth.values().all(|&d| d == 0),
                "seed {seed}: a cut never mended"
            );
            let cuts = |peer| {
                schedule
                    .events
                    .iter()
                    .any(|e| matches!(e.1, Fault::Cut(_, p) if p == peer))
            };
            store += u64::from(cuts(Peer::Store));
            data += u64::from(cuts(Peer::Datastore));
            assert!(setup.hosts >= 3);
        }
        assert!(
            store > 100 && data > 100,
            "store {store}, datastore {data} of 200"
        );
    }
}
