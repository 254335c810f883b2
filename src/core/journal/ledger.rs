//! The ledger (S-J1..S-J4, D6): which sequence number each journaled item
//! has, which segment holds it, which items are done, which segments can
//! be deleted. The [`Machine`](super::Machine) keeps one and asks it.
//!
//! - Every item accepted while the journal runs gets a **sequence number**
//!   ([`Seq`], from 1, increasing in staging order across all tenants) and
//!   is appended to the **current segment**. A segment covers a contiguous
//!   range of sequence numbers: from its `first` to the next segment's
//!   `first`. The ledger rolls to a new segment once the current one holds
//!   `segment_bytes` (S-J1).
//! - An item is **done** once it is written, lost or dropped: the machine
//!   reports that with [`Ledger::mark_done`] (the tenant's oldest `n`,
//!   since a tenant's items leave the engine in staging order, S-W3). Done
//!   items are handed out as **done marks** ([`Ledger::take_marks`]) to be
//!   appended to the current segment. A mark is lazy: lost in a crash, it
//!   means the item is staged again and written twice, which the sink's
//!   idempotency absorbs (S-J3).
//! - A segment is **deletable** when it is not the current one, all its
//!   items are done, and every segment whose items it marks done is gone:
//!   deleting it never forgets a mark still needed (S-J2, D6).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::Hash;

use crate::core::shrink;

/// An item's sequence number in the journal: from 1, in staging order
/// across all tenants. 0 is never a sequence number.
pub type Seq = u64;

/// A segment's number: from 1, one more for each new segment.
pub type SegmentId = u64;

/// Where a pending item of a tenant stands in the journal: journaled
/// under a sequence number, or accepted while the journal was down and in
/// memory only (S-J5). One word (0 is never a sequence number, so it
/// stands for the latter): a stage pushes one per item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry(Seq);

impl Entry {
    const UNJOURNALED: Entry = Entry(0);

    /// Journaled under `seq` (at least 1).
    fn at(seq: Seq) -> Self {
        debug_assert!(seq > 0, "0 is never a sequence number");
        Entry(seq)
    }

    /// Its sequence number, if journaled.
    fn seq(self) -> Option<Seq> {
        (self.0 > 0).then_some(self.0)
    }
}

/// The pending entries of each tenant. A hash map (foldhash with a fixed
/// seed, like the engine's tenant map): a stage looks its tenant up once,
/// and nothing decides anything by iterating it (S-C1).
type PerTenant<K> = HashMap<K, VecDeque<Entry>, foldhash::fast::FixedState>;

/// One segment's bookkeeping.
#[derive(Clone, Debug, Default)]
struct Segment {
    /// The first sequence number it holds (or would hold).
    first: Seq,
    /// Items it holds that are not done.
    live: u64,
    /// Bytes appended to it (header included).
    bytes: u64,
    /// Other existing segments whose items it holds done marks for: it is
    /// kept while any of them is (S-J2).
    marks_for: BTreeSet<SegmentId>,
    /// Segments holding done marks for its items.
    marked_by: BTreeSet<SegmentId>,
    /// Its seal record is counted in `bytes` (a resume may write it again
    /// after a failed commit: counted once, S-J10).
    sealed: bool,
}

/// What the driver must do with one appended item record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Append {
    /// The item's sequence number.
    pub seq: Seq,
    /// Start this new segment first (seal the current one): its id, and its
    /// first sequence number is `seq`.
    pub roll: Option<SegmentId>,
}

/// The sizes of done records, for [`Ledger::take_mark_runs`]: a record of
/// `n` marks takes `record + n * mark` bytes and holds at most `per_record`
/// marks; a new segment starts with `header` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MarkSizes {
    /// A segment header's bytes.
    pub header: u64,
    /// A done record's framing bytes.
    pub record: u64,
    /// One mark's bytes (at least 1).
    pub mark: u64,
    /// Marks in one record at most (at least 1).
    pub per_record: usize,
}

/// One done record to append: to a new segment `roll` (seal the current
/// one first) if set, else to the current segment (S-J2, D6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkRun {
    /// Start this new segment first; its first sequence number is
    /// [`Ledger::next_seq`].
    pub roll: Option<SegmentId>,
    /// The marks, in sequence order.
    pub seqs: Vec<Seq>,
}

/// [`Ledger::append`] refused an item: `max_bytes` would be exceeded
/// (S-J4), so the item is dropped at stage (the staging pipeline names it
/// [`Refusal::JournalFull`](crate::core::Refusal::JournalFull)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoRoom;

/// What the ledger counts and reserves under `max_bytes` besides item
/// records (S-J10): every byte of the segment files is counted, and an
/// item is admitted only if the writes that will free it (its done mark,
/// the seals and headers of the rolls marks may need) still fit after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Costs {
    /// A seal record's bytes: counted when a segment is sealed.
    pub seal: u64,
    /// Bytes reserved for each journaled item not yet marked done: its
    /// done mark in a record of its own (the worst case), and its share of
    /// the rolls that marks filling segments need.
    pub per_item: u64,
    /// Bytes reserved at all times: the current segment's seal and two
    /// rolls (a header and a seal each) for marks, a resume or the closing
    /// roll.
    pub fixed: u64,
    /// Bytes reserved at all times for the records that count a lone
    /// suspect's crashes ([`Sizes::lone_reserve`](super::Sizes::lone_reserve),
    /// S-J17): items and the other records of the journal's lives are
    /// refused before they touch it.
    pub lone: u64,
    /// One roll's bytes (a header and a seal): the records that count a
    /// lone suspect may also take the roll of `fixed` kept for a resume,
    /// whose segment S-J10 lets pass the bound during an incident anyway.
    pub roll: u64,
}

impl Costs {
    /// The costs of segments of `segment_bytes` with records of `sizes`.
    pub fn new(sizes: &super::batch::Sizes, segment_bytes: u64) -> Self {
        let mark = sizes.done + sizes.mark;
        let roll = sizes.header + sizes.seal;
        // A segment a mark run rolls to takes marks until less than one
        // mark's record is left: at least this many marks' bytes.
        let room = segment_bytes.saturating_sub(roll + mark).max(1);
        Costs {
            seal: sizes.seal,
            per_item: mark + (roll * mark).div_ceil(room),
            fixed: sizes.seal + 2 * roll,
            lone: sizes.lone_reserve(),
            roll,
        }
    }
}

/// The journal's sizes (S-J1, S-J4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes after which a new segment is started (at least 1).
    pub segment_bytes: u64,
    /// Bytes the journal may hold on disk in all segments; `None` = no
    /// bound.
    pub max_bytes: Option<u64>,
}

/// The default segment size without `max_bytes`: 16 MiB.
pub const DEFAULT_SEGMENT_BYTES: u64 = 16 << 20;
/// The smallest segment size: 128 bytes (smaller values are raised to it).
pub const MIN_SEGMENT_BYTES: u64 = 128;
/// The smallest `max_bytes`: 512 bytes (room for a few segments of the
/// smallest size).
pub const MIN_MAX_BYTES: u64 = 512;

