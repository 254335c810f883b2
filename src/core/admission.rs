//! Every stage's decision (S-W21): the refusal order, written once, and
//! what a refusal does; with the `capacity` and `capacity_bytes` checks
//! decided without the engine's lock, by reservation (S-A1, S-B5, S-W19).
//!
//! A stage is decided by [`decide`] over the facts its path can see
//! ([`Checks`]), in one order for every path (the request path's hand-off,
//! a stage decided under the engine's lock, a run, the engine's own
//! [`stage`](super::Engine::stage)): the shutdown fence first (S-W9), then
//! the journal's refusals (S-J8, S-J4), then the capacities (S-A1, S-B5,
//! S-B7). What a refusal does is the caller's setting ([`OnRefusal`]):
//! counted and dropped, or handed back uncounted (S-R5).
//!
//! A stage reserves one item and its weight before it hands the item to
//! the engine's intake; the engine's holder gives back what settled. The
//! reservation counts every item admitted and not yet settled: the ones
//! still on their way to the engine and the engine's pending ones, so a
//! capacity is never exceeded, whatever the interleaving. Atomics only: no
//! IO, no clock; the same sequence of calls gives the same answers.
//!
//! [`Stager`] is that decision for one engine in one thread, as the driver
//! carries it out: the harness, the model test and the fuzz target stage
//! through it.

use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};

use super::accounting::{DropReason, LostReason};
use super::config::Config;
use super::engine::{Engine, Intake, LazyStaged, Staged};
use super::stage_answers::Verdict;
use super::time::Time;

/// Why a stage was refused: one vocabulary for every way in (S-W21).
/// [`Outbox::stage`](crate::Outbox::stage) counts it (dropped under
/// [`drop_reason`](Self::drop_reason), or lost under `shutdown`);
/// [`Outbox::try_stage`](crate::Outbox::try_stage) and
/// [`Outbox::stage_wait`](crate::Outbox::stage_wait) hand the item back
/// with it, uncounted (S-R5).
///
/// Non-exhaustive: new causes may come (a stage inside a caller's
/// database transaction may one day refuse with the database's error).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Refusal {
    /// A shutdown (or abandon) began: the fence is up (S-W9). Counted lost
    /// under `shutdown`.
    ShuttingDown,
    /// The journal could not encode the item (S-J8): `encode_failed`.
    EncodeFailed,
    /// The journal has no room for its record (S-J4): `journal_full`.
    JournalFull,
    /// `capacity` or `capacity_bytes` is reached (S-A1, S-B5):
    /// `buffer_full`.
    BufferFull,
    /// The tenant's `tenant_capacity` is reached (S-B7): `tenant_full`.
    TenantFull,
    /// The outbox takes items only from its outbox table (S-T32):
    /// `table_only`.
    TableOnly,
}

impl Refusal {
    /// The drop counter it goes to when counted; `None` for
    /// [`ShuttingDown`](Self::ShuttingDown), counted lost under
    /// [`LostReason::Shutdown`] instead.
    pub fn drop_reason(self) -> Option<DropReason> {
        match self {
            Refusal::ShuttingDown => None,
            Refusal::EncodeFailed => Some(DropReason::EncodeFailed),
            Refusal::JournalFull => Some(DropReason::JournalFull),
            Refusal::BufferFull => Some(DropReason::BufferFull),
            Refusal::TenantFull => Some(DropReason::TenantFull),
            Refusal::TableOnly => Some(DropReason::TableOnly),
        }
    }

    /// The refusal a drop counter stands for, if a stage can be refused
    /// under it (`sink_error` cannot).
    pub fn of_drop(reason: DropReason) -> Option<Refusal> {
        match reason {
            DropReason::EncodeFailed => Some(Refusal::EncodeFailed),
            DropReason::JournalFull => Some(Refusal::JournalFull),
            DropReason::BufferFull => Some(Refusal::BufferFull),
            DropReason::TenantFull => Some(Refusal::TenantFull),
            DropReason::TableOnly => Some(Refusal::TableOnly),
            _ => None,
        }
    }

    /// What [`Outbox::stage`](crate::Outbox::stage) answers for it.
    pub fn staged(self) -> Staged {
        match self.drop_reason() {
            Some(reason) => Staged::Dropped(reason),
            None => Staged::ShuttingDown,
        }
    }

    /// The counter's name (`shutdown`, `encode_failed`, `journal_full`,
    /// `buffer_full`, `tenant_full`).
    pub fn as_str(self) -> &'static str {
        match self.drop_reason() {
            Some(reason) => reason.as_str(),
            None => LostReason::Shutdown.as_str(),
        }
    }
}

/// What a refusal does to the item (S-W21): the one setting that tells
/// the user calls apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnRefusal {
    /// Counted (dropped or lost) and the item let go: `stage`,
    /// `stage_many` (S-W1, S-W20).
    Count,
    /// Handed back uncounted: `try_stage` (S-R5).
    HandBack,
    /// Handed back uncounted, and tried again when items settle, until a
    /// timeout: `stage_wait` (S-R5). A shutdown is never waited out.
    Wait,
}

