//! One run of the net world: draws the config, workload and faults from the
//! seed, builds the turmoil simulation (turmoil's generator seeded from the
//! seed, a fixed epoch, a 1 ms tick), steps it while applying the network
//! schedule, heals everything at the end of the faulty phase, and runs the
//! end checks. The run's ending (the usual settle and shutdown, or every
//! handle dropped, S-W16) is drawn from a stream of its own, so the other
//! draws of a seed are those it had before that ending existed.

use std::panic;
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, UNIX_EPOCH};

use outbox::core::Time;
use rand::RngCore;

use super::app::{self, AppEnd, AppPlan};
use super::book::{self, Book, Ev, SharedBook};
use super::check::{self, Ending};
use super::datastore::{self, Durable, SharedStore, HOST};
use super::faults::{self, NetEvent, NetFaults, DROP_STREAM};
use super::sink::{Injected, NetSink};
use super::workload::NetWorkload;
use crate::draw::{self, rng};
use crate::world::{self, RunOptions, RunResult};

/// The application host's name.
pub const APP: &str = "app";

/// Turmoil's tick: the network delivers messages at this granularity.
pub const TICK: Duration = Duration::from_millis(1);

/// Fault and control kinds, in report order (every one shows in the
/// summary, zero or not).
pub const FAULT_KINDS: [&str; 25] = [
    "panic_create",
    "panic_poll",
    "panic_display",
    "hang",
    "client_error",
    "datastore_error",
    "lost_reply",
    "reject",
    "discard",
    "slow_commit",
    "hung_commit",
    "partition",
    "latency",
    "crash",
    "restart",
    "storm",
    "flush",
    "settle",
    "shutdown",
    "abandon",
    "liveness_unchecked",
    "i6_checked",
    "drop",
    "drop_i6_bound",
    "drop_gave_up",
];

/// Silences the deliberate panics of the sink (their payload is
/// [`Injected`]); every other panic reaches the previous hook.
fn quiet_injected_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<Injected>().is_none() {
                previous(info);
            }
        }));
    });
}

/// Runs `seed` in the net world; a panic outside the hosts becomes a
/// failure.
pub fn run(seed: u64, opts: &RunOptions) -> RunResult {
    quiet_injected_panics();
    world::catching_panics(seed, || run_inner(seed, opts))
}

/// The fixed part of the liveness bound after the heal, or `None` when I6
/// cannot be expected of this config in reasonable virtual time (a write
/// timeout shorter than a healthy round trip; an hour of linger or
/// backoff).
fn liveness_base(config: &outbox::Config, faults: &NetFaults) -> Option<Duration> {
    if config
        .write_timeout()
        .is_some_and(|t| t < Duration::from_millis(100))
    {
        return None;
    }
    let long = Duration::from_secs(300);
    if config.linger() > long || config.max_backoff() > long {
        return None;
    }
    // A hang started before the heal runs on until the write timeout.
    let hang = config
        .write_timeout()
        .unwrap_or(Duration::from_secs(120))
        .min(Duration::from_secs(120));
    Some(
        config.linger()
            + config.max_backoff() * 2
            + hang
            + faults.rpc_timeout * 2
            + Duration::from_secs(5),
    )
}