/// Sizes that contradict each other (S-J10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bounds {
    /// `segment_bytes` above half of `max_bytes`: the current segment is
    /// never deleted, so such a journal would stall at its bound.
    SegmentAboveHalf {
        /// The segment size asked for.
        segment_bytes: u64,
        /// The bound.
        max_bytes: u64,
        /// The largest `segment_bytes` this bound accepts: half of what
        /// it leaves beside the reserve.
        largest: u64,
    },
    /// `max_bytes` below [`MIN_MAX_BYTES`], or leaving less than two
    /// segments of [`MIN_SEGMENT_BYTES`] beside the reserve.
    MaxTooSmall {
        /// The bound asked for.
        max_bytes: u64,
        /// The smallest `max_bytes` accepted with this reserve and the
        /// segment size asked for (the smallest one when none was).
        smallest: u64,
    },
}

impl Limits {
    /// The limits of a configuration (S-J10): with `max_bytes` and no
    /// `segment_bytes`, segments of a quarter of `max_bytes`, at most
    /// [`DEFAULT_SEGMENT_BYTES`]; an explicit `segment_bytes` (raised to
    /// [`MIN_SEGMENT_BYTES`]) at most half of `max_bytes`.
    ///
    /// # Errors
    /// [`Bounds`] when the sizes contradict each other.
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    pub fn new(segment_bytes: Option<u64>, max_bytes: Option<u64>) -> Result<Limits, Bounds> {
        Limits::reserving(segment_bytes, max_bytes, 0)
    }

    /// Like [`new`](Self::new), with `reserved` bytes of `max_bytes` kept
    /// free at all times ([`Sizes::standing`](super::Sizes::standing)): the
    /// halves and quarters are of what is left beside them (S-J10).
    ///
    /// # Errors
    /// [`Bounds`] when the sizes contradict each other, or leave less than
    /// two segments of [`MIN_SEGMENT_BYTES`] beside `reserved`.
    pub fn reserving(
        segment_bytes: Option<u64>,
        max_bytes: Option<u64>,
        reserved: u64,
    ) -> Result<Limits, Bounds> {
        let segment = segment_bytes.map(|s| s.max(MIN_SEGMENT_BYTES));
        let Some(max) = max_bytes else {
            return Ok(Limits {
                segment_bytes: segment.unwrap_or(DEFAULT_SEGMENT_BYTES),
                max_bytes: None,
            });
        };
        let room = max.saturating_sub(reserved);
        // `room / 2 >= s` exactly when `max` is at least `reserved + 2 * s`:
        // the floor with the smallest segment, and the bound named to the
        // caller with the segment asked for, so that the advice holds.
        let fits_two = |s: u64| MIN_MAX_BYTES.max(reserved.saturating_add(s.saturating_mul(2)));
        if max < fits_two(MIN_SEGMENT_BYTES) {
            return Err(Bounds::MaxTooSmall {
                max_bytes: max,
                smallest: fits_two(segment.unwrap_or(MIN_SEGMENT_BYTES)),
            });
        }
        let segment_bytes = match segment {
            Some(s) if s > room / 2 => {
                return Err(Bounds::SegmentAboveHalf {
                    segment_bytes: s,
                    max_bytes: max,
                    largest: room / 2,
                })
            }
            Some(s) => s,
            None => (max / 4)
                .min(room / 2)
                .clamp(MIN_SEGMENT_BYTES, DEFAULT_SEGMENT_BYTES),
        };
        Ok(Limits {
            segment_bytes,
            max_bytes: Some(max),
        })
    }
}

/// The journal's bookkeeping: sequence numbers, segments, done marks,
/// deletions. Generic over the tenant key `K`.
///
/// Inputs: [`append`](Self::append) (an accepted item),
/// [`unjournaled`](Self::unjournaled) (an item accepted while the journal
/// is down), [`mark_done`](Self::mark_done) (a tenant's oldest items are done),
/// [`add_bytes`](Self::add_bytes) (marks or seals appended). Outputs:
/// [`take_marks`](Self::take_marks), [`poll_delete`](Self::poll_delete).
/// Every operation costs O(log S) per item for S segments, plus one
/// lookup of its tenant in a hash map, except `take_marks` (linear in the
/// marks taken).
#[derive(Debug)]
pub struct Ledger<K> {
    limits: Limits,
    next_seq: Seq,
    current: SegmentId,
    segments: BTreeMap<SegmentId, Segment>,
    /// (`first` sequence number, segment), to find a sequence's segment.
    /// Empty segments share their `first` with the next one: the later
    /// one is the one that holds items.
    by_first: BTreeSet<(Seq, SegmentId)>,
    tenants: PerTenant<K>,
    /// Tenants whose queues [`mark_done`](Self::mark_done) emptied, forgotten at the next
    /// `take_marks` unless they staged again.
    emptied: Vec<K>,
    marks: Vec<Seq>,
    deletable: BTreeSet<SegmentId>,
    /// Bytes of every existing segment.
    bytes: u64,
    /// Journaled items not yet done, in all segments.
    live: u64,
    costs: Costs,
    /// Pending items that are on no disk: accepted while the journal was
    /// down, or journaled in a commit that failed (S-J5).
    undurable: u64,
    /// Per tenant, its oldest pending items with attempt marks in this
    /// life (S-J17). Empty without attempts.
    attempted: HashMap<K, Marked, foldhash::fast::FixedState>,
    /// Attempt marks waiting for the next commit.
    attempts: Vec<Seq>,
    /// Attempt-end marks waiting for the next commit.
    ends: Vec<Seq>,
    /// Segments holding the records of the lives a recovery counted
    /// crashes from (S-J17): kept until this life's life record carries
    /// the counts on, even with nothing else in them.
    held: BTreeSet<SegmentId>,
    /// Restored segments with no pending item kept only for their done
    /// marks of other segments, with those marks: a recovery may write
    /// the marks again and let the segment go (S-J17).
    foldable: BTreeMap<SegmentId, Vec<Seq>>,
}

/// A tenant's oldest pending items marked in this life (S-J17): a
/// tenant's slice is always its oldest items, so both are prefixes.
#[derive(Clone, Copy, Debug, Default)]
struct Marked {
    /// Items with an attempt mark in this life.
    marked: u64,
    /// Of those, the ones whose attempt started and has not come back
    /// failed since (no end mark after their attempt mark).
    open: u64,
}

impl<K: Ord + Hash + Clone> Ledger<K> {
    /// A ledger whose next item gets sequence number `next_seq` (at least
    /// 1) in the new segment `segment` of `header_bytes` bytes.
    pub fn new(limits: Limits, next_seq: Seq, segment: SegmentId, header_bytes: u64) -> Self {
        let limits = Limits {
            segment_bytes: limits.segment_bytes.max(1),
            ..limits
        };
        let next_seq = next_seq.max(1);
        let mut ledger = Ledger {
            limits,
            next_seq,
            current: segment,
            segments: BTreeMap::new(),
            by_first: BTreeSet::new(),
            tenants: PerTenant::default(),
            emptied: Vec::new(),
            marks: Vec::new(),
            deletable: BTreeSet::new(),
            bytes: 0,
            live: 0,
            costs: Costs::default(),
            undurable: 0,
            attempted: HashMap::default(),
            attempts: Vec::new(),
            ends: Vec::new(),
            held: BTreeSet::new(),
            foldable: BTreeMap::new(),
        };
        ledger.open_segment(segment, next_seq, header_bytes);
        ledger
    }