impl OnRefusal {
    /// Whether `refusal` is counted (else the item goes back to the
    /// caller).
    pub fn counts(self, _refusal: Refusal) -> bool {
        self == OnRefusal::Count
    }

    /// Whether the caller waits for room after `refusal`: only a waiting
    /// stage, only for room (a full journal or capacity), never once the
    /// fence is up, never for an item the journal cannot encode (S-R5,
    /// S-W21).
    pub fn waits(self, refusal: Refusal) -> bool {
        self == OnRefusal::Wait
            && !matches!(
                refusal,
                Refusal::ShuttingDown | Refusal::EncodeFailed | Refusal::TableOnly
            )
    }
}

/// The facts a stage's path can see, asked by [`decide`] in its order,
/// each at most once and only while nothing refused yet. A path that
/// cannot refuse for a reason keeps its default (`true`: room).
pub trait Checks {
    /// Whether the outbox takes items only from its outbox table (S-T32).
    fn table_only(&mut self) -> bool {
        false
    }
    /// Whether the shutdown fence is up (S-W9).
    fn fenced(&mut self) -> bool;
    /// Whether the item was encoded (with a journal, S-J8).
    fn encoded(&mut self) -> bool {
        true
    }
    /// Whether the journal has room for its record (S-J4). May hold the
    /// journal's lock until the item is appended.
    fn journal_room(&mut self) -> bool {
        true
    }
    /// Whether `capacity` and `capacity_bytes` have room (S-A1, S-B5);
    /// may reserve it ([`Admission::reserve`]).
    fn buffer_room(&mut self) -> bool {
        true
    }
    /// Whether the tenant's quota has room (S-B7).
    fn tenant_room(&mut self) -> bool {
        true
    }
    /// Gives back what [`buffer_room`](Self::buffer_room) reserved: a
    /// later check refused.
    fn unreserve(&mut self) {}
}

/// The refusal order, written once (S-W21): an outbox that takes items
/// only from its outbox table (S-T32, always refused), the fence (S-W9), the
/// journal's encoding (S-J8) and room (S-J4), the buffer's capacities
/// (S-A1, S-B5), the tenant's quota (S-B7). The first that refuses is
/// the answer; the later ones are not asked.
///
/// # Errors
/// The first refusal; a buffer reservation made before it is given back.
#[inline(always)]
pub fn decide(checks: &mut impl Checks) -> Result<(), Refusal> {
    if checks.table_only() {
        return Err(Refusal::TableOnly);
    }
    if checks.fenced() {
        return Err(Refusal::ShuttingDown);
    }
    if !checks.encoded() {
        return Err(Refusal::EncodeFailed);
    }
    if !checks.journal_room() {
        return Err(Refusal::JournalFull);
    }
    if !checks.buffer_room() {
        return Err(Refusal::BufferFull);
    }
    if !checks.tenant_room() {
        checks.unreserve();
        return Err(Refusal::TenantFull);
    }
    Ok(())
}

/// A decision taken before the fence was read again: the fence outranks
/// every other refusal (S-W21), so a refusal counted under the engine's
/// lock, where the fence may have gone up since, is the fence's if it is
/// up now.
pub fn recheck(decided: Result<(), Refusal>, fenced: bool) -> Result<(), Refusal> {
    struct Again(bool, Result<(), Refusal>);
    impl Checks for Again {
        fn table_only(&mut self) -> bool {
            self.1 == Err(Refusal::TableOnly)
        }
        fn fenced(&mut self) -> bool {
            self.0
        }
        fn encoded(&mut self) -> bool {
            self.1 != Err(Refusal::EncodeFailed)
        }
        fn journal_room(&mut self) -> bool {
            self.1 != Err(Refusal::JournalFull)
        }
        fn buffer_room(&mut self) -> bool {
            self.1 != Err(Refusal::BufferFull)
        }
        fn tenant_room(&mut self) -> bool {
            self.1 != Err(Refusal::TenantFull)
        }
    }
    // The fence never comes down again (S-W9).
    let fenced = fenced || decided == Err(Refusal::ShuttingDown);
    decide(&mut Again(fenced, decided))
}

/// The request path's decision and hand-off (S-W19, S-W21): the item
/// decided over `facts`; if admitted, `send` hands it to the hand-off
/// queue. A send refused because the fence went up since it was read
/// (S-W9) is the fence's refusal, its reservation given back.
///
/// # Errors
/// The refusal, with the tenant and the item, nothing held for them.
#[inline]
pub(crate) fn hand_off<K: Ord + Hash + Clone, I>(
    facts: &mut Facts<'_, K, I>,
    tenant: K,
    item: I,
    send: impl FnOnce(K, I) -> Result<(), (K, I)>,
) -> Result<(), (Refusal, K, I)> {
    if let Err(refusal) = decide(facts) {
        return Err((refusal, tenant, item));
    }
    send(tenant, item).map_err(|(tenant, item)| {
        facts.admission.release(1, facts.weight);
        (Refusal::ShuttingDown, tenant, item)
    })
}