fn run_inner(seed: u64, opts: &RunOptions) -> RunResult {
    let d = Draws::draw(seed, opts);
    let setup = d.setup();
    let book = new_book(opts, &d);
    let store = Arc::new(Mutex::new(Durable::new(
        rng(d.store_seed),
        d.faults.rates,
        d.faults.storm_factor,
    )));
    let end = Arc::new(Mutex::new(AppEnd::default()));
    let mut sim = build_sim(seed, &d, &book, &store, &end);
    let steps = step_until_done(&mut sim, &book, &d.faults, d.phase);
    let end_time = Time::from_elapsed(sim.elapsed());
    drop(sim);

    let app_end = std::mem::take(&mut *end.lock().unwrap_or_else(|e| e.into_inner()));
    let mut b = book::lock(&book);
    check_the_end(&mut b, &store, &app_end);
    let mut counters = app_end.counters;
    if matches!(app_end.ending, Ending::Dropped { .. }) {
        // For the summary only (no check reads it): the metrics do not
        // export attempts, so with the outbox gone the sink's count stands
        // in. Every attempt the engine hands out reaches the sink, so they
        // agree in every other ending.
        counters.attempts = b.slices.values().map(|s| u64::from(s.attempts)).sum();
    }
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

/// Everything a seed draws, in the order it draws it.
struct Draws {
    phase: Duration,
    pick: draw::ConfigPick,
    workload: NetWorkload,
    faults: NetFaults,
    turmoil_seed: u64,
    sink_seed: u64,
    store_seed: u64,
    /// [`liveness_base`].
    liveness: Option<Duration>,
    /// Drawn from a stream of its own ([`DROP_STREAM`]).
    drop_deadline: Option<Duration>,
}

impl Draws {
    fn draw(seed: u64, opts: &RunOptions) -> Draws {
        let phase = Duration::from_secs(opts.net_secs.max(1));
        let mut r = rng(seed);
        let pick = draw::config(&mut r);
        let workload = NetWorkload::draw(&mut r, phase);
        let faults = NetFaults::draw(&mut r, phase);
        let turmoil_seed = r.next_u64();
        let sink_seed = r.next_u64();
        let store_seed = r.next_u64();
        let liveness = liveness_base(&pick.config, &faults);
        // A drop deadline that covers the I6 bound for every item the stagers
        // can stage (each may pass the cap by one call).
        let covers = liveness.map(|base| {
            let most = workload.cap + u64::from(workload.stagers) * u64::from(workload.max_count);
            app::i6_bound(base, most, pick.config.concurrency(), workload.tenants)
        });
        let drop_deadline = faults::draw_drop(&mut rng(seed ^ DROP_STREAM), covers);
        Draws {
            phase,
            pick,
            workload,
            faults,
            turmoil_seed,
            sink_seed,
            store_seed,
            liveness,
            drop_deadline,
        }
    }

    /// What the seed drew, one line.
    fn setup(&self) -> String {
        let (pick, workload, faults) = (&self.pick, &self.workload, &self.faults);
        format!(
            "config {:?} weighs={} | tenants {} skew {}/2 items ~{} stagers {} gap {:?} burst 1/{} x{} \
             sizes <= {} | rates {:?} storm x{} rpc timeout {:?} latency {:?} net events {} \
             control gap {:?} shutdown {:?} join {:?} abandon {:?} | I6 base {:?} | drop {:?}",
            pick.config,
            pick.weighs,
            workload.tenants,
            workload.skew_half,
            workload.items,
            workload.stagers,
            workload.mean_gap,
            workload.burst_odds,
            workload.burst_max,
            workload.max_size,
            faults.rates,
            faults.storm_factor,
            faults.rpc_timeout,
            faults.calm_latency,
            faults.schedule.len(),
            faults.control_gap,
            faults.shutdown_at,
            faults.shutdown_join,
            faults.abandon_at,
            self.liveness,
            self.drop_deadline
        )
    }
}

/// The run's book: the shortest backoff for I7, every fault kind at zero.
fn new_book(opts: &RunOptions, d: &Draws) -> SharedBook {
    let config = &d.pick.config;
    let mut new_book = Book::new(opts.trace, config.concurrency());
    let jitter = (config.jitter() * 1_000_000.0).round() as u128;
    let initial = config.initial_backoff().as_nanos();
    new_book.min_backoff =
        Duration::from_nanos(u64::try_from(initial - initial * jitter / 1_000_000).unwrap_or(0));
    if opts.trace {
        new_book = new_book.with_timeline(d.workload.tenants);
    }
    let book: SharedBook = Arc::new(Mutex::new(new_book));
    {
        let mut b = book::lock(&book);
        for k in FAULT_KINDS {
            b.faults.insert(k, 0);
        }
    }
    book
}

/// The turmoil simulation: the datastore host and the application client.
fn build_sim(
    seed: u64,
    d: &Draws,
    book: &SharedBook,
    store: &SharedStore,
    end: &Arc<Mutex<AppEnd>>,
) -> turmoil::Sim<'static> {
    let sink = NetSink::new(
        Arc::clone(book),
        rng(d.sink_seed),
        d.faults.rates,
        d.faults.storm_factor,
        d.faults.rpc_timeout,
        d.pick.config.concurrency().max(1) * 2 + 2,
    );
    let plan = AppPlan {
        seed,
        config: d.pick.config.clone(),
        weighs: d.pick.weighs,
        workload: d.workload.clone(),
        faults: d.faults.clone(),
        phase: d.phase,
        liveness_base: d.liveness,
        drop_deadline: d.drop_deadline,
    };
    let mut sim = turmoil::Builder::new()
        .rng_seed(d.turmoil_seed)
        .epoch(UNIX_EPOCH)
        // Turmoil has no TIME_WAIT: a wide port range keeps a reused port
        // from meeting a server socket still open for its last owner.
        .ephemeral_ports(1024..=65535)
        .tick_duration(TICK)
        .simulation_duration(Duration::from_secs(365 * 24 * 3600))
        .min_message_latency(Duration::ZERO)
        .max_message_latency(d.faults.calm_latency)
        .build();
    {
        let store = Arc::clone(store);
        let book = Arc::clone(book);
        sim.host(HOST, move || {
            datastore::serve(Arc::clone(&store), Arc::clone(&book))
        });
    }
    sim.client(APP, app::run(plan, sink, Arc::clone(book), Arc::clone(end)));
    sim
}

