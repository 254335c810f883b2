//! One run of the crash world: draws the config, workload, crashes and
//! storage faults from the seed (each on a stream of its own), builds the
//! turmoil simulation (the datastore host as in the net world, per item
//! idempotent; the application as a host that can crash and restart on its
//! disk), steps it while crashing and restarting the application on the
//! drawn schedule, heals at the end of the faulty phase, and runs the end
//! checks.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use outbox::core::Time;
use outbox::Config;
use rand::{Rng, RngCore};

use super::app::{self, AppEnd, AppPlan, Control, Ctx};
use super::check;
use super::disk::{self, DiskFaults, Trip};
use super::faults::{CrashFaults, How, DISK_RNG_STREAM};
use super::ledger::{self, Ledger, SharedLedger};
use super::versions::Versions;
use crate::draw::{log_uniform, rng};
use crate::net::book::{self, Book, Ev, SharedBook};
use crate::net::datastore::{self, Durable, SharedStore, HOST};
use crate::net::faults::Rates;
use crate::net::workload::NetWorkload;
use crate::timeline::HostMark;
use crate::world::{self, RunOptions, RunResult};

/// The application host's name.
pub const APP: &str = "app";

/// Turmoil's tick.
pub const TICK: Duration = Duration::from_millis(1);

/// Fault and control kinds, in report order. Of the codec versions
/// (S-J14): `version_change` counts the lives that ran another version
/// than the life before, `version_seed` the seeds with one,
/// `version_fail` the builds that failed under `Fail` (each rolled back),
/// `other_version` the items recoveries counted lost under that reason.
pub const FAULT_KINDS: [&str; 20] = [
    "crash",
    "poison",
    "poisoned",
    "expired",
    "crash_in_commit",
    "crash_in_deletion",
    "crash_in_recovery",
    "crash_in_shutdown",
    "restart",
    "torn_writes",
    "eio",
    "rot",
    "disk_full",
    "sync_ok",
    "recovered",
    "unreadable",
    "version_change",
    "version_seed",
    "version_fail",
    "other_version",
];

/// The stream of the config and the journal's settings.
const CONFIG_STREAM: u64 = 0xC0F1_6000_0000_0004;

/// The stream of the age limit (S-R3).
const AGE_STREAM: u64 = 0xA6E0_0000_0000_0005;

/// The faulty phase of the crash world: a quarter of `--secs`.
pub fn phase(opts: &RunOptions) -> Duration {
    Duration::from_millis((opts.net_secs.max(1) * 1_000 / 4).max(1_000))
}

/// Runs `seed` in the crash world; a panic outside the hosts becomes a
/// failure.
pub fn run(seed: u64, opts: &RunOptions) -> RunResult {
    world::catching_panics(seed, || run_inner(seed, opts))
}

/// Everything a seed draws.
struct Draws {
    phase: Duration,
    plan: AppPlan,
    faults: CrashFaults,
    turmoil_seed: u64,
}

impl Draws {
    fn draw(seed: u64, opts: &RunOptions) -> Draws {
        let phase = phase(opts);
        let mut r = rng(seed);
        let workload = NetWorkload::draw(&mut r, phase);
        let turmoil_seed = r.next_u64();
        let mut c = rng(seed ^ CONFIG_STREAM);
        let mut config = Config::builder()
            .concurrency(c.random_range(1..=8))
            .max_batch(log_uniform(&mut c, 1, 256) as usize)
            .linger(Duration::from_millis(log_uniform(&mut c, 1, 50) - 1))
            .initial_backoff(Duration::from_millis(10))
            .max_backoff(Duration::from_millis(500))
            .seed(seed);
        // An age limit in a third of the seeds (S-R3 across lives), from a
        // stream of its own (the other draws stay as they were): from
        // above the longest linger to longer than most outages.
        let mut a = rng(seed ^ AGE_STREAM);
        if crate::draw::chance(&mut a, 1, 3) {
            config = config.max_item_age(Duration::from_millis(log_uniform(&mut a, 50, 3_000)));
        }
        let config = config.build().expect("a valid config");
        // A bound in a third of the seeds (S-J10), with segments of a
        // quarter of it or drawn up to a quarter of it (half of what the
        // standing reserves leave is the most a build accepts); small
        // segments in all.
        let max_bytes =
            crate::draw::chance(&mut c, 1, 3).then(|| log_uniform(&mut c, 1_024, 32_768));
        let segment_bytes = match max_bytes {
            Some(_) if crate::draw::chance(&mut c, 1, 2) => None,
            Some(max) => Some(log_uniform(&mut c, 256, max / 4)),
            None => Some(log_uniform(&mut c, 256, 65_536)),
        };
        let poison = draw_poison(seed, &workload);
        let plan = AppPlan {
            seed,
            poison,
            config,
            segment_bytes,
            max_bytes,
            sync_interval: Duration::from_millis(log_uniform(&mut c, 1, 20)),
            workload,
            sync_gap: Duration::from_millis(log_uniform(&mut c, 5, 500)),
            versions: if opts.fixed_versions {
                Versions::fixed(0)
            } else {
                Versions::draw(seed)
            },
        };
        Draws {
            phase,
            plan,
            faults: CrashFaults::draw(seed, phase),
            turmoil_seed,
        }
    }

