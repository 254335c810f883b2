//! The application host: the real tokio driver (`outbox::Outbox`) writing
//! through [`NetSink`], staging tasks, controls at random moments, and the
//! checks only the application can make.
//!
//! Phases:
//! 1. faulty (`phase` of virtual time): several tasks stage the drawn
//!    workload; flushes and settles with random deadlines, perhaps a
//!    shutdown (perhaps joined by a second call) or an abandon, at random
//!    moments. After every stage call the counters must balance (I3);
//!    every answer must come by its deadline (S-W15) and say something
//!    consistent; after a shutdown answers, I8 holds.
//! 2. healed (the world stops every fault at `phase`): unless a shutdown or
//!    abandon happened, one of two endings, drawn from the seed:
//!    - `settle` must return 0 pending within a bound (I6), then a final
//!      shutdown, then I8;
//!    - or (1 run in 4) the handles are dropped at once, with no settle
//!      and no shutdown (S-W16): the writer must drain what it holds until
//!      its drop deadline and exit, which the application sees as the
//!      sink being dropped, within the deadline and a little slack (a
//!      writer that lingers is a zombie). What was unwritten at the
//!      deadline is lost under `deadline` and handed back to no one. With
//!      the outbox gone, the final counters are read from the exported
//!      metrics: they must balance with nothing pending (S-W14). When the
//!      drop deadline covers the I6 bound, nothing may be lost under
//!      `deadline`: the drain under the writer's own shutdown is the
//!      settle's, lingering batches sent at once.
//!
//! At the end the exported metrics must equal the counters (I3); the run's
//! final counters and its ending go into the book for the end checks.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use outbox::core::{Counters, LostReason, Report};
use outbox::telemetry::names;
use outbox::{Config, Outbox, Staged};
use rand::Rng;

use super::book::{self, ms, Admit, End, Ev, ItemRec, SharedBook};
use super::check::{self, Ending};
use super::faults::NetFaults;
use super::metrics::SimRecorder;
use super::sink::{Item, NetKey, NetSink};
use super::workload::NetWorkload;
use crate::draw::{chance, gap, log_uniform, rng, SimRng};

/// A flush, settle or shutdown may answer this long after its deadline
/// (tokio's timer rounds up to the millisecond).
const SLACK: Duration = Duration::from_millis(2);

/// The writer may take this long past its drop deadline to exit: it only
/// has to take back the writes it cancelled (S-W16, S-W15).
const EXIT_SLACK: Duration = Duration::from_secs(2);

/// How often the application looks whether the writer has exited.
const EXIT_POLL: Duration = Duration::from_millis(5);

/// The drop deadline when the run ends with a shutdown: that shutdown
/// governs, the writer's own is never started.
const DEFAULT_DROP_DEADLINE: Duration = Duration::from_secs(1);

/// Everything the application host needs, drawn by the world.
#[derive(Clone)]
pub struct AppPlan {
    /// The run's seed (stagers and controls derive their generators).
    pub seed: u64,
    /// The outbox's config.
    pub config: Config,
    /// Whether items are weighed (a byte limit is set).
    pub weighs: bool,
    /// The workload.
    pub workload: NetWorkload,
    /// The faults (for the controls' schedule and the sink's rates).
    pub faults: NetFaults,
    /// The faulty phase's length.
    pub phase: Duration,
    /// The fixed part of the healed phase's liveness bound (linger,
    /// backoff, hangs, timeouts), if I6 is checked in this run; the app
    /// adds the time to drain what is pending at the heal.
    pub liveness_base: Option<Duration>,
    /// The drop ending, with the writer's drop deadline (S-W16): at the
    /// heal, if no shutdown or abandon happened, every handle is dropped
    /// instead of settling and shutting down.
    pub drop_deadline: Option<Duration>,
}

/// The I6 bound for draining `pending` items after the heal, from its
/// fixed part `base`: a healthy round trip takes a few ticks, so 20 ms per
/// write the backlog could need, one slot at a time, plus one per tenant.
pub fn i6_bound(base: Duration, pending: u64, concurrency: usize, tenants: u32) -> Duration {
    let conc = concurrency.max(1) as u64;
    let writes = pending / conc + u64::from(tenants);
    base + Duration::from_millis(20).saturating_mul(u32::try_from(writes).unwrap_or(u32::MAX))
}