/// The network's state under the fault schedule.
#[derive(Default)]
struct Network {
    /// The next schedule entry to apply.
    next: usize,
    healed: bool,
    down: bool,
    partitioned: bool,
}

impl Network {
    /// Applies the schedule's entries due by `t` (none once healed).
    fn apply_due(&mut self, sim: &mut turmoil::Sim<'_>, book: &SharedBook, faults: &NetFaults) {
        let t = sim.elapsed();
        let at = Time::from_elapsed(t);
        while !self.healed && self.next < faults.schedule.len() && faults.schedule[self.next].0 <= t
        {
            let ev = faults.schedule[self.next].1;
            self.next += 1;
            let mut b = book::lock(book);
            match ev {
                NetEvent::Partition => {
                    self.partitioned = true;
                    sim.partition(APP, HOST);
                    b.fault(at, "partition");
                }
                NetEvent::Repair => {
                    self.partitioned = false;
                    sim.repair(APP, HOST);
                    b.record(at, Ev::Net("repair"));
                }
                NetEvent::Crash => {
                    if !self.down {
                        self.down = true;
                        sim.crash(HOST);
                        b.fault(at, "crash");
                    }
                }
                NetEvent::Restart => {
                    if self.down {
                        self.down = false;
                        sim.bounce(HOST);
                        b.fault(at, "restart");
                    }
                }
                NetEvent::Latency(us) => {
                    sim.set_max_message_latency(Duration::from_micros(us));
                    b.fault(at, "latency");
                }
                NetEvent::StormBegins => {
                    b.weather.storm = true;
                    b.fault(at, "storm");
                }
                NetEvent::StormEnds => {
                    b.weather.storm = false;
                    b.record(at, Ev::Net(ev.kind()));
                }
            }
        }
    }

    /// Ends every fault at the end of the faulty phase.
    fn heal(&mut self, sim: &mut turmoil::Sim<'_>, book: &SharedBook, faults: &NetFaults) {
        let at = Time::from_elapsed(sim.elapsed());
        self.healed = true;
        if self.partitioned {
            sim.repair(APP, HOST);
        }
        if self.down {
            sim.bounce(HOST);
        }
        sim.set_max_message_latency(faults.calm_latency.min(Duration::from_millis(5)));
        let mut b = book::lock(book);
        b.weather = book::Weather {
            storm: false,
            healed: true,
        };
        b.record(at, Ev::Net("healed: every fault stops"));
    }
}

/// Steps the simulation until the application finishes, a host fails or
/// the healed phase outlives its cap (I6); the steps taken.
fn step_until_done(
    sim: &mut turmoil::Sim<'_>,
    book: &SharedBook,
    faults: &NetFaults,
    phase: Duration,
) -> u64 {
    let mut net = Network::default();
    let mut steps = 0u64;
    loop {
        net.apply_due(sim, book, faults);
        let t = sim.elapsed();
        if !net.healed && t >= phase {
            net.heal(sim, book, faults);
        }
        if net.healed && healed_phase_overran(book, t, phase) {
            break;
        }
        steps += 1;
        book::lock(book).steps = steps;
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                book::lock(book).fail("host", format!("a host failed: {e}"));
                break;
            }
        }
    }
    steps
}

/// I6: the application must finish by its cap after the heal.
fn healed_phase_overran(book: &SharedBook, t: Duration, phase: Duration) -> bool {
    let cap = book::lock(book)
        .must_end_by
        .unwrap_or_default()
        .max(phase + Duration::from_secs(200));
    if t <= cap {
        return false;
    }
    book::lock(book).fail(
        "I6",
        format!(
            "the application had not finished at {} ms, after the faults stopped \
             at {} ms: an answer never came",
            t.as_millis(),
            phase.as_millis()
        ),
    );
    true
}

/// The application finished its script (I6), then the end checks.
fn check_the_end(b: &mut Book, store: &SharedStore, app_end: &AppEnd) {
    if b.failure.is_some() {
        return;
    }
    if !app_end.finished {
        b.fail("I6", "the application did not finish its script".into());
        return;
    }
    let abandoned = b.faults.get("abandon").copied().unwrap_or(0) > 0;
    let ending = match app_end.ending {
        Ending::Shutdown if abandoned => Ending::Abandoned,
        e => e,
    };
    let st = datastore::lock(store);
    if let Some((rule, detail)) = check::end(b, &st, &app_end.counters, ending) {
        drop(st);
        b.fail(rule, detail);
    }
}