    fn setup(&self) -> String {
        let (p, f) = (&self.plan, &self.faults);
        format!(
            "config {:?} | segment {} B, max {:?} B, sync interval {:?}, sync gap {:?} | tenants {} \
             items ~{} stagers {} | poison {:?} | versions {:?} | crashes {:?} downtime <= {:?} | block {:?} disk {:?}",
            p.config,
            p.segment(),
            p.max_bytes,
            p.sync_interval,
            p.sync_gap,
            p.workload.tenants,
            p.workload.items,
            p.workload.stagers,
            p.poison,
            p.versions.deploys,
            f.crashes,
            f.max_downtime,
            f.block_size,
            f.disk
        )
    }
}

fn run_inner(seed: u64, opts: &RunOptions) -> RunResult {
    let d = Draws::draw(seed, opts);
    let setup = d.setup();
    let mut new_book = Book::new(opts.trace, d.plan.config.concurrency());
    if opts.trace {
        new_book = new_book.with_timeline(d.plan.workload.tenants);
    }
    new_book.on_commit = Some(check::on_commit);
    new_book.max_item_age = d.plan.config.max_item_age();
    for k in FAULT_KINDS {
        new_book.faults.insert(k, 0);
    }
    let book: SharedBook = Arc::new(Mutex::new(new_book));
    let mut store = Durable::new(rng(seed ^ 0x5707E), datastore_rates(seed), 1);
    store.per_item = true;
    let store: SharedStore = Arc::new(Mutex::new(store));
    let faults = DiskFaults::new(
        rng(seed ^ DISK_RNG_STREAM),
        d.faults.disk,
        Arc::clone(&book),
    );
    let ledger: SharedLedger = Arc::new(Mutex::new(Ledger {
        life: 1,
        poison: d.plan.poison.iter().copied().collect(),
        ..Ledger::default()
    }));
    let ctx = Ctx {
        plan: Arc::new(d.plan.clone()),
        book: Arc::clone(&book),
        ledger: Arc::clone(&ledger),
        faults: Arc::clone(&faults),
        control: Arc::new(Control::default()),
        end: Arc::new(Mutex::new(AppEnd::default())),
        store: Arc::clone(&store),
    };
    if d.faults.block_size.is_some() {
        book::lock(&book).fault(Time::ZERO, "torn_writes");
    }
    let mut sim = build_sim(&d, &book, &store, &ctx);
    let mut host = Host::new(&d, seed);
    let steps = host.step_until_done(&mut sim, &ctx, d.phase);
    let end_time = Time::from_elapsed(sim.elapsed());
    drop(sim);

    let app_end = std::mem::take(&mut *ctx.end.lock().unwrap_or_else(|e| e.into_inner()));
    let mut b = book::lock(&book);
    if b.failure.is_none() {
        if app_end.finished {
            let st = datastore::lock(&store);
            let l = ledger::lock(&ledger);
            let rotten = disk::lock(&faults).rotten_items.clone();
            // S-J17: a poisoned item is given up, not written; S-J14: an
            // item a recovery of another codec version may have refused
            // is counted lost, its segment perhaps gone.
            let spared: std::collections::BTreeSet<u64> = rotten
                .union(&l.poisoned)
                .chain(&l.refused)
                .chain(&l.expired)
                .copied()
                .collect();
            let max = outbox::core::relay::DEFAULT_MAX_CRASH_ATTEMPTS;
            if let Some((rule, detail)) =
                check::d1::synced_items_written(&b, &st, &l.synced, &spared).or_else(|| {
                    check::s_j17::poisoned_only_after_its_crashes(
                        &l.poisoned,
                        &l.poison,
                        &l.cuts,
                        max,
                    )
                })
            {
                drop(st);
                b.fail(rule, detail);
            }
        } else {
            b.fail("D5", "the application did not finish its script".into());
        }
    }
    let l = ledger::lock(&ledger);
    *b.faults.entry("sync_ok").or_default() += l.synced.len() as u64;
    *b.faults.entry("recovered").or_default() += l.recoveries.iter().map(|r| r.1).sum::<u64>();
    *b.faults.entry("unreadable").or_default() += l.unreadable;
    *b.faults.entry("poisoned").or_default() += l.poisoned.len() as u64;
    *b.faults.entry("expired").or_default() += l.expired.len() as u64;
    *b.faults.entry("version_change").or_default() += l.version_changes;
    *b.faults.entry("version_seed").or_default() += u64::from(l.version_changes > 0);
    *b.faults.entry("version_fail").or_default() += l.version_fails;
    *b.faults.entry("other_version").or_default() += l.other_version;
    drop(l);
    let counters = app_end.counters;
    RunResult {
        seed,
        steps,
        items: b.items.len() as u64,
        counters,
        faults: b.faults.clone(),
        failure: b.failure.clone(),
        trace_hash: b.hash(),
        trace: b.trace.take().unwrap_or_default(),
        timeline: b.take_timeline(end_time),
        setup,
        end: end_time,
    }
}

