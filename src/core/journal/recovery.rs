//! Recovery, sans IO (D2, D4, S-J7): from the segment files the driver
//! read back, what to refuse, what to cut, seal or delete, which items to
//! stage again in which order, and what to count lost.
//!
//! The driver lists and reads the files and decodes their records; it
//! hands each one over as a [`SegmentFile`]. [`plan`] decides: a file
//! that is not the journal's or of another format version is refused; a
//! last segment holding at most a torn header is deleted (a crash while
//! creating it); a torn tail of the last segment is cut; the last segment
//! is sealed. The driver carries out the [`Step`]s, then
//! [`Plan::finish`] gives the items to stage again and the ledger that
//! tracks them.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hash;

use super::ledger::{Ledger, Limits, SegmentId, Seq};
use super::poison::{self, Lives};

/// What a segment file's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// Intact: its segment id and first sequence number.
    Valid {
        /// The segment's id.
        id: SegmentId,
        /// Its first sequence number.
        first: Seq,
        /// Whether it is of the previous format version (S-J14: its items
        /// are of codec version 0).
        v1: bool,
    },
    /// Shorter than a header: a crash while creating the segment.
    Short,
    /// A journal header with damage: its fields cannot be trusted.
    Damaged,
    /// Another format version.
    Version(u16),
    /// Not a journal segment at all.
    Foreign,
}

/// One segment file as the driver read it back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentFile<K, P> {
    /// Its id, from its name.
    pub id: SegmentId,
    /// What its header says.
    pub head: Head,
    /// Whether the whole file is what a crash while creating it can leave
    /// (at most a torn header, S-J7).
    pub torn: bool,
    /// Its length in bytes.
    pub len: u64,
    /// Where its last valid record ends (the header's end when none).
    pub valid_end: u64,
    /// Bytes skipped as damaged between valid records.
    pub skipped: u64,
    /// Readable item records: sequence number, tenant, payload.
    pub items: Vec<(Seq, K, P)>,
    /// Sequence numbers of item records whose checksum held but whose
    /// tenant or item could not be decoded.
    pub undecodable: Vec<Seq>,
    /// Sequence numbers of item records of another codec version than the
    /// recovering one's (S-J14): never decoded, refused.
    pub other: Vec<Seq>,
    /// Done marks it holds.
    pub marks: Vec<Seq>,
    /// Its seal record's end, if readable.
    pub seal: Option<Seq>,
    /// Its records of the journal's lives (S-J17).
    pub lives: Lives,
}

/// A segment the recovery does not recognize, so it refuses the whole
/// directory (S-J7): never a guess.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unrecognized {
    /// The segment's file is not one of the journal's.
    Foreign(SegmentId),
    /// The segment was written by another format version.
    Version {
        /// The segment.
        id: SegmentId,
        /// Its version.
        version: u16,
    },
}

/// A file operation a recovery needs before the journal runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Delete the last segment, torn while it was created (it never held a
    /// record). A failure is no error: the first commit creates the same
    /// segment and heads it again in place (S-J5).
    Delete(SegmentId),
    /// Cut the last segment to `len` bytes (a torn tail, never synced).
    Truncate {
        /// The segment.
        id: SegmentId,
        /// Its new length.
        len: u64,
    },
    /// Append a seal record (`end`) to the last segment and sync it.
    Seal {
        /// The segment.
        id: SegmentId,
        /// Every item of the segment is below it.
        end: Seq,
    },
}

/// What a recovery found in the files, for its report (D4).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// Segment files read (the torn last one deleted aside).
    pub segments: usize,
    /// Bytes cut from the end of the last segment.
    pub torn_bytes: u64,
    /// Bytes skipped as damaged between or after valid records.
    pub damaged_bytes: u64,
    /// Segments with a damaged header (their records were still read).
    pub damaged_headers: usize,
    /// Last segments torn while they were created, deleted.
    pub empty_segments: usize,
}

/// A recovery's decisions: the steps to carry out, then
/// [`finish`](Self::finish).
#[derive(Debug)]
pub struct Plan<K, P> {
    /// The counts.
    pub found: Found,
    /// The file operations, in order.
    pub steps: Vec<Step>,
    /// Items of another codec version not known done, in sequence order
    /// (S-J14): refused, counted lost under `other_version`, or the build
    /// fails, as configured.
    pub other: Vec<Seq>,
    segments: Vec<ScannedSegment<K, P>>,
    lives: Lives,
    /// Segments holding records of the lives the crashes are counted from
    /// (S-J17): kept until the new life's record carries the counts on.
    counted_in: BTreeSet<SegmentId>,
}