/// The journal's append step, as a commit asks it (S-J4, D2): implemented
/// by the journal, under its lock.
pub(crate) trait Append<K> {
    /// Tells `decide` whether the journal has room for the stage's record
    /// `record` (S-J4), then appends it under the tenant `decide` names,
    /// if any (the item was taken); returns `decide`'s answer.
    fn append_if<R>(&mut self, record: usize, decide: impl FnOnce(bool) -> (Option<K>, R)) -> R;
}

/// An item prepared outside every lock (step 1 of S-W21): its weight and,
/// with a journal, its record's index in the stage's run (`Some(None)`:
/// the codec refused it; `None`: no journal).
pub(crate) struct Prepared<K, I> {
    pub(crate) tenant: K,
    pub(crate) item: I,
    pub(crate) weight: u64,
    pub(crate) record: Option<Option<usize>>,
    /// Refused on the request path already (S-W19): only counted under
    /// the engine's lock, as the fence's if it went up since (S-W21).
    pub(crate) refused: Option<Refusal>,
}

impl<K, I> Prepared<K, I> {
    /// `item` of `tenant`, weighing `weight` bytes, with its `record`'s
    /// index (see [`Prepared`]), not refused yet.
    pub(crate) fn new(tenant: K, item: I, weight: u64, record: Option<Option<usize>>) -> Self {
        Prepared {
            tenant,
            item,
            weight,
            record,
            refused: None,
        }
    }
}

/// How [`Admission::commit`] takes items in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Commit {
    /// The items' stamp, if the engine reads it (S-A3, S-R3).
    pub(crate) at: Option<Time>,
    /// What a refusal does.
    pub(crate) on: OnRefusal,
    /// Each item is checked against its tenant's `tenant_capacity` (S-B7)
    /// and taken in at once, so the next one sees the engine's count.
    pub(crate) quota: bool,
}

impl Admission {
    /// Steps 2 and 3 of the pipeline under the engine's lock (S-B7, S-W20,
    /// S-W21), into `engine` whose share of the reservations is `held`
    /// (items, bytes), with the `journal`'s append step under its lock if
    /// there is a journal: `items` in order, each answered through
    /// `answer`, each decided (one refused on the request path only
    /// counted, as the fence's if it is up now), its record appended, and
    /// the item taken in: at once with a quota, which reads the engine's
    /// count, else all together. Returns whether the writer must drain.
    pub(crate) fn commit<K: Ord + Hash + Clone, I, A: Append<K>>(
        &self,
        (engine, held): (&mut Engine<K, I>, &mut (u64, u64)),
        mut journal: Option<&mut A>,
        how: Commit,
        items: impl IntoIterator<Item = Prepared<K, I>>,
        answer: &mut impl FnMut(Verdict<I>),
    ) -> bool {
        let Commit { at, on, quota } = how;
        let (mut wake, mut batch) = (false, Vec::new());
        // Under the lock: the fence cannot go up meanwhile.
        let fenced = engine.is_shutting_down();
        for p in items {
            let ask = |room: bool| {
                decide(&mut Facts {
                    table_only: self.table_only,
                    fenced,
                    encoded: !matches!(p.record, Some(None)),
                    journal_room: room,
                    admission: self,
                    weight: p.weight,
                    quota: quota.then_some((&*engine, &p.tenant)),
                })
            };
            let verdict = match (p.refused, journal.as_deref_mut(), p.record) {
                (Some(refusal), ..) => recheck(Err(refusal), fenced),
                (None, Some(a), Some(Some(i))) => a.append_if(i, |room| {
                    let verdict = ask(room);
                    (verdict.is_ok().then(|| p.tenant.clone()), verdict)
                }),
                (None, ..) => ask(true),
            };
            match verdict {
                Err(refusal) if !on.counts(refusal) => {
                    answer(Err((refusal, p.item)));
                    continue;
                }
                Err(refusal) => answer(Ok(refusal.staged())),
                Ok(()) => answer(Ok(Staged::Accepted)),
            }
            // Its event is drained by the writer.
            wake |= p.refused.is_some();
            let handoff = Handoff {
                tenant: p.tenant,
                item: p.item,
                weight: Some(p.weight),
                at,
                refusal: verdict.err(),
            };
            if quota {
                wake |= self.intake(engine, held, [handoff]).wake;
            } else {
                batch.push(handoff);
            }
        }
        // Accepted ones: the fence is down (read under this lock) and
        // their room is reserved; refused ones are counted.
        let intake = self.intake(engine, held, batch);
        debug_assert_eq!(intake.refused, 0);
        wake | intake.wake
    }
}

/// An item decided outside the engine, on its way to the engine's intake
/// ([`Engine::stage_batch`](super::Engine::stage_batch), S-W19, S-W21):
/// admitted, its reservation held until it settles; or refused, to be
/// counted.
#[derive(Debug)]
pub struct Handoff<K, I> {
    /// Its tenant.
    pub tenant: K,
    /// The item.
    pub item: I,
    /// Its clamped weight in bytes (0 without a weigher), as
    /// [`Engine::weigh_item`](super::Engine::weigh_item) gives it, if the
    /// request path weighed it (to reserve bytes); `None`: the engine
    /// weighs it at intake.
    pub weight: Option<u64>,
    /// When it was staged, if the engine reads that (a linger or a
    /// `max_item_age`, S-A3, S-R3); `None`: stamped at intake.
    pub at: Option<Time>,
    /// `None`: admitted. `Some`: refused by [`decide`] for this reason,
    /// to be counted (S-W21); nothing is reserved for it.
    pub refusal: Option<Refusal>,
}