/// The stream of the datastore's fault rates (xored into the seed).
pub const STORE_STREAM: u64 = 0x5707_E000_0000_0004;

/// The datastore's faults until the heal, drawn from their own stream: in
/// half the seeds it answers retryable errors (2% to 20% of requests), so
/// that writes are retried while crashes come (a done mark taken
/// before its write completes is then seen, D1); none in the others.
fn datastore_rates(seed: u64) -> Rates {
    let mut r = rng(seed ^ STORE_STREAM);
    if !crate::draw::chance(&mut r, 1, 2) {
        return Rates::default();
    }
    Rates {
        error: r.random_range(20..200),
        ..Rates::default()
    }
}

/// The turmoil simulation: the datastore host and the application host.
fn build_sim(
    d: &Draws,
    book: &SharedBook,
    store: &SharedStore,
    ctx: &Ctx,
) -> turmoil::Sim<'static> {
    let mut b = turmoil::Builder::new();
    b.rng_seed(d.turmoil_seed)
        .epoch(UNIX_EPOCH)
        .ephemeral_ports(1024..=65535)
        .tick_duration(TICK)
        .simulation_duration(Duration::from_secs(365 * 24 * 3600))
        .min_message_latency(Duration::ZERO)
        .max_message_latency(Duration::from_millis(2));
    if let Some(block) = d.faults.block_size {
        b.fs().block_size(block);
    }
    let mut sim = b.build();
    {
        let store = Arc::clone(store);
        let book = Arc::clone(book);
        sim.host(HOST, move || {
            datastore::serve(Arc::clone(&store), Arc::clone(&book))
        });
    }
    let ctx = ctx.clone();
    sim.host(APP, move || app::life(ctx.clone()));
    sim
}

/// The application host's state under the crash schedule.
struct Host {
    crashes: Vec<(Duration, How)>,
    next: usize,
    /// Down since a crash: restart at this time.
    restart_at: Option<Duration>,
    /// A crash due at this time (a shutdown's), with its kind.
    crash_at: Option<(Duration, &'static str)>,
    /// Arm this trip at the next restart (a crash inside recovery).
    arm_at_restart: Option<Trip>,
    /// The kind of the armed trip, for the count when it fires.
    armed_kind: &'static str,
    healed: bool,
    downtime: rand_chacha::ChaCha8Rng,
    max_downtime: Duration,
}

impl Host {
    fn new(d: &Draws, seed: u64) -> Host {
        Host {
            crashes: d.faults.crashes.clone(),
            next: 0,
            restart_at: None,
            crash_at: None,
            arm_at_restart: None,
            armed_kind: "crash",
            healed: false,
            downtime: rng(seed ^ 0xD0_317E),
            max_downtime: d.faults.max_downtime,
        }
    }

