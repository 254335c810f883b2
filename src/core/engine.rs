//! The engine: every batching, retry, drop, loss, flush and shutdown
//! decision, as a sans-IO state machine (S-C1).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::mem;

use super::accounting::{Counters, DropReason, LostReason, LOG_EVERY};
use super::admission::{Handoff, Refusal};
use super::ages::{ItemAge, ItemOutcome};
use super::backlog::{take_front, Phase, Retry, Tenant};
use super::backoff::Backoff;
use super::breaker::{Breaker, BreakerState};
use super::canary;
use super::config::{Config, ConfigError, ErrorPolicy};
use super::group::{GroupId, Groups};
use super::schedule::{Due, Schedule};
use super::shrink;
use super::tenants::TenantTable;
use super::time::Time;
use super::wait::{WaitKind, Waits};
use super::write::{
    AfterFailure, DeadLetter, DeadReason, Event, Failure, Outcome, Report, ShutdownReport,
    Unwritten, WaitId, Write, WriteId,
};

/// Measures an item in bytes for `max_batch_bytes` and `capacity_bytes`
/// (S-B5). It must be pure: the same item always weighs the same. A weight
/// above [`MAX_WEIGHT`] is taken as `MAX_WEIGHT`, a weight of 0 as 1, so
/// `capacity_bytes` also bounds how many items are pending (S-B8).
pub type Weigher<I> = Box<dyn Fn(&I) -> u64 + Send + Sync>;

/// The largest weight an item is given: 2^40 bytes (1 TiB). Weights are
/// clamped to it so byte sums cannot overflow below 2^24 such items pending;
/// byte sums saturate beyond that (S-B5: no input makes the batcher fail).
pub const MAX_WEIGHT: u64 = 1 << 40;

/// Whether `stage` accepted the item (S-W1, S-A1). The caller need not look.
///
/// Non-exhaustive: new outcomes may come (a match needs a `_` arm).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[must_use = "the decision is informational; use `let _ =` to ignore it"]
pub enum Staged {
    /// The item is pending and will be written.
    Accepted,
    /// Refused by a capacity policy; counted dropped.
    Dropped(DropReason),
    /// Refused because the outbox is shutting down or shut down; counted
    /// lost under `shutdown` (S-W9). The same name as
    /// [`StageError::ShuttingDown`](crate::StageError::ShuttingDown).
    ShuttingDown,
}

impl Staged {
    /// The old name of [`Staged::ShuttingDown`]; works in patterns too.
    #[deprecated(note = "renamed `Staged::ShuttingDown` (the name `StageError` uses)")]
    #[allow(non_upper_case_globals)]
    pub const Refused: Staged = Staged::ShuttingDown;
}

/// What a [`Stager`](super::Stager)'s stage decided, and whether the
/// driver must drain the engine because of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "`wake` says whether the driver must drain the engine"]
pub struct LazyStaged {
    /// Whether the item was accepted, as [`Engine::stage`] returns it.
    pub staged: Staged,
    /// Whether the driver must drain the engine
    /// ([`poll_write`](Engine::poll_write), [`poll_event`](Engine::poll_event),
    /// [`poll_timeout`](Engine::poll_timeout)) because of this stage: a
    /// tenant became ready while a write slot is free and nothing else was
    /// ready, an event was queued with none before it, or the next timeout
    /// moved earlier. When `false`, a drain already due (after the previous
    /// such `true`, or after the write that holds the slots comes back)
    /// covers this item, provided the driver drains fully each time.
    pub wake: bool,
}

/// What [`Engine::stage_batch`] took in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use = "`wake` says whether the driver must drain the engine"]
pub struct Intake {
    /// Items that became pending.
    pub accepted: u64,
    /// Their weights, in bytes, saturating.
    pub accepted_bytes: u64,
    /// Items handed over as admitted that the engine refused after all
    /// (its shutdown fence was up: counted lost under `shutdown`).
    pub refused: u64,
    /// Their weights, in bytes, saturating.
    pub refused_bytes: u64,
    /// Items handed over refused ([`Handoff::refusal`]), now counted.
    pub counted: u64,
    /// Whether the driver must drain the engine, as [`LazyStaged::wake`].
    pub wake: bool,
    /// [`Engine::stage_durable`]: whether its unreadable items are due a
    /// log (S-A6).
    pub log: bool,
}

/// `finish` was given a write the engine does not know, or one whose item
/// count differs from what was handed out: a driver bug. The write comes
/// back whole so nothing is silently leaked, and the engine is unchanged.
#[derive(Debug, PartialEq, Eq)]
pub struct UnknownWrite<K, I>(pub Write<K, I>);

impl<K, I> fmt::Display for UnknownWrite<K, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "write {} is not in flight, or its items were changed",
            self.0.id
        )
    }
}

impl<K: fmt::Debug, I: fmt::Debug> std::error::Error for UnknownWrite<K, I> {}

/// A write handed out and not yet finished.
#[derive(Debug)]
struct InFlight<K> {
    tenant: K,
    /// Items in the slice: the write must come back with as many (S-C2).
    len: usize,
    /// Their weight, released from `pending_bytes` when they settle.
    bytes: u64,
    /// This attempt's number, 1 for the first.
    attempt: u32,
    /// When this attempt started: its latency runs from here.
    started: Time,
    /// When the slice's first attempt started: `max_retry_duration` runs
    /// from here (S-A5).
    first_started: Time,
    /// When the slice's oldest item was staged: `max_item_age` runs from
    /// here (S-R3).
    oldest: Time,
    /// Given up by a shutdown deadline or abandon: its items are already
    /// counted lost; when they come back they go to the dead-letter hand-off.
    given_up: bool,
    /// The group it was handed out in (S-F1): the group holds a
    /// concurrency slot until its last slice is back.
    group: GroupId,
}

/// Lifecycle of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    Open,
    /// The shutdown fence is up: nothing is accepted, the rest drains.
    Closing,
    /// Shut down or abandoned: nothing pending, no write starts (I8).
    Closed,
}

/// The shutdown in progress (S-W9).
#[derive(Debug)]
struct Shutdown<K, I> {
    /// The first caller's wait; its report carries the accounting.
    first: WaitId,
    /// Later callers, answered with zeros (S-W9).
    later: Vec<WaitId>,
    /// Set once the first wait settled: the report to send when the last
    /// given-up write has come back.
    settled: Option<Report>,
    /// Dead letters, in runs: handed back sorted by tenant, then
    /// [`HeldIn`].
    unwritten: Vec<HeldRun<K, I>>,
    /// The first caller has been answered.
    reported: bool,
    /// The earliest deadline any call gave.
    deadline: Time,
}

/// Where a run of given-up items was held. One tenant's runs sort in
/// this order, which is their staging order: a tenant has a write in
/// flight or a retry slice, never both, and either holds items older than
/// its backlog.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum HeldIn {
    /// A write in flight, given up, that came back unwritten.
    InFlight,
    /// A failed write's slice, backing off before its retry.
    Retry,
    /// The backlog waiting for a write.
    Backlog,
    /// The backlog, with items an earlier life attempted (S-J16: the
    /// store may hold them).
    TriedBacklog,
}

/// A run of one tenant's given-up items, oldest first.
#[derive(Debug)]
struct HeldRun<K, I> {
    tenant: K,
    held_in: HeldIn,
    items: Vec<I>,
}

impl<K, I> HeldRun<K, I> {
    /// As handed back: attempted unless it is a backlog never tried (S-J16).
    fn into_unwritten(self) -> Unwritten<K, I> {
        Unwritten {
            attempted: self.held_in != HeldIn::Backlog,
            tenant: self.tenant,
            items: self.items,
        }
    }
}

/// The tenant table, hashed with foldhash with a fixed seed: a few
/// instructions per 16-byte key where SipHash takes about a hundred, and
/// the same every run. Lookups only; nothing ever iterates the table to
/// decide anything (S-C1), so its order is moot. Like any unkeyed hash it
/// does not resist keys chosen to collide: tenant ids come from the
/// service, not from its clients.
type Tenants<K, I> = TenantTable<K, I>;

/// Items of the intake whose lookups are in flight at once (S-C10): enough
/// to overlap the memory latency, few enough for the CPU's miss queue.
const INTAKE_WINDOW: usize = 16;

/// Tenants from which the intake prefetches: below, the table (about
/// 150 B a tenant) fits in a core's L2 cache and its loads do not wait.
const PREFETCH_FROM: usize = 4096;

/// The outbox engine: a deterministic, sans-IO state machine (S-C1).
///
/// `K` is the tenant key (the driver uses [`TenantId`](crate::TenantId));
/// its `Ord`, `Eq` and `Hash` must agree, as for any map key. `I` is the
/// item. Feed it inputs, each with the current [`Time`]. Items come in
/// through three staging inputs (S-W21, S-W22):
/// - [`stage`](Self::stage): one item, the engine deciding its refusals;
/// - [`stage_batch`](Self::stage_batch): items decided outside the engine
///   ([`decide`](super::decide)): the request path's hand-offs in chunks,
///   a run of `stage_many`, a stage decided under the driver's lock, each
///   admitted or carrying the refusal to count;
/// - [`stage_durable`](Self::stage_durable): items already durable (a
///   journal's recovery, an outbox table's rows), never refused by a
///   capacity, with an age and a key handed back when they settle, and the
///   count of those that could not be read back.
///
/// The other inputs:
/// [`finish`](Self::finish) / [`finish_lost`](Self::finish_lost),
/// [`flush`](Self::flush), [`settle`](Self::settle),
/// [`shutdown`](Self::shutdown), [`abandon`](Self::abandon),
/// [`hand_over_tenants`](Self::hand_over_tenants) (a lost partition of an
/// outbox table, S-L16), [`handle_timeout`](Self::handle_timeout).
/// Some inputs return items the engine is done with
/// ([`finish`](Self::finish), [`abandon`](Self::abandon)). After every
/// input, drain its outputs in this order:
/// 1. [`poll_write`](Self::poll_write) until `None`: writes to start;
/// 2. [`poll_event`](Self::poll_event) until `None`: what to count, log and
///    answer (including [`Event::CancelInFlight`]); refusals coalesced
///    under S-B8 come out one log point at a time;
/// 3. [`poll_timeout`](Self::poll_timeout): when to call
///    [`handle_timeout`](Self::handle_timeout) next;
/// 4. [`take_released`](Self::take_released): the items let go of (refused,
///    dropped, given up), already counted, for the driver to drop outside
///    its lock. It may be taken at any point of the drain; what matters is
///    that it is taken after every input.
///
/// [`stage_batch`](Self::stage_batch) and
/// [`stage_durable`](Self::stage_durable) also say whether what they took
/// in needs a drain at all ([`Intake::wake`]).
///
/// Every input first handles the timers due at its `now`, so a driver that
/// is late with `handle_timeout` loses nothing (S-W17). Time never runs
/// backwards: a `now` earlier than one already seen is taken as the latest
/// seen.
///
/// Cost: O(log T) per input and per write for T tenants (S-C4), plus
/// O(W) per touched tenant while W flushes, settles or shutdowns wait.
///
/// # Memory (S-B8)
/// Beyond the items themselves (`size_of::<I>()` each, plus whatever heap
/// an item owns), the engine holds
///
/// `O(1) + O(P) + O(T) + O(F) + O(W · (1 + T_W)) + O(E)`
///
/// where P is the items pending (at most `capacity`, or `capacity_bytes`,
/// an item weighing at least 1 byte), T the tenants holding items or a
/// write in flight (at most P + F), F the writes in flight (at most
/// `concurrency` × `max_slices_per_write`), W the flushes, settles and shutdowns open or answered
/// and not yet polled, T_W the tenants those touched, and E the events of
/// the inputs since the last full drain of
/// [`poll_event`](Self::poll_event) other than stage refusals. Each term
/// is within a factor of 4 of the live count, plus a few slots. So, with a
/// capacity set, memory is bounded by the configuration and that state
/// whatever the inputs:
/// - A refused or dropped stage leaves no per-item state: it is counted,
///   its event coalesces into one queued event per reason (see
///   [`Event::Dropped`]), and the item waits in
///   [`take_released`](Self::take_released) for the caller to drop.
/// - What a burst took is given back once it drained: the tenant map, the
///   event queue, the ready queue, each tenant's backlog and wait marks
///   shrink when they fall below a quarter full (amortised O(1) per
///   removal); timers and writes in flight live in B-trees, which free
///   their nodes as they empty. After a burst has drained the engine
///   holds a small constant more than a fresh one.
pub struct Engine<K, I> {
    config: Config,
    /// Measures items for the byte limits; `None` when none is set.
    weigher: Option<Weigher<I>>,
    backoff: Backoff,
    /// Gates when a write may start, sink-wide (S-R1, S-R2).
    breaker: Breaker,
    /// The latest time seen (time never runs backwards).
    now: Time,
    life: Life,
    counters: Counters,
    /// The weight of every pending item (in flight and backing off too),
    /// saturating.
    pending_bytes: u64,
    /// Per tenant holding items or a write in flight: its backlog, retry
    /// slice, phase and wait marks. Nothing else is kept per tenant.
    tenants: Tenants<K, I>,
    /// Which tenants are ready, lingering or backing off, and the wait
    /// deadlines: every timer the engine has.
    sched: Schedule<K>,
    in_flight: BTreeMap<WriteId, InFlight<K>>,
    /// Groups with a slice in flight, given-up ones included: each holds
    /// one concurrency slot (S-W3, S-F1).
    groups: Groups,
    /// The id of the next new write (a retry keeps its write's id).
    next_write: u64,
    /// The open flushes, settles and shutdowns, and what each covers.
    waits: Waits,
    /// The shutdown, from the fence on; never cleared (its `reported` says
    /// whether it has answered).
    shutdown: Option<Shutdown<K, I>>,
    events: VecDeque<Event<K, I>>,
    /// Events taken by `poll_event` so far: with `events.len()`, places
    /// an event by its sequence number.
    popped: u64,
    /// Per stage-time refusal reason (see [`slot_of`]), its last event:
    /// while that event is queued, later refusals for the same reason add
    /// to it (S-B8).
    refusals: [Option<Coalesced>; 6],
    /// Items let go of and not handed back by a return value (see
    /// [`Engine::take_released`]): the engine never drops an item itself.
    released: Vec<I>,
    /// When a write last committed (the health snapshot's).
    last_written: Option<Time>,
    /// The keys of durable items not yet settled (S-W22).
    keys: Keys<K>,
    /// The ages of the items settled since the last
    /// [`drain_item_ages`](Engine::drain_item_ages) (S-R7).
    ages: Vec<ItemAge>,
    /// Tenants handed over while a write of theirs was in flight
    /// ([`Engine::hand_over_tenants`], S-L16): what they hold is handed
    /// over when that write ends. At most one per write in flight.
    handing_over: BTreeSet<K>,
    /// The suspects of a crash, written alone (S-J17).
    suspects: super::suspects::Suspects<K>,
}