impl<K, I> Handoff<K, I> {
    /// An admitted item as the plain hand-off carries it (S-W19): the
    /// tenant and the item alone, weighed and stamped at the intake.
    pub(crate) fn plain((tenant, item): (K, I)) -> Self {
        Handoff {
            tenant,
            item,
            weight: None,
            at: None,
            refusal: None,
        }
    }
}

/// The reservations against the buffer's capacities (S-A1, S-B5). Without
/// either capacity configured, every call is free: nothing is counted.
#[derive(Debug)]
pub struct Admission {
    capacity: Option<u64>,
    capacity_bytes: Option<u64>,
    /// Every stage is refused: the outbox takes items only from its
    /// outbox table (S-T32).
    table_only: bool,
    /// Items admitted and not yet settled.
    items: AtomicU64,
    /// Their clamped weights, in bytes, saturating.
    bytes: AtomicU64,
}

impl Admission {
    /// The admission of `config`'s capacities, with nothing reserved.
    pub fn new(config: &Config) -> Self {
        Admission {
            capacity: config.capacity.map(|c| c as u64),
            capacity_bytes: config.capacity_bytes,
            table_only: config.table_only,
            items: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// Whether every stage is refused: the outbox takes items only from
    /// its outbox table (S-T32).
    pub fn table_only(&self) -> bool {
        self.table_only
    }

    /// Whether a capacity is configured: without one, nothing is counted.
    pub fn is_bounded(&self) -> bool {
        self.capacity.is_some() || self.capacity_bytes.is_some()
    }

    /// Reserves room for one item weighing `weight` bytes (already clamped,
    /// see [`MAX_WEIGHT`](super::MAX_WEIGHT)), the engine's rule: refused when
    /// `capacity` items are admitted, or when the bytes admitted plus
    /// `weight` exceed `capacity_bytes` (S-A1, S-B5).
    ///
    /// # Errors
    /// [`DropReason::BufferFull`]: nothing was reserved.
    pub fn reserve(&self, weight: u64) -> Result<(), DropReason> {
        if let Some(cap) = self.capacity {
            // A compare-exchange, not an add-then-undo: two racing stages
            // at the edge never both fail for want of one slot.
            self.items
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < cap).then_some(n + 1)
                })
                .map_err(|_| DropReason::BufferFull)?;
        }
        if let Some(cap) = self.capacity_bytes {
            let took = self
                .bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                    let after = b.saturating_add(weight);
                    (after <= cap).then_some(after)
                });
            if took.is_err() {
                if self.capacity.is_some() {
                    self.items.fetch_sub(1, Ordering::AcqRel);
                }
                return Err(DropReason::BufferFull);
            }
        }
        Ok(())
    }

    /// Gives back `items` weighing `bytes` that settled (or were refused
    /// after their reservation).
    pub fn release(&self, items: u64, bytes: u64) {
        if self.capacity.is_some() {
            self.items.fetch_sub(items, Ordering::AcqRel);
        }
        if self.capacity_bytes.is_some() {
            // Saturating: byte sums saturate in the engine too (S-B5).
            let _ = self
                .bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                    Some(b.saturating_sub(bytes))
                });
        }
    }

    /// Counts `items` weighing `bytes` that became pending without a
    /// reservation (a recovery, D4, or a stage decided under the lock).
    pub fn add(&self, items: u64, bytes: u64) {
        if self.capacity.is_some() {
            self.items.fetch_add(items, Ordering::AcqRel);
        }
        if self.capacity_bytes.is_some() {
            let _ = self
                .bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                    Some(b.saturating_add(bytes))
                });
        }
    }

    /// Brings the engine's share of the reservations, `held` (items,
    /// bytes), to what the engine has pending now: gives back what settled
    /// since, adds what became pending without a reservation (a stage
    /// decided under the engine's lock, a recovery). Call after every
    /// engine input, once the items it took in from hand-offs were added to
    /// `held` ([`Intake`](super::Intake)).
    pub fn follow(&self, held: &mut (u64, u64), pending: u64, pending_bytes: u64) {
        if self.is_bounded() {
            let (items, bytes) = *held;
            self.release(
                items.saturating_sub(pending),
                bytes.saturating_sub(pending_bytes),
            );
            self.add(
                pending.saturating_sub(items),
                pending_bytes.saturating_sub(bytes),
            );
        }
        *held = (pending, pending_bytes);
    }

    /// The engine takes in `batch`, each item decided by [`decide`] and,
    /// if admitted, holding a reservation (S-W19, S-W21): the engine's
    /// share of the reservations, `held` (items, bytes), grows by what it
    /// took; what it refused after all (its fence was up, S-W9) is given
    /// back. Refused items in `batch` are counted and held nothing.
    pub(crate) fn intake<K: Ord + Hash + Clone, I>(
        &self,
        engine: &mut Engine<K, I>,
        held: &mut (u64, u64),
        batch: impl IntoIterator<Item = Handoff<K, I>>,
    ) -> Intake {
        let intake = engine.stage_batch(batch);
        held.0 += intake.accepted;
        held.1 = held.1.saturating_add(intake.accepted_bytes);
        self.release(intake.refused, intake.refused_bytes);
        intake
    }

    /// Items admitted and not yet settled (0 when unbounded).
    pub fn items(&self) -> u64 {
        self.items.load(Ordering::Acquire)
    }
}

