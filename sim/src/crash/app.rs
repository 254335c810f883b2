//! The application host of the crash world: one life of the process per
//! start. Each life builds a journaled outbox on the host's simulated disk
//! (recovery runs in the build), then, until the world heals or asks for
//! a clean shutdown, stages the drawn workload and calls `sync` from time
//! to time, noting in the [`Ledger`] which items each answered sync
//! covered (D1). A crash ends a life anywhere; the world starts the next
//! one on the same disk.
//!
//! Once healed, the life that runs then settles the outbox within a bound
//! (D5), checks the accounting (D4) and the disk use (D6), shuts down
//! cleanly, checks the disk use again and ends the run.
//!
//! [`Ledger`]: super::ledger::Ledger

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox::core::{Counters, LostReason};
use outbox::journal::{JournalConfig, JournalError, OtherRecord, OtherVersion, Versioned};
use outbox::{BuildError, Config, Outbox, Staged, TenantId};
use rand::Rng;

use super::check::{self, Broken};
use super::codec::ItemCodec;
use super::disk::{self, SharedFaults, SimDisk};
use super::ledger::{self, SharedLedger};
use super::sink::CrashSink;
use super::versions::{OnOther, Versions};
use crate::draw::{gap, rng, SimRng};
use crate::net::book::{self, Admit, Ev, ItemRec, SharedBook};
use crate::net::check::i3;
use crate::net::datastore::{self, SharedStore};
use crate::net::sink::Item;
use crate::net::workload::NetWorkload;
use crate::timeline::HostMark;

type Crash = Outbox<CrashSink>;

/// Everything a life needs, drawn by the world.
#[derive(Clone)]
pub struct AppPlan {
    /// The run's seed.
    pub seed: u64,
    /// The poison items' ids (S-J17).
    pub poison: Vec<u64>,
    /// The outbox's config.
    pub config: Config,
    /// The journal's segment size (small, so segments roll and go), or
    /// `None` for its default (a quarter of `max_bytes`).
    pub segment_bytes: Option<u64>,
    /// The journal's bound, in a share of seeds (S-J10).
    pub max_bytes: Option<u64>,
    /// The journal's group-commit interval.
    pub sync_interval: Duration,
    /// The workload.
    pub workload: NetWorkload,
    /// Mean gap between two `sync` calls.
    pub sync_gap: Duration,
    /// The codec versions of the lives (S-J14).
    pub versions: Versions,
}

impl AppPlan {
    /// The segment size the journal uses.
    pub fn segment(&self) -> u64 {
        outbox::core::journal::Limits::new(self.segment_bytes, self.max_bytes)
            .expect("the world draws valid bounds")
            .segment_bytes
    }
}

/// What the world tells the running life.
#[derive(Debug, Default)]
pub struct Control {
    /// Every fault stopped: settle, check and end.
    pub healed: AtomicBool,
    /// Shut down cleanly now and exit.
    pub shutdown: AtomicBool,
}

/// What the application leaves for the end checks.
#[derive(Debug, Default)]
pub struct AppEnd {
    /// The last life's counters after its final shutdown.
    pub counters: Counters,
    /// The run's script finished.
    pub finished: bool,
}

/// Everything shared by the lives of the application.
#[derive(Clone)]
pub struct Ctx {
    /// The plan.
    pub plan: Arc<AppPlan>,
    /// The book.
    pub book: SharedBook,
    /// The ledger.
    pub ledger: SharedLedger,
    /// The disk's faults.
    pub faults: SharedFaults,
    /// The world's orders.
    pub control: Arc<Control>,
    /// The end.
    pub end: Arc<Mutex<AppEnd>>,
    /// The datastore (what is written, for S-J14's checks at recovery).
    pub store: SharedStore,
}

/// How often the journal retries after a fault (S-J5).
const RETRY_INTERVAL: Duration = Duration::from_millis(100);