/// A queued refusal event that later refusals add to (S-B8).
#[derive(Clone, Copy, Debug)]
struct Coalesced {
    /// Its sequence number (see `Engine::popped`).
    seq: u64,
    /// Its reason's counter before its first item: with its `items`, which
    /// log points (S-A6) it spans.
    before: u64,
}

impl Coalesced {
    /// If its `items` span two log points or more (S-A6: the 1st, then
    /// every 1,000th), cuts off the part before the second one, which
    /// holds exactly one, and returns its size; the rest stays queued.
    fn cut(&mut self, items: &mut u64) -> Option<u64> {
        let first = if self.before == 0 {
            1
        } else {
            (self.before / LOG_EVERY + 1) * LOG_EVERY
        };
        let second = if first == 1 {
            LOG_EVERY
        } else {
            first + LOG_EVERY
        };
        if second > self.before + *items {
            return None;
        }
        let part = second - 1 - self.before;
        *items -= part;
        self.before += part;
        Some(part)
    }
}

/// Its slot in `Engine::refusals`: the reasons whose events coalesce
/// (S-B8).
fn slot_of(refusal: Refusal) -> usize {
    match refusal {
        Refusal::BufferFull => 0,
        Refusal::TenantFull => 1,
        Refusal::ShuttingDown => 2,
        Refusal::EncodeFailed => 3,
        Refusal::JournalFull => 4,
        Refusal::TableOnly => 5,
    }
}

/// The engine's own facts for a stage it decides itself
/// ([`Engine::stage`]): the fence, the buffer's capacities, the tenant's
/// quota (S-W21).
struct Own<'a, K, I> {
    engine: &'a Engine<K, I>,
    tenant: &'a K,
    weight: u64,
}

impl<K: Ord + Hash + Clone, I> super::admission::Checks for Own<'_, K, I> {
    fn table_only(&mut self) -> bool {
        self.engine.config.table_only
    }

    fn fenced(&mut self) -> bool {
        self.engine.life != Life::Open
    }

    fn buffer_room(&mut self) -> bool {
        let (e, cfg) = (self.engine, &self.engine.config);
        !(cfg
            .capacity
            .is_some_and(|cap| e.counters.pending >= cap as u64)
            || cfg
                .capacity_bytes
                .is_some_and(|cap| e.pending_bytes.saturating_add(self.weight) > cap))
    }

    fn tenant_room(&mut self) -> bool {
        self.engine.tenant_has_room(self.tenant)
    }
}

/// An item that is already durable, for [`Engine::stage_durable`]
/// (S-W22): read back from a journal (D4), or from an outbox table.
#[derive(Debug)]
pub struct Durable<K, I> {
    /// Its tenant.
    pub tenant: K,
    /// The item.
    pub item: I,
    /// How long ago it was first staged, as the caller knows it: its stamp
    /// is this long before the input's `now` (S-A3, S-R3).
    /// `Duration::ZERO` when the caller does not know.
    pub age: std::time::Duration,
    /// An opaque key handed back in [`Event::KeyDone`] once the item
    /// settled; `None`: nothing is handed back.
    pub key: Option<u64>,
}

/// The keys of a tenant's durable items ([`Durable::key`]), by the index
/// its items settle at: a tenant's items settle oldest first, whatever
/// ends them (S-W22).
#[derive(Debug, Default)]
struct Keyed {
    /// Items of the tenant settled since its first keyed item was staged.
    settled: u64,
    /// (settle index, key), in staging order.
    keys: VecDeque<(u64, u64)>,
}

/// Every tenant's [`Keyed`]: empty unless durable items carry keys, so a
/// settling slice pays one emptiness check for it.
#[derive(Debug)]
struct Keys<K>(BTreeMap<K, Keyed>);

impl<K> Default for Keys<K> {
    fn default() -> Self {
        Keys(BTreeMap::new())
    }
}

impl<K: Ord + Clone> Keys<K> {
    /// Expects `key` back once the item staged now for `tenant` (with
    /// `tenant`'s state before it) settles.
    fn expect<I>(&mut self, tenant: &K, state: Option<&Tenant<I>>, key: u64) {
        let pending = state.map_or(0, |t| t.pending as u64);
        // The tenant cloned only for its first key in the engine.
        if !self.0.contains_key(tenant) {
            self.0.insert(tenant.clone(), Keyed::default());
        }
        let Some(keyed) = self.0.get_mut(tenant) else {
            return;
        };
        keyed.keys.push_back((keyed.settled + pending, key));
    }

    /// `n` more of `tenant`'s oldest items are done, `how(i)` saying how
    /// the i-th ended: hands back the keys among them, in order.
    fn done(
        &mut self,
        tenant: &K,
        n: usize,
        how: impl Fn(usize) -> ItemOutcome,
        out: &mut VecDeque<Event<K, impl Sized>>,
    ) {
        let Some(keyed) = self.0.get_mut(tenant) else {
            return;
        };
        let end = keyed.settled + n as u64;
        while let Some(&(at, key)) = keyed.keys.front() {
            if at >= end {
                break;
            }
            keyed.keys.pop_front();
            let outcome = how((at - keyed.settled) as usize);
            out.push_back(Event::KeyDone {
                key,
                written: outcome == ItemOutcome::Written,
                outcome,
            });
        }
        keyed.settled = end;
        if keyed.keys.is_empty() {
            self.0.remove(tenant);
        }
    }
}