    fn crash(&mut self, sim: &mut turmoil::Sim<'_>, ctx: &Ctx, kind: &'static str, what: &str) {
        sim.crash(APP);
        let mut failed = disk::lock(&ctx.faults).take_failed_marks();
        {
            // S-J17: the crash may cut every item handed in this life, and
            // an item whose mark a failed commit left on disk (the next
            // life looks).
            let mut l = ledger::lock(&ctx.ledger);
            let poison = if kind == "poison" {
                l.poison_hit.take()
            } else {
                None
            };
            l.poison_hit = None;
            let handed = std::mem::take(&mut l.handed);
            failed.retain(|_, id| !handed.contains(id));
            if !failed.is_empty() {
                l.unstarted.push((failed, poison));
            }
            for id in handed {
                let c = l.cuts.entry(id).or_default();
                c.0 += 1;
                if poison.is_some_and(|p| p != id) {
                    c.1 += 1;
                }
            }
        }
        disk::lock(&ctx.faults).crashed();
        let t = sim.elapsed();
        let down = Duration::from_micros(
            self.downtime
                .random_range(0..=u64::try_from(self.max_downtime.as_micros()).unwrap_or(0)),
        );
        self.restart_at = Some(t + down);
        self.crash_at = None;
        ledger::lock(&ctx.ledger).crashes += 1;
        let mut b = book::lock(&ctx.book);
        *b.faults.entry(kind).or_default() += 1;
        b.record(
            Time::from_elapsed(t),
            Ev::Host(HostMark::Crash, format!("the app host crashes {what}")),
        );
    }

    fn restart(&mut self, sim: &mut turmoil::Sim<'_>, ctx: &Ctx) {
        self.restart_at = None;
        {
            let items = book::lock(&ctx.book).items.len() as u64;
            let mut l = ledger::lock(&ctx.ledger);
            l.life += 1;
            l.life_start = items;
            l.replayed.clear();
            l.handed.clear();
        }
        if let Some(trip) = self.arm_at_restart.take().filter(|_| !self.healed) {
            disk::lock(&ctx.faults).arm(trip);
        }
        ctx.control.shutdown.store(false, Ordering::SeqCst);
        sim.bounce(APP);
        let life = ledger::lock(&ctx.ledger).life;
        let mut b = book::lock(&ctx.book);
        *b.faults.entry("restart").or_default() += 1;
        b.record(
            Time::from_elapsed(sim.elapsed()),
            Ev::Host(
                HostMark::Restart,
                format!("life {life} starts on the same disk"),
            ),
        );
    }

    /// Applies the schedule's entries due by now.
    fn apply_due(&mut self, sim: &mut turmoil::Sim<'_>, ctx: &Ctx) {
        let t = sim.elapsed();
        let up = self.restart_at.is_none();
        // S-J17: a poison item's write takes the process down, healed or
        // not.
        let hit = ledger::lock(&ctx.ledger).poison_hit;
        if let Some(id) = hit.filter(|_| up) {
            self.crash(
                sim,
                ctx,
                "poison",
                &format!("in the write of poison item #{id}"),
            );
            return;
        }
        let tripped = disk::lock(&ctx.faults).tripped();
        if let Some(what) = tripped {
            let kind = self.armed_kind;
            self.crash(sim, ctx, kind, &format!("inside a storage call ({what})"));
            return;
        }
        if let Some((at, kind)) = self.crash_at {
            if at <= t && up {
                self.crash(sim, ctx, kind, "during its shutdown");
                return;
            }
        }
        while !self.healed && self.next < self.crashes.len() && self.crashes[self.next].0 <= t {
            let how = self.crashes[self.next].1;
            self.next += 1;
            if !up {
                continue;
            }
            match how {
                How::Now => self.crash(sim, ctx, how.kind(), "at a drawn moment"),
                How::Inside(trip) => {
                    self.armed_kind = how.kind();
                    disk::lock(&ctx.faults).arm(trip);
                    book::lock(&ctx.book).record(
                        Time::from_elapsed(t),
                        Ev::Note(format!(
                            "armed: a crash inside the {} `{}` call from now",
                            ordinal(trip.skip),
                            trip.call.as_str()
                        )),
                    );
                }
                How::Recovery(trip) => {
                    self.armed_kind = how.kind();
                    self.arm_at_restart = Some(trip);
                    self.crash(
                        sim,
                        ctx,
                        "crash",
                        "at a drawn moment, to crash again in recovery",
                    );
                }
                How::Shutdown(after) => {
                    ctx.control.shutdown.store(true, Ordering::SeqCst);
                    self.crash_at = Some((t + after, how.kind()));
                    book::lock(&ctx.book).record(
                        Time::from_elapsed(t),
                        Ev::Control {
                            kind: "shutdown",
                            deadline_ms: 0,
                        },
                    );
                }
            }
            return;
        }
    }