fn fail(book: &SharedBook, broken: impl IntoIterator<Item = Broken>) {
    let mut b = book::lock(book);
    for (rule, detail) in broken {
        b.fail(rule, detail);
    }
}

/// The records a `Hand` recovery handed over (S-J14), per build.
type Handed = Arc<Mutex<Vec<OtherRecord>>>;

fn build(
    ctx: &Ctx,
    (version, on_other): (u32, OnOther),
    handed: &Handed,
) -> Result<Crash, BuildError> {
    let plan = &ctx.plan;
    let other = match on_other {
        OnOther::Refuse => OtherVersion::Refuse,
        OnOther::Fail => OtherVersion::Fail,
        OnOther::Hand => {
            let handed = Arc::clone(handed);
            OtherVersion::hand(move |r| {
                handed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(r);
            })
        }
    };
    let mut journal = JournalConfig::with_storage(SimDisk::new(Arc::clone(&ctx.faults)))
        .inline_io(true)
        .max_bytes(plan.max_bytes)
        .sync_interval(plan.sync_interval)
        .retry_interval(RETRY_INTERVAL)
        .other_version(other)
        .wall_clock(wall_clock);
    if let Some(segment) = plan.segment_bytes {
        journal = journal.segment_bytes(segment);
    }
    Outbox::builder(CrashSink::new(
        Arc::clone(&ctx.book),
        Arc::clone(&ctx.ledger),
        Arc::clone(&ctx.faults),
    ))
    .config(plan.config.clone())
    .journal_with_codec(journal, Versioned::new(ItemCodec, version))
    .dead_letters(dead_letters(ctx))
    .build()
}

/// The wall clock records are stamped with and recovered ages measured
/// on (S-R3): the simulation's time from a fixed date (2026-01-01 UTC),
/// so an age across a crash is the simulated time between the stage and
/// the recovery, the same on every replay (the system's clock would make
/// a recovered item's age, and whether it outlived the linger, S-A3,
/// depend on the machine).
fn wall_clock() -> SystemTime {
    const EPOCH: Duration = Duration::from_secs(1_767_225_600);
    UNIX_EPOCH + EPOCH + turmoil::sim_elapsed().unwrap_or_default()
}

/// Notes the items dead-lettered `poisoned` (S-J17) and `expired`
/// (S-R3, checked old enough); the world's outbox gives nothing else up
/// while it runs.
fn dead_letters(ctx: &Ctx) -> outbox::DeadLetters<TenantId, Item> {
    let ledger = Arc::clone(&ctx.ledger);
    let book = Arc::clone(&ctx.book);
    outbox::DeadLetters::callback(move |d: outbox::DeadLetter<TenantId, Item>| {
        let ids: Vec<u64> = d.items.iter().map(|i| i.id).collect();
        match d.reason {
            outbox::DeadReason::Poisoned => {
                book::lock(&book).record(
                    book::now(),
                    Ev::Note(format!("items {ids:?} dead-lettered poisoned")),
                );
                ledger::lock(&ledger).poisoned.extend(ids);
            }
            outbox::DeadReason::Expired => {
                let mut b = book::lock(&book);
                let now = book::now();
                b.record(
                    now,
                    Ev::Note(format!("items {ids:?} dead-lettered expired")),
                );
                if let Some((rule, detail)) = check::s_r3::expired_when_old(&b, &ids, now) {
                    b.fail(rule, detail);
                }
                let mut l = ledger::lock(&ledger);
                if let Some((rule, detail)) = (!d.attempted)
                    .then(|| check::s_j16::unattempted(&l, &ids))
                    .flatten()
                {
                    b.fail(rule, detail);
                }
                drop(b);
                l.expired.extend(ids);
            }
            _ => {}
        }
    })
}