impl<K: fmt::Debug, I> fmt::Debug for Engine<K, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("now", &self.now)
            .field("life", &self.life)
            .field("counters", &self.counters)
            .field("tenants", &self.tenants.len())
            .field("in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

impl<K: Ord + Hash + Clone, I> Engine<K, I> {
    /// An engine whose items are not weighed.
    ///
    /// # Errors
    /// [`ConfigError::WeigherRequired`] if the config sets a byte limit;
    /// use [`Engine::with_weigher`].
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        Self::build(config, None)
    }

    /// An engine that weighs items with `weigher` for the byte limits (S-B5).
    ///
    /// # Errors
    /// None today; the `Result` keeps the constructors alike.
    pub fn with_weigher(
        config: Config,
        weigher: impl Fn(&I) -> u64 + Send + Sync + 'static,
    ) -> Result<Self, ConfigError> {
        Self::build(config, Some(Box::new(weigher)))
    }

    /// The same engine, relaying an outbox table (S-E7): the table holds
    /// every item until it is removed from it, so a write refused under a
    /// stale epoch ([`Failure::StaleEpoch`]) hands its tenant over (counted
    /// `handed_over`, left for the partition's next owner). Without it
    /// (the default: an in-memory outbox, or one with a journal) nothing
    /// can take the items over, and a stale epoch is a terminal failure of
    /// the write: its items are lost under `stale_epoch` and dead-lettered
    /// ([`DeadReason::StaleEpoch`]), never dropped silently. An outbox
    /// built with an outbox table calls it.
    #[must_use]
    pub fn with_outbox_table(mut self) -> Self {
        self.config.outbox_table = true;
        self
    }

    fn build(config: Config, weigher: Option<Weigher<I>>) -> Result<Self, ConfigError> {
        config.check_weigher(weigher.is_some())?;
        let backoff = Backoff::new(
            config.initial_backoff,
            config.max_backoff,
            config.jitter_ppm,
            config.seed,
        );
        Ok(Engine {
            breaker: Breaker::new(config.breaker),
            config,
            weigher,
            backoff,
            now: Time::ZERO,
            life: Life::Open,
            counters: Counters::default(),
            pending_bytes: 0,
            tenants: Tenants::default(),
            sched: Schedule::default(),
            in_flight: BTreeMap::new(),
            groups: Groups::default(),
            next_write: 1,
            waits: Waits::default(),
            shutdown: None,
            events: VecDeque::new(),
            popped: 0,
            refusals: [None; 6],
            released: Vec::new(),
            ages: Vec::new(),
            last_written: None,
            keys: Keys::default(),
            handing_over: BTreeSet::new(),
            suspects: Default::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A snapshot of the counters (S-W14).
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Items accepted and not yet written, lost or dropped (S-W14).
    pub fn pending(&self) -> u64 {
        self.counters.pending
    }

    /// Bytes pending, as the weigher measures them (0 without one).
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Writes (slices) handed out and not yet finished, given-up ones
    /// included.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Groups handed out with a slice not yet finished, given-up ones
    /// included: the concurrency slots taken (S-W3, S-F1). Equal to
    /// [`in_flight`](Self::in_flight) while every group holds one slice.
    pub fn groups_in_flight(&self) -> usize {
        self.groups.len()
    }

    /// Tenants the engine holds state for (waiting, in flight or backing off).
    pub fn tenants(&self) -> usize {
        self.tenants.len()
    }

    /// The breaker's state (S-R1, S-R2): always
    /// [`BreakerState::Closed`] without a breaker.
    pub fn breaker(&self) -> BreakerState {
        self.breaker.state()
    }

    /// Failed attempts in a row across all tenants, as the breaker counts
    /// them (S-R1), with the breaker off too: a committed write or a
    /// terminal rejection resets the count, a cancelled attempt leaves it.
    pub fn consecutive_failures(&self) -> u32 {
        self.breaker.consecutive_failures()
    }

    /// When a write last committed, if one has.
    pub fn last_written(&self) -> Option<Time> {
        self.last_written
    }

    /// When the oldest pending item was staged, as far as the engine
    /// knows: exact with a `max_item_age` (items are stamped then, S-R3);
    /// otherwise a lower bound on its age (a backlog's linger clock, a
    /// write's first attempt). `None` with nothing pending. Cost O(T + F)
    /// for T tenants and F writes in flight: for a health snapshot, not
    /// for every input.
    pub fn oldest_pending(&self) -> Option<Time> {
        let backlogs = self.tenants.values().filter_map(|t| {
            let retry = t.retry.as_ref().map(|r| r.oldest);
            let waiting = (!t.items.is_empty()).then(|| t.oldest_waiting(t.waiting_since));
            retry.into_iter().chain(waiting).min()
        });
        let in_flight = self
            .in_flight
            .values()
            .filter(|r| !r.given_up)
            .map(|r| r.oldest);
        backlogs.chain(in_flight).min()
    }

    /// Whether the shutdown fence is up (S-W9).
    pub fn is_shutting_down(&self) -> bool {
        self.life != Life::Open
    }

    /// Whether the engine is shut down or abandoned: nothing pending, no
    /// write starts (I8).
    pub fn is_closed(&self) -> bool {
        self.life == Life::Closed
    }

    /// The latest time the engine has seen.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Takes the items the engine let go of since the last call: items
    /// refused or dropped by [`stage`](Self::stage) (counted lost under
    /// `shutdown` or dropped, S-W14), and items of a write given up by an
    /// abandon that no shutdown report will carry (counted lost). They are
    /// already counted; the caller only drops them.
    ///
    /// The engine never drops an item itself, so an item's `Drop`
    /// (application code) never runs inside an engine call, which a driver
    /// typically makes under a lock: the driver drops these after the
    /// lock, where a slow, re-entrant or panicking `Drop` harms nobody
    /// (S-W13). Allocation-free when there are none.
    pub fn take_released(&mut self) -> Vec<I> {
        mem::take(&mut self.released)
    }

    // ----- inputs -------------------------------------------------------

    /// Stages one item for `tenant` (S-W1), the engine deciding everything
    /// in the refusal order of S-W21 ([`decide`](super::admission::decide):
    /// the fence, S-W9, then `capacity` and `capacity_bytes`, S-A1, S-B5,
    /// then `tenant_capacity`, S-B7). Never waits and never fails: the
    /// item is pending on return, or counted dropped or lost under
    /// `shutdown`, as the result says; a refused item is kept for
    /// [`take_released`](Self::take_released).
    pub fn stage(&mut self, now: Time, tenant: K, item: I) -> Staged {
        self.advance(now);
        let weight = self.weigh(&item);
        let verdict = super::admission::decide(&mut Own {
            engine: self,
            tenant: &tenant,
            weight,
        });
        let (staged, _) = self.take_one(tenant, item, weight, verdict);
        staged
    }

    /// Takes in items decided outside the engine (S-W19, S-W21), in the
    /// order given, which is each tenant's staging order: the request
    /// path's hand-offs, a run of `stage_many`, a stage decided under the
    /// driver's lock. Each is counted staged. An admitted one (no
    /// [`refusal`](Handoff::refusal)) becomes pending at the back of its
    /// tenant: its capacities were checked by the
    /// [`Admission`](super::Admission) that admitted it, so none is checked
    /// again. A refused one is counted under its refusal, or under
    /// `shutdown` if the fence is up now (the fence outranks every other
    /// refusal, S-W21), and kept for [`take_released`](Self::take_released).
    /// An item stamped `at` advances the engine's time to it first (S-A3,
    /// S-R3); one without a stamp takes the latest time seen. The driver
    /// must close its hand-off before the shutdown fence goes up (S-W9):
    /// an admitted item that still comes after it is counted lost under
    /// `shutdown`. O(1) per item.
    ///
    /// The chunk's decisions are those of its items taken one by one
    /// (S-C10); from 4,096 tenants on, a window of items has
    /// its tenants hashed and their state prefetched before any is taken
    /// in, so that their memory loads overlap instead of waiting in turn.
    pub fn stage_batch(&mut self, batch: impl IntoIterator<Item = Handoff<K, I>>) -> Intake {
        let mut intake = Intake::default();
        let mut batch = batch.into_iter();
        let mut window: Vec<(Handoff<K, I>, u64, Option<usize>)> = Vec::new();
        loop {
            if self.tenants.len() < PREFETCH_FROM {
                // A table this small stays in the caches: nothing to
                // overlap, and the passes would only cost instructions.
                let Some(h) = batch.next() else {
                    return intake;
                };
                let hash = self.tenants.hash(&h.tenant);
                self.take_handoff(h, hash, None, &mut intake);
                continue;
            }
            window.reserve_exact(INTAKE_WINDOW);
            // Hash, then fetch the index slots, then the tenants, then the
            // backs of their backlogs: each pass's loads are in flight
            // together, and the last pass finds them in cache.
            let tenants = &self.tenants;
            window.extend(batch.by_ref().take(INTAKE_WINDOW).map(|h| {
                let hash = tenants.hash(&h.tenant);
                tenants.prefetch_index(hash);
                (h, hash, None)
            }));
            if window.is_empty() {
                return intake;
            }
            for (_, hash, slot) in &mut window {
                *slot = tenants.prefetch_tenant(*hash);
            }
            for slot in window.iter().filter_map(|w| w.2) {
                tenants.prefetch_backlog(slot);
            }
            for (h, hash, slot) in window.drain(..) {
                self.take_handoff(h, hash, slot, &mut intake);
            }
        }
    }

    /// One item of [`stage_batch`](Self::stage_batch), its tenant hashing
    /// to `hash`, perhaps in dense slot `guess` (checked before use).
    // Inlined in both of its loops: a call per item costs the 1-tenant
    // intake a tenth of its instructions.
    #[inline(always)]
    fn take_handoff(
        &mut self,
        handoff: Handoff<K, I>,
        hash: u64,
        guess: Option<usize>,
        intake: &mut Intake,
    ) {
        let Handoff {
            tenant,
            item,
            weight,
            at,
            refusal,
        } = handoff;
        if let Some(at) = at {
            self.advance(at);
        }
        // A weight given is clamped as the engine's own (S-B5).
        let weight = weight.map_or_else(|| self.weigh(&item), |w| w.min(MAX_WEIGHT));
        let fenced = self.life != Life::Open;
        let verdict = super::admission::recheck(refusal.map_or(Ok(()), Err), fenced);
        let (_, wake) = self.take_one_hashed(tenant, (hash, guess), item, weight, verdict);
        intake.wake |= wake;
        match (refusal, verdict) {
            (None, Ok(())) => {
                intake.accepted += 1;
                intake.accepted_bytes = intake.accepted_bytes.saturating_add(weight);
            }
            (None, Err(_)) => {
                intake.refused += 1;
                intake.refused_bytes = intake.refused_bytes.saturating_add(weight);
            }
            (Some(_), _) => intake.counted += 1,
        }
    }

    /// Takes in items that are already durable (S-W22): a journal's
    /// recovery (D4) today, an outbox table's rows tomorrow. Never refused
    /// by a capacity or a quota (the caller reserved their room before it
    /// read them; refusing them now would lose them): each is counted
    /// under `recovered` rather than `staged` and becomes pending at the
    /// back of its tenant, stamped its [`age`](Durable::age) before `now`
    /// (never before its tenant's latest stamp, S-R3). Its
    /// [`key`](Durable::key), if any, comes back in an
    /// [`Event::KeyDone`] once the item settled (written, dropped or
    /// lost). After the shutdown fence (S-W9) an item is counted lost
    /// under `shutdown` (its key comes back at once, not written): the
    /// caller stops reading at the fence.
    ///
    /// `unreadable` counts items the caller found and could not read back
    /// (damaged or undecodable records; their tenants unknown, so no
    /// event): counted recovered and lost under `journal_unreadable`
    /// (D4). [`Intake::log`] says whether to log them (S-A6).
    pub fn stage_durable(
        &mut self,
        now: Time,
        items: impl IntoIterator<Item = Durable<K, I>>,
        unreadable: u64,
    ) -> Intake {
        self.advance(now);
        let mut intake = Intake::default();
        for Durable {
            tenant,
            item,
            age,
            key,
        } in items
        {
            self.counters.recovered += 1;
            let weight = self.weigh(&item);
            if self.life != Life::Open {
                let no_event_queued = self.events.is_empty();
                self.count_refusal(tenant, Refusal::ShuttingDown);
                self.released.push(item);
                if let Some(key) = key {
                    self.events.push_back(Event::KeyDone {
                        key,
                        written: false,
                        outcome: ItemOutcome::Lost(LostReason::Shutdown),
                    });
                }
                intake.refused += 1;
                intake.wake |= no_event_queued || key.is_some();
                continue;
            }
            let at = Time::from_nanos(
                self.now
                    .as_nanos()
                    .saturating_sub(u64::try_from(age.as_nanos()).unwrap_or(u64::MAX)),
            );
            if let Some(key) = key {
                self.keys.expect(&tenant, self.tenants.get(&tenant), key);
            }
            intake.accepted += 1;
            intake.accepted_bytes = intake.accepted_bytes.saturating_add(weight);
            intake.wake |= self.enqueue(tenant, item, weight, at);
        }
        self.counters.recovered += unreadable;
        intake.log = self
            .counters
            .add_lost(LostReason::JournalUnreadable, unreadable);
        intake
    }

    /// Counts `items` of another codec version that a journal recovery
    /// refused (S-J14) as recovered and lost under `other_version`; like
    /// `stage_durable`'s `unreadable`, no event (their tenants are not
    /// decoded). Returns whether to log (S-A6).
    pub fn recover_other_version(&mut self, items: u64) -> bool {
        self.counters.recovered += items;
        self.counters.add_lost(LostReason::OtherVersion, items)
    }

    /// Counts `items` of `tenant` that a journal recovery found poisoned
    /// (S-J17: their writes were cut by a crash `max_crash_attempts`
    /// times) as recovered and lost under `poisoned`, with an
    /// [`Event::Lost`], and hands them out as a dead letter (attempted)
    /// with `dead_letters` on, else keeps them for
    /// [`take_released`](Self::take_released). They never enter the
    /// tenant's queue: the recovery marks them done itself. After the
    /// shutdown fence they are counted so all the same (they were given
    /// up before it).
    pub fn recover_poisoned(&mut self, now: Time, tenant: K, items: Vec<I>) {
        self.advance(now);
        let n = items.len() as u64;
        if n == 0 {
            return;
        }
        self.counters.recovered += n;
        self.count_lost(&tenant, LostReason::Poisoned, n);
        let items = self.dead_letter_at_run_time(&tenant, items, DeadReason::Poisoned, true);
        self.released.extend(items);
    }

    /// The oldest `n` pending items of `tenant` are the suspects of a
    /// crash, or come before one (S-J17): each is written alone, in a
    /// write and a group of its own, started only when no other write is
    /// in flight, and no other write starts until it ends. Call after
    /// [`stage_durable`](Self::stage_durable) took them; `n` past what
    /// the tenant holds is harmless.
    pub fn write_alone(&mut self, tenant: K, n: u64) {
        self.suspects.set(tenant, n);
    }

    /// A journal's recovery (S-J16): the oldest `n` pending items of
    /// `tenant` were attempted in an earlier life (an attempt mark on disk,
    /// or a crash count in a life record), so the store may hold them. A dead letter or an
    /// unwritten run that holds any of them says `attempted: true`
    /// ([`DeadLetter::attempted`], [`Unwritten::attempted`]), whenever
    /// they are given up. Call after [`stage_durable`](Self::stage_durable),
    /// before any write.
    pub fn tried_before(&mut self, tenant: K, n: u64) {
        self.suspects.set_tried(tenant, n);
    }

    /// The tenant whose suspect's lone attempt is in flight (S-J17): its
    /// write waits for its attempt marks even on a journal that is down.
    pub(crate) fn lone_tenant(&self) -> Option<&K> {
        self.suspects.lone()
    }

    /// An item's weight as the engine measures it (S-B5): 0 without a
    /// weigher, else the weigher's clamped to `1..=MAX_WEIGHT`. For a
    /// driver that admits items before the engine sees them
    /// ([`Handoff`]).
    pub fn weigh_item(&self, item: &I) -> u64 {
        self.weigh(item)
    }

    /// Whether `tenant`'s `tenant_capacity` has room for one more item
    /// (S-B7); always without one. For a driver that decides a stage under
    /// its lock ([`Checks::tenant_room`](super::Checks::tenant_room)).
    pub fn tenant_has_room(&self, tenant: &K) -> bool {
        self.config
            .tenant_capacity
            .is_none_or(|cap| self.tenants.get(tenant).is_none_or(|t| t.pending < cap))
    }

    /// A stage at `self.now`, decided `verdict`: counted staged, then
    /// pending at the back of its tenant, or counted under its refusal and
    /// kept for `take_released`. Returns what the stager is told and
    /// whether the driver must drain (a refusal, only if its event is the
    /// first queued).
    fn take_one(
        &mut self,
        tenant: K,
        item: I,
        weight: u64,
        verdict: Result<(), Refusal>,
    ) -> (Staged, bool) {
        let hash = self.tenants.hash(&tenant);
        self.take_one_hashed(tenant, (hash, None), item, weight, verdict)
    }

    /// [`take_one`](Self::take_one), the tenant hashing to `lookup.0`,
    /// perhaps in dense slot `lookup.1` (checked before use).
    #[inline(always)]
    fn take_one_hashed(
        &mut self,
        tenant: K,
        lookup: (u64, Option<usize>),
        item: I,
        weight: u64,
        verdict: Result<(), Refusal>,
    ) -> (Staged, bool) {
        self.counters.staged += 1;
        match verdict {
            Ok(()) => {
                let now = self.now;
                let wake = self.enqueue_hashed(tenant, lookup, item, weight, now);
                (Staged::Accepted, wake)
            }
            Err(refusal) => {
                let no_event_queued = self.events.is_empty();
                self.count_refusal(tenant, refusal);
                self.released.push(item);
                (refusal.staged(), no_event_queued)
            }
        }
    }

    /// Makes an admitted item pending at the back of its tenant's backlog
    /// and places the tenant. Returns whether the driver must drain: a
    /// tenant became ready while a write slot is free and nothing else was
    /// ready, or the next timeout moved earlier. `at` is its stamp: `now`,
    /// or earlier for a durable item with an age (S-W22), never before the
    /// tenant's latest stamp (stamps stay in staging order, S-R3).
    fn enqueue(&mut self, tenant: K, item: I, weight: u64, at: Time) -> bool {
        let hash = self.tenants.hash(&tenant);
        self.enqueue_hashed(tenant, (hash, None), item, weight, at)
    }

    /// [`enqueue`](Self::enqueue), the tenant hashing to `lookup.0`,
    /// perhaps in dense slot `lookup.1`. Inlined in its callers, as
    /// `take_handoff`.
    #[inline(always)]
    fn enqueue_hashed(
        &mut self,
        tenant: K,
        lookup: (u64, Option<usize>),
        item: I,
        weight: u64,
        at: Time,
    ) -> bool {
        self.counters.pending += 1;
        self.pending_bytes = self.pending_bytes.saturating_add(weight);
        let now = self.now;
        // A new ready tenant needs the driver only if nothing else was
        // ready and a slot is free: otherwise a drain is already due.
        let slot_free = self.groups.len() < self.config.concurrency;
        // One lookup: the fields are borrowed apart.
        let Engine {
            tenants,
            waits,
            sched,
            config,
            ..
        } = self;
        let t = tenants.get_or_insert(&tenant, lookup.0, lookup.1, || Tenant::new(now));
        // The new item comes after every open wait (S-A4).
        waits.catch_up(&mut t.wait_marks, t.pending as u64);
        let at = t.stamps.back().map_or(at, |last| at.max(last));
        if t.items.is_empty() {
            t.waiting_since = at;
        }
        t.items.push_back(item);
        // A first age timer earlier than every other timer moves the next
        // timeout earlier: the driver must know (S-R3).
        let mut armed_earlier = false;
        if let Some(age) = config.max_item_age {
            t.stamps.push_back(at);
            if t.expiry.is_none() {
                let before = sched.next_timeout();
                set_expiry(sched, t, &tenant, age);
                armed_earlier = t.expiry.is_some_and(|at| before.is_none_or(|b| at < b));
            }
        }
        t.bytes = t.bytes.saturating_add(weight);
        t.pending += 1;
        let first_ready = slot_free && !sched.has_ready();
        let wake = match t.phase {
            Phase::Idle => {
                // An idle tenant had nothing pending, so this item is its
                // only one: staged after every flush, never skipping linger (and
                // the engine is open, or the stage was refused above).
                debug_assert!(t.pending == 1 && !waits.skips_linger(&t.wait_marks));
                let next = sched.next_timeout();
                ready_or_linger(tenant, t, config, now, false, sched);
                match t.phase {
                    Phase::Lingering(key) => next.is_none_or(|at| key.0 < at),
                    _ => first_ready,
                }
            }
            Phase::Lingering(_) if batch_full(t, config) => {
                sched.unschedule(&mut t.phase);
                sched.ready(tenant, &mut t.phase);
                first_ready
            }
            _ => false,
        };
        wake || armed_earlier
    }

    /// Hands out the next write to start, if a concurrency slot is free and
    /// a tenant is ready (S-W3, S-W4, S-B1): a group of one slice, whatever
    /// `max_slices_per_write` says. Call until `None` after every input.
    pub fn poll_write(&mut self, now: Time) -> Option<Write<K, I>> {
        self.advance(now);
        let tenant = self.next_ready()?;
        let group = self.groups.open();
        Some(self.start_slice(tenant, group))
    }

    /// Hands out the next group to start (S-F1, S-F2), if a concurrency
    /// slot is free and a tenant is ready: the slices of up to
    /// `max_slices_per_write` distinct ready tenants, in the order they
    /// became ready (S-B1), stopping before a slice that would take the
    /// group past `max_group_items` (the first slice always goes). Each
    /// slice is a [`Write`] of its own: its own id, attempt, retry and
    /// outcome, finished one by one with [`finish`](Self::finish) or
    /// [`finish_lost`](Self::finish_lost); the group holds one slot until
    /// its last slice is back. With `max_slices_per_write` 1 this is
    /// [`poll_write`](Self::poll_write). Call until `None` after every
    /// input.
    pub fn poll_group(&mut self, now: Time) -> Option<Vec<Write<K, I>>> {
        self.advance(now);
        let tenant = self.next_ready()?;
        let group = self.groups.open();
        let first = self.start_slice(tenant, group);
        let mut items = first.items.len();
        let alone = self.suspects.lone() == Some(&first.tenant);
        let mut slices = vec![first];
        // While the breaker is open a probe goes alone (S-R1); so does a
        // suspect of a crash, and none joins a group (S-J17).
        while !alone
            && slices.len() < self.config.max_slices_per_write
            && self.breaker.may_start(self.now)
        {
            let Some(next) = self.sched.peek_ready() else {
                break;
            };
            if self.suspects.is_alone(next) {
                break;
            }
            if let Some(cap) = self.config.max_group_items {
                // An upper bound of the slice's size: the byte limit may
                // cut it shorter, never longer.
                let t = self.tenants.get(next).expect("ready tenant exists");
                let size = match &t.retry {
                    Some(r) => r.items.len(),
                    None => self
                        .config
                        .max_batch
                        .map_or(t.items.len(), |m| m.min(t.items.len())),
                };
                if items + size > cap {
                    break;
                }
            }
            let tenant = self.sched.pop_ready().expect("just peeked");
            if self.expire(&tenant) {
                continue;
            }
            let mut slice = self.start_slice(tenant, group);
            // Canary (issue 26): a retry takes its group mate's items.
            if slice.attempt > 1 && canary::on(canary::GROUP_RETRY_SWAP) {
                let mate = slices.last_mut().expect("a group has its first slice");
                mem::swap(&mut slice.items, &mut mate.items);
            }
            items += slice.items.len();
            slices.push(slice);
        }
        Some(slices)
    }

    /// Whether a write may start: open, a concurrency slot free (S-W3),
    /// and the breaker letting it (S-R1).
    fn group_slot_free(&self) -> bool {
        self.life != Life::Closed
            && self.groups.len() < self.config.concurrency
            && self.breaker.may_start(self.now)
    }

    /// Pops the next ready tenant with something left to start once what
    /// is older than `max_item_age` is counted expired (S-R3), if a write
    /// may start.
    fn next_ready(&mut self) -> Option<K> {
        loop {
            if !self.group_slot_free() {
                return None;
            }
            if self.suspects.lone().is_some() {
                // A suspect's attempt is in flight: nothing starts beside
                // it until it comes back (S-J17).
                return None;
            }
            // A suspect of a crash starts once nothing else is in flight,
            // its retry too (S-J17); what is ready behind it waits.
            if self.groups.len() > 0
                && self
                    .sched
                    .peek_ready()
                    .is_some_and(|t| self.suspects.is_alone(t))
            {
                return None;
            }
            let tenant = self.sched.pop_ready()?;
            if !self.expire(&tenant) {
                return Some(tenant);
            }
        }
    }

    /// Starts the write of a ready `tenant` in `group`: its retry slice,
    /// else a new batch cut from its backlog (S-W4, S-W5).
    fn start_slice(&mut self, tenant: K, group: GroupId) -> Write<K, I> {
        let now = self.now;
        let id;
        let alone = self.suspects.is_alone(&tenant);
        let max_batch = if alone {
            Some(1)
        } else {
            self.config.max_batch
        };
        let t = self.tenants.get_mut(&tenant).expect("ready tenant exists");
        let (items, bytes, attempt, first_started, oldest) = match t.retry.take() {
            Some(r) => {
                id = r.id;
                (r.items, r.bytes, r.attempts + 1, r.first_started, r.oldest)
            }
            None => {
                id = WriteId(self.next_write);
                self.next_write += 1;
                let weigher = self.weigher.as_deref();
                let oldest = t.oldest_waiting(now);
                let (items, bytes) = t.cut_batch(
                    max_batch,
                    self.config.max_batch_bytes,
                    |i| weight(weigher, i),
                    now,
                );
                (items, bytes, 1, now, oldest)
            }
        };
        debug_assert!(!items.is_empty());
        t.phase = Phase::InFlight(id);
        if let Some(at) = t.expiry.take() {
            // Decided when the write ends (S-R3).
            self.sched.move_expiry(&tenant, Some(at), None);
        }
        self.counters.attempts += 1;
        if alone {
            self.suspects.started(tenant.clone());
        }
        self.breaker.started(id);
        self.groups.join(group);
        self.in_flight.insert(
            id,
            InFlight {
                tenant: tenant.clone(),
                len: items.len(),
                bytes,
                attempt,
                started: now,
                first_started,
                oldest,
                given_up: false,
                group,
            },
        );
        Write {
            id,
            tenant,
            items,
            attempt,
            deadline: self.config.write_timeout.map(|d| now + d),
        }
    }

    /// Before a ready tenant's write starts, counts lost under `expired`
    /// what was staged longer than `max_item_age` ago (S-R3): a retry
    /// slice whose oldest item is that old goes whole (a retry is the
    /// identical slice or nothing, S-W5), backlog items one by one from
    /// the oldest. Returns whether nothing is left to start now (the
    /// tenant is then placed again, or forgotten).
    fn expire(&mut self, tenant: &K) -> bool {
        let t = self.tenants.get(tenant).expect("ready tenant exists");
        if t.retry.is_none() && t.items.is_empty() {
            // Emptied while it was ready: by its age timer, or handed over
            // (S-L16).
            self.schedule_after_write(tenant.clone());
            return true;
        }
        let Some(age) = self.config.max_item_age else {
            return false;
        };
        // Staged before the cutoff: older than `age` now.
        let age = u64::try_from(age.as_nanos()).unwrap_or(u64::MAX);
        let Some(cutoff) = self.now.as_nanos().checked_sub(age) else {
            return false;
        };
        let cutoff = Time::from_nanos(cutoff);
        let weigher = self.weigher.as_deref();
        let t = self.tenants.get_mut(tenant).expect("ready tenant exists");
        // Canary (issue 26): a retry slice that never expires.
        let retry_expired = t.retry.as_ref().is_some_and(|r| r.oldest < cutoff)
            && !canary::on(canary::EXPIRED_RETRY);
        let runs = take_expired(t, cutoff, weigher, retry_expired);
        if runs.is_empty() {
            return false;
        }
        let nothing_left = retry_expired || t.items.is_empty();
        t.phase = Phase::Idle;
        self.give_up_expired(tenant, runs);
        if nothing_left {
            self.schedule_after_write(tenant.clone());
            true
        } else {
            // Still ready, at the front: it starts now with what is left.
            self.tenants.get_mut(tenant).expect("holds items").phase = Phase::Ready;
            false
        }
    }

    /// Counts `runs` (taken by [`take_expired`]) lost under `expired`
    /// (S-R3), settles them, and hands them back as dead letters or keeps
    /// them for `take_released`.
    fn give_up_expired(&mut self, tenant: &K, runs: Vec<ExpiredRun<I>>) {
        for ExpiredRun {
            items,
            bytes,
            attempted,
        } in runs
        {
            // S-J16: a run with an item an earlier life attempted (the
            // tenant's oldest) may be in the store.
            let attempted = attempted || self.suspects.tried(tenant) > 0;
            let n = items.len();
            self.count_lost(tenant, LostReason::Expired, n as u64);
            self.mark_done(tenant, n, bytes, |_| ItemOutcome::Lost(LostReason::Expired));
            let items = self.dead_letter_at_run_time(tenant, items, DeadReason::Expired, attempted);
            self.released.extend(items);
        }
    }

    /// A tenant's age timer fell due (S-R3): unless a write of it is in
    /// flight, what it holds that is older than `max_item_age` is given
    /// up now, breaker open or not, as [`expire`](Self::expire) does at a
    /// write's start (a retry slice whole, the backlog from its oldest).
    /// With a write in flight, its items and those behind it are decided
    /// when it ends. The timer is armed again for what is left.
    fn expire_by_timer(&mut self, tenant: K) {
        let Some(age) = self.config.max_item_age else {
            return;
        };
        let Some(t) = self.tenants.get_mut(&tenant) else {
            return;
        };
        // Popped from the schedule: disarmed.
        t.expiry = None;
        let age_ns = u64::try_from(age.as_nanos()).unwrap_or(u64::MAX);
        let Some(cutoff) = self.now.as_nanos().checked_sub(age_ns) else {
            set_expiry(&mut self.sched, t, &tenant, age);
            return;
        };
        let cutoff = Time::from_nanos(cutoff);
        let weigher = self.weigher.as_deref();
        let retry_expired = t.retry.as_ref().is_some_and(|r| r.oldest < cutoff);
        if retry_expired && canary::on(canary::EXPIRED_RETRY) {
            // Canary (issue 26): a retry slice that never expires (and its
            // timer, not armed again, never fires again).
            return;
        }
        let runs = take_expired(t, cutoff, weigher, retry_expired);
        let expired = !runs.is_empty();
        // Lingering, backing off (its retry slice gone) or idle: placed
        // again below for what is left, or forgotten.
        let placed = t.phase == Phase::Ready;
        if expired && !placed {
            self.sched.unschedule(&mut t.phase);
        }
        self.give_up_expired(&tenant, runs);
        if expired && !placed {
            self.schedule_after_write(tenant.clone());
        }
        if let Some(t) = self.tenants.get_mut(&tenant) {
            set_expiry(&mut self.sched, t, &tenant, age);
        }
    }

    /// Takes back a write with its outcome (S-C2): the items are settled,
    /// kept for a retry with the identical slice (S-W5), dropped (S-A5) or
    /// lost (S-A5, S-B2, S-W12).
    ///
    /// Returns the items the engine is done with (written, dropped, lost;
    /// empty when they are kept for a retry or handed back as dead letters)
    /// so the driver drops them outside its lock: an item's `Drop` is the
    /// application's code and may panic (S-W13 containment).
    ///
    /// A write the engine gave up at the shutdown deadline or on abandon is
    /// already counted lost. If it comes back [`Outcome::Written`], its
    /// items are in the store: they stay counted lost (counters never
    /// decrease; "lost" means given up) but are not handed back as dead
    /// letters, so nobody stores them twice (S-B6). Any other outcome hands
    /// them back.
    ///
    /// # Errors
    /// [`UnknownWrite`], carrying the write back, if it is not in flight or
    /// its item count is not the one handed out (the items must come back
    /// untouched, S-C2).
    pub fn finish(
        &mut self,
        now: Time,
        write: Write<K, I>,
        outcome: Outcome,
    ) -> Result<Vec<I>, Box<UnknownWrite<K, I>>> {
        self.advance(now);
        match self.in_flight.get(&write.id) {
            Some(rec) if rec.len == write.items.len() => {}
            _ => return Err(Box::new(UnknownWrite(write))),
        }
        let rec = self.in_flight.remove(&write.id).expect("just checked");
        self.breaker.ended(write.id, outcome.failure(), self.now);
        self.groups.leave(rec.group);
        if rec.given_up {
            return Ok(self.finish_given_up(write, &rec, outcome));
        }
        let items = match outcome.failure() {
            None => self.finish_written(write, rec, outcome.discarded()),
            Some(failure) => self.finish_failed(write, rec, failure),
        };
        // The tenant's age timer, armed again, may be due already (S-R3).
        self.advance(self.now);
        Ok(items)
    }

    /// A write committed, `discarded` of its items refused by the store
    /// (counted lost under `discarded`). Returns its items to drop.
    fn finish_written(&mut self, write: Write<K, I>, rec: InFlight<K>, discarded: usize) -> Vec<I> {
        let n = write.items.len();
        let discarded = discarded.min(n);
        self.last_written = Some(self.now);
        self.counters.written += (n - discarded) as u64;
        self.counters.writes += 1;
        self.events.push_back(Event::Written {
            id: write.id,
            tenant: rec.tenant.clone(),
            items: n as u64,
            attempt: rec.attempt,
            latency: self.now - rec.started,
            given_up: false,
        });
        if discarded > 0 {
            self.count_lost(&rec.tenant, LostReason::Discarded, discarded as u64);
        }
        self.mark_done(&rec.tenant, n, rec.bytes, |i| {
            if i < n - discarded {
                ItemOutcome::Written
            } else {
                ItemOutcome::Lost(LostReason::Discarded)
            }
        });
        // Canary (issue 26): a commit on the last allowed attempt dead-lettered.
        let items = if self.config.max_attempts == Some(rec.attempt)
            && canary::on(canary::WRITTEN_DEAD_LETTER)
        {
            self.dead_letter_at_run_time(
                &rec.tenant,
                write.items,
                DeadReason::RetriesExhausted,
                true,
            )
        } else {
            write.items
        };
        self.schedule_after_write(rec.tenant);
        items
    }

    /// A write attempt failed: its items are kept for a retry with the
    /// identical slice (S-W5), or dropped or lost as [`Self::after_failure`]
    /// decides. Returns the items to drop (none when kept).
    fn finish_failed(&mut self, write: Write<K, I>, rec: InFlight<K>, failure: Failure) -> Vec<I> {
        self.counters.add_failed(failure);
        let handed_over = failure == Failure::StaleEpoch && self.config.outbox_table;
        if handed_over || self.is_handing_over(&rec.tenant) {
            return self.hand_over(write, rec, failure);
        }
        let next = self.after_failure(&rec, failure);
        self.attempt_failed(write.id, &rec, failure, next);
        let n = write.items.len();
        let settled = match next {
            AfterFailure::RetryIn(wait) => {
                // A suspect backing off holds no one back (S-J17, S-W8).
                self.suspects.came_back(&rec.tenant);
                let t = self.tenants.get_mut(&rec.tenant).expect("tenant in flight");
                self.sched
                    .backoff(rec.tenant.clone(), &mut t.phase, self.now + wait);
                t.retry = Some(Box::new(Retry {
                    id: write.id,
                    items: write.items,
                    bytes: rec.bytes,
                    attempts: rec.attempt,
                    first_started: rec.first_started,
                    oldest: rec.oldest,
                }));
                if let Some(age) = self.config.max_item_age {
                    set_expiry(&mut self.sched, t, &rec.tenant, age);
                }
                return Vec::new();
            }
            AfterFailure::Dropped => ItemOutcome::Dropped(DropReason::SinkError),
            AfterFailure::Lost if failure == Failure::Rejected => {
                ItemOutcome::Lost(LostReason::Terminal)
            }
            AfterFailure::Lost if failure == Failure::StaleEpoch => {
                ItemOutcome::Lost(LostReason::StaleEpoch)
            }
            AfterFailure::Lost if failure == Failure::TaskLost => {
                ItemOutcome::Lost(LostReason::JoinFailed)
            }
            // Handed over never gets here (`hand_over`), nor given up;
            // counted as lost only to keep the match whole.
            AfterFailure::Lost | AfterFailure::GivenUp | AfterFailure::HandedOver => {
                ItemOutcome::Lost(LostReason::RetriesExhausted)
            }
        };
        self.mark_done(&rec.tenant, n, rec.bytes, |_| settled);
        let reason = match (next, failure) {
            (AfterFailure::Dropped, _) => Some(DeadReason::SinkError),
            (AfterFailure::Lost, Failure::Rejected) => Some(DeadReason::Terminal),
            (AfterFailure::Lost, Failure::StaleEpoch) => Some(DeadReason::StaleEpoch),
            // As from `finish_lost`: lost, not a dead letter (S-W13).
            (AfterFailure::Lost, Failure::TaskLost) => None,
            (AfterFailure::Lost, _) => Some(DeadReason::RetriesExhausted),
            _ => None,
        };
        let items = match reason {
            Some(reason) => self.dead_letter_at_run_time(&rec.tenant, write.items, reason, true),
            None => write.items,
        };
        self.schedule_after_write(rec.tenant);
        items
    }

    /// A write came back under a stale epoch on an engine relaying an
    /// outbox table (S-E7), or failed after its
    /// tenant was handed over (S-L16): another instance owns the
    /// partition, so neither this write nor anything of its tenant is
    /// written here any more (a later write would overtake the
    /// handed-over items). The write's items, then the tenant's waiting
    /// ones, settle as handed over and are returned to be dropped: the
    /// outbox table still holds them.
    fn hand_over(&mut self, write: Write<K, I>, rec: InFlight<K>, failure: Failure) -> Vec<I> {
        self.attempt_failed(write.id, &rec, failure, AfterFailure::HandedOver);
        self.handing_over.remove(&rec.tenant);
        let n = write.items.len();
        self.mark_done(&rec.tenant, n, rec.bytes, |_| ItemOutcome::HandedOver);
        let mut items = write.items;
        let waiting = self.take_waiting_handed_over(&rec.tenant);
        let m = waiting.len();
        items.extend(waiting);
        self.counters.handed_over += (n + m) as u64;
        self.events.push_back(Event::HandedOver {
            tenant: rec.tenant.clone(),
            items: (n + m) as u64,
        });
        self.schedule_after_write(rec.tenant);
        items
    }

    /// Hands these tenants over (S-L16): their partition of an outbox
    /// table was lost, so nothing more of them is written here and the
    /// table keeps their items for the partition's next owner. For each
    /// tenant the engine holds, in the order given, its waiting items (a
    /// retry slice backing off, then its backlog) leave the engine now,
    /// counted `handed_over` with one [`Event::HandedOver`], and count in
    /// the flushes and settles that cover them as handed over. A tenant
    /// with a write in flight keeps its items until that write ends (a
    /// tenant's items settle in staging order, S-W5, S-T31): written, what
    /// it holds then (items staged meanwhile too) is handed over; failed,
    /// whatever the failure, all of it is handed over with the write's own
    /// items (neither retried nor lost). Tenants the engine does not hold
    /// are skipped; a tenant staged again once handed over starts afresh.
    /// The caller finds the tenants (the outbox table's driver keeps them
    /// by partition): the engine visits only those, O(log T) each (S-C4).
    ///
    /// Returns the items handed over now. Does nothing once the engine
    /// closed (it holds nothing then).
    pub fn hand_over_tenants(&mut self, now: Time, tenants: impl IntoIterator<Item = K>) -> u64 {
        self.advance(now);
        let mut handed = 0;
        // Ready tenants stay in the ready queue with nothing to start:
        // passed over when popped (`expire`), or forgotten at the close.
        for tenant in tenants {
            if self.life == Life::Closed {
                break;
            }
            let Some(t) = self.tenants.get(&tenant) else {
                continue;
            };
            if matches!(t.phase, Phase::InFlight(_)) {
                self.handing_over.insert(tenant);
                continue;
            }
            handed += self.hand_over_waiting(&tenant);
        }
        handed
    }

    /// Whether `tenant` was handed over with a write in flight.
    fn is_handing_over(&self, tenant: &K) -> bool {
        !self.handing_over.is_empty() && self.handing_over.contains(tenant)
    }

    /// Hands `tenant`'s waiting items over (S-L16): settled, counted, one
    /// event, released to be dropped. Returns how many.
    fn hand_over_waiting(&mut self, tenant: &K) -> u64 {
        let items = self.take_waiting_handed_over(tenant);
        let n = items.len() as u64;
        if n > 0 {
            self.counters.handed_over += n;
            self.events.push_back(Event::HandedOver {
                tenant: tenant.clone(),
                items: n,
            });
            self.released.extend(items);
        }
        self.forget_if_empty(tenant);
        n
    }

    /// Takes `tenant`'s waiting items (its retry slice, then its backlog:
    /// their staging order) off its timers and marks them done as handed
    /// over; returns them for the caller to count.
    fn take_waiting_handed_over(&mut self, tenant: &K) -> Vec<I> {
        let Some(t) = self.tenants.get_mut(tenant) else {
            return Vec::new();
        };
        self.sched.unschedule(&mut t.phase);
        if let Some(at) = t.expiry.take() {
            self.sched.move_expiry(tenant, Some(at), None);
        }
        let (mut items, mut bytes) = match t.retry.take() {
            Some(r) => (r.items, r.bytes),
            None => (Vec::new(), 0),
        };
        items.extend(take_front(&mut t.items, usize::MAX));
        bytes = bytes.saturating_add(mem::take(&mut t.bytes));
        t.stamps.clear();
        if !items.is_empty() {
            // One run, oldest first: the retry slice precedes the backlog.
            self.mark_done(tenant, items.len(), bytes, |_| ItemOutcome::HandedOver);
        }
        items
    }

    /// With `dead_letters` on, hands `items` out as an
    /// [`Event::DeadLetter`] (S-R4; `attempted`: whether an attempt of
    /// them started, S-J16) and returns nothing to drop; else returns them
    /// to be dropped.
    fn dead_letter_at_run_time(
        &mut self,
        tenant: &K,
        items: Vec<I>,
        reason: DeadReason,
        attempted: bool,
    ) -> Vec<I> {
        if !self.config.dead_letters || items.is_empty() {
            return items;
        }
        self.events.push_back(Event::DeadLetter(DeadLetter {
            tenant: tenant.clone(),
            items,
            reason,
            attempted,
        }));
        Vec::new()
    }

    /// What becomes of a failed attempt's items, counted: lost if the
    /// store rejected them (S-B2) or refused them under a stale epoch with
    /// no outbox table to hand them over to (S-E7), lost under
    /// `join_failed` if the driver reports the task lost (S-W13), dropped
    /// under the `drop` error policy
    /// (S-A5), lost once retries are exhausted (S-A5), else retried after
    /// a backoff (S-W5).
    fn after_failure(&mut self, rec: &InFlight<K>, failure: Failure) -> AfterFailure {
        let n = rec.len as u64;
        let exhausted = self
            .config
            .max_attempts
            .is_some_and(|max| rec.attempt >= max)
            || self
                .config
                .max_retry_duration
                .is_some_and(|max| self.now - rec.first_started >= max);
        if failure == Failure::Rejected {
            self.count_lost(&rec.tenant, LostReason::Terminal, n);
            AfterFailure::Lost
        } else if failure == Failure::StaleEpoch {
            // No outbox table to hand it over to (S-E7): terminal.
            self.count_lost(&rec.tenant, LostReason::StaleEpoch, n);
            AfterFailure::Lost
        } else if failure == Failure::TaskLost {
            self.count_lost(&rec.tenant, LostReason::JoinFailed, n);
            AfterFailure::Lost
        } else if self.config.error_policy == ErrorPolicy::Drop {
            self.count_dropped(&rec.tenant, DropReason::SinkError, n);
            AfterFailure::Dropped
        } else if exhausted {
            self.count_lost(&rec.tenant, LostReason::RetriesExhausted, n);
            AfterFailure::Lost
        } else {
            AfterFailure::RetryIn(self.backoff.wait(rec.attempt))
        }
    }

    /// The task running write `id` ended without giving its items back
    /// (S-W13): they are counted lost under `join_failed`. Returns whether
    /// `id` was in flight.
    pub fn finish_lost(&mut self, now: Time, id: WriteId) -> bool {
        self.advance(now);
        let Some(rec) = self.in_flight.remove(&id) else {
            return false;
        };
        self.breaker.ended(id, Some(Failure::TaskLost), self.now);
        self.groups.leave(rec.group);
        self.counters.add_failed(Failure::TaskLost);
        if rec.given_up {
            self.attempt_failed(id, &rec, Failure::TaskLost, AfterFailure::GivenUp);
            self.end_given_up_write(&rec.tenant);
            self.maybe_finish_shutdown();
            return true;
        }
        self.count_lost(&rec.tenant, LostReason::JoinFailed, rec.len as u64);
        self.attempt_failed(id, &rec, Failure::TaskLost, AfterFailure::Lost);
        self.mark_done(&rec.tenant, rec.len, rec.bytes, |_| {
            ItemOutcome::Lost(LostReason::JoinFailed)
        });
        self.schedule_after_write(rec.tenant);
        // The tenant's age timer, armed again, may be due already (S-R3).
        self.advance(self.now);
        true
    }

    /// A write the engine gave up (shutdown deadline, abandon) came back:
    /// its items are already counted lost, but the attempt still ends in
    /// one counted outcome (S-W18). Written after all, it counts as a
    /// write and its items are in the store, so they are returned to be
    /// dropped; otherwise it counts as failed by its kind and its items go
    /// to the dead letters (S-B6).
    fn finish_given_up(
        &mut self,
        write: Write<K, I>,
        rec: &InFlight<K>,
        outcome: Outcome,
    ) -> Vec<I> {
        let done = match outcome.failure() {
            None => {
                self.counters.writes += 1;
                self.events.push_back(Event::Written {
                    id: write.id,
                    tenant: write.tenant.clone(),
                    items: rec.len as u64,
                    attempt: rec.attempt,
                    latency: self.now - rec.started,
                    given_up: true,
                });
                write.items
            }
            Some(failure) => {
                self.counters.add_failed(failure);
                self.attempt_failed(write.id, rec, failure, AfterFailure::GivenUp);
                self.dead_letter(write.tenant.clone(), write.items);
                Vec::new()
            }
        };
        self.end_given_up_write(&write.tenant);
        self.maybe_finish_shutdown();
        done
    }

    /// Queues the event of a failed attempt (S-W18: one per attempt).
    fn attempt_failed(
        &mut self,
        id: WriteId,
        rec: &InFlight<K>,
        failure: Failure,
        next: AfterFailure,
    ) {
        self.events.push_back(Event::AttemptFailed {
            id,
            tenant: rec.tenant.clone(),
            items: rec.len as u64,
            attempt: rec.attempt,
            failure,
            next,
            latency: self.now - rec.started,
        });
    }

    /// Handles every timer due at `now`, once each, in the order they fall
    /// due (S-W17). Every other input does this too.
    pub fn handle_timeout(&mut self, now: Time) {
        self.advance(now);
    }

    /// Starts a flush (S-A4): everything pending is sent at once, lingering
    /// batches included, never overtaking earlier items; the answer comes as
    /// [`Event::WaitDone`] when those items are settled or at `deadline`.
    pub fn flush(&mut self, now: Time, deadline: Time) -> WaitId {
        self.advance(now);
        self.release_lingering();
        self.start_wait(WaitKind::Flush, deadline)
    }

    /// Starts a settle (S-W10): like [`flush`](Self::flush) but lingering
    /// batches keep their linger. Answered by [`Event::WaitDone`].
    pub fn settle(&mut self, now: Time, deadline: Time) -> WaitId {
        self.advance(now);
        self.start_wait(WaitKind::Settle, deadline)
    }

    /// The deadline of the shutdown under way, the earliest any call gave
    /// (S-W9); `None` before a shutdown. Outlives the shutdown's answer:
    /// with a journal, the driver bounds its wait for the last done marks
    /// by it (S-W15, S-J3).
    pub fn shutdown_deadline(&self) -> Option<Time> {
        self.shutdown.as_ref().map(|sd| sd.deadline)
    }

    /// Raises the shutdown fence (S-W9): later stages are refused; what is
    /// pending drains with retries until `deadline`, then every unwritten
    /// item is lost under `deadline` and handed back (S-B6). Answered by
    /// [`Event::ShutdownDone`]. A second call joins the first (its deadline
    /// tightens the shutdown's if earlier) and is answered with zeros.
    pub fn shutdown(&mut self, now: Time, deadline: Time) -> WaitId {
        self.advance(now);
        match self.life {
            Life::Closed => {
                let id = self.waits.next_id();
                // Its answer may still wait for a journal's marks (S-W15).
                if let Some(sd) = self.shutdown.as_mut() {
                    sd.deadline = sd.deadline.min(deadline);
                }
                self.events.push_back(Event::ShutdownDone {
                    id,
                    report: ShutdownReport::new(Report::default(), false, Vec::new()),
                });
                id
            }
            Life::Closing => {
                let sd = self.shutdown.as_mut().expect("closing has a shutdown");
                let id = self.waits.next_id();
                sd.later.push(id);
                sd.deadline = sd.deadline.min(deadline);
                let first = sd.first;
                if let Some(old) = self.waits.deadline_key(first) {
                    if deadline < old.0 {
                        self.sched.cancel_deadline(old);
                        let key = self.sched.deadline(first, deadline);
                        self.waits.set_deadline_key(first, key);
                        self.advance(self.now);
                    }
                }
                id
            }
            Life::Open => {
                self.life = Life::Closing;
                self.release_lingering();
                let id = self.waits.next_id();
                self.shutdown = Some(Shutdown {
                    first: id,
                    later: Vec::new(),
                    settled: None,
                    unwritten: Vec::new(),
                    reported: false,
                    deadline,
                });
                self.open_wait(id, WaitKind::Shutdown, deadline);
                id
            }
        }
    }

    /// Gives up at once (S-A7): everything pending is counted lost under
    /// `abandoned`, writes in flight are to be cancelled
    /// ([`Event::CancelInFlight`]), waits are answered, the engine closes.
    /// Returns the items the engine held (those in flight are released,
    /// see [`take_released`](Self::take_released), when they come back,
    /// unless a shutdown is waiting for them). During
    /// a shutdown that has not answered yet, the held items go to that
    /// shutdown's dead letters instead and this returns nothing: each item
    /// is handed back once, to one caller. Each run says whether an
    /// attempt of it started ([`Unwritten::attempted`], S-J16): a run that
    /// failed and waited for its retry may be in the store.
    pub fn abandon(&mut self, now: Time) -> Vec<Unwritten<K, I>> {
        self.advance(now);
        let held = self.give_up_all(LostReason::Abandoned);
        self.close();
        held.into_iter().map(HeldRun::into_unwritten).collect()
    }

    // ----- outputs ------------------------------------------------------

    /// The ages of the items settled since the last call, in settle order
    /// (S-R7): one per pending item that was written, lost, dropped after
    /// its staging, or handed over, from its staging time (a durable
    /// item's given age included, S-W22) to `now` as it settled. Kept only
    /// with a `max_item_age` (S-R3: items are stamped then); empty
    /// otherwise. Drain it with the events: undrained, it holds one sample
    /// (32 bytes) per settled item.
    pub fn drain_item_ages(&mut self) -> std::vec::Drain<'_, ItemAge> {
        self.ages.drain(..)
    }

    /// The next event to export or act on; call until `None` after every input.
    pub fn poll_event(&mut self) -> Option<Event<K, I>> {
        if let Some(part) = self.split_refusals() {
            return Some(part);
        }
        let event = self.events.pop_front()?;
        self.popped += 1;
        shrink::deque(&mut self.events);
        Some(event)
    }

    /// Coalesced refusals at the front of the queue that span more than
    /// one log point (S-A6: the first, then every 1,000th per reason) are
    /// handed out one log point at a time: the part before the second log
    /// point goes now, the rest stays in front. So the log keeps its rate
    /// while the queue holds one event per reason (S-B8).
    fn split_refusals(&mut self) -> Option<Event<K, I>> {
        let popped = self.popped;
        let c = self
            .refusals
            .iter_mut()
            .flatten()
            .find(|c| c.seq == popped)?;
        Some(match self.events.front_mut()? {
            Event::Dropped {
                tenant,
                items,
                reason,
                ..
            } => Event::Dropped {
                items: c.cut(items)?,
                tenant: tenant.clone(),
                reason: *reason,
                log: true,
            },
            Event::Lost {
                tenant,
                items,
                reason,
                ..
            } => Event::Lost {
                items: c.cut(items)?,
                tenant: tenant.clone(),
                reason: *reason,
                log: true,
            },
            _ => return None,
        })
    }

    /// When the next timer falls due (linger, backoff, deadline, or the
    /// breaker's next probe while a tenant is ready for it, S-R2), if any.
    /// The driver calls [`handle_timeout`](Self::handle_timeout) then.
    pub fn poll_timeout(&self) -> Option<Time> {
        let timer = self.sched.next_timeout();
        // Only a probe that could start then: a write slot free (a group
        // holds one, whatever its slices, S-F1) and a tenant ready.
        // Otherwise the next input (a write's end, a timer) re-arms it,
        // and an idle breaker arms nothing.
        let probe = self.breaker.next_probe().filter(|_| {
            self.life != Life::Closed
                && self.sched.has_ready()
                && self.groups.len() < self.config.concurrency
        });
        match (timer, probe) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ----- time ---------------------------------------------------------

    /// Moves the clock to `now` and fires what is due, each timer once, in
    /// (instant, arming order) (S-W17).
    fn advance(&mut self, now: Time) {
        self.now = self.now.max(now);
        while let Some(due) = self.sched.pop_due(self.now) {
            match due {
                Due::Tenant(tenant) => self.make_ready(tenant),
                Due::Expiry(tenant) => self.expire_by_timer(tenant),
                Due::Deadline(id) => {
                    if self.shutdown.as_ref().is_some_and(|sd| sd.first == id) {
                        self.waits.mark_deadline_passed(id);
                        self.give_up_all(LostReason::Deadline);
                        self.close();
                    } else if let Some(report) = self.waits.expire(id) {
                        self.events.push_back(Event::WaitDone { id, report });
                    }
                }
            }
        }
    }

    // ----- scheduling ---------------------------------------------------

    fn weigh(&self, item: &I) -> u64 {
        weight(self.weigher.as_deref(), item)
    }

    /// A tenant whose linger or backoff ended.
    fn make_ready(&mut self, tenant: K) {
        let t = self
            .tenants
            .get_mut(&tenant)
            .expect("a timed tenant exists");
        self.sched.ready(tenant, &mut t.phase);
    }

    /// After a write settled (not retried), the tenant's next step.
    fn schedule_after_write(&mut self, tenant: K) {
        let Some(t) = self.tenants.get_mut(&tenant) else {
            return;
        };
        t.phase = Phase::Idle;
        if self.is_handing_over(&tenant) {
            // Handed over while its write was out (S-L16).
            self.handing_over.remove(&tenant);
            self.hand_over_waiting(&tenant);
            return;
        }
        let Some(t) = self.tenants.get_mut(&tenant) else {
            return;
        };
        if t.items.is_empty() || self.life == Life::Closed {
            // Nothing waits, or given up already and nothing may start (I8).
            self.forget_if_empty(&tenant);
            return;
        }
        if let Some(age) = self.config.max_item_age {
            // Its timer waited for the write's end (S-R3).
            set_expiry(&mut self.sched, t, &tenant, age);
        }
        self.waits.catch_up(&mut t.wait_marks, t.pending as u64);
        let skip_linger = self.life != Life::Open || self.waits.skips_linger(&t.wait_marks);
        ready_or_linger(
            tenant,
            t,
            &self.config,
            self.now,
            skip_linger,
            &mut self.sched,
        );
    }

    /// A flush or shutdown sends lingering batches at once (S-A3, S-A4), in
    /// the order their lingers would have ended.
    fn release_lingering(&mut self) {
        let lingering: Vec<K> = self.sched.take_lingering().collect();
        for tenant in lingering {
            self.make_ready(tenant);
        }
    }

    // ----- accounting ---------------------------------------------------

    fn count_lost(&mut self, tenant: &K, reason: LostReason, items: u64) {
        let log = self.counters.add_lost(reason, items);
        self.events.push_back(Event::Lost {
            tenant: tenant.clone(),
            items,
            reason,
            log,
        });
    }

    fn count_dropped(&mut self, tenant: &K, reason: DropReason, items: u64) {
        let log = self.counters.add_dropped(reason, items);
        self.events.push_back(Event::Dropped {
            tenant: tenant.clone(),
            items,
            reason,
            log,
        });
    }

    /// Counts one refused stage and queues its event, or adds it to the
    /// queued event of an earlier refusal for the same reason (S-B8): a
    /// producer that outruns a stalled driver grows no queue. Counters stay
    /// exact and the log still comes at the first and every 1,000th (S-A6).
    fn count_refusal(&mut self, tenant: K, refusal: Refusal) {
        let log = match refusal.drop_reason() {
            Some(reason) => self.counters.add_dropped(reason, 1),
            None => self.counters.add_lost(LostReason::Shutdown, 1),
        };
        let slot = &mut self.refusals[slot_of(refusal)];
        let queued = slot
            .and_then(|c| c.seq.checked_sub(self.popped))
            .and_then(|at| self.events.get_mut(at as usize));
        if let Some(
            Event::Dropped {
                items, log: logs, ..
            }
            | Event::Lost {
                items, log: logs, ..
            },
        ) = queued
        {
            *items += 1;
            *logs |= log;
            return;
        }
        let before = match refusal.drop_reason() {
            Some(reason) => self.counters.dropped(reason),
            None => self.counters.lost(LostReason::Shutdown),
        } - 1;
        *slot = Some(Coalesced {
            seq: self.popped + self.events.len() as u64,
            before,
        });
        self.events.push_back(match refusal.drop_reason() {
            Some(reason) => Event::Dropped {
                tenant,
                items: 1,
                reason,
                log,
            },
            None => Event::Lost {
                tenant,
                items: 1,
                reason: LostReason::Shutdown,
                log,
            },
        });
    }

    /// The tenant's `n` oldest pending items (weighing `bytes`) left the
    /// pending state, `how(i)` saying how the i-th did; the caller has
    /// counted them written, dropped or lost. Takes them off the pending
    /// count and bytes, counts them into the waits that cover them, and
    /// answers the waits that completes.
    fn mark_done(&mut self, tenant: &K, n: usize, bytes: u64, how: impl Fn(usize) -> ItemOutcome) {
        self.counters.pending -= n as u64;
        self.pending_bytes = self.pending_bytes.saturating_sub(bytes);
        let t = self
            .tenants
            .get_mut(tenant)
            .expect("a settling tenant exists");
        self.waits.catch_up(&mut t.wait_marks, t.pending as u64);
        t.pending -= n;
        self.suspects.done(tenant, n as u64);
        t.stamps.take_ages(n, self.now, &how, &mut self.ages);
        if !self.keys.0.is_empty() {
            self.keys.done(tenant, n, &how, &mut self.events);
        }
        for id in self
            .waits
            .count_done(&mut t.wait_marks, n, |i| how(i).settled_as())
        {
            self.answer_wait(id);
        }
    }

    fn start_wait(&mut self, kind: WaitKind, deadline: Time) -> WaitId {
        let id = self.waits.next_id();
        self.open_wait(id, kind, deadline);
        id
    }

    fn open_wait(&mut self, id: WaitId, kind: WaitKind, deadline: Time) {
        let key = self.sched.deadline(id, deadline);
        let done = self.waits.open(id, kind, self.counters.pending, key);
        if done {
            self.answer_wait(id);
        } else {
            // A deadline already past fires now.
            self.advance(self.now);
        }
    }

    /// A wait's items are all settled (or its deadline passed): answer it.
    fn answer_wait(&mut self, id: WaitId) {
        let Some((report, key)) = self.waits.take(id) else {
            return;
        };
        self.sched.cancel_deadline(key);
        if self.shutdown.as_ref().is_some_and(|sd| sd.first == id) {
            self.close();
            self.shutdown.as_mut().expect("checked").settled = Some(report);
            self.maybe_finish_shutdown();
        } else {
            self.events.push_back(Event::WaitDone { id, report });
        }
    }

    /// A given-up write of `tenant` came back: the tenant is no longer in
    /// flight (its items were settled when it was given up).
    fn end_given_up_write(&mut self, tenant: &K) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            if matches!(t.phase, Phase::InFlight(_)) {
                t.phase = Phase::Idle;
            }
        }
        self.forget_if_empty(tenant);
    }

    /// Forgets a tenant that holds nothing and has nothing scheduled: the
    /// one place a tenant leaves the table, so it holds only tenants
    /// with items or a write in flight (S-B8).
    fn forget_if_empty(&mut self, tenant: &K) {
        let gone = self.tenants.remove_if(tenant, Tenant::is_empty);
        if let Some(at) = gone.and_then(|t| t.expiry) {
            self.sched.move_expiry(tenant, Some(at), None);
        }
    }

    /// Closes the engine: no write starts from now on (I8). The ready
    /// tenants leave the ready queue; those that hold nothing any more
    /// (emptied by their age timer or a hand-over, S-L16, while ready)
    /// are forgotten (S-B8). Once, at the close.
    fn close(&mut self) {
        self.life = Life::Closed;
        for tenant in self.sched.take_ready() {
            if let Some(t) = self.tenants.get_mut(&tenant) {
                if t.phase == Phase::Ready {
                    t.phase = Phase::Idle;
                }
            }
            self.forget_if_empty(&tenant);
        }
    }

    /// Gives up every pending item for `reason` (S-W9 deadline, S-A7):
    /// in-flight writes are marked and the driver is told to cancel them;
    /// retry slices and backlogs are taken out. The items taken out go to a
    /// shutdown still to be answered (its dead letters), or are returned,
    /// tenant by tenant in key order, when there is none. Tenants left
    /// with nothing are forgotten.
    ///
    /// Its cost is bounded (S-W9): one sort of the held tenants' keys, one
    /// lookup and constant work per tenant beside moving its items (no
    /// allocation per tenant: a backlog becomes its run in place), the
    /// open waits settled in bulk, and the tenant table rebuilt once.
    fn give_up_all(&mut self, reason: LostReason) -> Vec<HeldRun<K, I>> {
        // An outbox table still holds every item given up here: handed
        // over to the next start or owner, not lost, not unwritten (S-T38).
        let hand_over = self.config.table_only;
        let outcome = if hand_over {
            ItemOutcome::HandedOver
        } else {
            ItemOutcome::Lost(reason)
        };
        // Everything held is given up here: no mark is left to act on.
        self.handing_over.clear();
        // In flight first (per tenant the oldest items; at most
        // `concurrency` writes): settled one by one, as any slice.
        let mut in_flight: Vec<(K, usize, u64)> = Vec::new();
        for rec in self.in_flight.values_mut().filter(|r| !r.given_up) {
            rec.given_up = true;
            in_flight.push((rec.tenant.clone(), rec.len, rec.bytes));
        }
        if !in_flight.is_empty() {
            self.events.push_back(Event::CancelInFlight);
        }
        for (tenant, n, bytes) in in_flight {
            self.count_given_up(&tenant, n as u64, reason, hand_over);
            self.mark_done(&tenant, n, bytes, |_| outcome);
        }
        // Tenant by tenant in key order, so the run is reproducible (S-C1).
        let mut keys: Vec<K> = self.tenants.keys().cloned().collect();
        keys.sort_unstable();
        let mut held = Vec::new();
        for tenant in keys {
            let runs = self.take_held(&tenant, outcome);
            for run in runs.into_iter().flatten() {
                self.count_given_up(&tenant, run.items.len() as u64, reason, hand_over);
                held.push(run);
            }
        }
        self.sched.clear_ready();
        // Dead letters are filed before the waits settle, which may answer
        // the shutdown.
        if hand_over {
            self.released
                .extend(held.drain(..).flat_map(|run| run.items));
        } else if let Some(sd) = self.shutdown.as_mut().filter(|sd| !sd.reported) {
            sd.unwritten.append(&mut held);
        }
        // Nothing is pending any more: every open wait is owed the rest.
        for id in self.waits.count_all_done(outcome.settled_as()) {
            self.answer_wait(id);
        }
        self.forget_all_empty();
        held
    }

    /// Counts `n` items of `tenant` given up for `reason`: lost, or handed
    /// over with an outbox table (S-T38), with their event.
    fn count_given_up(&mut self, tenant: &K, n: u64, reason: LostReason, hand_over: bool) {
        if hand_over {
            self.counters.handed_over += n;
            self.events.push_back(Event::HandedOver {
                tenant: tenant.clone(),
                items: n,
            });
        } else {
            self.count_lost(tenant, reason, n);
        }
    }

    /// Takes `tenant`'s waiting items out as given up (`outcome`), its
    /// retry slice, then its backlog, and settles them without touching
    /// the waits (the caller settles those in bulk): the pending counts,
    /// their ages (S-R7) and their keys. Unschedules the tenant.
    fn take_held(&mut self, tenant: &K, outcome: ItemOutcome) -> [Option<HeldRun<K, I>>; 2] {
        let t = self.tenants.get_mut(tenant).expect("key just listed");
        self.sched.unschedule(&mut t.phase);
        if t.phase == Phase::Ready {
            t.phase = Phase::Idle;
        }
        let retry = t.retry.take().map(|r| {
            (
                HeldRun {
                    tenant: tenant.clone(),
                    held_in: HeldIn::Retry,
                    items: r.items,
                },
                r.bytes,
            )
        });
        // S-J16: the oldest `tried` pending items, the retry slice's
        // first, an earlier life attempted.
        let retried = retry.as_ref().map_or(0, |(r, _)| r.items.len() as u64);
        let tried = self.suspects.tried(tenant) > retried;
        let backlog = (!t.items.is_empty()).then(|| {
            t.stamps.clear();
            (
                HeldRun {
                    tenant: tenant.clone(),
                    held_in: if tried {
                        HeldIn::TriedBacklog
                    } else {
                        HeldIn::Backlog
                    },
                    items: take_front(&mut t.items, usize::MAX),
                },
                mem::take(&mut t.bytes),
            )
        });
        let n = retry.as_ref().map_or(0, |(r, _)| r.items.len())
            + backlog.as_ref().map_or(0, |(r, _)| r.items.len());
        let bytes = retry.as_ref().map_or(0, |(_, b)| *b) + backlog.as_ref().map_or(0, |(_, b)| *b);
        self.counters.pending -= n as u64;
        self.pending_bytes = self.pending_bytes.saturating_sub(bytes);
        t.pending -= n;
        t.stamps.take_ages(n, self.now, |_| outcome, &mut self.ages);
        if !self.keys.0.is_empty() {
            self.keys.done(tenant, n, |_| outcome, &mut self.events);
        }
        [retry.map(|(r, _)| r), backlog.map(|(r, _)| r)]
    }

    /// Forgets, in one pass, every tenant left with nothing (after a
    /// shutdown deadline or an abandon, S-B8), their age timers with them.
    fn forget_all_empty(&mut self) {
        let mut timers = Vec::new();
        self.tenants.retain(|tenant, t| {
            if !t.is_empty() {
                return true;
            }
            if let Some(at) = t.expiry {
                timers.push((tenant.clone(), at));
            }
            false
        });
        for (tenant, at) in timers {
            self.sched.move_expiry(&tenant, Some(at), None);
        }
    }

    /// Files items that came back from a given-up write: dead letters of a
    /// shutdown still to be answered, else released (already counted lost).
    fn dead_letter(&mut self, tenant: K, items: Vec<I>) {
        if self.config.table_only {
            // Handed over, still in the outbox table (S-T38).
            self.released.extend(items);
            return;
        }
        match self.shutdown.as_mut().filter(|sd| !sd.reported) {
            Some(sd) => sd.unwritten.push(HeldRun {
                tenant,
                held_in: HeldIn::InFlight,
                items,
            }),
            None => self.released.extend(items),
        }
    }

    /// Sends the shutdown reports once the shutdown wait settled and every
    /// given-up write has come back (so the dead letters are complete).
    fn maybe_finish_shutdown(&mut self) {
        let Some(sd) = self.shutdown.as_mut() else {
            return;
        };
        let Some(report) = sd.settled else {
            return;
        };
        if self.in_flight.values().any(|r| r.given_up) {
            return;
        }
        sd.settled = None;
        sd.reported = true;
        let mut unwritten = mem::take(&mut sd.unwritten);
        unwritten.sort_by(|a, b| (&a.tenant, a.held_in).cmp(&(&b.tenant, b.held_in)));
        let first = sd.first;
        let later = mem::take(&mut sd.later);
        self.events.push_back(Event::ShutdownDone {
            id: first,
            report: ShutdownReport::new(
                report,
                true,
                unwritten.into_iter().map(HeldRun::into_unwritten).collect(),
            ),
        });
        for id in later {
            self.events.push_back(Event::ShutdownDone {
                id,
                report: ShutdownReport::new(
                    Report {
                        deadline_passed: report.deadline_passed,
                        ..Report::default()
                    },
                    false,
                    Vec::new(),
                ),
            });
        }
    }
}

/// Sets `tenant`'s age timer (S-R3) to the age deadline of the oldest
/// item it holds (its retry slice's or its backlog's), or disarms it while
/// a write of it is in flight (what waits behind a write is decided when
/// it ends: a tenant's items settle in staging order) or it holds none.
fn set_expiry<K: Ord + Clone, I>(
    sched: &mut Schedule<K>,
    t: &mut Tenant<I>,
    tenant: &K,
    age: std::time::Duration,
) {
    let age_ns = u64::try_from(age.as_nanos()).unwrap_or(u64::MAX);
    let due = match t.phase {
        Phase::InFlight(_) => None,
        _ => t.expiry_due(age_ns),
    };
    sched.move_expiry(tenant, t.expiry, due);
    t.expiry = due;
}

/// One run of a tenant's items past `max_item_age` (S-R3), with its
/// weight in bytes and whether an attempt of it started (S-J16).
struct ExpiredRun<I> {
    items: Vec<I>,
    bytes: u64,
    attempted: bool,
}

/// Takes what `t` holds that was staged before `cutoff` (S-R3): its retry
/// slice whole when `retry_expired` (attempted, S-J16), then, with no
/// retry slice left, its backlog from the oldest (never attempted).
fn take_expired<I>(
    t: &mut Tenant<I>,
    cutoff: Time,
    weigher: Option<&(dyn Fn(&I) -> u64 + Send + Sync)>,
    retry_expired: bool,
) -> Vec<ExpiredRun<I>> {
    let mut runs = Vec::new();
    if retry_expired {
        let r = t.retry.take().expect("just checked");
        runs.push(ExpiredRun {
            items: r.items,
            bytes: r.bytes,
            attempted: true,
        });
    }
    if t.retry.is_none() {
        let (items, bytes) = t.take_staged_before(cutoff, |i| weight(weigher, i));
        if !items.is_empty() {
            runs.push(ExpiredRun {
                items,
                bytes,
                attempted: false,
            });
        }
    }
    runs
}

/// An item's weight (S-B5): 0 without a weigher, else the weigher's
/// clamped to `1..=MAX_WEIGHT` (S-B8: `capacity_bytes` bounds the count).
pub(crate) fn weight<I>(weigher: Option<&(dyn Fn(&I) -> u64 + Send + Sync)>, item: &I) -> u64 {
    weigher.map_or(0, |w| w(item).clamp(1, MAX_WEIGHT))
}

/// Whether the tenant's waiting backlog fills a batch (S-A3).
fn batch_full<I>(t: &Tenant<I>, config: &Config) -> bool {
    config.max_batch.is_some_and(|m| t.items.len() >= m)
        || config.max_batch_bytes.is_some_and(|m| t.bytes >= m)
}

/// Places an idle tenant with waiting items (S-A3): ready at once when
/// there is no linger, the batch is full, its linger has run out, or a
/// flush or shutdown is waiting for its items (`skip_linger`); else lingering
/// until `linger` after its oldest waiting item.
fn ready_or_linger<K, I>(
    tenant: K,
    t: &mut Tenant<I>,
    config: &Config,
    now: Time,
    skip_linger: bool,
    sched: &mut Schedule<K>,
) {
    debug_assert!(t.phase == Phase::Idle && !t.items.is_empty());
    let until = t.waiting_since + config.linger;
    if skip_linger || config.linger.is_zero() || until <= now || batch_full(t, config) {
        sched.ready(tenant, &mut t.phase);
    } else {
        sched.linger(tenant, &mut t.phase, until);
    }
}
