//! The book of one net-world run: everything the hosts and the world saw,
//! shared by them behind one lock (turmoil runs every host on one thread,
//! so the order of entries is the run's order).
//!
//! - the ordered event log, hashed for the determinism self-check (S-B4)
//!   and kept as text with `--trace`;
//! - the account of every item (how `stage` answered, whether a shutdown
//!   handed it back) and of every slice the sink saw (its attempts and how
//!   the last one ended), for the end checks (I1, I5);
//! - the weather (calm, storm, healed) the sink and the datastore read
//!   their fault rates from;
//! - what is in flight in the sink (I4) and whether the outbox is closed
//!   (I8);
//! - fault counts and the first broken invariant.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use outbox::core::Time;

use crate::timeline::{Attempt, AttemptEnd, ControlKind, HostMark, Timeline};
use outbox::testkit::Violation;

use crate::world::step_index;

/// A check of the items a per-item commit wrote for the first time.
pub type CommitCheck = fn(
    &Book,
    u128,
    &[crate::net::protocol::WireItem],
    &crate::net::datastore::Durable,
) -> Vec<(&'static str, String)>;

/// The book, shared.
pub type SharedBook = Arc<Mutex<Book>>;

/// Locks the book (a panic elsewhere never leaves it half-written).
pub fn lock(book: &SharedBook) -> MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Now, in virtual time since the start of the run (inside a host).
pub fn now() -> Time {
    Time::from_elapsed(turmoil::sim_elapsed().unwrap_or_default())
}

/// How `stage` answered for an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Admit {
    /// Accepted: pending.
    Accepted,
    /// Dropped at once by a capacity limit.
    Dropped(&'static str),
    /// Refused after the shutdown fence (lost under `shutdown`).
    Refused,
}

/// How one attempt ended, as the sink saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum End {
    /// Still running.
    Running,
    /// The sink returned `Ok` with `discarded` items consumed unwritten.
    Ok(u32),
    /// A retryable failure (error, panic, a panicking error).
    Failed,
    /// A terminal rejection.
    Terminal,
    /// The future was dropped before it finished (write timeout or
    /// cancellation).
    Dropped,
}

/// One entry of the event log.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Ev {
    /// A stage call.
    Stage {
        /// Tenant index.
        tenant: u32,
        /// Item id.
        id: u64,
        /// How it answered.
        admit: Admit,
    },
    /// The sink started an attempt of the slice whose first item is `first`.
    Attempt {
        /// Tenant index.
        tenant: u32,
        /// The slice's first item id (its identity).
        first: u64,
        /// Items in the slice.
        len: usize,
        /// 1, 2, … as the sink counts the slice's attempts.
        attempt: u32,
    },
    /// An attempt ended.
    AttemptEnd {
        /// The slice's first item id.
        first: u64,
        /// How.
        end: End,
    },
    /// The datastore committed a slice (`fresh`: for the first time).
    Commit {
        /// Tenant index.
        tenant: u32,
        /// The slice's first item id.
        first: u64,
        /// Items in the slice.
        len: usize,
        /// First commit of this identity.
        fresh: bool,
    },
    /// A fault was injected.
    Fault(&'static str),
    /// A network event was applied.
    Net(&'static str),
    /// A flush, settle, shutdown or abandon was called.
    Control {
        /// Which.
        kind: &'static str,
        /// Its deadline, ms (0 for abandon).
        deadline_ms: u64,
    },
    /// A flush, settle or shutdown answered.
    Answer {
        /// Which.
        kind: &'static str,
        /// Written, dropped, lost, pending.
        counts: [u64; 4],
        /// Whether its deadline passed.
        deadline_passed: bool,
    },
    /// A phase of the run began.
    Phase(&'static str),
    /// The application host or its journal (crash world): a crash, a
    /// restart, a recovery, a sync's answer.
    Host(HostMark, String),
    /// A line of the crash world's trace that is not drawn.
    Note(String),
}

impl fmt::Display for Ev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ev::Stage { tenant, id, admit } => write!(f, "stage t{tenant} #{id} {admit:?}"),
            Ev::Attempt {
                tenant,
                first,
                len,
                attempt,
            } => write!(f, "attempt t{tenant} slice #{first}+{len} try {attempt}"),
            Ev::AttemptEnd { first, end } => write!(f, "  end slice #{first}: {end:?}"),
            Ev::Commit {
                tenant,
                first,
                len,
                fresh,
            } => write!(
                f,
                "datastore commit t{tenant} slice #{first}+{len}{}",
                if *fresh { "" } else { " (again, a no-op)" }
            ),
            Ev::Fault(kind) => write!(f, "fault {kind}"),
            Ev::Net(kind) => write!(f, "net {kind}"),
            Ev::Control { kind, deadline_ms } => write!(f, "{kind}({deadline_ms} ms)"),
            Ev::Answer {
                kind,
                counts,
                deadline_passed,
            } => write!(
                f,
                "{kind} answered: written {} dropped {} lost {} pending {}{}",
                counts[0],
                counts[1],
                counts[2],
                counts[3],
                if *deadline_passed {
                    ", deadline passed"
                } else {
                    ""
                }
            ),
            Ev::Phase(p) => write!(f, "== {p}"),
            Ev::Host(mark, what) => write!(f, "host {}: {what}", mark.as_str()),
            Ev::Note(what) => write!(f, "{what}"),
        }
    }
}