/// What the application leaves for the end checks.
#[derive(Debug, Default)]
pub struct AppEnd {
    /// The outbox's counters at the end (after a drop, as the exported
    /// metrics tell them, `attempts` left 0: it is not exported).
    pub counters: Counters,
    /// How the run ended (the world tells an abandon apart).
    pub ending: Ending,
    /// The application finished its script.
    pub finished: bool,
}

/// The shared slot for [`AppEnd`].
pub type SharedEnd = Arc<Mutex<AppEnd>>;

type Net<K> = Outbox<NetSink<K>>;

/// The host software of the application (a turmoil client).
pub async fn run<K: NetKey>(
    plan: AppPlan,
    sink: NetSink<K>,
    book: SharedBook,
    end: SharedEnd,
) -> turmoil::Result {
    let recorder = SimRecorder::default();
    let Some(alive) = sink.alive() else {
        book::lock(&book).fail(
            "build",
            "the application was given a clone of the sink".into(),
        );
        return Ok(());
    };
    let built = metrics::with_local_recorder(&recorder, || {
        let mut b = Outbox::builder(sink)
            .config(plan.config.clone())
            .drop_timeout(plan.drop_deadline.unwrap_or(DEFAULT_DROP_DEADLINE));
        if plan.weighs {
            b = b.weigher(|i: &Item| u64::from(i.size));
        }
        if plan.config.dead_letters() {
            // Every run-time dead letter is checked as it comes out (I13).
            let book = Arc::clone(&book);
            b = b.dead_letters(outbox::DeadLetters::callback(
                move |dl: outbox::DeadLetter<K, Item>| {
                    let ids: Vec<u64> = dl.items.iter().map(|i| i.id).collect();
                    let tenant = dl
                        .items
                        .first()
                        .map(|i| i.tenant)
                        .filter(|t| K::of(*t) == dl.tenant);
                    let mut b = book::lock(&book);
                    if let Some((rule, detail)) =
                        check::i13::on_letter(&mut b, tenant, &ids, dl.reason)
                    {
                        b.fail(rule, detail);
                    }
                },
            ));
        }
        b.build()
    });
    let outbox = match built {
        Ok(o) => o,
        Err(e) => {
            book::lock(&book).fail("build", format!("the outbox did not build: {e}"));
            return Ok(());
        }
    };
    book::lock(&book).record(book::now(), Ev::Phase("faulty phase"));
    let mut stagers = Vec::new();
    for k in 0..plan.workload.stagers {
        let r = rng(plan.seed ^ (0x5747_0000 + u64::from(k)));
        stagers.push(tokio::spawn(stager(
            outbox.clone(),
            Arc::clone(&book),
            plan.workload.clone(),
            r,
            plan.phase,
        )));
    }
    let closing = Arc::new(Mutex::new(Vec::new()));
    let controls = tokio::spawn(controls(
        outbox.clone(),
        Arc::clone(&book),
        recorder.clone(),
        plan.clone(),
        Arc::clone(&closing),
    ));
    let sampler = tokio::spawn(sample(
        outbox.clone(),
        Arc::clone(&book),
        recorder.clone(),
        plan.phase,
    ));
    // The faulty phase; the world heals at `phase`, we look a tick later.
    tokio::time::sleep(plan.phase.saturating_sub(elapsed()) + Duration::from_millis(1)).await;
    for s in stagers {
        let _ = s.await;
    }
    let _ = controls.await;
    let _ = sampler.await;
    let closers: Vec<_> =
        std::mem::take(&mut *closing.lock().unwrap_or_else(PoisonError::into_inner));
    let closed_early = !closers.is_empty() || outbox.is_shutting_down();
    for c in closers {
        let _ = c.await;
    }
    book::lock(&book).record(book::now(), Ev::Phase("healed phase"));
    let (counters, ending) = match plan.drop_deadline.filter(|_| !closed_early) {
        Some(deadline) => drop_handles(outbox, &alive, &book, &recorder, &plan, deadline).await,
        None => {
            if !closed_early {
                healed(&outbox, &book, &recorder, &plan).await;
            }
            let counters = outbox.counters();
            if let Some(m) = recorder.mismatch(&counters) {
                book::lock(&book).fail("I3", format!("at the end: {m}"));
            }
            (counters, Ending::Shutdown)
        }
    };
    super::attempts::check_quiet(&recorder, &book).await;
    let mut e = end.lock().unwrap_or_else(PoisonError::into_inner);
    e.counters = counters;
    e.ending = ending;
    e.finished = true;
    Ok(())
}