    /// Counts seals and reserves room for marks with `costs` (S-J10); the
    /// default counts item records and headers only.
    pub fn with_costs(mut self, costs: Costs) -> Self {
        self.costs = costs;
        self
    }

    /// The limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The current segment: where new records go.
    pub fn current(&self) -> SegmentId {
        self.current
    }

    /// Pending items with a record in the current segment.
    pub fn current_live(&self) -> u64 {
        self.segments.get(&self.current).map_or(0, |s| s.live)
    }

    /// The sequence number the next item gets; every item staged so far
    /// has a smaller one.
    pub fn next_seq(&self) -> Seq {
        self.next_seq
    }

    /// Segments that exist (not yet deleted), the current one included.
    pub fn segments(&self) -> usize {
        self.segments.len()
    }

    /// Bytes in every existing segment (D6).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Journaled items not yet done, in all segments.
    pub fn live(&self) -> u64 {
        self.live
    }

    /// Bytes reserved for the writes that free the items journaled so far
    /// and `more` more (S-J10).
    fn reserved(&self, more: u64) -> u64 {
        self.costs.fixed + self.costs.lone + (self.live + more) * self.costs.per_item
    }

    /// Takes an accepted item of `tenant` whose record takes `record_bytes`
    /// bytes: its sequence number, and whether to roll to a new segment of
    /// `header_bytes` first (S-J1).
    ///
    /// # Errors
    /// [`NoRoom`] when `max_bytes` would be exceeded (S-J4); nothing
    /// is recorded then.
    pub fn append(
        &mut self,
        tenant: K,
        record_bytes: u64,
        header_bytes: u64,
    ) -> Result<Append, NoRoom> {
        if !self.fits(record_bytes, header_bytes, 0) {
            return Err(NoRoom);
        }
        let (roll, _) = self.cost(record_bytes, header_bytes);
        let seq = self.next_seq;
        self.next_seq += 1;
        let roll = roll.then(|| {
            let id = self.current + 1;
            self.seal_current();
            self.open_segment(id, seq, header_bytes);
            id
        });
        let seg = self
            .segments
            .get_mut(&self.current)
            .expect("current exists");
        seg.live += 1;
        seg.bytes += record_bytes;
        self.bytes += record_bytes;
        self.live += 1;
        self.tenants
            .entry(tenant)
            .or_default()
            .push_back(Entry::at(seq));
        Ok(Append { seq, roll })
    }

    /// Takes an item of `tenant` accepted while the journal is down: it
    /// has no record, only a place in the tenant's order (S-J5).
    pub fn unjournaled(&mut self, tenant: K) {
        self.undurable += 1;
        self.tenants
            .entry(tenant)
            .or_default()
            .push_back(Entry::UNJOURNALED);
    }

    /// Pending items on no disk (S-J5): a sync barrier cannot answer that
    /// everything before it is durable while this is above 0.
    pub fn undurable(&self) -> u64 {
        self.undurable
    }

    /// Whether `max_bytes` leaves room for a record of `record_bytes`
    /// (and a new segment's header of `header_bytes` and the old one's
    /// seal, should it roll), with the room its done mark and every other
    /// pending write needs still reserved, `outside` bytes more counted
    /// (S-J4, S-J10).
    pub fn fits(&self, record_bytes: u64, header_bytes: u64, outside: u64) -> bool {
        let Some(max) = self.limits.max_bytes else {
            return true;
        };
        let (_, extra) = self.cost(record_bytes, header_bytes);
        self.bytes
            .saturating_add(extra)
            .saturating_add(self.reserved(1))
            .saturating_add(outside)
            <= max
    }

    /// Whether appending a record of `record_bytes` rolls to a new segment,
    /// and the bytes it adds.
    fn cost(&self, record_bytes: u64, header_bytes: u64) -> (bool, u64) {
        let cur = self.segments.get(&self.current).map_or(0, |s| s.bytes);
        let roll =
            cur > header_bytes && cur.saturating_add(record_bytes) > self.limits.segment_bytes;
        let roll_cost = if roll {
            header_bytes + self.costs.seal
        } else {
            0
        };
        (roll, record_bytes + roll_cost)
    }

    /// A commit failed: every pending item with a sequence number from
    /// `synced` on is on no disk now (S-J5). They stay in their tenants'
    /// order as unjournaled items and stop holding their segments. Returns
    /// how many. Costs O(pending items); runs once per incident.
    pub fn incident(&mut self, synced: Seq) -> u64 {
        let mut moved = Vec::new();
        for queue in self.tenants.values_mut() {
            for entry in queue.iter_mut() {
                if let Some(seq) = entry.seq() {
                    if seq >= synced {
                        *entry = Entry::UNJOURNALED;
                        moved.push(seq);
                    }
                }
            }
        }
        // In sequence order, whatever the map's order.
        moved.sort_unstable();
        // Marks not yet written are for items on no disk now.
        self.attempts.clear();
        self.ends.clear();
        self.undurable += moved.len() as u64;
        for seq in &moved {
            if let Some(id) = self.segment_of(*seq) {
                if let Some(seg) = self.segments.get_mut(&id) {
                    if seg.live > 0 {
                        seg.live -= 1;
                        self.live -= 1;
                    }
                }
                self.check_deletable(id);
            }
        }
        moved.len() as u64
    }

    /// `n` bytes (done marks, a seal) were appended to the current segment.
    pub fn add_bytes(&mut self, n: u64) {
        if let Some(seg) = self.segments.get_mut(&self.current) {
            seg.bytes += n;
            self.bytes += n;
        }
    }

    /// The oldest `n` pending items of `tenant` are done (written, lost or
    /// dropped); their marks wait for [`take_marks`](Self::take_marks).
    /// Returns how many of them were journaled. Extra `n` beyond what the
    /// ledger tracks for the tenant is ignored (items staged before the
    /// journal existed).
    pub fn mark_done(&mut self, tenant: &K, n: u64) -> u64 {
        let Some(queue) = self.tenants.get_mut(tenant) else {
            return 0;
        };
        let take = usize::try_from(n).unwrap_or(usize::MAX).min(queue.len());
        let mut journaled = 0;
        for entry in queue.drain(..take) {
            match entry.seq() {
                Some(seq) => {
                    self.marks.push(seq);
                    journaled += 1;
                }
                None => self.undurable -= 1,
            }
        }
        if queue.is_empty() {
            // Kept until the next `take_marks`: a tenant staging again
            // before it finds its queue (no insertion, no allocation).
            self.emptied.push(tenant.clone());
        }
        if !self.attempted.is_empty() {
            if let Some(a) = self.attempted.get_mut(tenant) {
                a.marked = a.marked.saturating_sub(take as u64);
                a.open = a.open.saturating_sub(take as u64);
                if a.marked == 0 {
                    self.attempted.remove(tenant);
                }
            }
        }
        journaled
    }