/// A stage's decision for one engine in one thread, as the driver carries
/// it out (S-W19, S-W21): the same [`decide`] over the same facts (the
/// fence, the buffer's reservation, the tenant's quota), then one
/// [`Engine::stage_batch`] input that takes the item in or counts its
/// refusal. The harness, the model test and the fuzz target stage through
/// it, so they drive the staging path the outbox runs.
#[derive(Debug)]
pub struct Stager {
    admission: Admission,
    /// The engine's share of the reservations (items, bytes).
    held: (u64, u64),
}

/// What one stage's path sees, for [`decide`] (S-W21): read by the
/// caller before the decision (the fence, the journal's encoding and
/// room), or asked by it in its order (the buffer's reservation, the
/// tenant's quota). The driver's request path, a stage decided under the
/// engine's lock, a run (S-W20) and [`Stager`] all decide through it.
pub(crate) struct Facts<'a, K, I> {
    /// The outbox takes items only from its outbox table (S-T32).
    pub(crate) table_only: bool,
    /// The shutdown fence is up (S-W9).
    pub(crate) fenced: bool,
    /// The item was encoded (always, without a journal, S-J8).
    pub(crate) encoded: bool,
    /// The journal has room for its record (always, without one, S-J4).
    pub(crate) journal_room: bool,
    /// Where the buffer's room is reserved (S-A1, S-B5).
    pub(crate) admission: &'a Admission,
    /// The item's clamped weight.
    pub(crate) weight: u64,
    /// The engine and the tenant, for a `tenant_capacity` (S-B7); `None`
    /// where the quota is not checked (the request path's hand-off).
    pub(crate) quota: Option<(&'a Engine<K, I>, &'a K)>,
}

impl<'a, K, I> Facts<'a, K, I> {
    /// The facts of the request path (S-W19): `fenced` and `encoded` as
    /// read, the journal's room until told otherwise, the buffer's room
    /// reserved in `admission` for `weight` bytes, no quota.
    pub(crate) fn new(admission: &'a Admission, fenced: bool, encoded: bool, weight: u64) -> Self {
        Facts {
            table_only: admission.table_only(),
            fenced,
            encoded,
            journal_room: true,
            admission,
            weight,
            quota: None,
        }
    }
}

impl<K: Ord + Hash + Clone, I> Checks for Facts<'_, K, I> {
    fn table_only(&mut self) -> bool {
        self.table_only
    }

    fn fenced(&mut self) -> bool {
        self.fenced
    }

    fn encoded(&mut self) -> bool {
        self.encoded
    }

    fn journal_room(&mut self) -> bool {
        self.journal_room
    }

    fn buffer_room(&mut self) -> bool {
        self.admission.reserve(self.weight).is_ok()
    }

    // Inlined: on the request path the quota is `None` and this folds
    // away (a call here cost every stage 13 instructions).
    #[inline]
    fn tenant_room(&mut self) -> bool {
        self.quota
            .is_none_or(|(e, tenant)| e.tenant_has_room(tenant))
    }

    fn unreserve(&mut self) {
        self.admission.release(1, self.weight);
    }
}

impl Stager {
    /// A stager for `engine` (fresh, or with recovered items pending).
    pub fn new<K: Ord + Hash + Clone, I>(engine: &Engine<K, I>) -> Self {
        let admission = Admission::new(engine.config());
        let held = (engine.pending(), engine.pending_bytes());
        admission.add(held.0, held.1);
        Stager { admission, held }
    }

    /// Stages `item` for `tenant` at `now` as `Outbox::stage` does (a
    /// refusal is counted, [`OnRefusal::Count`]); `wake` says whether the
    /// driver would drain. `now` is read only where the driver reads its
    /// clock: for the stamp, when the engine reads it (a linger or a
    /// `max_item_age`).
    pub fn stage<K: Ord + Hash + Clone, I>(
        &mut self,
        engine: &mut Engine<K, I>,
        now: Time,
        tenant: K,
        item: I,
    ) -> LazyStaged {
        // What settled since the last stage gives its room back, as after
        // every input of the driver.
        self.admission
            .follow(&mut self.held, engine.pending(), engine.pending_bytes());
        let handoff = self.decided(engine, now, tenant, item);
        let verdict = handoff.refusal.map_or(Ok(()), Err);
        let intake = self.take_in(engine, [handoff]);
        let staged = match verdict {
            Err(refusal) => refusal.staged(),
            Ok(()) if intake.accepted > 0 => Staged::Accepted,
            Ok(()) => Staged::ShuttingDown,
        };
        LazyStaged {
            staged,
            wake: intake.wake,
        }
    }