    fn heal(&mut self, sim: &mut turmoil::Sim<'_>, ctx: &Ctx) {
        self.healed = true;
        self.crash_at = None;
        self.arm_at_restart = None;
        disk::lock(&ctx.faults).heal();
        ctx.control.healed.store(true, Ordering::SeqCst);
        let mut b = book::lock(&ctx.book);
        b.weather.healed = true;
        b.record(
            Time::from_elapsed(sim.elapsed()),
            Ev::Net("healed: every fault stops"),
        );
    }

    /// Steps until the application finished its script or the run's cap.
    fn step_until_done(&mut self, sim: &mut turmoil::Sim<'_>, ctx: &Ctx, phase: Duration) -> u64 {
        let mut steps = 0u64;
        let cap = phase + Duration::from_secs(120);
        loop {
            let t = sim.elapsed();
            if !self.healed && t >= phase {
                self.heal(sim, ctx);
            }
            self.apply_due(sim, ctx);
            if self.restart_at.is_some_and(|at| at <= t || self.healed) {
                self.restart(sim, ctx);
            }
            let finished = ctx.end.lock().unwrap_or_else(|e| e.into_inner()).finished;
            // A broken rule ends the seed: what follows a broken journal
            // (a canary's) may be arbitrarily slow, and proves nothing.
            if finished || book::lock(&ctx.book).failure.is_some() {
                break;
            }
            if self.restart_at.is_none() && !sim.is_host_running(APP) {
                // The process exited after a clean shutdown: started again
                // (a deploy).
                self.crash_at = None;
                self.restart_at = Some(t);
            }
            if t > cap {
                book::lock(&ctx.book).fail(
                    "D5",
                    format!(
                        "the application had not finished {} s after the faults stopped: the \
                         journal wedged or a settle never answered",
                        (t - phase).as_secs()
                    ),
                );
                break;
            }
            steps += 1;
            book::lock(&ctx.book).steps = steps;
            if let Err(e) = sim.step() {
                book::lock(&ctx.book).fail("host", format!("a host failed: {e}"));
                break;
            }
        }
        steps
    }
}

/// The stream of the poison items.
const POISON_STREAM: u64 = 0x9015_0000_0000_0004;

/// Poison items (S-J17) in a third of the seeds, with or without
/// `max_bytes`: one to three ids among the first items staged, each
/// crashing the app at its write. Under a bound the journal keeps a
/// standing reserve for the records that count a lone suspect's crashes
/// (S-J10, S-J17), so a journal at its bound behind a poison suspect
/// still counts them (seeds 900143, 900275, 900352, 900391, 900675,
/// 900996 looped before it).
fn draw_poison(seed: u64, workload: &NetWorkload) -> Vec<u64> {
    let mut r = rng(seed ^ POISON_STREAM);
    if !crate::draw::chance(&mut r, 1, 3) {
        return Vec::new();
    }
    let within = workload.cap.clamp(1, 300);
    let mut ids: Vec<u64> = (0..r.random_range(1..=3))
        .map(|_| r.random_range(0..within))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

fn ordinal(skip: u32) -> String {
    match skip {
        0 => "next".to_owned(),
        n => format!("{}th", n + 1),
    }
}