    /// The attempt of `tenant`'s oldest `n` pending items starts (S-J17):
    /// the attempt marks of the journaled ones whose attempt is not open
    /// in this life (never marked, or come back failed since) wait for
    /// the next commit. Returns how many marks that adds (0 for items on
    /// no disk).
    pub fn mark_attempt(&mut self, tenant: &K, n: u64) -> u64 {
        let Some(queue) = self.tenants.get(tenant) else {
            return 0;
        };
        let n = usize::try_from(n).unwrap_or(usize::MAX).min(queue.len());
        let m = self.attempted.get(tenant).copied().unwrap_or_default();
        let from = usize::try_from(m.open).unwrap_or(usize::MAX);
        if n <= from {
            return 0;
        }
        let before = self.attempts.len();
        self.attempts
            .extend(queue.range(from..n).filter_map(|e| e.seq()));
        let marked = Marked {
            marked: m.marked.max(n as u64),
            open: n as u64,
        };
        self.attempted.insert(tenant.clone(), marked);
        (self.attempts.len() - before) as u64
    }

    /// The marks of `tenant`'s attempt in flight are to be taken anew
    /// (S-J17): a failed commit lost them, and a suspect's lone attempt
    /// starts only once they are on disk.
    pub fn reopen(&mut self, tenant: &K) {
        if let Some(m) = self.attempted.get_mut(tenant) {
            m.open = 0;
        }
    }

    /// The attempt of `tenant`'s oldest `n` pending items came back
    /// failed and waits for its retry (S-J17): the attempt-end marks of
    /// those whose attempt is open wait for the next commit. Returns how
    /// many marks that adds.
    pub fn mark_ended(&mut self, tenant: &K, n: u64) -> u64 {
        let Some(m) = self.attempted.get_mut(tenant) else {
            return 0;
        };
        let Some(queue) = self.tenants.get(tenant) else {
            return 0;
        };
        let open = usize::try_from(m.open).unwrap_or(usize::MAX);
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        let k = open.min(n).min(queue.len());
        // A tenant has one attempt in flight: its items are the open ones.
        m.open = 0;
        let before = self.ends.len();
        self.ends.extend(queue.range(..k).filter_map(|e| e.seq()));
        (self.ends.len() - before) as u64
    }

    /// Puts back the attempt mark of `seq`, taken and not written: it
    /// waits for the next commit (S-J17).
    pub fn defer_attempt(&mut self, seq: Seq) {
        self.attempts.push(seq);
    }

    /// Whether attempt marks wait for a commit.
    pub fn attempts_waiting(&self) -> bool {
        !self.attempts.is_empty()
    }

    /// Whether segments wait to be handed out for deletion.
    pub fn deletions_waiting(&self) -> bool {
        !self.deletable.is_empty()
    }

    /// The attempt marks waiting, in sequence order.
    pub fn take_attempts(&mut self) -> Vec<Seq> {
        let mut seqs = std::mem::take(&mut self.attempts);
        seqs.sort_unstable();
        seqs
    }

    /// The attempt-end marks waiting, in sequence order.
    pub fn take_ends(&mut self) -> Vec<Seq> {
        let mut seqs = std::mem::take(&mut self.ends);
        seqs.sort_unstable();
        seqs
    }

    /// Whether an item whose attempt mark is on disk in this life is still
    /// pending: only then does a clean close need saying (S-J17).
    pub fn has_attempted(&self) -> bool {
        !self.attempted.is_empty()
    }

    /// Whether a record of the journal's lives of `len` bytes fits under
    /// `max_bytes`, `outside` bytes more counted, with the writes that
    /// free the pending items still reserved, and the lone reserve too
    /// unless `lone` (S-J10, S-J17). Only the records that count a lone
    /// suspect's crashes (a life record trimmed to one count, one lone
    /// attempt mark, a clean close) pass `lone`; the others are written
    /// while room is left beside the reserve, so they never cost an item
    /// its admission nor a journal its progress.
    pub fn note_fits(&self, len: u64, outside: u64, lone: bool) -> bool {
        let Some(max) = self.limits.max_bytes else {
            return true;
        };
        let mut reserved = self.reserved(0);
        if lone {
            reserved -= self.costs.lone + self.costs.roll.min(self.costs.fixed);
        }
        self.bytes
            .saturating_add(len)
            .saturating_add(outside)
            .saturating_add(reserved)
            <= max
    }

    /// Every pending item of every tenant is done (a shutdown deadline,
    /// an abandon): returns how many were journaled.
    #[cfg(any(test, feature = "testkit"))]
    pub fn mark_all_done(&mut self) -> u64 {
        // In the map's order: `take_marks` sorts the marks.
        let tenants = std::mem::take(&mut self.tenants);
        self.undurable = 0;
        self.attempted.clear();
        let mut journaled = 0;
        for (_, queue) in tenants {
            for entry in queue {
                if let Some(seq) = entry.seq() {
                    self.marks.push(seq);
                    journaled += 1;
                }
            }
        }
        journaled
    }

    /// The done marks to append to the current segment now, in sequence
    /// order. Their items stop counting as live; the current segment
    /// remembers whose marks it holds (S-J2); segments left with no live
    /// item become deletable when nothing else holds them.
    #[cfg(any(test, feature = "testkit"))]
    pub fn take_marks(&mut self) -> Vec<Seq> {
        let marks = self.take_done();
        self.remark(&marks);
        marks
    }

    /// Like [`take_marks`](Self::take_marks), with the marks cut into done
    /// records that keep every segment within `segment_bytes` (D6): marks
    /// fill the current segment's room, then the ledger rolls to a new
    /// segment and goes on there. Without this, the marks of a batch of done items
    /// would grow the current segment past `segment_bytes` with nothing to
    /// roll it, since only an item's append rolls. A segment holding only
    /// its header takes at least one mark, so a tiny `segment_bytes` never
    /// rolls forever (S-J3, D6). The runs' bytes are counted here, from `sizes`: the
    /// caller appends each run's record (after the roll, if any) and does
    /// not call [`add_bytes`](Self::add_bytes) for it.
    pub fn take_mark_runs(&mut self, sizes: MarkSizes) -> Vec<MarkRun> {
        let marks = self.take_done();
        let mark = sizes.mark.max(1);
        let mut runs = Vec::new();
        let mut rest = &marks[..];
        while !rest.is_empty() {
            let cur = self.segments.get(&self.current).map_or(0, |s| s.bytes);
            let segment_bytes = self.limits.segment_bytes;
            let fit = |cur: u64| segment_bytes.saturating_sub(cur + sizes.record) / mark;
            let mut roll = None;
            let mut n = fit(cur);
            if n == 0 && cur > sizes.header {
                roll = Some(self.roll(sizes.header));
                n = fit(sizes.header);
            }
            let n = usize::try_from(n)
                .unwrap_or(usize::MAX)
                .clamp(1, sizes.per_record.max(1))
                .min(rest.len());
            let (seqs, tail) = rest.split_at(n);
            rest = tail;
            self.remark(seqs);
            self.add_bytes(sizes.record + mark * n as u64);
            runs.push(MarkRun {
                roll,
                seqs: seqs.to_vec(),
            });
        }
        runs
    }