/// Builds the life's outbox (recovery runs in the build) as a supervisor
/// would: again a moment later when it fails, and, when a `Fail` build
/// meets items of another codec version (S-J14), rolled back to the
/// version the last life ran, handing over what that one does not read.
/// The deploy it ran and the records handed over; `None` when the journal
/// does not open after the heal (D5, failed).
async fn open(ctx: &Ctx, life: u32) -> Option<(Crash, (u32, OnOther), Vec<OtherRecord>)> {
    let deploy = ctx.plan.versions.of(life);
    let mut run = (deploy.version, deploy.on_other);
    let handed: Handed = Arc::default();
    loop {
        handed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        ledger::lock(&ctx.ledger).version = run.0;
        let before = (run.1 == OnOther::Fail).then(disk::snapshot);
        // What the recovery can know an earlier life attempted (S-J16).
        let marked = disk::marked_items().unwrap_or_default();
        let e = match build(ctx, run, &handed) {
            Ok(o) => {
                // A mark a rotten byte hid from the recovery (its read
                // may have drawn the rot) is one it cannot know (S-J16).
                let rotten = disk::lock(&ctx.faults).rotten_marks.clone();
                // The recovery read the wall clock in the build (S-R3).
                let mut l = ledger::lock(&ctx.ledger);
                l.recovered_at = Some(book::now());
                l.marked_at_recovery = marked
                    .into_iter()
                    .filter(|(seq, _)| !rotten.contains(seq))
                    .map(|(_, id)| id)
                    .collect();
                drop(l);
                let records =
                    std::mem::take(&mut *handed.lock().unwrap_or_else(PoisonError::into_inner));
                return Some((o, run, records));
            }
            Err(e) => e,
        };
        if let BuildError::Journal(JournalError::OtherVersion {
            file,
            version,
            expected,
            items,
        }) = &e
        {
            if run.1 == OnOther::Fail {
                let unchanged = before.is_some_and(|b| b.ok() == disk::snapshot().ok());
                let error = (file.as_str(), *version, *expected, *items);
                run = rolled_back(ctx, life, run.0, error, unchanged);
                continue;
            }
        }
        let healed = ctx.control.healed.load(Ordering::SeqCst);
        book::lock(&ctx.book).record(
            book::now(),
            Ev::Note(format!("life {life}: the outbox did not build: {e}")),
        );
        if healed {
            fail(
                &ctx.book,
                [(
                    "D5",
                    format!("the journal does not open after the faults stopped: {e}"),
                )],
            );
            ctx.end
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .finished = true;
            return None;
        }
        // A supervisor starts the process again a moment later.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `Fail` build of `version` met items of another version (S-J14):
/// checks its error, and rolls the deploy back to the version the last
/// life ran, under `Hand`.
fn rolled_back(
    ctx: &Ctx,
    life: u32,
    version: u32,
    error: (&str, u32, u32, u64),
    unchanged: bool,
) -> (u32, OnOther) {
    let written = written(ctx);
    let rotten = disk::lock(&ctx.faults).rotten_items.clone();
    let mut b = book::lock(&ctx.book);
    let mut l = ledger::lock(&ctx.ledger);
    l.version_fails += 1;
    let r = check::s_j14::refusable(&b, &l, version, &written, &rotten);
    let broken = check::s_j14::failed_as_told(life, version, error, &r, &l, unchanged);
    let back = l.versions.values().next_back().copied().unwrap_or(version);
    b.record(
        book::now(),
        Ev::Note(format!(
            "life {life}: the build of codec version {version} refused {} items of version {} \
             (OtherVersion); the deploy is rolled back to version {back}, handing them over",
            error.3, error.1
        )),
    );
    for (rule, detail) in broken {
        b.fail(rule, detail);
    }
    (back, OnOther::Hand)
}

/// S-J17: before the recovery, each crash since the last start counts
/// against the items whose attempt marks a failed commit of its process
/// left on the disk (never handed to the sink then: on a journal that is
/// down the attempt waits, and the journal cannot make "did not start"
/// durable before that commit's sync, so its recovery counts the mark).
fn unstarted_cuts(ctx: &Ctx) {
    let pending = std::mem::take(&mut ledger::lock(&ctx.ledger).unstarted);
    if pending.is_empty() {
        return;
    }
    let on_disk = match disk::attempt_marks() {
        Ok(m) => m,
        Err(e) => {
            fail(
                &ctx.book,
                [("S-J17", format!("the disk cannot be read: {e}"))],
            );
            return;
        }
    };
    let mut l = ledger::lock(&ctx.ledger);
    for (marks, poison) in pending {
        let cut: BTreeSet<u64> = marks
            .iter()
            .filter(|(mark, _)| on_disk.contains(mark))
            .map(|(_, id)| *id)
            .collect();
        for id in cut {
            let c = l.cuts.entry(id).or_default();
            c.0 += 1;
            if poison.is_some_and(|p| p != id) {
                c.1 += 1;
            }
        }
    }
}

/// The items in the datastore now.
fn written(ctx: &Ctx) -> BTreeSet<u64> {
    let st = datastore::lock(&ctx.store);
    st.by_tenant.values().flatten().copied().collect()
}

/// The recovery of a life that runs codec `version` under `on_other`
/// (S-J14): what it counted lost under `other_version` and the records it
/// handed over are checked against what it may and must refuse; the
/// ledger learns the life's version and what may be gone.
fn refusals(
    ctx: &Ctx,
    outbox: &Crash,
    life: u32,
    (version, on_other): (u32, OnOther),
    records: &[OtherRecord],
) {
    let lost = outbox.counters().lost(LostReason::OtherVersion);
    let written = written(ctx);
    let rotten = disk::lock(&ctx.faults).rotten_items.clone();
    let mut b = book::lock(&ctx.book);
    let mut l = ledger::lock(&ctx.ledger);
    let r = check::s_j14::refusable(&b, &l, version, &written, &rotten);
    let mut broken = Vec::new();
    let mut ids = Vec::new();
    for rec in records {
        match check::s_j14::handed_record(&b, &l, version, rec) {
            Ok(id) => ids.push(id),
            Err(e) => broken.push(e),
        }
    }
    let handed = (on_other == OnOther::Hand).then_some(&ids[..]);
    broken.extend(check::s_j14::refused_as_told(
        life, version, lost, handed, &r,
    ));
    if l.versions
        .values()
        .next_back()
        .is_some_and(|&v| v != version)
    {
        l.version_changes += 1;
        b.record(
            book::now(),
            Ev::Note(format!(
                "life {life}: codec version {version} ({on_other:?}); {lost} items of another \
                 version counted lost under other_version"
            )),
        );
    }
    l.versions.insert(life, version);
    l.other_version += lost;
    if on_other == OnOther::Hand {
        l.refused.extend(ids);
    } else if lost > 0 {
        l.refused.extend(r.may);
    }
    for (rule, detail) in broken {
        b.fail(rule, detail);
    }
}

/// One life of the host (its software; turmoil calls it at every start).
pub async fn life(ctx: Ctx) -> turmoil::Result {
    let life = ledger::lock(&ctx.ledger).life;
    unstarted_cuts(&ctx);
    let Some((outbox, run, records)) = open(&ctx, life).await else {
        return Ok(());
    };
    refusals(&ctx, &outbox, life, run, &records);
    let c = outbox.counters();
    let unreadable = c.lost(LostReason::JournalUnreadable);
    let accepted_before = book::lock(&ctx.book)
        .items
        .iter()
        .filter(|i| i.admit == Admit::Accepted)
        .count() as u64;
    fail(
        &ctx.book,
        check::d4::recovery_bounded(c.recovered, accepted_before, life),
    );
    {
        let mut l = ledger::lock(&ctx.ledger);
        l.recoveries.push((life, c.recovered, unreadable));
        l.unreadable += unreadable;
    }
    book::lock(&ctx.book).record(
        book::now(),
        Ev::Host(
            HostMark::Recovery(c.recovered),
            format!(
                "life {life}: recovered {} items, {unreadable} unreadable",
                c.recovered
            ),
        ),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for k in 0..ctx.plan.workload.stagers {
        let r = rng(ctx.plan.seed ^ (0x5747_0000 + u64::from(k)) ^ (u64::from(life) << 32));
        tasks.push(tokio::spawn(stager(
            outbox.clone(),
            ctx.clone(),
            r,
            Arc::clone(&stop),
        )));
    }
    tasks.push(tokio::spawn(syncer(
        outbox.clone(),
        ctx.clone(),
        rng(ctx.plan.seed ^ 0x5_1C ^ (u64::from(life) << 32)),
        Arc::clone(&stop),
    )));
    loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        if ctx.control.healed.load(Ordering::SeqCst) {
            stop.store(true, Ordering::SeqCst);
            for t in tasks {
                let _ = t.await;
            }
            healed(outbox, &ctx, life).await;
            return Ok(());
        }
        if ctx.control.shutdown.swap(false, Ordering::SeqCst) {
            stop.store(true, Ordering::SeqCst);
            for t in tasks {
                let _ = t.await;
            }
            shut_down(&outbox, &ctx, life, Duration::from_secs(5)).await;
            book::lock(&ctx.book).record(
                book::now(),
                Ev::Note(format!("life {life}: the process exits after its shutdown")),
            );
            return Ok(());
        }
    }
}

/// Stages one item and notes it.
fn stage(outbox: &Crash, ctx: &Ctx, tenant: u32, size: u32) -> Option<u64> {
    // Noted before the call: the sink may be handed it at once.
    let id = note(ctx, tenant);
    let item = Item { id, tenant, size };
    let staged = outbox.stage(TenantId::from_u128(u128::from(tenant) + 1), item);
    admitted(ctx, tenant, id, staged)
}

/// Stages a run of items of one tenant with `stage_many_outcomes` (S-W20)
/// and notes each, as `stage` would.
fn stage_run(outbox: &Crash, ctx: &Ctx, tenant: u32, sizes: &[u32]) {
    let key = TenantId::from_u128(u128::from(tenant) + 1);
    let items: Vec<Item> = sizes
        .iter()
        .map(|&size| Item {
            id: note(ctx, tenant),
            tenant,
            size,
        })
        .collect();
    let ids: Vec<u64> = items.iter().map(|i| i.id).collect();
    let outcomes = outbox.stage_many_outcomes(items.into_iter().map(|i| (key, i)));
    assert_eq!(outcomes.len(), ids.len(), "S-W20: one outcome per item");
    for (id, staged) in ids.into_iter().zip(outcomes) {
        admitted(ctx, tenant, id, staged);
    }
}

/// Notes an item about to be staged (refused until its stage says).
fn note(ctx: &Ctx, tenant: u32) -> u64 {
    let mut b = book::lock(&ctx.book);
    let id = b.items.len() as u64;
    b.items.push(ItemRec {
        tenant,
        admit: Admit::Refused,
        handed_back: false,
        staged_at: book::now(),
        dead_letter: false,
    });
    {
        let mut l = ledger::lock(&ctx.ledger);
        let life = l.life;
        l.item_life.push(life);
    }
    id
}

/// Notes what the stage of item `id` said; its id if accepted.
fn admitted(ctx: &Ctx, tenant: u32, id: u64, staged: Staged) -> Option<u64> {
    let admit = match staged {
        Staged::Accepted => Admit::Accepted,
        Staged::Dropped(r) => Admit::Dropped(r.as_str()),
        Staged::ShuttingDown => Admit::Refused,
        // A new outcome must be taught to the crash world before it runs.
        other => unimplemented!("the crash world does not know the stage outcome {other:?}"),
    };
    let mut b = book::lock(&ctx.book);
    b.items[id as usize].admit = admit;
    b.record(book::now(), Ev::Stage { tenant, id, admit });
    (admit == Admit::Accepted).then_some(id)
}

async fn stager(outbox: Crash, ctx: Ctx, mut r: SimRng, stop: Arc<AtomicBool>) {
    let w = &ctx.plan.workload;
    loop {
        tokio::time::sleep(gap(&mut r, w.mean_gap)).await;
        if stop.load(Ordering::SeqCst) || book::lock(&ctx.book).items.len() as u64 >= w.cap {
            return;
        }
        let tenant = w.tenant(&mut r);
        let count = r.random_range(1..=w.max_count);
        // The same draws, in the same order, as one stage per item.
        let sizes: Vec<u32> = (0..count).map(|_| w.size(&mut r)).collect();
        // Runs of an even count go through `stage_many` (S-W20), so each
        // tenant meets both paths, interleaved, in one journal.
        if count % 2 == 0 {
            stage_run(&outbox, &ctx, tenant, &sizes);
        } else {
            for size in sizes {
                stage(&outbox, &ctx, tenant, size);
            }
        }
    }
}

/// Calls `sync` every so often; an `Ok` answer covers every item this
/// life accepted before the call (D1).
async fn syncer(outbox: Crash, ctx: Ctx, mut r: SimRng, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(gap(&mut r, ctx.plan.sync_gap)).await;
        let (life, covered) = {
            let b = book::lock(&ctx.book);
            let l = ledger::lock(&ctx.ledger);
            let covered: Vec<u64> = (l.life_start..b.items.len() as u64)
                .filter(|id| b.items[*id as usize].admit == Admit::Accepted)
                .collect();
            (l.life, covered)
        };
        let answer = outbox.sync().await;
        let ok = answer.is_ok();
        if ok && !disk::lock(&ctx.faults).writes_fail() {
            bound_held(&ctx, "at an answered sync");
        }
        {
            let mut l = ledger::lock(&ctx.ledger);
            if ok {
                l.synced.extend(covered.iter().copied());
            }
        }
        book::lock(&ctx.book).record(
            book::now(),
            Ev::Host(
                HostMark::Sync(ok),
                format!(
                    "life {life}: sync over {} items answered {}",
                    covered.len(),
                    match &answer {
                        Ok(()) => "ok".to_owned(),
                        Err(e) => e.to_string(),
                    }
                ),
            ),
        );
        accounting(&outbox, &ctx, life);
    }
}

/// I3 and D4 at any moment of a life.
fn accounting(outbox: &Crash, ctx: &Ctx, life: u32) {
    let c = outbox.counters();
    let replayed = ledger::lock(&ctx.ledger).replayed.len();
    fail(
        &ctx.book,
        i3::counters_balance(&c)
            .into_iter()
            .chain(check::d4::recovered_counted(&c, replayed, life)),
    );
}

/// A clean shutdown: every item handed back is the caller's (D1 does not
/// ask for it).
async fn shut_down(outbox: &Crash, ctx: &Ctx, life: u32, deadline: Duration) {
    book::lock(&ctx.book).record(
        book::now(),
        Ev::Control {
            kind: "shutdown",
            deadline_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
        },
    );
    let report = outbox.shutdown(deadline).await;
    let mut b = book::lock(&ctx.book);
    for items in report.unwritten.iter().map(|r| &r.items) {
        for i in items {
            b.items[i.id as usize].handed_back = true;
        }
    }
    // S-J16: a run that says it was never attempted holds nothing the
    // store may hold, as far as the outbox can know.
    let l = ledger::lock(&ctx.ledger);
    for run in report.unwritten.iter().filter(|r| !r.attempted) {
        let ids: Vec<u64> = run.items.iter().map(|i| i.id).collect();
        if let Some((rule, detail)) = check::s_j16::unattempted(&l, &ids) {
            b.fail(rule, detail);
        }
    }
    drop(l);
    let r = report.report();
    b.record(
        book::now(),
        Ev::Answer {
            kind: "shutdown",
            counts: [r.written, r.dropped, r.lost, r.pending],
            deadline_passed: r.deadline_passed,
        },
    );
    b.record(book::now(), Ev::Note(format!("life {life}: shut down")));
}

/// S-J10: with a bound, the segment files hold at most `max_bytes`.
fn bound_held(ctx: &Ctx, when: &str) {
    let Some(max) = ctx.plan.max_bytes else {
        return;
    };
    match disk::disk_use() {
        Ok((_, files)) => fail(&ctx.book, check::s_j10::bound_held(when, &files, max)),
        Err(e) => fail(
            &ctx.book,
            [("S-J10", format!("the disk cannot be read: {e}"))],
        ),
    }
}

/// The healed phase: D5, D4, D6, a clean shutdown, D6 again.
async fn healed(outbox: Crash, ctx: &Ctx, life: u32) {
    let pending = outbox.pending();
    let bound = check::d5::bound(pending);
    book::lock(&ctx.book).record(
        book::now(),
        Ev::Control {
            kind: "settle",
            deadline_ms: u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
        },
    );
    let report = outbox.settle(bound).await;
    let c = outbox.counters();
    let replayed = ledger::lock(&ctx.ledger).replayed.len();
    fail(
        &ctx.book,
        check::d5::settled_in_bound(&report, pending, bound)
            .into_iter()
            .chain(check::d4::settled_accounting(&c, life))
            .chain(check::d4::recovered_counted(&c, replayed, life))
            .chain(i3::counters_balance(&c)),
    );
    // With the faults stopped, the journal must be up again within a few
    // retry intervals (D5): an error no fault caused (a commit appending to
    // a segment it never created, say) would otherwise pass unseen.
    let mut last = outbox.sync().await;
    for _ in 0..5 {
        if last.is_ok() {
            break;
        }
        tokio::time::sleep(RETRY_INTERVAL).await;
        last = outbox.sync().await;
    }
    if let Err(e) = last {
        let detail = format!("the journal is not up 5 retry intervals after the heal: {e}");
        fail(&ctx.book, [("D5", detail)]);
    }
    // Done marks go to disk with a commit; a second one lets the segments
    // they free go.
    for _ in 0..2 {
        let _ = outbox.sync().await;
    }
    let segment = ctx.plan.segment();
    bound_held(ctx, "after the final settle");
    match disk::disk_use() {
        Ok((bytes, files)) => fail(
            &ctx.book,
            check::d6::disk_use_small("after the final settle", bytes, &files, 2 * segment + 4096),
        ),
        Err(e) => fail(&ctx.book, [("D6", format!("the disk cannot be read: {e}"))]),
    }
    shut_down(&outbox, ctx, life, Duration::from_secs(10)).await;
    let counters = outbox.counters();
    // The shutdown answers once the last done marks are durable; the
    // journal's closing round runs when the writer exits, once the last
    // handle is gone. With nothing pending, disk use must be at most the
    // current segment, whose items are all done (the journal's docs promise
    // one empty segment; a segment of an earlier life left behind is a
    // leak that grows with crashes).
    drop(outbox);
    let limit = segment + 4096;
    let mut used = disk::disk_use();
    for _ in 0..200 {
        if used
            .as_ref()
            .is_ok_and(|(bytes, files)| *bytes <= limit && files.len() <= 1)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        used = disk::disk_use();
    }
    match used {
        Ok((bytes, files)) => fail(
            &ctx.book,
            check::d6::disk_use_small("1 s after the final shutdown", bytes, &files, limit)
                .or_else(|| {
                    (files.len() > 1).then(|| {
                        (
                            "D6",
                            format!(
                                "1 s after the final shutdown: {} files: {files:?}",
                                files.len()
                            ),
                        )
                    })
                }),
        ),
        Err(e) => fail(&ctx.book, [("D6", format!("the disk cannot be read: {e}"))]),
    }
    let mut e = ctx.end.lock().unwrap_or_else(PoisonError::into_inner);
    e.counters = counters;
    e.finished = true;
}