    /// `item` decided at `now` as the driver's request path decides it
    /// (S-W21), on its way to the engine's intake: the weight travels only
    /// when something reads it before the intake, the stamp only when the
    /// engine reads it (S-W19).
    fn decided<K: Ord + Hash + Clone, I>(
        &self,
        engine: &Engine<K, I>,
        now: Time,
        tenant: K,
        item: I,
    ) -> Handoff<K, I> {
        let config = engine.config();
        let stamps = !config.linger().is_zero() || config.max_item_age().is_some();
        let full = stamps || config.capacity_bytes().is_some();
        let weight = engine.weigh_item(&item);
        let verdict = decide(&mut Facts {
            table_only: self.admission.table_only(),
            fenced: engine.is_shutting_down(),
            encoded: true,
            journal_room: true,
            admission: &self.admission,
            weight,
            quota: Some((engine, &tenant)),
        });
        Handoff {
            tenant,
            item,
            weight: full.then_some(weight),
            at: stamps.then_some(now),
            refusal: verdict.err(),
        }
    }

    /// Hands `chunk` to the engine's intake and keeps the reservations in
    /// step with what it took in.
    fn take_in<K: Ord + Hash + Clone, I>(
        &mut self,
        engine: &mut Engine<K, I>,
        chunk: impl IntoIterator<Item = Handoff<K, I>>,
    ) -> Intake {
        self.admission.intake(engine, &mut self.held, chunk)
    }