    /// The done marks waiting, sorted; their items stop counting as live,
    /// and segments left with no live item become deletable when nothing
    /// else holds them. Not yet linked to the segment that will hold them.
    fn take_done(&mut self) -> Vec<Seq> {
        self.forget_emptied();
        let mut marks = std::mem::take(&mut self.marks);
        marks.sort_unstable();
        for &seq in &marks {
            let Some(id) = self.segment_of(seq) else {
                continue;
            };
            let seg = self.segments.get_mut(&id).expect("found above");
            if seg.live > 0 {
                seg.live -= 1;
                self.live -= 1;
            }
            self.check_deletable(id);
        }
        marks
    }

    /// Forgets the tenants whose queues [`mark_done`](Self::mark_done) emptied
    /// and that staged nothing since.
    fn forget_emptied(&mut self) {
        for tenant in self.emptied.drain(..) {
            if self.tenants.get(&tenant).is_some_and(VecDeque::is_empty) {
                self.tenants.remove(&tenant);
            }
        }
        shrink::map(&mut self.tenants);
        shrink::vec(&mut self.emptied);
    }

    /// Marks already taken are written into the current segment (their
    /// first copy, or again after a failed commit lost it): the current
    /// segment now holds marks for their segments (S-J2). Live counts are
    /// not touched.
    pub fn remark(&mut self, seqs: &[Seq]) {
        for &seq in seqs {
            if let Some(id) = self.segment_of(seq) {
                self.link_mark(id);
            }
        }
    }

    /// The current segment holds a done mark for an item of segment `id`:
    /// unless that is itself, it is kept while `id` is (S-J2).
    fn link_mark(&mut self, id: SegmentId) {
        let current = self.current;
        if id == current {
            return;
        }
        if let Some(seg) = self.segments.get_mut(&id) {
            seg.marked_by.insert(current);
            if let Some(cur) = self.segments.get_mut(&current) {
                cur.marks_for.insert(id);
            }
        }
    }

    /// Whether marks wait for [`take_marks`](Self::take_marks).
    pub fn has_marks(&self) -> bool {
        !self.marks.is_empty()
    }

    /// The next segment the driver may delete (after the records handed
    /// out before it are synced). Deleting it is final: the ledger forgets
    /// it now, which may make others deletable.
    #[cfg(any(test, feature = "testkit"))]
    pub fn poll_delete(&mut self) -> Option<SegmentId> {
        self.poll_delete_sized().map(|(id, _)| id)
    }

    /// Like [`poll_delete`](Self::poll_delete), with the segment's bytes,
    /// which stay on disk until the driver deleted its file.
    pub fn poll_delete_sized(&mut self) -> Option<(SegmentId, u64)> {
        let id = self.deletable.pop_first()?;
        let seg = self.segments.remove(&id)?;
        self.by_first.remove(&(seg.first, id));
        self.bytes -= seg.bytes;
        for other in &seg.marked_by {
            if let Some(o) = self.segments.get_mut(other) {
                o.marks_for.remove(&id);
            }
            self.check_deletable(*other);
        }
        for other in &seg.marks_for {
            if let Some(o) = self.segments.get_mut(other) {
                o.marked_by.remove(&id);
            }
        }
        Some((id, seg.bytes))
    }

    /// Forgets segment `id`, which a failed resume opened and a later
    /// resume replaces (S-J5): it holds no item, and the done marks it may
    /// hold are written again in the current segment, so it no longer
    /// keeps the segments it marks, and its bytes no longer count against
    /// `max_bytes`. The driver deletes its file once the replacement's
    /// marks are durable. Returns whether it was known; a segment with
    /// items, or the current one, is kept.
    #[cfg(any(test, feature = "testkit"))]
    pub fn abandon(&mut self, id: SegmentId) -> bool {
        self.abandon_sized(id).is_some()
    }

    /// Like [`abandon`](Self::abandon): the bytes the ledger forgot, if it
    /// forgot the segment.
    pub fn abandon_sized(&mut self, id: SegmentId) -> Option<u64> {
        let seg = self.segments.get(&id)?;
        if id == self.current || seg.live > 0 {
            return None;
        }
        let seg = self.segments.remove(&id).expect("checked");
        self.by_first.remove(&(seg.first, id));
        self.deletable.remove(&id);
        self.bytes -= seg.bytes;
        for other in &seg.marks_for {
            if let Some(o) = self.segments.get_mut(other) {
                o.marked_by.remove(&id);
            }
        }
        for other in &seg.marked_by {
            if let Some(o) = self.segments.get_mut(other) {
                o.marks_for.remove(&id);
            }
            self.check_deletable(*other);
        }
        Some(seg.bytes)
    }

    /// Starts a new segment now (after a recovery, or to retry after a
    /// fault): the current one is sealed and may become deletable.
    pub fn roll(&mut self, header_bytes: u64) -> SegmentId {
        let id = self.current + 1;
        self.seal_current();
        self.open_segment(id, self.next_seq, header_bytes);
        id
    }

    fn open_segment(&mut self, id: SegmentId, first: Seq, header_bytes: u64) {
        self.current = id;
        self.by_first.insert((first, id));
        self.segments.insert(
            id,
            Segment {
                first,
                bytes: header_bytes,
                ..Segment::default()
            },
        );
        self.bytes += header_bytes;
    }

    fn seal_current(&mut self) {
        let id = self.current;
        self.seal(id);
        // An empty segment rolled away from: it never holds anything again.
        self.current = 0;
        self.check_deletable(id);
    }

    /// Segment `id` (if it exists) takes a seal record (S-J10). Returns
    /// whether it was unsealed.
    pub fn seal(&mut self, id: SegmentId) -> bool {
        let Some(seg) = self.segments.get_mut(&id).filter(|s| !s.sealed) else {
            return false;
        };
        seg.sealed = true;
        seg.bytes += self.costs.seal;
        self.bytes += self.costs.seal;
        true
    }

    /// Segment `id`, sealed already, took its seal record again (a resume
    /// seals what failed commits wrote, S-J5): the record's bytes count
    /// too (S-J10).
    pub fn resealed(&mut self, id: SegmentId) {
        if let Some(seg) = self.segments.get_mut(&id).filter(|s| s.sealed) {
            seg.bytes += self.costs.seal;
            self.bytes += self.costs.seal;
        }
    }

    fn segment_of(&self, seq: Seq) -> Option<SegmentId> {
        self.by_first
            .range(..=(seq, SegmentId::MAX))
            .next_back()
            .map(|(_, id)| *id)
    }