/// One segment as the plan reads it (D4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScannedSegment<K, P> {
    /// Its id (from its file name and header).
    pub id: SegmentId,
    /// The first sequence number it holds (from its header).
    pub first: Seq,
    /// Where its range ends (exclusive), when known: its seal record, or
    /// the next segment's `first`. `None` for the last segment when it has
    /// no seal (a crash cut it): then its end is its last readable item.
    pub end: Option<Seq>,
    /// Readable item records: sequence number, tenant, payload.
    pub items: Vec<(Seq, K, P)>,
    /// Sequence numbers of records whose checksum held but whose tenant or
    /// item could not be decoded (not in `items`): counted lost like
    /// unreadable records.
    pub undecodable: Vec<Seq>,
    /// Sequence numbers of items of another codec version (not in
    /// `items`): refused (S-J14).
    pub other: Vec<Seq>,
    /// Done marks it holds.
    pub marks: Vec<Seq>,
    /// Its size on disk after any torn tail was cut.
    pub bytes: u64,
}

/// What a recovery found (D4): the items to stage again, in order, and the
/// counts.
#[derive(Debug)]
pub struct Recovery<K, P> {
    /// Items not known done, in sequence order (so per tenant in staging
    /// order, D2): stage them again before any new item.
    pub items: Vec<(Seq, K, P)>,
    /// Items in a segment's range that could not be read back (corrupt or
    /// undecodable) and are not marked done: counted lost under
    /// `journal_unreadable` (D4).
    pub unreadable: u64,
    /// Items of another codec version not marked done: counted lost under
    /// `other_version` (S-J14).
    pub other: u64,
    /// Readable items skipped because they are marked done.
    pub done: u64,
    /// Items whose attempts crashes cut `max_crash_attempts` times, in
    /// sequence order (S-J17): not staged again, marked done at the first
    /// commit, dead-lettered under `poisoned`.
    pub poisoned: Vec<(Seq, K, P)>,
    /// `(item, crashes)` of the items of `items` cut by one crash or
    /// more, in sequence order: the life record's (S-J17).
    pub crashes: Vec<(Seq, u32)>,
    /// Per tenant (in tenant order), how many of its oldest items of
    /// `items` go alone: up to its last suspect (S-J17).
    pub alone: Vec<(K, u64)>,
    /// Per tenant (in tenant order), how many of its oldest items of
    /// `items` an earlier life attempted: up to its last one with an
    /// attempt mark on disk (S-J16: the store may hold them, so a dead
    /// letter of them says `attempted`).
    pub tried: Vec<(K, u64)>,
    /// The sequence number the next item gets.
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    pub next_seq: Seq,
    /// The id the next segment gets.
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    pub next_segment: SegmentId,
}