/// What the book knows of one item.
#[derive(Clone, Copy, Debug)]
pub struct ItemRec {
    /// Tenant index.
    pub tenant: u32,
    /// How `stage` answered.
    pub admit: Admit,
    /// Handed back by a shutdown (dead letter) or by abandon.
    pub handed_back: bool,
    /// When `stage` was called (I12).
    pub staged_at: Time,
    /// Handed out in a run-time dead letter (I13).
    pub dead_letter: bool,
}

/// What the sink saw of one slice (identified by its first item).
#[derive(Clone, Debug)]
pub struct SliceRec {
    /// Tenant index.
    pub tenant: u32,
    /// The item ids of the first attempt.
    pub ids: Vec<u64>,
    /// Attempts started.
    pub attempts: u32,
    /// How the latest attempt ended.
    pub last: End,
    /// When the latest attempt ended (I7: the next starts a backoff later).
    pub ended_at: Option<Time>,
}

/// The weather the fault rates follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Weather {
    /// A storm: rates times the storm factor.
    pub storm: bool,
    /// The faults have stopped for good.
    pub healed: bool,
}

/// The book of one run (see the module docs).
#[derive(Debug)]
pub struct Book {
    hasher: DefaultHasher,
    events: u64,
    /// The event log as text, with `--trace`.
    pub trace: Option<Vec<String>>,
    /// The first broken invariant.
    pub failure: Option<Violation>,
    /// Faults and controls injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// The weather.
    pub weather: Weather,
    /// Every item staged, by id.
    pub items: Vec<ItemRec>,
    /// Every slice the sink saw, by its first item's id.
    pub slices: BTreeMap<u64, SliceRec>,
    /// Sink attempts in flight, per tenant (I4).
    pub in_flight: BTreeMap<u32, u32>,
    /// Sink attempts in flight in all (I4).
    pub in_flight_total: usize,
    /// The most attempts ever in flight at once.
    pub in_flight_max: usize,
    /// The configured concurrency (0 taken as 1).
    pub concurrency: usize,
    /// The shortest backoff the config allows: `initial_backoff` less its
    /// full jitter (I7).
    pub min_backoff: Duration,
    /// The sink's model of the breaker (I10).
    pub breaker: crate::net::check::i10::Model,
    /// Run-time dead letters are on (I13, S-R4).
    pub dead_letters_on: bool,
    /// Items handed out as run-time dead letters, per `DeadReason::ALL`.
    pub dead_letters: [u64; outbox::DeadReason::ALL.len()],
    /// The configured `max_item_age` (I12, S-R3).
    pub max_item_age: Option<Duration>,
    /// A shutdown or abandon was called (backoff no longer checked).
    pub closing: bool,
    /// When a shutdown answered or abandon returned: no attempt may start
    /// after (I8).
    pub closed_at: Option<Time>,
    /// Turmoil steps so far (the run's step count).
    pub steps: u64,
    /// The healed phase must be over by then (virtual time), or the run
    /// is stuck (I6).
    pub must_end_by: Option<Duration>,
    /// The picture of the run, with `--trace` and at most 255 tenants.
    pub timeline: Option<Timeline>,
    /// Checks run on each per-item commit (crash world: D2, D3), given
    /// the request's tenant, the items committed now and the store.
    pub on_commit: Option<CommitCheck>,
    /// Per slice (first item id): its open attempt's index in the
    /// timeline, and when its last attempt ended (for backoff lines).
    open: BTreeMap<u64, usize>,
    last_end: BTreeMap<u64, Time>,
    storm_began: Option<Time>,
}

impl Book {
    /// An empty book; `trace` keeps the log as text.
    pub fn new(trace: bool, concurrency: usize) -> Book {
        Book {
            hasher: DefaultHasher::new(),
            events: 0,
            trace: trace.then(Vec::new),
            failure: None,
            faults: BTreeMap::new(),
            weather: Weather::default(),
            items: Vec::new(),
            slices: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            in_flight_total: 0,
            in_flight_max: 0,
            concurrency: concurrency.max(1),
            min_backoff: Duration::ZERO,
            max_item_age: None,
            dead_letters_on: false,
            dead_letters: [0; outbox::DeadReason::ALL.len()],
            breaker: crate::net::check::i10::Model::default(),
            closing: false,
            closed_at: None,
            steps: 0,
            must_end_by: None,
            timeline: None,
            on_commit: None,
            open: BTreeMap::new(),
            last_end: BTreeMap::new(),
            storm_began: None,
        }
    }