    pub(super) fn check_deletable(&mut self, id: SegmentId) {
        if id == self.current {
            return;
        }
        if let Some(seg) = self.segments.get(&id) {
            if seg.live == 0 && seg.marks_for.is_empty() && !self.held.contains(&id) {
                self.deletable.insert(id);
            }
        }
    }

    /// Queues a recovered item of `tenant` under `seq`, after the ones
    /// queued before (a recovery queues them in sequence order).
    pub(super) fn restore_pending(&mut self, tenant: K, seq: Seq) {
        self.tenants
            .entry(tenant)
            .or_default()
            .push_back(Entry::at(seq));
    }

    /// Takes the recovered items of `seqs` out of their tenants' queues
    /// (S-J17: poisoned, never staged). Once, at recovery; the map's order
    /// decides nothing.
    pub(super) fn drop_pending(&mut self, seqs: &BTreeSet<Seq>) {
        for queue in self.tenants.values_mut() {
            queue.retain(|e| e.seq().is_none_or(|s| !seqs.contains(&s)));
        }
    }

    /// Keeps the segments `ids` until [`release`](Self::release): they
    /// hold the records of the lives whose crashes a recovery counted
    /// (S-J17).
    pub(super) fn hold(&mut self, ids: BTreeSet<SegmentId>) {
        self.held = ids;
        for id in self.held.clone() {
            self.deletable.remove(&id);
        }
    }

    /// This life's life record carries the counts on: the segments held
    /// for the records of earlier lives may go (S-J17).
    pub(super) fn release(&mut self) {
        for id in std::mem::take(&mut self.held) {
            self.check_deletable(id);
        }
    }

    /// Whether `max_bytes` is passed into the standing reserves (S-J10):
    /// the records of the journal's lives took part of them.
    pub(super) fn in_reserve(&self) -> bool {
        self.limits
            .max_bytes
            .is_some_and(|max| self.bytes.saturating_add(self.reserved(0)) > max)
    }

    /// Folds the restored segments kept only for their done marks of
    /// other segments (S-J17, S-J2): they stop holding those segments and
    /// become deletable, and their marks, returned in sequence order, are
    /// to be written again in the current segment (the caller counts
    /// their bytes and calls [`remark`](Self::remark)), so that the
    /// records of earlier lives they hold stop taking room. None while a
    /// segment is [held](Self::hold).
    pub(super) fn fold(&mut self) -> Vec<Seq> {
        if !self.held.is_empty() {
            return Vec::new();
        }
        let mut seqs = Vec::new();
        for (id, marks) in std::mem::take(&mut self.foldable) {
            // Foldable is decided at `restore`: a restored segment with no
            // live item, which no item joins later. Only a directory with
            // a segment of the last id (`u64::MAX`, never written by a
            // journal) makes one the current segment too: kept.
            let Some(seg) = self.segments.get_mut(&id) else {
                continue;
            };
            if id == self.current {
                continue;
            }
            let others = std::mem::take(&mut seg.marks_for);
            for other in others {
                if let Some(o) = self.segments.get_mut(&other) {
                    o.marked_by.remove(&id);
                }
            }
            self.check_deletable(id);
            seqs.extend(marks);
        }
        seqs.sort_unstable();
        seqs.dedup();
        seqs
    }

    /// A recovered item under `seq` is done at once (S-J17: poisoned):
    /// its mark waits for the first commit.
    pub(super) fn restore_done(&mut self, seq: Seq) {
        self.marks.push(seq);
    }