    /// Stages `items` at `now` as the driver does when they reach the
    /// writer together: each is decided on its own (a refusal is counted),
    /// and all go to the engine's intake as one chunk, in order (S-W19,
    /// S-C10). Returns each item's verdict, in order, and whether the
    /// driver would drain. With a `tenant_capacity`, or past the fence,
    /// each goes through [`stage`](Self::stage) in turn, as the driver
    /// decides those under the engine's lock.
    pub fn stage_chunk<K: Ord + Hash + Clone, I>(
        &mut self,
        engine: &mut Engine<K, I>,
        now: Time,
        items: Vec<(K, I)>,
    ) -> (Vec<Staged>, bool) {
        let config = engine.config();
        if config.tenant_capacity().is_some() || engine.is_shutting_down() {
            let mut wake = false;
            let verdicts = items
                .into_iter()
                .map(|(tenant, item)| {
                    let staged = self.stage(engine, now, tenant, item);
                    wake |= staged.wake;
                    staged.staged
                })
                .collect();
            return (verdicts, wake);
        }
        self.admission
            .follow(&mut self.held, engine.pending(), engine.pending_bytes());
        let mut verdicts = Vec::with_capacity(items.len());
        let mut chunk = Vec::with_capacity(items.len());
        for (tenant, item) in items {
            let handoff = self.decided(engine, now, tenant, item);
            verdicts.push(handoff.refusal.map_or(Staged::Accepted, Refusal::staged));
            chunk.push(handoff);
        }
        let intake = self.take_in(engine, chunk);
        (verdicts, intake.wake)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Facts that refuse for the reasons set, and record what was asked.
    #[derive(Default)]
    struct Set {
        refuse: Vec<Refusal>,
        asked: Vec<Refusal>,
        unreserved: bool,
    }

    impl Set {
        fn room(&mut self, r: Refusal) -> bool {
            self.asked.push(r);
            !self.refuse.contains(&r)
        }
    }

    impl Checks for Set {
        fn fenced(&mut self) -> bool {
            !self.room(Refusal::ShuttingDown)
        }
        fn encoded(&mut self) -> bool {
            self.room(Refusal::EncodeFailed)
        }
        fn journal_room(&mut self) -> bool {
            self.room(Refusal::JournalFull)
        }
        fn buffer_room(&mut self) -> bool {
            self.room(Refusal::BufferFull)
        }
        fn tenant_room(&mut self) -> bool {
            self.room(Refusal::TenantFull)
        }
        fn unreserve(&mut self) {
            self.unreserved = true;
        }
    }

    /// Every refusal, in S-W21's order.
    const ALL: [Refusal; 6] = [
        Refusal::TableOnly,
        Refusal::ShuttingDown,
        Refusal::EncodeFailed,
        Refusal::JournalFull,
        Refusal::BufferFull,
        Refusal::TenantFull,
    ];

    #[test]
    fn each_refusal_is_counted_under_its_own_name_and_reads_back_from_it() {
        // The drop counter and the refusal name each other both ways; the
        // fence's is a loss, `shutdown` (S-W9, S-W21).
        for r in ALL {
            assert_eq!(
                r.drop_reason().and_then(Refusal::of_drop),
                r.drop_reason().map(|_| r)
            );
            let name = r.drop_reason().map_or("shutdown", DropReason::as_str);
            assert_eq!(r.as_str(), name, "{r:?}");
        }
        let names: Vec<_> = ALL.iter().map(|r| r.as_str()).collect();
        let expected = [
            "table_only",
            "shutdown",
            "encode_failed",
            "journal_full",
            "buffer_full",
            "tenant_full",
        ];
        assert_eq!(names, expected);
        assert_eq!(
            Refusal::of_drop(DropReason::SinkError),
            None,
            "not a stage's refusal"
        );
    }

    /// A path that can refuse only at the fence: every other check keeps
    /// its default.
    struct FenceOnly(bool);

    impl Checks for FenceOnly {
        fn fenced(&mut self) -> bool {
            self.0
        }
    }

    #[test]
    fn a_path_that_cannot_refuse_for_a_reason_finds_room_for_it() {
        // The defaults of `Checks` are room (and no table-only outbox):
        // only the fence refuses here.
        assert_eq!(decide(&mut FenceOnly(false)), Ok(()));
        assert_eq!(decide(&mut FenceOnly(true)), Err(Refusal::ShuttingDown));
    }

    #[test]
    fn s_w21_the_fence_outranks_every_refusal_and_later_checks_are_not_asked() {
        use Refusal::*;
        let order = [
            ShuttingDown,
            EncodeFailed,
            JournalFull,
            BufferFull,
            TenantFull,
        ];
        for (i, first) in order.iter().enumerate() {
            // Everything from `first` on refuses: `first` is the answer.
            let mut set = Set {
                refuse: order[i..].to_vec(),
                ..Set::default()
            };
            assert_eq!(decide(&mut set), Err(*first));
            assert_eq!(set.asked, order[..=i], "asked in order, then stopped");
            assert_eq!(set.unreserved, *first == TenantFull);
            // A refusal counted after the fence went up is the fence's.
            assert_eq!(recheck(Err(*first), true), Err(ShuttingDown));
            assert_eq!(recheck(Err(*first), false), Err(*first));
        }
        assert_eq!(decide(&mut Set::default()), Ok(()));
        assert_eq!(recheck(Ok(()), true), Err(ShuttingDown));
    }

    #[test]
    fn capacity_refuses_the_item_past_it_and_release_makes_room() {
        let a = Admission::new(&Config::builder().capacity(2).build().unwrap());
        assert_eq!(a.reserve(0), Ok(()));
        assert_eq!(a.reserve(0), Ok(()));
        assert_eq!(a.reserve(0), Err(DropReason::BufferFull));
        a.release(1, 0);
        assert_eq!(a.reserve(0), Ok(()));
        assert_eq!(a.items(), 2);
    }

    #[test]
    fn capacity_bytes_refuses_what_would_exceed_it_and_keeps_no_item() {
        // A byte limit needs a weigher in `build`; the admission only
        // needs the numbers.
        let config = Config {
            capacity: Some(10),
            capacity_bytes: Some(100),
            ..Config::default()
        };
        let a = Admission::new(&config);
        assert_eq!(a.reserve(60), Ok(()));
        assert_eq!(a.reserve(41), Err(DropReason::BufferFull));
        assert_eq!(a.items(), 1, "the refused item's slot is given back");
        assert_eq!(a.reserve(40), Ok(()));
        a.release(2, 100);
        assert_eq!(a.items(), 0);
    }

    #[test]
    fn unbounded_counts_nothing() {
        let a = Admission::new(&Config::default());
        assert!(!a.is_bounded());
        for _ in 0..10 {
            assert_eq!(a.reserve(u64::MAX), Ok(()));
        }
        a.add(3, 3);
        assert_eq!(a.items(), 0);
    }
    #[test]
    fn a_table_only_outbox_refuses_every_stage_first() {
        // S-T32: the admission carries the setting and a path's facts read
        // it from there, ahead of every other refusal (S-W21).
        let config = Config {
            table_only: true,
            ..Config::default()
        };
        let a = Admission::new(&config);
        assert!(a.table_only());
        assert!(!Admission::new(&Config::default()).table_only());
        let mut facts = Facts::<u64, u64>::new(&a, true, false, 0);
        assert_eq!(decide(&mut facts), Err(Refusal::TableOnly));
        let engine = Engine::<u64, u64>::new(Config::default()).unwrap();
        let stager = Stager {
            admission: a,
            held: (0, 0),
        };
        let h = stager.decided(&engine, Time::ZERO, 1, 1);
        assert_eq!(h.refusal, Some(Refusal::TableOnly), "the test kit's path");
        // The engine's own stage reads it from its config.
        let mut engine = Engine::<u64, u64>::new(config).unwrap();
        let staged = engine.stage(Time::ZERO, 1, 1);
        assert_eq!(
            staged,
            Staged::Dropped(DropReason::TableOnly),
            "the engine's path"
        );
        assert_eq!(engine.counters().dropped(DropReason::TableOnly), 1);
        assert_eq!(engine.pending(), 0);
    }

    #[test]
    fn what_is_added_is_held_against_the_capacity() {
        // A recovery's items are pending at build (D4): added, they take
        // their room.
        let a = Admission::new(&Config::builder().capacity(3).build().unwrap());
        a.add(2, 0);
        assert_eq!(a.items(), 2);
        assert_eq!(a.reserve(0), Ok(()));
        assert_eq!(a.reserve(0), Err(DropReason::BufferFull));
    }

    /// A journal with room for every record, appending nothing.
    struct Roomy;

    impl Append<u64> for Roomy {
        fn append_if<R>(&mut self, _: usize, decide: impl FnOnce(bool) -> (Option<u64>, R)) -> R {
            decide(true).1
        }
    }

    #[test]
    fn a_commit_asks_for_a_drain_for_a_counted_refusal_and_for_an_accepted_item_alone() {
        // The request path's refusal counted under the lock is an event
        // the writer drains (S-W21): the commit asks for a drain, also
        // when the intake asks for one too.
        let mut engine = Engine::<u64, u64>::new(Config::default()).unwrap();
        let a = Admission::new(engine.config());
        let mut held = (0, 0);
        let refused = Prepared {
            refused: Some(Refusal::BufferFull),
            ..Prepared::new(1, 10, 0, None)
        };
        let how = Commit {
            at: None,
            on: OnRefusal::Count,
            quota: false,
        };
        let mut answers = Vec::new();
        let wake = a.commit(
            (&mut engine, &mut held),
            None::<&mut Roomy>,
            how,
            [refused, Prepared::new(2, 20, 0, None)],
            &mut |v| answers.push(v.map_err(|(r, _)| r)),
        );
        assert!(wake);
        // An accepted item alone: the intake's drain is the commit's.
        let mut alone = Engine::<u64, u64>::new(Config::default()).unwrap();
        let mut held_alone = (0, 0);
        let wake_alone = a.commit(
            (&mut alone, &mut held_alone),
            None::<&mut Roomy>,
            how,
            [Prepared::new(3, 30, 0, None)],
            &mut |v| assert!(v.is_ok()),
        );
        assert!(wake_alone, "a tenant's first item asks for a drain");
        let staged = Refusal::BufferFull.staged();
        assert_eq!(answers, [Ok(staged), Ok(Staged::Accepted)]);
        assert_eq!(engine.counters().dropped(DropReason::BufferFull), 1);
        assert_eq!((engine.pending(), held.0), (1, 1));
    }

    #[test]
    fn the_test_kits_hand_offs_carry_the_stamp_and_the_weight_as_the_drivers_do() {
        // S-W19: the stamp when the engine reads it (a linger or an age
        // limit), the weight when bytes are reserved on the request path.
        let now = Time::from_millis(7);
        let ms = std::time::Duration::from_millis(5);
        let cases = [
            (Config::default(), false, false),
            (
                Config {
                    linger: ms,
                    ..Config::default()
                },
                true,
                true,
            ),
            (
                Config {
                    max_item_age: Some(ms),
                    ..Config::default()
                },
                true,
                true,
            ),
            (
                Config {
                    capacity_bytes: Some(100),
                    ..Config::default()
                },
                false,
                true,
            ),
        ];
        for (config, stamped, weighed) in cases {
            let engine = Engine::<u64, u64>::with_weigher(config, |_| 3).unwrap();
            let stager = Stager::new(&engine);
            let h = stager.decided(&engine, now, 1, 1);
            assert_eq!(h.at, stamped.then_some(now), "{:?}", engine.config());
            assert_eq!(h.weight, weighed.then_some(3), "{:?}", engine.config());
            assert_eq!(h.refusal, None);
        }
    }

    #[test]
    fn a_chunk_with_a_tenant_quota_sees_each_item_the_one_before_took_in() {
        // S-B7: with a `tenant_capacity`, each item of a chunk is decided
        // against the engine's count after the item before it.
        let config = Config::builder().tenant_capacity(2).build().unwrap();
        let mut engine = Engine::<u64, u64>::new(config).unwrap();
        let mut stager = Stager::new(&engine);
        let items = (0..4).map(|i| (1, i)).collect();
        let (verdicts, wake) = stager.stage_chunk(&mut engine, Time::ZERO, items);
        let full = Refusal::TenantFull.staged();
        assert_eq!(verdicts, [Staged::Accepted, Staged::Accepted, full, full]);
        assert_eq!(engine.pending(), 2);
        assert!(wake, "a tenant's first item asks for a drain");
    }

    #[test]
    fn a_chunk_gets_back_the_room_of_what_settled_since_the_last_stage() {
        // The reservations follow the engine before a chunk, as after
        // every input of the driver: two written items give their room
        // back to the next two.
        let config = Config::builder().capacity(2).build().unwrap();
        let mut engine = Engine::<u64, u64>::new(config).unwrap();
        let mut stager = Stager::new(&engine);
        let now = Time::ZERO;
        let (first, _) = stager.stage_chunk(&mut engine, now, vec![(1, 1), (1, 2)]);
        assert_eq!(first, [Staged::Accepted, Staged::Accepted]);
        let write = engine.poll_write(now).expect("a write");
        engine
            .finish(now, write, crate::core::Outcome::WRITTEN)
            .unwrap();
        assert_eq!(engine.pending(), 0);
        let (next, _) = stager.stage_chunk(&mut engine, now, vec![(1, 3), (1, 4)]);
        assert_eq!(next, [Staged::Accepted, Staged::Accepted]);
    }
}