    /// Keeps a timeline of the run for `tenants` tenants (at most 255).
    pub fn with_timeline(mut self, tenants: u32) -> Book {
        if let Ok(tenants) = u8::try_from(tenants) {
            self.timeline = Some(Timeline {
                tenants,
                ..Timeline::default()
            });
        }
        self
    }

    /// Closes the timeline at `end` and hands it out.
    pub fn take_timeline(&mut self, end: Time) -> Option<Timeline> {
        let mut t = self.timeline.take()?;
        if let Some(began) = self.storm_began.take() {
            t.storms.push((began, end));
        }
        t.end = end;
        Some(t)
    }

    fn draw(&mut self, at: Time, ev: &Ev) {
        let Some(t) = self.timeline.as_mut() else {
            return;
        };
        let lane = |tenant: u32| u8::try_from(tenant).ok();
        match ev {
            Ev::Stage { tenant, admit, .. } => {
                if let Some(k) = lane(*tenant) {
                    let ok = u32::from(*admit == Admit::Accepted);
                    t.stages.push((at, k, ok, 1 - ok));
                }
            }
            Ev::Attempt {
                tenant,
                first,
                len,
                attempt,
            } => {
                if let Some(k) = lane(*tenant) {
                    if let Some(end) = self.last_end.remove(first) {
                        t.backoffs.push((k, end, at));
                    }
                    self.open.insert(*first, t.attempts.len());
                    t.attempts.push(Attempt {
                        tenant: k,
                        write: *first,
                        attempt: *attempt,
                        items: *len,
                        start: at,
                        end: at,
                        result: AttemptEnd::Running,
                    });
                }
            }
            Ev::AttemptEnd { first, end } => {
                if let Some(ix) = self.open.remove(first) {
                    let a = &mut t.attempts[ix];
                    a.end = at;
                    a.result = match end {
                        End::Running => AttemptEnd::Running,
                        End::Ok(_) => AttemptEnd::Written,
                        End::Failed => AttemptEnd::Failed,
                        End::Terminal => AttemptEnd::Rejected,
                        End::Dropped => AttemptEnd::Cancelled,
                    };
                    self.last_end.insert(*first, at);
                }
            }
            Ev::Control { kind, deadline_ms } => {
                let (kind, deadline) = match *kind {
                    "flush" => (ControlKind::Flush, Some(*deadline_ms)),
                    "settle" => (ControlKind::Settle, Some(*deadline_ms)),
                    // Dropping the handles starts the writer's own
                    // shutdown with the drop deadline (S-W16).
                    "shutdown" | "drop" => (ControlKind::Shutdown, Some(*deadline_ms)),
                    _ => (ControlKind::Abandon, None),
                };
                let deadline = deadline.map(|d| at + Duration::from_millis(d));
                t.controls.push((at, kind, deadline));
            }
            Ev::Host(mark, _) => t.host.push((at, *mark)),
            Ev::Fault("storm") => self.storm_began = Some(at),
            Ev::Net(what) if what.starts_with("storm_end") || what.starts_with("healed") => {
                if let Some(began) = self.storm_began.take() {
                    t.storms.push((began, at));
                }
                if what.starts_with("healed") {
                    t.healed_at = Some(at);
                }
            }
            _ => {}
        }
    }

    /// Records `ev` at `at` in the log (and its hash).
    pub fn record(&mut self, at: Time, ev: Ev) {
        self.events += 1;
        at.hash(&mut self.hasher);
        ev.hash(&mut self.hasher);
        if let Some(t) = self.trace.as_mut() {
            t.push(format!("{at:>14} {ev}"));
        }
        self.draw(at, &ev);
    }

    /// Counts a fault or control of `kind` and logs it.
    pub fn fault(&mut self, at: Time, kind: &'static str) {
        *self.faults.entry(kind).or_default() += 1;
        self.record(at, Ev::Fault(kind));
    }

    /// Records a broken invariant (the first one is kept).
    pub fn fail(&mut self, rule: &'static str, detail: String) {
        if let Some(t) = self.trace.as_mut() {
            t.push(format!("!! {rule} broken: {detail}"));
        }
        if self.failure.is_none() {
            self.failure = Some(Violation {
                rule,
                detail,
                step: step_index(self.steps),
            });
        }
    }

    /// The hash of the log so far.
    pub fn hash(&self) -> u64 {
        let mut h = self.hasher.clone();
        self.events.hash(&mut h);
        h.finish()
    }

    /// Events logged.
    pub fn events(&self) -> u64 {
        self.events
    }
}

/// Milliseconds of `d`, for logs.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