    /// Adds a segment read back by a recovery, with `live` items not done,
    /// `bytes` on disk and the done marks `marks` of items of other
    /// segments still on disk (in any order).
    pub(super) fn restore(
        &mut self,
        id: SegmentId,
        first: Seq,
        live: u64,
        bytes: u64,
        marks: Vec<(Seq, SegmentId)>,
    ) {
        let marks_for: BTreeSet<SegmentId> = marks.iter().map(|(_, of)| *of).collect();
        if live == 0 && !marks.is_empty() {
            self.foldable
                .insert(id, marks.into_iter().map(|(seq, _)| seq).collect());
        }
        self.by_first.insert((first, id));
        self.bytes += bytes;
        self.live += live;
        for other in &marks_for {
            if let Some(o) = self.segments.get_mut(other) {
                o.marked_by.insert(id);
            }
        }
        self.segments.insert(
            id,
            Segment {
                first,
                live,
                bytes,
                marks_for,
                marked_by: BTreeSet::new(),
                sealed: true,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 10;

    fn limits(segment_bytes: u64) -> Limits {
        Limits {
            segment_bytes,
            max_bytes: None,
        }
    }

    fn deletions(l: &mut Ledger<u32>) -> Vec<SegmentId> {
        std::iter::from_fn(|| l.poll_delete()).collect()
    }

    #[test]
    fn a_record_that_rolls_fits_only_with_room_for_the_new_header_and_the_old_seal() {
        // S-J10: a record that rolls adds its new segment's header and the
        // old segment's seal to the files, besides its own bytes.
        let costs = Costs {
            seal: 6,
            ..Costs::default()
        };
        let bounded = Limits {
            segment_bytes: 100,
            max_bytes: Some(1_000),
        };
        let mut l: Ledger<u32> = Ledger::new(bounded, 1, 1, H).with_costs(costs);
        l.append(7, 80, H).unwrap();
        assert_eq!(l.bytes(), H + 80);
        // 20 more would pass 100: 20 + H + 6 = 36 bytes, 126 in all.
        assert!(l.fits(20, H, 1_000 - 126));
        assert!(!l.fits(20, H, 1_000 - 125));
        // 10 more stay in the segment: 100 in all.
        assert!(l.fits(10, H, 1_000 - 100));
        assert!(!l.fits(10, H, 1_000 - 99));
    }

    #[test]
    fn attempt_and_end_marks_count_what_each_call_adds() {
        // S-J17: each call says how many marks it added, whatever still
        // waits from the calls before it.
        let mut l: Ledger<u32> = Ledger::new(limits(1_000), 1, 1, H);
        for tenant in [1, 1, 2, 2, 2] {
            l.append(tenant, 10, H).unwrap();
        }
        assert_eq!(l.mark_attempt(&1, 2), 2);
        assert_eq!(l.mark_attempt(&2, 3), 3, "tenant 1's marks still wait");
        assert_eq!(l.mark_attempt(&2, 3), 0, "its attempt is open already");
        assert_eq!(l.take_attempts(), [1, 2, 3, 4, 5]);
        assert_eq!(l.mark_ended(&1, 2), 2);
        assert_eq!(l.mark_ended(&2, 3), 3, "tenant 1's ends still wait");
        assert_eq!(l.take_ends(), [1, 2, 3, 4, 5]);
    }

    #[test]
    fn an_abandoned_resume_segment_stops_counting_and_keeping_what_it_marks() {
        // S-J5 (review finding 5): each failed resume's segment is
        // replaced by the next one's; the ledger forgets it, so retries
        // neither add bytes nor keep marked segments alive.
        let mut l: Ledger<u32> = Ledger::new(limits(1_000), 1, 1, H);
        l.append(7, 10, H).unwrap();
        assert_eq!(l.mark_done(&7, 1), 1);
        let marks = l.take_marks();
        let first = l.roll(H);
        l.add_bytes(8);
        l.remark(&marks);
        assert_eq!(l.bytes(), H + 10 + H + 8);
        assert!(!l.abandon(first), "the current segment is kept");
        let second = l.roll(H);
        l.add_bytes(8);
        l.remark(&marks);
        assert!(l.abandon(first));
        assert!(!l.abandon(first), "forgotten once");
        assert_eq!(l.bytes(), H + 10 + H + 8, "as if the resume had tried once");
        assert_eq!(l.segments(), 2);
        // Segment 1's items are done, their marks handed out: it goes;
        // `second`, which marks them, goes once it is not current.
        assert_eq!(deletions(&mut l), [1]);
        l.roll(H);
        assert_eq!(deletions(&mut l), [second]);
    }

    #[test]
    fn sequence_numbers_follow_staging_order_and_segments_roll_by_bytes() {
        let mut l: Ledger<u32> = Ledger::new(limits(40), 1, 1, H);
        let a = l.append(7, 10, H).unwrap();
        let b = l.append(8, 10, H).unwrap();
        let c = l.append(7, 10, H).unwrap();
        assert_eq!((a.seq, b.seq, c.seq), (1, 2, 3));
        assert_eq!((a.roll, b.roll, c.roll), (None, None, None));
        // 10 + 30 = 40 bytes: the next record would pass 40.
        let d = l.append(7, 10, H).unwrap();
        assert_eq!(
            d,
            Append {
                seq: 4,
                roll: Some(2)
            }
        );
        assert_eq!(l.current(), 2);
        assert_eq!(l.segments(), 2);
        assert_eq!(l.bytes(), 40 + H + 10);
        assert_eq!(l.live(), 4);
    }

    #[test]
    fn an_oversized_record_does_not_roll_an_empty_segment() {
        // S-J1: a record bigger than a segment gets a segment of its own,
        // never an endless roll.
        let mut l: Ledger<u32> = Ledger::new(limits(20), 1, 1, H);
        assert_eq!(l.append(1, 100, H).unwrap().roll, None);
        assert_eq!(l.append(1, 100, H).unwrap().roll, Some(2));
        assert_eq!(l.append(1, 100, H).unwrap().roll, Some(3));
    }

    /// Done records of 5 bytes plus 8 per mark, at most `per_record` marks.
    fn mark_sizes(per_record: usize) -> MarkSizes {
        MarkSizes {
            header: H,
            record: 5,
            mark: 8,
            per_record,
        }
    }

    #[test]
    fn done_marks_fill_the_current_segment_then_roll_it() {
        // D6 (crash seed 2323): one batch of done items' marks never grow a segment past
        // `segment_bytes`; they fill its room, then go on in a new one.
        let sizes = mark_sizes(4);
        let mut l: Ledger<u32> = Ledger::new(limits(60), 1, 1, H);
        for _ in 0..10 {
            l.append(1, 4, H).unwrap();
        } // segment 1: 10 + 40 = 50 bytes, room for one mark (5 + 8 = 13 > 10)
        l.mark_done(&1, 10);
        let runs = l.take_mark_runs(sizes);
        let shape: Vec<_> = runs.iter().map(|r| (r.roll, r.seqs.len())).collect();
        // Segment 1 has no room: roll to 2 (10 header), 4 marks (37 bytes),
        // then 1 more mark fits (60 - 47 - 5 = 8), then roll to 3 for 5.
        assert_eq!(shape, [(Some(2), 4), (None, 1), (Some(3), 4), (None, 1)]);
        let all: Vec<Seq> = runs.iter().flat_map(|r| r.seqs.clone()).collect();
        assert_eq!(all, (1..=10).collect::<Vec<_>>());
        // Every item is done and marked elsewhere: segment 1 goes; segment
        // 2 holds only marks for a deleted segment once 1 is gone.
        assert_eq!(l.poll_delete(), Some(1));
        assert_eq!(l.poll_delete(), Some(2));
        assert_eq!(l.poll_delete(), None);
        assert_eq!(l.current(), 3);
        assert_eq!(l.bytes(), H + 2 * 5 + 5 * 8);
    }

    #[test]
    fn a_segment_holding_only_its_header_takes_a_mark_whatever_its_size() {
        // A tiny `segment_bytes` never rolls forever.
        let sizes = mark_sizes(100);
        let mut l: Ledger<u32> = Ledger::new(limits(12), 1, 1, H);
        l.append(1, 4, H).unwrap();
        l.append(1, 4, H).unwrap();
        l.mark_done(&1, 2);
        let shape: Vec<_> = l
            .take_mark_runs(sizes)
            .iter()
            .map(|r| (r.roll, r.seqs.len()))
            .collect();
        assert_eq!(shape, [(Some(3), 1), (Some(4), 1)]);
    }

    #[test]
    fn a_current_segment_holding_only_its_header_takes_the_first_mark_without_a_roll() {
        // D6: a fresh segment (a resume's, a close's) is not rolled away
        // for want of room it can never have; it takes the mark.
        let mut l: Ledger<u32> = Ledger::new(limits(12), 1, 1, H);
        l.append(1, 4, H).unwrap();
        let fresh = l.roll(H);
        l.mark_done(&1, 1);
        let runs = l.take_mark_runs(mark_sizes(100));
        assert_eq!(
            runs,
            [MarkRun {
                roll: None,
                seqs: vec![1]
            }]
        );
        assert_eq!(l.current(), fresh);
    }

    #[test]
    fn a_segment_with_live_items_is_never_abandoned() {
        // S-J5: only a failed resume's segment, which holds no item, is
        // forgotten; one holding an item not done is the item's only copy.
        let mut l: Ledger<u32> = Ledger::new(limits(1_000), 1, 1, H);
        l.append(7, 10, H).unwrap();
        let second = l.roll(H);
        assert_eq!(l.abandon_sized(1), None, "item 1 is in segment 1");
        assert_eq!(l.abandon_sized(second), None, "the current segment");
        assert_eq!((l.segments(), l.bytes()), (2, H + 10 + H));
        assert_eq!(l.mark_done(&7, 1), 1);
        let _ = l.take_marks();
        assert_eq!(l.abandon_sized(1), Some(H + 10), "done: it may go");
    }

    #[test]
    fn mark_done_marks_a_tenants_oldest_items_done() {
        let mut l: Ledger<u32> = Ledger::new(limits(1_000), 1, 1, H);
        for t in [1, 2, 1, 1, 2] {
            l.append(t, 10, H).unwrap();
        }
        assert_eq!(l.mark_done(&1, 2), 2);
        assert_eq!(l.take_marks(), [1, 3]);
        assert_eq!(l.mark_done(&2, 5), 2, "capped at what the tenant has");
        assert_eq!(l.mark_done(&9, 1), 0, "an unknown tenant");
        assert_eq!(l.take_marks(), [2, 5]);
        assert_eq!(l.live(), 1);
        assert!(!l.has_marks());
    }

    #[test]
    fn a_tenant_marked_empty_is_forgotten_at_the_next_take_unless_it_staged() {
        // Memory follows the pending items (S-B8), one commit round late.
        let mut l: Ledger<u32> = Ledger::new(limits(1_000), 1, 1, H);
        l.append(1, 10, H).unwrap();
        l.append(2, 10, H).unwrap();
        l.mark_done(&1, 1);
        l.mark_done(&2, 1);
        l.append(2, 10, H).unwrap();
        assert_eq!(l.tenants.len(), 2, "kept until the next take");
        assert_eq!(l.take_marks(), [1, 2]);
        assert_eq!(l.tenants.keys().collect::<Vec<_>>(), [&2]);
        assert_eq!(l.mark_done(&2, 1), 1, "its new item, in order");
        assert_eq!(l.take_marks(), [3]);
        l.take_marks();
        assert!(l.tenants.is_empty() && l.emptied.is_empty());
    }

    #[test]
    fn unjournaled_items_keep_their_place_but_leave_no_mark() {
        // S-J5: an item accepted while the journal is down is in the
        // tenant's order, so a later mark_done pops the right ones.
        let mut l: Ledger<u32> = Ledger::new(limits(1_000), 1, 1, H);
        l.append(1, 10, H).unwrap();
        l.unjournaled(1);
        l.append(1, 10, H).unwrap();
        assert_eq!(l.mark_done(&1, 2), 1);
        assert_eq!(l.take_marks(), [1]);
        assert_eq!(l.mark_done(&1, 1), 1);
        assert_eq!(l.take_marks(), [2]);
    }

    #[test]
    fn a_segment_goes_once_its_items_are_done_but_never_the_current_one() {
        // D6.
        let mut l: Ledger<u32> = Ledger::new(limits(30), 1, 1, H);
        l.append(1, 10, H).unwrap();
        l.append(1, 10, H).unwrap();
        l.append(2, 10, H).unwrap(); // rolls: segment 2
        l.mark_done(&2, 1);
        l.take_marks();
        assert_eq!(deletions(&mut l), [] as [u64; 0], "segment 2 is current");
        l.mark_done(&1, 1);
        l.take_marks();
        assert_eq!(deletions(&mut l), [] as [u64; 0], "one item of 1 is live");
        l.mark_done(&1, 1);
        l.take_marks();
        assert_eq!(deletions(&mut l), [1]);
        assert_eq!(l.segments(), 1);
        assert_eq!(l.bytes(), H + 10);
    }

    #[test]
    fn a_deleted_segment_is_forgotten_whole_so_memory_follows_the_files() {
        // A journal that runs for months rolls and deletes millions of
        // segments: the ledger keeps what it knows of the segments on disk
        // only, their sequence ranges included, never one entry per
        // segment ever written.
        let mut l: Ledger<u32> = Ledger::new(limits(30), 1, 1, H);
        for round in 0..50 {
            l.append(1, 10, H).unwrap();
            l.append(1, 10, H).unwrap(); // the second rolls: a new segment
            assert_eq!(l.mark_done(&1, 2), 2, "round {round}");
            l.take_marks();
            l.poll_delete();
        }
        assert!(l.segments() <= 2, "{} segments kept", l.segments());
        assert_eq!(
            l.by_first.len(),
            l.segments(),
            "one range per segment still known, none of a deleted one"
        );
        let abandoned = l.roll(H);
        l.roll(H);
        assert!(l.abandon(abandoned));
        assert_eq!(l.by_first.len(), l.segments(), "nor of an abandoned one");
    }

    #[test]
    fn a_segment_holding_marks_for_a_live_segment_is_kept() {
        // S-J2: deleting segment 2 would forget that item 1 is done while
        // segment 1 still holds item 2 live.
        let mut l: Ledger<u32> = Ledger::new(limits(30), 1, 1, H);
        l.append(1, 10, H).unwrap(); // seq 1, segment 1
        l.append(2, 10, H).unwrap(); // seq 2, segment 1
        assert_eq!(l.append(3, 10, H).unwrap().roll, Some(2)); // seq 3
        l.mark_done(&1, 1);
        assert_eq!(l.take_marks(), [1]); // the mark goes to segment 2
        l.add_bytes(10);
        assert_eq!(l.append(3, 10, H).unwrap().roll, Some(3)); // seq 4
        l.mark_done(&3, 2);
        l.take_marks(); // segment 2's item done; marks in segment 3
        assert_eq!(
            deletions(&mut l),
            [] as [u64; 0],
            "2 marks item 1 of live segment 1"
        );
        l.mark_done(&2, 1);
        l.take_marks();
        assert_eq!(deletions(&mut l), [1, 2], "1 goes, then 2 is free");
    }

    #[test]
    fn max_bytes_refuses_and_records_nothing() {
        // S-J4.
        let mut l: Ledger<u32> = Ledger::new(
            Limits {
                segment_bytes: 1_000,
                max_bytes: Some(H + 25),
            },
            1,
            1,
            H,
        );
        l.append(1, 20, H).unwrap();
        assert_eq!(l.append(1, 20, H), Err(NoRoom));
        assert_eq!(l.next_seq(), 2);
        assert_eq!(l.mark_done(&1, 5), 1);
        l.take_marks();
        l.append(1, 5, H).unwrap();
    }

    #[test]
    fn an_incident_turns_unsynced_items_undurable_and_frees_their_segment() {
        // S-J5.
        let mut l: Ledger<u32> = Ledger::new(limits(30), 1, 1, H);
        l.append(1, 10, H).unwrap(); // seq 1, synced
        l.append(2, 10, H).unwrap(); // seq 2
        l.append(1, 10, H).unwrap(); // seq 3, segment 2
        assert_eq!(l.incident(2), 2);
        assert_eq!(l.undurable(), 2);
        assert_eq!(l.live(), 1);
        assert_eq!(l.mark_done(&1, 2), 1, "seq 1 is journaled, seq 3 no more");
        assert_eq!(l.undurable(), 1);
        assert_eq!(l.take_marks(), [1]);
        l.roll(H);
        assert_eq!(deletions(&mut l), [1, 2], "nothing live holds them");
        l.mark_done(&2, 1);
        assert_eq!(l.undurable(), 0);
        assert!(l.take_marks().is_empty());
    }

    #[test]
    fn mark_all_done_marks_every_pending_item() {
        let mut l: Ledger<u32> = Ledger::new(limits(1_000), 1, 1, H);
        for t in [3, 1, 2] {
            l.append(t, 1, H).unwrap();
        }
        l.unjournaled(1);
        assert_eq!(l.mark_all_done(), 3);
        assert_eq!(l.take_marks(), [1, 2, 3]);
        assert_eq!(l.live(), 0);
    }
}