/// The segment ids of a directory's files, sorted, from `(name, id)`
/// pairs (`id` parsed from the name, `None` when it is not a segment's
/// name): the name of the first file that is neither the lock (`lock`)
/// nor a segment is refused (S-J7).
///
/// # Errors
/// The name of a foreign file.
pub fn segment_ids(
    names: impl IntoIterator<Item = (String, Option<SegmentId>)>,
    lock: &str,
) -> Result<Vec<SegmentId>, String> {
    let mut ids = Vec::new();
    for (name, id) in names {
        match id {
            Some(id) => ids.push(id),
            None if name == lock => {}
            None => return Err(name),
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Decides what the segment `files` (in id order) need: refusals first,
/// then the torn last segment's deletion, the torn tail's cut and the
/// last segment's seal (a seal record of `seal_bytes`).
///
/// # Errors
/// [`Unrecognized`] for a file that is not the journal's or of another format
/// version.
pub fn plan<K, P>(
    files: Vec<SegmentFile<K, P>>,
    seal_bytes: u64,
) -> Result<Plan<K, P>, Unrecognized> {
    let mut found = Found::default();
    let mut steps = Vec::new();
    let mut kept = Vec::with_capacity(files.len());
    let last = files.last().map(|f| f.id);
    for file in files {
        if Some(file.id) == last && file.torn {
            steps.push(Step::Delete(file.id));
            found.empty_segments += 1;
            continue;
        }
        match file.head {
            Head::Foreign => return Err(Unrecognized::Foreign(file.id)),
            Head::Version(version) => {
                return Err(Unrecognized::Version {
                    id: file.id,
                    version,
                })
            }
            Head::Valid { id, .. } if id != file.id => return Err(Unrecognized::Foreign(file.id)),
            Head::Short | Head::Damaged => found.damaged_headers += 1,
            Head::Valid { .. } => {}
        }
        kept.push(file);
    }
    found.segments = kept.len();
    let counted_in = counted_in(&kept);
    let mut lives = Lives::default();
    for file in &mut kept {
        lives.extend(std::mem::take(&mut file.lives));
    }
    let other = other_pending(&kept);
    let mut segments = scan_all(kept, &mut found, &mut steps);
    link_ends(&mut segments);
    if let Some(seg) = segments.last_mut() {
        if seg.end.is_none() {
            let end = open_end(seg);
            steps.push(Step::Seal { id: seg.id, end });
            seg.end = Some(end);
            seg.bytes += seal_bytes;
        }
    }
    Ok(Plan {
        found,
        steps,
        other,
        segments,
        lives,
        counted_in,
    })
}

/// The files holding records of the lives a recovery counts crashes from
/// (S-J17): the latest life record's life and the lives after it (every
/// life without one).
fn counted_in<K, P>(files: &[SegmentFile<K, P>]) -> BTreeSet<SegmentId> {
    let base = files
        .iter()
        .flat_map(|f| f.lives.starts.iter().map(|(life, _)| *life))
        .max()
        .unwrap_or(0);
    files
        .iter()
        .filter(|f| {
            let l = &f.lives;
            l.attempts
                .iter()
                .map(|(life, _)| *life)
                .chain(l.ends.iter().map(|(_, life, _)| *life))
                .chain(l.starts.iter().map(|(life, _)| *life))
                .chain(l.clean.iter().copied())
                .any(|life| life >= base)
        })
        .map(|f| f.id)
        .collect()
}

/// The items of another codec version not marked done, in sequence order.
fn other_pending<K, P>(files: &[SegmentFile<K, P>]) -> Vec<Seq> {
    let marked: BTreeSet<Seq> = files.iter().flat_map(|f| f.marks.iter().copied()).collect();
    let mut other: Vec<Seq> = files
        .iter()
        .flat_map(|f| f.other.iter().copied())
        .filter(|s| !marked.contains(s))
        .collect();
    other.sort_unstable();
    other.dedup();
    other
}

/// Reads every kept file into a [`ScannedSegment`]: its first sequence
/// number (inferred through a damaged header), its damage, and for the
/// last one the cut of a torn tail.
fn scan_all<K, P>(
    files: Vec<SegmentFile<K, P>>,
    found: &mut Found,
    steps: &mut Vec<Step>,
) -> Vec<ScannedSegment<K, P>> {
    let last = files.len().checked_sub(1);
    let mut scanned: Vec<ScannedSegment<K, P>> = Vec::with_capacity(files.len());
    for (i, file) in files.into_iter().enumerate() {
        found.damaged_bytes += file.skipped;
        let tail = file.len.saturating_sub(file.valid_end);
        let lowest = file
            .items
            .iter()
            .map(|x| x.0)
            .chain(file.undecodable.iter().copied())
            .chain(file.other.iter().copied())
            .min();
        let first = match file.head {
            Head::Valid { first, .. } => first,
            // A damaged header: the previous segment's end if it is the one
            // just before, else the lowest readable sequence number.
            _ => scanned
                .last()
                .filter(|p| p.id + 1 == file.id)
                .and_then(|p| p.end)
                .or(lowest)
                .unwrap_or(1),
        };
        let mut bytes = file.valid_end;
        if Some(i) == last {
            if tail > 0 {
                found.torn_bytes = tail;
                steps.push(Step::Truncate {
                    id: file.id,
                    len: file.valid_end,
                });
            }
        } else {
            found.damaged_bytes += tail;
            bytes = file.len;
        }
        scanned.push(ScannedSegment {
            id: file.id,
            first,
            end: file.seal,
            items: file.items,
            undecodable: file.undecodable,
            other: file.other,
            marks: file.marks,
            bytes,
        });
    }
    scanned
}

/// A segment's range ends where the next one's starts, when its seal is
/// unreadable and the next one is its direct successor.
fn link_ends<K, P>(scanned: &mut [ScannedSegment<K, P>]) {
    for i in 1..scanned.len() {
        let (before, after) = scanned.split_at_mut(i);
        let prev = before.last_mut().expect("i >= 1");
        if prev.end.is_none() && prev.id + 1 == after[0].id {
            prev.end = Some(after[0].first);
        }
    }
}

/// Where the range of an unsealed last segment ends: past every sequence
/// number it holds, at least its first.
fn open_end<K, P>(seg: &ScannedSegment<K, P>) -> Seq {
    seg.items
        .iter()
        .map(|x| x.0 + 1)
        .chain(seg.undecodable.iter().map(|s| s + 1))
        .chain(seg.other.iter().map(|s| s + 1))
        .chain(seg.marks.iter().map(|s| s + 1))
        .max()
        .unwrap_or(seg.first)
        .max(seg.first)
}

impl<K: Ord + Hash + Clone, P> Plan<K, P> {
    /// After the steps: the items to stage again and a ledger that tracks
    /// them, with a fresh current segment of `header_bytes` after the last
    /// one; items whose attempts crashes cut `max_crash_attempts` times
    /// are poisoned (S-J17).
    pub fn finish(
        self,
        limits: Limits,
        header_bytes: u64,
        max_crash_attempts: u32,
    ) -> (Recovery<K, P>, Ledger<K>) {
        let (mut r, mut ledger) = Recovery::new(self.segments, limits, header_bytes);
        ledger.hold(self.counted_in);
        r.judge(&self.lives, max_crash_attempts, &mut ledger);
        r.tried = tried(&self.lives, &r.items);
        (r, ledger)
    }
}

/// What [`restage`] decides.
struct Restage {
    /// The items staged again (sequence number, segment), in order.
    keep: Vec<(Seq, SegmentId)>,
    /// Items unreadable and not done.
    unreadable: u64,
    /// Items of another codec version and not done (S-J14).
    other: u64,
    /// Readable items done.
    done: u64,
}

/// Decides what `segments` (in any order) leave to do: the items staged
/// again (sequence number, segment) in sequence order, how many items are
/// unreadable and not done, how many are of another codec version and
/// not done, and how many readable items are done (D2, D4, S-J14).
fn restage<K, P>(segments: &[ScannedSegment<K, P>]) -> Restage {
    let marked: BTreeSet<Seq> = segments
        .iter()
        .flat_map(|s| s.marks.iter().copied())
        .collect();
    let mut keep = Vec::new();
    let mut unreadable = 0;
    let mut done = 0;
    let mut other_lost = 0;
    for seg in segments {
        let readable: BTreeSet<Seq> = seg.items.iter().map(|(s, _, _)| *s).collect();
        // Unrecognized, not unreadable: known, and counted apart.
        let other: BTreeSet<Seq> = seg
            .other
            .iter()
            .copied()
            .filter(|s| !marked.contains(s) && !readable.contains(s))
            .collect();
        other_lost += other.len() as u64;
        for &seq in &readable {
            if marked.contains(&seq) {
                done += 1;
            } else {
                keep.push((seq, seg.id));
            }
        }
        let last = readable
            .iter()
            .chain(&seg.undecodable)
            .chain(&other)
            .max()
            .map_or(seg.first, |s| s.saturating_add(1));
        let end = seg.end.unwrap_or(last).max(last).max(seg.first);
        // Counted by range queries, not by walking the range: a range is
        // only as wide as the sequence numbers on disk say, and the cost
        // must follow the records, never the numbers.
        let known = readable.range(seg.first..end).count() as u64
            + marked
                .range(seg.first..end)
                .filter(|s| !readable.contains(s))
                .count() as u64
            + other.range(seg.first..end).count() as u64;
        unreadable += (end - seg.first).saturating_sub(known);
    }
    keep.sort_unstable();
    Restage {
        keep,
        unreadable,
        other: other_lost,
        done,
    }
}

/// The sequence number after every one the segments know of.
fn next_seq<K, P>(segments: &[ScannedSegment<K, P>]) -> Seq {
    segments
        .iter()
        .flat_map(|s| {
            s.items
                .iter()
                .map(|(q, _, _)| q.saturating_add(1))
                .chain(s.other.iter().map(|q| q.saturating_add(1)))
                .chain(s.end)
                .chain(s.marks.iter().map(|q| q.saturating_add(1)))
                .chain([s.first])
        })
        .max()
        .unwrap_or(1)
}

/// Restores every scanned segment into `ledger`, with the items of
/// `keep` live and the marks it holds for other segments still on disk:
/// a segment kept for its own marks keeps its items' marks too (S-J2). A
/// mark past its segment's end is for a deleted one.
fn restore_segments<K: Ord + Hash + Clone, P>(
    ledger: &mut Ledger<K>,
    segments: &[ScannedSegment<K, P>],
    keep: &[(Seq, SegmentId)],
) {
    let live_per: BTreeMap<SegmentId, u64> = keep.iter().fold(BTreeMap::new(), |mut m, (_, id)| {
        *m.entry(*id).or_default() += 1;
        m
    });
    let firsts: BTreeSet<(Seq, SegmentId)> = segments.iter().map(|s| (s.first, s.id)).collect();
    let segment_of = |seq: Seq| {
        firsts
            .range(..=(seq, SegmentId::MAX))
            .next_back()
            .map(|(_, id)| *id)
    };
    let ends: BTreeMap<SegmentId, Option<Seq>> = segments.iter().map(|s| (s.id, s.end)).collect();
    let mut sorted: Vec<&ScannedSegment<K, P>> = segments.iter().collect();
    sorted.sort_by_key(|s| s.id);
    for s in &sorted {
        let marks: Vec<(Seq, SegmentId)> = s
            .marks
            .iter()
            .filter_map(|q| {
                let id = segment_of(*q)?;
                let past_end = ends.get(&id).copied().flatten().is_some_and(|e| *q >= e);
                (!past_end && id != s.id).then_some((*q, id))
            })
            .collect();
        let live = live_per.get(&s.id).copied().unwrap_or(0);
        ledger.restore(s.id, s.first, live, s.bytes, marks);
    }
    for s in &sorted {
        ledger.check_deletable(s.id);
    }
}

impl<K: Ord + Hash + Clone, P> Recovery<K, P> {
    /// Reads the plan of `segments` into a recovery and a ledger that
    /// tracks the recovered items, with a fresh current segment of
    /// `header_bytes` after the last one.
    pub fn new(
        segments: Vec<ScannedSegment<K, P>>,
        limits: Limits,
        header_bytes: u64,
    ) -> (Self, Ledger<K>) {
        let Restage {
            keep,
            unreadable,
            other,
            done,
        } = restage(&segments);
        let next_seq = next_seq(&segments);
        let next_segment = segments
            .iter()
            .map(|s| s.id.saturating_add(1))
            .max()
            .unwrap_or(1);
        let mut ledger = Ledger::new(limits, next_seq, next_segment, header_bytes);
        restore_segments(&mut ledger, &segments, &keep);
        let items = kept_items(segments, &keep);
        // Their tenants queued in the ledger, so that their outcomes mark
        // them done.
        for (seq, tenant, _) in &items {
            ledger.restore_pending(tenant.clone(), *seq);
        }
        let recovery = Recovery {
            items,
            unreadable,
            other,
            done,
            poisoned: Vec::new(),
            crashes: Vec::new(),
            alone: Vec::new(),
            tried: Vec::new(),
            next_seq,
            next_segment,
        };
        (recovery, ledger)
    }
}

/// The readable items of `segments` that `keep` names (sorted by sequence
/// number), in sequence order, each sequence number once: where two
/// segments hold the same one, the record of the one later in `segments`.
/// One stable sort of the records (already in order within a segment, so
/// nearly linear) and one merge with `keep`, not a map of every record
/// (a million items recover in a third less time).
fn kept_items<K, P>(
    segments: Vec<ScannedSegment<K, P>>,
    keep: &[(Seq, SegmentId)],
) -> Vec<(Seq, K, P)> {
    let mut all: Vec<(Seq, K, P)> = segments.into_iter().flat_map(|s| s.items).collect();
    // Stable: of the records of one sequence number, the last one read
    // stays last.
    all.sort_by_key(|&(seq, _, _)| seq);
    let mut all = all.into_iter().peekable();
    let mut items = Vec::with_capacity(keep.len());
    for &(seq, _) in keep {
        while all.next_if(|(s, _, _)| *s < seq).is_some() {}
        let mut last = None;
        while let Some(record) = all.next_if(|(s, _, _)| *s == seq) {
            last = Some(record);
        }
        items.extend(last);
    }
    items
}

/// Per tenant (in tenant order), how many of its oldest `items` (in
/// staging order) come up to its last one that `lives` says was attempted
/// (S-J16): an attempt mark of any life still on disk, or a crash count in
/// a life record (whose marks may be gone). A tenant's slices are its
/// oldest items, so those attempted are a prefix of them. The marks of an
/// attempt that ended (failed, for a retry) go with their segment once a
/// later life's record is on disk: such an item is not named.
fn tried<K: Ord + Clone, P>(lives: &Lives, items: &[(Seq, K, P)]) -> Vec<(K, u64)> {
    let counted = lives
        .starts
        .iter()
        .flat_map(|(_, c)| c.iter().map(|&(seq, _)| seq));
    let marked: BTreeSet<Seq> = (lives.attempts.iter().map(|&(_, seq)| seq))
        .chain(counted)
        .collect();
    if marked.is_empty() {
        return Vec::new();
    }
    // Per tenant: items so far, and up to which of them were attempted.
    let mut per: BTreeMap<&K, (u64, u64)> = BTreeMap::new();
    for (seq, tenant, _) in items {
        let e = per.entry(tenant).or_default();
        e.0 += 1;
        if marked.contains(seq) {
            e.1 = e.0;
        }
    }
    per.into_iter()
        .filter(|(_, (_, tried))| *tried > 0)
        .map(|(t, (_, tried))| (t.clone(), tried))
        .collect()
}

impl<K: Ord + Hash + Clone, P> Recovery<K, P> {
    /// Counts the crashes of the restored items from `lives` (S-J17): the
    /// poisoned ones leave `items` (their marks wait in `ledger`), the
    /// suspects' counts go to `crashes`, and each tenant's items up to
    /// its last suspect go alone.
    fn judge(&mut self, lives: &Lives, max_crash_attempts: u32, ledger: &mut Ledger<K>) {
        let pending: BTreeSet<Seq> = self.items.iter().map(|(s, _, _)| *s).collect();
        let counts = poison::crashes(lives, &pending);
        if counts.is_empty() {
            return;
        }
        let items = std::mem::take(&mut self.items);
        // Per tenant: items kept so far, and up to which of them go alone.
        let mut per: BTreeMap<K, (u64, u64)> = BTreeMap::new();
        let mut poisoned = BTreeSet::new();
        for (seq, tenant, payload) in items {
            let n = counts.get(&seq).copied().unwrap_or(0);
            if poison::poisoned(n, max_crash_attempts) {
                poisoned.insert(seq);
                self.poisoned.push((seq, tenant, payload));
                continue;
            }
            let e = per.entry(tenant.clone()).or_default();
            e.0 += 1;
            if n > 0 {
                e.1 = e.0;
                self.crashes.push((seq, n));
            }
            self.items.push((seq, tenant, payload));
        }
        self.alone = per
            .into_iter()
            .filter(|(_, (_, alone))| *alone > 0)
            .map(|(t, (_, alone))| (t, alone))
            .collect();
        if !poisoned.is_empty() {
            ledger.drop_pending(&poisoned);
            for seq in poisoned {
                ledger.restore_done(seq);
            }
        }
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

    fn seg(
        id: SegmentId,
        first: Seq,
        end: Option<Seq>,
        items: &[(Seq, u32)],
        marks: &[Seq],
    ) -> ScannedSegment<u32, Seq> {
        ScannedSegment {
            id,
            first,
            end,
            items: items.iter().map(|&(s, t)| (s, t, s * 100)).collect(),
            undecodable: Vec::new(),
            other: Vec::new(),
            marks: marks.to_vec(),
            bytes: 100,
        }
    }

    fn file(id: SegmentId, len: u64, valid_end: u64, skipped: u64) -> SegmentFile<u32, Seq> {
        SegmentFile {
            id,
            head: Head::Valid {
                id,
                first: id,
                v1: false,
            },
            torn: false,
            len,
            valid_end,
            skipped,
            items: vec![(id, 7, 0)],
            undecodable: Vec::new(),
            other: Vec::new(),
            marks: Vec::new(),
            seal: None,
            lives: Lives::default(),
        }
    }

    #[test]
    fn a_sequence_number_read_from_two_segments_is_staged_again_once_from_the_one_read_last() {
        // D2: the items come back in sequence order, each once; the
        // records of two segments holding one sequence number (not
        // written so, but read so after damage) give the record of the
        // segment that comes later in the recovery's list.
        let mut a = seg(1, 1, Some(3), &[(2, 7), (1, 7)], &[]);
        let mut b = seg(2, 2, None, &[(3, 8), (2, 7)], &[]);
        a.items[0].2 = 201;
        b.items[1].2 = 202;
        let (r, _) = Recovery::new(vec![b.clone(), a.clone()], limits(1_000), H);
        assert_eq!(r.items, [(1, 7, 100), (2, 7, 201), (3, 8, 300)]);
        // In id order, as a recovery lists them: the higher id's record,
        // not the lower's.
        let (r, _) = Recovery::new(vec![a, b], limits(1_000), H);
        assert_eq!(r.items, [(1, 7, 100), (2, 7, 202), (3, 8, 300)]);
        let (r, _) = Recovery::new(
            vec![
                seg(1, 1, Some(3), &[(1, 7), (2, 7)], &[]),
                seg(2, 3, None, &[(3, 8), (4, 8)], &[1, 4]),
            ],
            limits(1_000),
            H,
        );
        assert_eq!(r.items, [(2, 7, 200), (3, 8, 300)], "marked done: not kept");
    }

    #[test]
    fn a_plan_touches_a_file_only_for_what_it_found_and_counts_its_bytes() {
        // S-J7, D4: a last segment whose records end at its length is
        // sealed, never cut to the length it has; a torn one is cut, then
        // sealed. Damage is counted where it is: bytes skipped between
        // records, and a segment's tail past its last valid record.
        const SEAL: u64 = 17;
        let p = plan(vec![file(1, 100, 100, 0), file(2, 80, 80, 0)], SEAL).unwrap();
        assert_eq!(p.steps, [Step::Seal { id: 2, end: 3 }]);
        assert_eq!(
            p.found,
            Found {
                segments: 2,
                ..Found::default()
            }
        );
        let (_, ledger) = p.finish(limits(1_000), H, 3);
        assert_eq!(
            ledger.bytes(),
            100 + 80 + SEAL + H,
            "the seal and a fresh segment"
        );

        let p = plan(vec![file(1, 120, 100, 5), file(2, 95, 80, 3)], SEAL).unwrap();
        assert_eq!(
            p.steps,
            [
                Step::Truncate { id: 2, len: 80 },
                Step::Seal { id: 2, end: 3 }
            ]
        );
        let want = Found {
            segments: 2,
            torn_bytes: 15,
            damaged_bytes: 5 + 20 + 3,
            ..Found::default()
        };
        assert_eq!(p.found, want);
        let (_, ledger) = p.finish(limits(1_000), H, 3);
        assert_eq!(
            ledger.bytes(),
            120 + 80 + SEAL + H,
            "the first file stays whole"
        );
    }

    #[test]
    fn an_unsealed_last_segment_is_sealed_past_every_number_it_holds() {
        // S-J7, D4: the seal's end is past the last record of any kind,
        // an item that cannot be decoded, one of another codec version, a
        // done mark whose item record was damaged; the next item gets a
        // number past it, never one a record on disk holds already.
        type Add = fn(&mut SegmentFile<u32, Seq>);
        let last = |f: &mut SegmentFile<u32, Seq>| f.items = vec![(1, 7, 0)];
        let cases: [(&str, Add); 3] = [
            ("undecodable", |f| f.undecodable = vec![5]),
            ("other version", |f| f.other = vec![5]),
            ("mark", |f| f.marks = vec![5]),
        ];
        for (what, add) in cases {
            let mut f = file(1, 100, 100, 0);
            last(&mut f);
            add(&mut f);
            let p = plan(vec![f], 17).unwrap();
            assert_eq!(p.steps, [Step::Seal { id: 1, end: 6 }], "{what}");
            let (r, _) = p.finish(limits(1_000), H, 3);
            assert_eq!(r.next_seq, 6, "{what}");
        }
    }

    #[test]
    fn recovery_restages_what_is_not_done_in_sequence_order() {
        // D2, D4.
        let segments = vec![
            seg(2, 4, None, &[(4, 1), (5, 2), (6, 1)], &[1, 4]),
            seg(1, 1, Some(4), &[(1, 1), (2, 2), (3, 1)], &[2]),
        ];
        let (r, mut l) = Recovery::new(segments, limits(1_000), H);
        let order: Vec<(Seq, u32)> = r.items.iter().map(|(s, t, _)| (*s, *t)).collect();
        assert_eq!(order, [(3, 1), (5, 2), (6, 1)]);
        assert_eq!(r.items[0].2, 300, "the payload travels with its item");
        assert_eq!(
            (r.unreadable, r.done, r.next_seq, r.next_segment),
            (0, 3, 7, 3)
        );
        assert_eq!(l.current(), 3);
        assert_eq!(l.live(), 3);
        // Tenant 1's two recovered items are marked done first, in order.
        l.mark_done(&1, 2);
        assert_eq!(l.take_marks(), [3, 6]);
        l.mark_done(&2, 1);
        l.take_marks();
        assert_eq!(deletions(&mut l), [1, 2]);
    }

    #[test]
    fn recovery_counts_holes_in_a_known_range_unless_marked_done() {
        // D4: seq 2 unreadable (counted), seq 5 unreadable but marked done
        // (not counted), seq 7 past the seal's end (a torn tail of the last
        // segment has no known end: not counted).
        let segments = vec![
            seg(1, 1, Some(4), &[(1, 1), (3, 1)], &[]),
            seg(2, 4, Some(7), &[(4, 1), (6, 1)], &[5]),
            seg(3, 7, None, &[], &[]),
        ];
        let Restage {
            keep,
            unreadable,
            done,
            ..
        } = restage(&segments);
        assert_eq!(unreadable, 1);
        assert_eq!(done, 0);
        assert_eq!(keep.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 3, 4, 6]);
    }

    #[test]
    fn recovery_counts_undecodable_items_as_unreadable() {
        let mut s = seg(1, 1, None, &[(1, 1)], &[]);
        s.undecodable.push(2);
        let (r, _) = Recovery::new(vec![s], limits(1_000), H);
        assert_eq!(r.unreadable, 1);
        assert_eq!(r.items.len(), 1);
    }

    #[test]
    fn an_empty_segment_sharing_its_first_with_the_next_is_told_apart() {
        // Found by tests/journal_model.rs: a recovered empty segment 1 and
        // the new segment 2 both start at sequence 1; deleting 1 must not
        // make sequence 1 unfindable in 2.
        let segments = vec![seg(1, 1, Some(1), &[], &[])];
        let (_, mut l) = Recovery::new(segments, limits(1_000), H);
        assert_eq!(deletions(&mut l), [1]);
        l.append(5, 10, H).unwrap();
        l.mark_done(&5, 1);
        assert_eq!(l.take_marks(), [1]);
        assert_eq!(l.live(), 0);
    }

    #[test]
    fn a_recovered_segment_kept_for_its_marks_keeps_the_marks_of_its_items() {
        // Found by tests/journal_model.rs: segment 2 holds item 3 (done)
        // and the mark of item 1 (segment 1, live): it is kept. Segment 3
        // holds the mark of item 3: deleting it would bring item 3 back
        // after the next crash.
        let segments = vec![
            seg(1, 1, Some(3), &[(1, 1), (2, 1)], &[]),
            seg(2, 3, Some(4), &[(3, 2)], &[1]),
            seg(3, 4, Some(4), &[], &[3]),
        ];
        let (r, mut l) = Recovery::new(segments, limits(1_000), H);
        assert_eq!(r.items.iter().map(|x| x.0).collect::<Vec<_>>(), [2]);
        assert_eq!(deletions(&mut l), [] as [u64; 0]);
        l.mark_done(&1, 1);
        l.take_marks();
        assert_eq!(deletions(&mut l), [1, 2, 3]);
    }

    #[test]
    fn items_of_another_version_are_counted_apart_and_keep_their_numbers() {
        // S-J14: seq 2 and 4 are of another codec version (4 marked done),
        // seq 5 the last one on disk: refused, not unreadable, and the
        // next item is numbered past them.
        let mut s = seg(1, 1, None, &[(1, 1), (3, 1)], &[4]);
        s.other = vec![2, 4, 5];
        let (r, l) = Recovery::new(vec![s], limits(1_000), H);
        assert_eq!((r.unreadable, r.other, r.done), (0, 2, 0));
        assert_eq!(r.items.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(r.next_seq, 6);
        assert_eq!(l.live(), 2, "refused items are not live");
    }

    #[test]
    fn recovery_of_nothing_starts_at_one() {
        let (r, l) = Recovery::<u32, u64>::new(Vec::new(), limits(1_000), H);
        assert_eq!((r.next_seq, r.next_segment, r.unreadable), (1, 1, 0));
        assert_eq!(l.current(), 1);
        assert_eq!(l.segments(), 1);
    }

    #[test]
    fn a_fully_done_recovered_segment_is_deletable_at_once() {
        let segments = vec![seg(1, 1, Some(3), &[(1, 1), (2, 1)], &[1, 2])];
        let (r, mut l) = Recovery::new(segments, limits(1_000), H);
        assert!(r.items.is_empty());
        assert_eq!(deletions(&mut l), [1]);
    }
}