fn elapsed() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// Stages one item and logs it; checks S-W14 (I3) after the call.
fn stage<K: NetKey>(outbox: &Net<K>, book: &SharedBook, tenant: u32, size: u32) -> Staged {
    let id = book::lock(book).items.len() as u64;
    let item = Item { id, tenant, size };
    let staged = outbox.stage(K::of(tenant), item);
    let admit = match staged {
        Staged::Accepted => Admit::Accepted,
        Staged::Dropped(r) => Admit::Dropped(r.as_str()),
        Staged::Refused => Admit::Refused,
        // A new outcome must be taught to the net world before it runs.
        other => unimplemented!("the net world does not know the stage outcome {other:?}"),
    };
    let c = outbox.counters();
    let mut b = book::lock(book);
    b.items.push(ItemRec {
        tenant,
        admit,
        handed_back: false,
        staged_at: book::now(),
        dead_letter: false,
    });
    b.record(book::now(), Ev::Stage { tenant, id, admit });
    let n = b.items.len();
    for (rule, detail) in check::i3::counters_balance(&c)
        .into_iter()
        .chain(check::i3::every_stage_counted(&c, n))
    {
        b.fail(rule, detail);
    }
    staged
}

async fn stager<K: NetKey>(
    outbox: Net<K>,
    book: SharedBook,
    w: NetWorkload,
    mut r: SimRng,
    until: Duration,
) {
    let mut burst = 0u32;
    loop {
        let wait = if burst > 0 {
            burst -= 1;
            Duration::from_micros(r.random_range(0..=1_000))
        } else {
            if chance(&mut r, 1, w.burst_odds) {
                burst = r.random_range(1..=w.burst_max);
            }
            gap(&mut r, w.mean_gap)
        };
        // Never past the end of the faulty phase: the healed phase waits
        // for the stagers.
        tokio::time::sleep(wait.min(until.saturating_sub(elapsed()))).await;
        if elapsed() >= until || book::lock(&book).items.len() as u64 >= w.cap {
            return;
        }
        let tenant = w.tenant(&mut r);
        let count = r.random_range(1..=w.max_count);
        for _ in 0..count {
            let size = w.size(&mut r);
            let _ = stage(&outbox, &book, tenant, size);
        }
    }
}

/// Every 250 ms of the faulty phase: the counters balance and the
/// exported metrics equal them (I3, S-W11, S-W14).
async fn sample<K: NetKey>(
    outbox: Net<K>,
    book: SharedBook,
    recorder: SimRecorder,
    until: Duration,
) {
    while elapsed() < until {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let c = outbox.counters();
        let mismatch = recorder.mismatch(&c);
        let mut b = book::lock(&book);
        if let Some((rule, detail)) = check::i3::counters_balance(&c) {
            b.fail(rule, detail);
        }
        if let Some(m) = mismatch {
            b.fail("I3", m);
        }
    }
}

fn counts(r: &Report) -> [u64; 4] {
    [r.written, r.dropped, r.lost, r.pending]
}

/// Checks an answer against its deadline (S-W15) and its own consistency.
fn judge(book: &SharedBook, kind: &'static str, called: Duration, deadline: Duration, r: &Report) {
    let now = elapsed();
    let mut b = book::lock(book);
    b.record(
        book::now(),
        Ev::Answer {
            kind,
            counts: counts(r),
            deadline_passed: r.deadline_passed,
        },
    );
    if now > called + deadline + SLACK {
        b.fail(
            "S-W15",
            format!(
                "a {kind} with a {} ms deadline answered after {} ms",
                ms(deadline),
                ms(now - called)
            ),
        );
    }
    if !r.deadline_passed && r.pending > 0 {
        b.fail(
            "S-A4",
            format!(
                "a {kind} answered in time with {} items still pending",
                r.pending
            ),
        );
    }
}

/// Flushes and settles at random moments, a shutdown and an abandon when
/// the plan says; every answer is awaited on its own task.
async fn controls<K: NetKey>(
    outbox: Net<K>,
    book: SharedBook,
    recorder: SimRecorder,
    plan: AppPlan,
    closing: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
) {
    let mut r = rng(plan.seed ^ 0xC0_4712);
    let f = &plan.faults;
    let mut next_control = f.control_gap.map(|g| gap(&mut r, g));
    let mut shutdown = f.shutdown_at;
    let mut join = None;
    let mut abandon = f.abandon_at;
    loop {
        let next = [
            next_control,
            shutdown.map(|s| s.0),
            join.map(|j: (Duration, Duration)| j.0),
            abandon,
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(at) = next.filter(|at| *at < plan.phase) else {
            return;
        };
        tokio::time::sleep(at.saturating_sub(elapsed())).await;
        let now = elapsed();
        if abandon.is_some_and(|a| a <= now) {
            abandon = None;
            book::lock(&book).record(
                book::now(),
                Ev::Control {
                    kind: "abandon",
                    deadline_ms: 0,
                },
            );
            book::lock(&book).fault(book::now(), "abandon");
            book::lock(&book).closing = true;
            book::lock(&book).breaker.may_cancel();
            let held = outbox.abandon();
            let mut b = book::lock(&book);
            // Slices in flight are given up too (lost under `abandoned`),
            // though not handed back: whatever their attempt returns.
            let running: Vec<u64> = b
                .slices
                .values()
                .filter(|s| s.last == End::Running)
                .flat_map(|s| s.ids.iter().copied())
                .collect();
            for id in running {
                b.items[id as usize].handed_back = true;
            }
            for run in &held {
                for i in &run.items {
                    b.items[i.id as usize].handed_back = true;
                }
            }
            if outbox.pending() != 0 {
                let p = outbox.pending();
                b.fail("S-A7", format!("{p} items still pending after abandon"));
            }
            b.closed_at.get_or_insert(book::now());
            continue;
        }
        if let Some((at, deadline)) = shutdown.filter(|s| s.0 <= now) {
            shutdown = None;
            join = f.shutdown_join.map(|(after, d)| (at + after, d));
            let h = tokio::spawn(shut_down(
                outbox.clone(),
                Arc::clone(&book),
                recorder.clone(),
                deadline,
                true,
            ));
            closing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(h);
            continue;
        }
        if let Some((_, deadline)) = join.filter(|j| j.0 <= now) {
            join = None;
            let h = tokio::spawn(shut_down(
                outbox.clone(),
                Arc::clone(&book),
                recorder.clone(),
                deadline,
                false,
            ));
            closing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(h);
            continue;
        }
        if next_control.is_some_and(|c| c <= now) {
            let g = f.control_gap.unwrap_or(Duration::from_secs(1));
            next_control = Some(now + gap(&mut r, g).max(Duration::from_micros(1)));
            let deadline = if chance(&mut r, 1, 10) {
                Duration::ZERO
            } else {
                Duration::from_millis(log_uniform(&mut r, 1, 60_000))
            };
            let flush = chance(&mut r, 1, 2);
            let kind = if flush { "flush" } else { "settle" };
            book::lock(&book).record(
                book::now(),
                Ev::Control {
                    kind,
                    deadline_ms: ms(deadline),
                },
            );
            book::lock(&book).fault(book::now(), kind);
            let answer = if flush {
                outbox.flush(deadline)
            } else {
                outbox.settle(deadline)
            };
            let book = Arc::clone(&book);
            tokio::spawn(async move {
                let report = answer.await;
                judge(&book, kind, now, deadline, &report);
            });
        }
    }
}

/// Shuts down with `deadline` and checks the answer and I8. `first_call`:
/// this call raised the fence (its report carries the accounting).
async fn shut_down<K: NetKey>(
    outbox: Net<K>,
    book: SharedBook,
    recorder: SimRecorder,
    deadline: Duration,
    first_call: bool,
) {
    let called = elapsed();
    {
        let mut b = book::lock(&book);
        b.record(
            book::now(),
            Ev::Control {
                kind: "shutdown",
                deadline_ms: ms(deadline),
            },
        );
        b.fault(book::now(), "shutdown");
        b.closing = true;
        b.breaker.may_cancel();
    }
    let was_closing = outbox.is_shutting_down();
    let report = outbox.shutdown(deadline).await;
    judge(&book, "shutdown", called, deadline, &report.report());
    let mut b = book::lock(&book);
    if first_call && !was_closing && !report.first {
        b.fail(
            "S-W9",
            "the shutdown that raised the fence was not told it was first".into(),
        );
    }
    if !report.first && report.report() != Report::default() && !report.deadline_passed {
        b.fail(
            "S-W9",
            format!(
                "a joining shutdown reported {:?}; the loss is reported once",
                report.report()
            ),
        );
    }
    if report.pending != 0 {
        b.fail(
            "S-W9",
            format!("a shutdown answered with {} pending", report.pending),
        );
    }
    let mut dead = 0u64;
    for items in report.unwritten.iter().map(|r| &r.items) {
        for i in items {
            dead += 1;
            b.items[i.id as usize].handed_back = true;
        }
    }
    b.closed_at.get_or_insert(book::now());
    drop(b);
    // I8: nothing pending, the gauge at zero, later stages refused and
    // counted, no write starts (checked by the sink).
    let c = outbox.counters();
    if dead > c.lost(LostReason::Deadline) {
        book::lock(&book).fail(
            "S-B6",
            format!(
                "{dead} dead letters handed back, {} items lost under `deadline`",
                c.lost(LostReason::Deadline)
            ),
        );
    }
    if outbox.pending() != 0 || c.pending != 0 {
        book::lock(&book).fail(
            "I8",
            format!(
                "{} items pending after the shutdown answered",
                outbox.pending()
            ),
        );
    }
    if recorder.pending_gauge() != Some(0.0) {
        book::lock(&book).fail(
            "I8",
            format!(
                "the pending gauge is {:?} after the shutdown answered",
                recorder.pending_gauge()
            ),
        );
    }
    let before = c.lost(LostReason::Shutdown);
    let staged = stage(&outbox, &book, 0, 1);
    let after = outbox.counters().lost(LostReason::Shutdown);
    if staged != Staged::Refused || after != before + 1 {
        book::lock(&book).fail(
            "I8",
            format!(
                "a stage after the shutdown answered gave {staged:?}, lost(shutdown) {before} -> {after}"
            ),
        );
    }
}

/// The healed phase: I6, then a final shutdown and I8.
async fn healed<K: NetKey>(
    outbox: &Net<K>,
    book: &SharedBook,
    recorder: &SimRecorder,
    plan: &AppPlan,
) {
    let deadline = match plan.liveness_base {
        Some(base) => {
            *book::lock(book).faults.entry("i6_checked").or_default() += 1;
            let bound = i6_bound(
                base,
                outbox.pending(),
                plan.config.concurrency(),
                plan.workload.tenants,
            );
            let called = elapsed();
            book::lock(book).must_end_by = Some(called + bound + bound + Duration::from_secs(60));
            book::lock(book).record(
                book::now(),
                Ev::Control {
                    kind: "settle",
                    deadline_ms: ms(bound),
                },
            );
            let pending = outbox.pending();
            let report = outbox.settle(bound).await;
            judge(book, "settle", called, bound, &report);
            if report.pending != 0 || report.deadline_passed || outbox.pending() != 0 {
                book::lock(book).fail(
                    "I6",
                    format!(
                        "after the faults stopped, a settle with a {} ms bound left {} of {pending} \
                         items pending ({} pending now)",
                        ms(bound),
                        report.pending,
                        outbox.pending()
                    ),
                );
            }
            bound
        }
        None => {
            *book::lock(book)
                .faults
                .entry("liveness_unchecked")
                .or_default() += 1;
            Duration::from_secs(10)
        }
    };
    shut_down(
        outbox.clone(),
        Arc::clone(book),
        recorder.clone(),
        deadline,
        true,
    )
    .await;
}

/// The drop ending (S-W16): the last handle is dropped at the heal, with
/// no settle and no shutdown; the writer must drain until `deadline`,
/// give up what is left, and exit. Returns the final counters, read from
/// the exported metrics since the outbox is gone, and the ending.
async fn drop_handles<K: NetKey>(
    outbox: Net<K>,
    alive: &Weak<()>,
    book: &SharedBook,
    recorder: &SimRecorder,
    plan: &AppPlan,
    deadline: Duration,
) -> (Counters, Ending) {
    let before = outbox.counters();
    if let Some(m) = recorder.mismatch(&before) {
        book::lock(book).fail("I3", format!("at the drop: {m}"));
    }
    let called = elapsed();
    // Liveness is checked where I6 is and the deadline leaves the drain
    // I6's whole bound: the writer's shutdown drains as a settle does,
    // lingering batches sent at once (S-A3), so it must lose nothing.
    let covered = plan
        .liveness_base
        .map(|base| {
            i6_bound(
                base,
                before.pending,
                plan.config.concurrency(),
                plan.workload.tenants,
            )
        })
        .filter(|bound| *bound <= deadline);
    log_drop(book, called, deadline, covered.is_some());
    // The last handle: the stagers, the controls and the sampler have
    // ended (their tasks are done, so their clones are gone), no shutdown
    // ran (its task would hold one), and a flush or settle still waiting
    // holds only its answer's channel, not a handle.
    drop(outbox);
    if !writer_exits(alive, book, called, deadline, before.pending).await {
        return (before, Ending::Dropped { gave_up_at: None });
    }
    book::lock(book).record(book::now(), Ev::Phase("the writer exited"));
    let staged = book::lock(book).items.len() as u64;
    let c = match recorder.counters(staged) {
        Ok(c) => c,
        Err(e) => {
            book::lock(book).fail("I3", format!("after the writer exited: {e}"));
            return (before, Ending::Dropped { gave_up_at: None });
        }
    };
    let mut b = book::lock(book);
    let lost = c.lost(LostReason::Deadline);
    let broken = [
        check::s_w16::nothing_pending_after_exit(&c),
        check::i3::counters_balance_after_exit(&c),
        check::i3::counters_never_decrease(&before, &c),
    ];
    for (rule, detail) in broken.into_iter().flatten() {
        b.fail(rule, detail);
    }
    if lost > 0 {
        *b.faults.entry("drop_gave_up").or_default() += 1;
    }
    if let Some(broken) =
        covered.and_then(|bound| check::s_w16::drained_what_it_held(deadline, bound, &before, lost))
    {
        b.fail(broken.0, broken.1);
    }
    // With a zero deadline the writer gives up in the very round it starts
    // its shutdown, after applying the outcomes it had joined: none of the
    // attempts ending then was given up, and none can end later (they are
    // cancelled). Else the deadline fires in a later round, before any
    // outcome of that round is applied (see `check::fates::tally`).
    let gave_up_at = recorder
        .first_counted(names::EVENTS_LOST, Some(LostReason::Deadline.as_str()))
        .filter(|_| !deadline.is_zero());
    (c, Ending::Dropped { gave_up_at })
}

/// Logs the drop and sets the run's time cap (I6).
fn log_drop(book: &SharedBook, called: Duration, deadline: Duration, covered: bool) {
    let mut b = book::lock(book);
    b.record(
        book::now(),
        Ev::Control {
            kind: "drop",
            deadline_ms: ms(deadline),
        },
    );
    b.fault(book::now(), "drop");
    b.breaker.may_cancel();
    if covered {
        *b.faults.entry("drop_i6_bound").or_default() += 1;
    }
    b.must_end_by = Some(called + deadline + EXIT_SLACK + Duration::from_secs(60));
}

/// Waits for the writer to exit after the drop (S-W16); false, with the
/// failure logged, if it is still there after `deadline` and some slack.
async fn writer_exits(
    alive: &Weak<()>,
    book: &SharedBook,
    called: Duration,
    deadline: Duration,
    pending: u64,
) -> bool {
    let limit = called + deadline + EXIT_SLACK;
    while alive.strong_count() > 0 {
        if elapsed() > limit {
            book::lock(book).fail(
                "S-W16",
                format!(
                    "the writer has not exited {} ms after every handle was dropped (drop \
                     deadline {} ms, {} items pending then): it lingers as a zombie",
                    ms(elapsed() - called),
                    ms(deadline),
                    pending
                ),
            );
            return false;
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
    true
}
