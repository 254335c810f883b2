//! The journal's on-disk format (S-J7): segment files of checksummed
//! records, and the scanner that reads them back through damage.
//!
//! A segment file is named `segment-{id:016x}.journal` and holds:
//!
//! ```text
//! header  (32 bytes): magic "outboxJ\0" · version u16 · 0u16 · segment id u64
//!                     · first sequence number u64 · crc32c of the 28 bytes before, u32
//! record  (repeated): body length u32 · crc32c(length bytes ++ body) u32 · body
//! body:   kind u8, then
//!         1 item (version 1): sequence u64 · tenant length u32 · tenant bytes · item bytes
//!         2 done: sequence u64, repeated (done marks)
//!         3 seal: end sequence u64 (every item of the segment is below it)
//!         4 schema (version 2): codec version u32 · the item type's name (UTF-8)
//!         5 item (version 2): sequence u64 · staged at u64 (ms since the Unix
//!           epoch, 0 unknown) · codec version u32 · tenant length u32
//!           · tenant bytes · item bytes
//!         6 attempts: life u64 · sequence u64, repeated (S-J17: these
//!           items' attempts in that life start once it is on disk)
//!         7 life: life u64 · (sequence u64 · crashes u32), repeated (a
//!           life's start after a recovery, with the crashes counted)
//!         8 clean: life u64 (that life closed cleanly)
//!         9 ended: life u64 · sequence u64, repeated (S-J17: these
//!           items' attempts in that life came back failed and wait for
//!           a retry; an attempt mark after it starts the next one)
//! ```
//!
//! A life is numbered by the first segment it created. The kinds 6 to 9
//! are read by this version only: an older one skips them as damage. A
//! version 2 journal written before kind 9 existed recovers: its marked
//! attempts have no end, so each counts as cut, as it did then (S-J15).
//!
//! Integers are little-endian. A record is valid when its length is
//! within bounds and its checksum matches; the scanner skips an invalid
//! stretch by looking for the next valid record (a chance match is 1 in
//! 2^32), so one damaged record costs only itself.
//!
//! Format version 2 (S-J14) writes a schema record right after every
//! header, in the same write (the type's name, shown by the inspector and
//! never used to refuse), and items of kind 5, each carrying the codec's
//! version (so a damaged schema record costs no item) and its staging
//! time. Version 1 segments are still read: their items are of codec
//! version 0, their staging time unknown.

use std::ops::Range;

use crate::core::journal::{Record as Numbered, Sizes};

/// The first 8 bytes of every segment.
pub const MAGIC: [u8; 8] = *b"outboxJ\0";
/// The format version this code writes (it reads [`V1`] too, S-J14).
pub const VERSION: u16 = 2;
/// The previous format version, still read: items of codec version 0,
/// no schema record, no staging time (S-J14).
pub const V1: u16 = 1;
/// Bytes in a segment header.
pub const HEADER_LEN: usize = 32;
/// Bytes before a record's body: length and checksum.
pub const FRAME_LEN: usize = 8;
/// The largest record body accepted (64 MiB): a longer length field is
/// damage, and an item that would need more is refused at stage.
pub const MAX_BODY: usize = 64 << 20;
/// Bytes of a seal record.
pub const SEAL_LEN: usize = FRAME_LEN + 1 + 8;
/// Bytes of an item record around its tenant and item bytes.
pub const ITEM_OVERHEAD: usize = FRAME_LEN + 1 + 8 + 8 + 4 + 4;
/// Bytes of a schema record around the type's name.
pub const SCHEMA_OVERHEAD: usize = FRAME_LEN + 1 + 4;
/// The longest type name a schema record keeps (longer ones are cut at a
/// character boundary: the name is only shown).
pub const MAX_TYPE_NAME: usize = 1_024;

const KIND_ITEM_V1: u8 = 1;
const KIND_DONE: u8 = 2;
const KIND_SEAL: u8 = 3;
const KIND_SCHEMA: u8 = 4;
const KIND_ITEM: u8 = 5;
const KIND_ATTEMPTS: u8 = 6;
const KIND_LIFE: u8 = 7;
const KIND_CLEAN: u8 = 8;
const KIND_ENDED: u8 = 9;
/// Where an item record's fields sit in its framed bytes.
const AT_SEQ: usize = FRAME_LEN + 1;
const AT_STAGED: usize = AT_SEQ + 8;
const AT_VERSION: usize = AT_STAGED + 8;
const AT_TENANT_LEN: usize = AT_VERSION + 4;

/// What a journal's records say of their items' type (S-J14): the codec's
/// version (compared at recovery) and the type's name (only shown).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schema {
    /// The codec's version ([`Codec::version`](crate::codec::Codec::version)).
    pub version: u32,
    /// The item type's name ([`Codec::item_type`](crate::codec::Codec::item_type)),
    /// at most [`MAX_TYPE_NAME`] bytes.
    pub name: String,
}

impl Schema {
    /// The schema of `version` and `name` (cut to [`MAX_TYPE_NAME`] bytes).
    pub fn new(version: u32, name: &str) -> Self {
        let mut end = name.len().min(MAX_TYPE_NAME);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        Schema {
            version,
            name: name[..end].to_owned(),
        }
    }

    /// The bytes a segment starts with: its header, then the schema
    /// record, written and synced together (S-J7, S-J14).
    pub fn head(&self, id: u64, first: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.head_len());
        out.extend_from_slice(&header(id, first));
        frame(&mut out, |b| {
            b.push(KIND_SCHEMA);
            b.extend_from_slice(&self.version.to_le_bytes());
            b.extend_from_slice(self.name.as_bytes());
        });
        out
    }

    /// Bytes of [`head`](Self::head).
    pub fn head_len(&self) -> usize {
        HEADER_LEN + SCHEMA_OVERHEAD + self.name.len()
    }

    /// The record sizes the journal machine counts with, for segments
    /// headed by this schema.
    pub fn sizes(&self) -> Sizes {
        Sizes {
            header: self.head_len() as u64,
            ..SIZES
        }
    }
}

/// What an item record carries besides its tenant and item (S-J14,
/// S-J15): the codec's version and the wall-clock time of its stage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    /// The codec's version.
    pub version: u32,
    /// Milliseconds since the Unix epoch at its stage; 0 when unknown.
    pub staged_ms: u64,
}

/// The file name of segment `id`.
pub fn segment_name(id: u64) -> String {
    format!("segment-{id:016x}.journal")
}

/// The segment id a file name stands for, if it is a segment's name.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("segment-")?.strip_suffix(".journal")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// A segment's header: its id and first sequence number. A segment of
/// this version starts with [`Schema::head`] (the header and the schema
/// record).
pub fn header(id: u64, first: u64) -> [u8; HEADER_LEN] {
    header_of(VERSION, id, first)
}

/// A header of format `version` (for tests that write older journals).
pub fn header_of(version: u16, id: u64, first: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..10].copy_from_slice(&version.to_le_bytes());
    h[12..20].copy_from_slice(&id.to_le_bytes());
    h[20..28].copy_from_slice(&first.to_le_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// What a header says: the recovery plan's
/// [`Head`](crate::core::journal::Head) (a damaged
/// header's fields cannot be trusted; a short one is a crash while
/// creating the segment).
pub use crate::core::journal::Head as Header;

/// Reads the header at the start of `bytes`.
pub fn read_header(bytes: &[u8]) -> Header {
    if bytes.len() < HEADER_LEN {
        let n = bytes.len().min(8);
        return if bytes[..n] == MAGIC[..n] {
            Header::Short
        } else {
            Header::Foreign
        };
    }
    let h = &bytes[..HEADER_LEN];
    let magic_off: u32 = h[..8]
        .iter()
        .zip(MAGIC)
        .map(|(a, b)| (a ^ b).count_ones())
        .sum();
    if magic_off > 1 {
        return Header::Foreign;
    }
    let crc = u32::from_le_bytes(h[28..32].try_into().expect("4 bytes"));
    if magic_off == 1 || crc32c::crc32c(&h[..28]) != crc {
        return Header::Damaged;
    }
    let version = u16::from_le_bytes([h[8], h[9]]);
    if version != VERSION && version != V1 {
        return Header::Version(version);
    }
    Header::Valid {
        id: u64_at(h, 12),
        first: u64_at(h, 20),
        v1: version == V1,
    }
}

/// Whether `bytes`, a whole segment file, is what a crash while creating
/// it can leave: no more than a header's length, not a valid header, and
/// its first bytes the magic's or zeros (the header's write lost, torn,
/// or never made).
pub fn torn_header(bytes: &[u8]) -> bool {
    if bytes.len() > HEADER_LEN
        || matches!(
            read_header(bytes),
            Header::Valid { .. } | Header::Version(_)
        )
    {
        return false;
    }
    let n = bytes.len().min(MAGIC.len());
    bytes[..n] == MAGIC[..n] || bytes[..n].iter().all(|&b| b == 0)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Appends a framed record with `body` to `out`.
fn frame(out: &mut Vec<u8>, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_LEN]);
    body(out);
    seal_frame(&mut out[start..]);
}

/// Writes the length and checksum of the frame `f` (its body in place).
fn seal_frame(f: &mut [u8]) {
    let len = u32::try_from(f.len() - FRAME_LEN).unwrap_or(u32::MAX);
    f[..4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&f[..4]), &f[FRAME_LEN..]);
    f[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Computes the checksum of every record in `records`: framed records
/// back to back, as [`EncodedItem::frame_unsealed`], [`done`] and [`seal`]
/// leave them. Stops at a length that runs past the end (never written
/// by this module).
pub fn seal_records(records: &mut [u8]) {
    let mut at = 0;
    while let Some(head) = records.get(at..at + FRAME_LEN) {
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
        let end = at + FRAME_LEN + len;
        let Some(f) = records.get_mut(at..end) else {
            return;
        };
        seal_frame(f);
        at = end;
    }
}

/// A done record's bytes besides its marks: the frame and the kind.
pub const DONE_OVERHEAD: usize = FRAME_LEN + 1;
/// One done mark's bytes (a sequence number, little-endian).
pub const MARK_LEN: usize = 8;
/// Marks in one done record at most.
pub const MARKS_PER_RECORD: usize = 8_192;

/// The record sizes the journal machine counts with, but the header's:
/// [`Schema::sizes`] adds the schema record a segment starts with.
pub const SIZES: Sizes = Sizes {
    header: HEADER_LEN as u64,
    seal: SEAL_LEN as u64,
    done: DONE_OVERHEAD as u64,
    mark: MARK_LEN as u64,
    marks_per_record: MARKS_PER_RECORD,
};

/// Bytes [`done`] appends for `n` marks.
pub fn done_len(n: usize) -> usize {
    n.div_ceil(MARKS_PER_RECORD) * DONE_OVERHEAD + n * MARK_LEN
}

/// Bytes [`note`] appends for the attempt-end marks (kind 9, S-J17) of
/// `n` items: the records of a life's number and `n` sequence numbers,
/// at most [`MARKS_PER_RECORD`] in each. The same as the attempt marks'
/// (kind 6) of `n` items.
#[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
pub fn ended_len(n: usize) -> usize {
    n.div_ceil(MARKS_PER_RECORD) * (DONE_OVERHEAD + 8) + n * MARK_LEN
}

/// Appends a done record marking `seqs` to `out` (in records of at most
/// [`MARKS_PER_RECORD`] marks each).
pub fn done(out: &mut Vec<u8>, seqs: &[u64]) {
    for chunk in seqs.chunks(MARKS_PER_RECORD) {
        frame(out, |b| {
            b.push(KIND_DONE);
            for s in chunk {
                b.extend_from_slice(&s.to_le_bytes());
            }
        });
    }
}

/// Appends the records of `note` (S-J17) to `out`: attempt and life
/// records in records of at most [`MARKS_PER_RECORD`] entries each.
pub fn note(out: &mut Vec<u8>, note: &crate::core::journal::Note) {
    use crate::core::journal::Note;
    match note {
        Note::Attempts { life, seqs } => life_marks(out, KIND_ATTEMPTS, *life, seqs),
        Note::Ended { life, seqs } => life_marks(out, KIND_ENDED, *life, seqs),
        Note::Life { life, counts } => {
            let mut chunks = counts.chunks(MARKS_PER_RECORD).peekable();
            if chunks.peek().is_none() {
                frame(out, |b| {
                    b.push(KIND_LIFE);
                    b.extend_from_slice(&life.to_le_bytes());
                });
            }
            for chunk in chunks {
                frame(out, |b| {
                    b.push(KIND_LIFE);
                    b.extend_from_slice(&life.to_le_bytes());
                    for (s, n) in chunk {
                        b.extend_from_slice(&s.to_le_bytes());
                        b.extend_from_slice(&n.to_le_bytes());
                    }
                });
            }
        }
        Note::Clean { life } => frame(out, |b| {
            b.push(KIND_CLEAN);
            b.extend_from_slice(&life.to_le_bytes());
        }),
    }
}

/// Appends records of `kind` holding `life` and `seqs`, at most
/// [`MARKS_PER_RECORD`] in each.
fn life_marks(out: &mut Vec<u8>, kind: u8, life: u64, seqs: &[u64]) {
    for chunk in seqs.chunks(MARKS_PER_RECORD) {
        frame(out, |b| {
            b.push(kind);
            b.extend_from_slice(&life.to_le_bytes());
            for s in chunk {
                b.extend_from_slice(&s.to_le_bytes());
            }
        });
    }
}

/// Appends a seal record (`end`: every item of the segment is below it).
pub fn seal(out: &mut Vec<u8>, end: u64) {
    frame(out, |b| {
        b.push(KIND_SEAL);
        b.extend_from_slice(&end.to_le_bytes());
    });
}

/// An item record encoded outside any lock, still without its sequence
/// number: [`EncodedItem::frame_unsealed`] copies it into the group-commit
/// buffer and adds the number there (cheap, done under the lock when the
/// number is known); [`seal_records`] adds the checksum at commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedItem {
    bytes: Vec<u8>,
}

impl EncodedItem {
    /// Builds the record from the tenant's and the item's bytes, written
    /// by `tenant` and `item` into the buffer they are given.
    ///
    /// # Errors
    /// Whatever `tenant` or `item` returns; a body over [`MAX_BODY`]
    /// bytes (`TooLarge`).
    /// The record carries codec version 0 and no staging time.
    #[cfg(any(test, feature = "testkit"))]
    pub fn new<E>(
        tenant: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
        item: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<Self, EncodeFailure<E>> {
        Self::new_in(Vec::new(), Stamp::default(), tenant, item).map_err(|(e, _)| e)
    }

    /// Like [`new`](Self::new), with `stamp`'s version and staging time.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    #[cfg(any(test, feature = "testkit"))]
    pub fn stamped<E>(
        stamp: Stamp,
        tenant: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
        item: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<Self, EncodeFailure<E>> {
        Self::new_in(Vec::new(), stamp, tenant, item).map_err(|(e, _)| e)
    }

    /// Like [`stamped`](Self::stamped), in `buffer` (cleared first): a
    /// caller that encodes many records reuses one buffer through
    /// [`into_buffer`](Self::into_buffer) instead of allocating one per
    /// record.
    ///
    /// # Errors
    /// As [`new`](Self::new), with `buffer` handed back.
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    pub fn new_in<E>(
        mut buffer: Vec<u8>,
        stamp: Stamp,
        tenant: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
        item: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<Self, (EncodeFailure<E>, Vec<u8>)> {
        buffer.clear();
        match encode_item(&mut buffer, stamp, tenant, item) {
            Ok(()) => Ok(EncodedItem { bytes: buffer }),
            Err(e) => Err((e, buffer)),
        }
    }

    /// The record, as the journal machine's `append` takes it.
    pub fn unsealed(&self) -> Unsealed<'_> {
        Unsealed(&self.bytes)
    }

    /// Bytes the framed record takes.
    #[cfg(any(test, feature = "testkit"))]
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Never: a record has at least its frame.
    #[cfg(feature = "testkit")]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Appends the framed record with sequence number `seq` to `out`, as
    /// [`Unsealed::frame_unsealed`].
    pub fn frame_unsealed(&self, seq: u64, out: &mut Vec<u8>) {
        self.unsealed().frame_unsealed(seq, out);
    }

    /// The buffer the record was built in, for the next
    /// [`new_in`](Self::new_in).
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    pub fn into_buffer(self) -> Vec<u8> {
        self.bytes
    }
}

/// Writes an item record at the end of `b`: the frame and the sequence
/// number left zero, the stamp, the tenant's bytes, their length, the
/// item's bytes. On an error, `b` may hold part of a record past its old
/// end.
fn encode_item<E>(
    b: &mut Vec<u8>,
    stamp: Stamp,
    tenant: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    item: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<(), EncodeFailure<E>> {
    let start = b.len();
    // The fixed part in one copy (a stage's record is mostly this part):
    // the frame and the sequence number are written at the append, the
    // tenant's length once the tenant is encoded.
    let mut fixed = [0; ITEM_OVERHEAD];
    fixed[FRAME_LEN] = KIND_ITEM;
    fixed[AT_STAGED..AT_VERSION].copy_from_slice(&stamp.staged_ms.to_le_bytes());
    fixed[AT_VERSION..AT_TENANT_LEN].copy_from_slice(&stamp.version.to_le_bytes());
    b.extend_from_slice(&fixed);
    tenant(b).map_err(EncodeFailure::Codec)?;
    let tenant_len =
        u32::try_from(b.len() - start - ITEM_OVERHEAD).map_err(|_| EncodeFailure::TooLarge)?;
    b[start + AT_TENANT_LEN..start + ITEM_OVERHEAD].copy_from_slice(&tenant_len.to_le_bytes());
    item(b).map_err(EncodeFailure::Codec)?;
    if b.len() - start - FRAME_LEN > MAX_BODY {
        return Err(EncodeFailure::TooLarge);
    }
    Ok(())
}

/// A framed item record without its sequence number and checksum,
/// borrowed from an [`EncodedItem`] or an [`EncodedRun`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsealed<'a>(&'a [u8]);

impl Unsealed<'_> {
    /// Bytes the framed record takes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never: a record has at least its frame.
    #[cfg(feature = "testkit")]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Appends the framed record with sequence number `seq` to `out`: one
    /// copy, then the number and the length written in place. Its checksum
    /// is left for [`seal_records`] (the committer computes it, off the
    /// outbox's lock): until then the record is not valid.
    pub fn frame_unsealed(&self, seq: u64, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(self.0);
        let f = &mut out[start..];
        f[AT_SEQ..AT_SEQ + 8].copy_from_slice(&seq.to_le_bytes());
        let len = u32::try_from(f.len() - FRAME_LEN).unwrap_or(u32::MAX);
        f[..4].copy_from_slice(&len.to_le_bytes());
    }
}

impl Numbered for Unsealed<'_> {
    fn framed_len(&self) -> usize {
        self.0.len()
    }

    fn frame(&self, seq: u64, out: &mut Vec<u8>) {
        self.frame_unsealed(seq, out);
    }
}

impl Numbered for &EncodedItem {
    fn framed_len(&self) -> usize {
        self.bytes.len()
    }

    fn frame(&self, seq: u64, out: &mut Vec<u8>) {
        self.frame_unsealed(seq, out);
    }
}

impl<'a> From<&'a EncodedItem> for Unsealed<'a> {
    fn from(item: &'a EncodedItem) -> Self {
        item.unsealed()
    }
}

/// Many item records encoded outside any lock into one buffer, each found
/// again by its index: a run of stages allocates once, not once per item
/// (S-W20).
#[derive(Clone, Debug, Default)]
pub struct EncodedRun {
    bytes: Vec<u8>,
    /// Each record's start and end in `bytes`.
    spans: Vec<(usize, usize)>,
}

impl EncodedRun {
    /// An empty run in `buffer` (cleared first), for reuse through
    /// [`into_buffer`](Self::into_buffer).
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    pub fn new_in(mut buffer: Vec<u8>) -> Self {
        buffer.clear();
        EncodedRun {
            bytes: buffer,
            spans: Vec::new(),
        }
    }

    /// Encodes one more record, as [`EncodedItem::stamped`] does; returns its
    /// index. A failed record takes no index (its bytes, if any, are
    /// dropped).
    ///
    /// # Errors
    /// As [`EncodedItem::new`].
    pub fn push<E>(
        &mut self,
        stamp: Stamp,
        tenant: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
        item: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<usize, EncodeFailure<E>> {
        let start = self.bytes.len();
        match encode_item(&mut self.bytes, stamp, tenant, item) {
            Ok(()) => {
                self.spans.push((start, self.bytes.len()));
                Ok(self.spans.len() - 1)
            }
            Err(e) => {
                self.bytes.truncate(start);
                Err(e)
            }
        }
    }

    /// An empty run that allocates nothing yet.
    pub const fn new() -> Self {
        EncodedRun {
            bytes: Vec::new(),
            spans: Vec::new(),
        }
    }

    /// Empties the run, keeping its buffers for the next records.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.spans.clear();
    }

    /// Bytes of memory the run's buffers hold, used or not.
    pub fn held_bytes(&self) -> usize {
        let span = std::mem::size_of::<(usize, usize)>();
        self.bytes.capacity() + self.spans.capacity() * span
    }

    /// The record of index `i`, if [`push`](Self::push) gave it.
    pub fn get(&self, i: usize) -> Option<Unsealed<'_>> {
        let &(start, end) = self.spans.get(i)?;
        Some(Unsealed(&self.bytes[start..end]))
    }

    /// Records in the run.
    #[cfg(any(test, feature = "testkit"))]
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether the run holds no record.
    #[cfg(any(test, feature = "testkit"))]
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The buffer, for the next [`new_in`](Self::new_in).
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    pub fn into_buffer(self) -> Vec<u8> {
        self.bytes
    }
}

/// Why an item could not be encoded.
#[derive(Debug)]
pub enum EncodeFailure<E> {
    /// The codec failed.
    Codec(E),
    /// The record would pass [`MAX_BODY`].
    TooLarge,
}

/// One record read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// An item: its sequence number, tenant bytes and item bytes.
    Item {
        /// Sequence number.
        seq: u64,
        /// Its codec version and staging time (version 0, time 0 in a
        /// version 1 segment).
        stamp: Stamp,
        /// The tenant, as the codec encoded it.
        tenant: &'a [u8],
        /// The item, as the codec encoded it.
        item: &'a [u8],
    },
    /// Done marks.
    Done(Vec<u64>),
    /// The segment's seal.
    Seal(u64),
    /// What the segment's items are (S-J14): the codec's version and the
    /// type's name (lossy UTF-8).
    Schema {
        /// The codec's version.
        version: u32,
        /// The item type's name.
        name: String,
    },
    /// Attempt marks of a life (S-J17).
    Attempts {
        /// The life.
        life: u64,
        /// The items.
        seqs: Vec<u64>,
    },
    /// A life's start after a recovery, with the crashes counted (S-J17).
    Life {
        /// The life.
        life: u64,
        /// `(item, crashes)`.
        counts: Vec<(u64, u32)>,
    },
    /// A life closed cleanly (S-J17).
    Clean(u64),
    /// Attempt-end marks of a life (S-J17): these items' attempts came
    /// back failed and wait for a retry.
    Ended {
        /// The life.
        life: u64,
        /// The items.
        seqs: Vec<u64>,
    },
}

/// What [`scan`] found in a segment's records.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan<'a> {
    /// The valid records, in file order.
    pub records: Vec<Record<'a>>,
    /// Byte ranges skipped as damaged between valid records.
    pub skipped: Vec<Range<usize>>,
    /// Where the last valid record ends: past it is a torn or damaged
    /// tail (empty when the file ends there).
    pub valid_end: usize,
}

/// Reads the records of a segment's bytes from `start` (after the
/// header). Never panics on any input.
pub fn scan(bytes: &[u8], start: usize) -> Scan<'_> {
    let mut out = Scan {
        valid_end: start.min(bytes.len()),
        ..Scan::default()
    };
    let mut at = start;
    while at < bytes.len() {
        match record_at(bytes, at) {
            Some((record, next)) => {
                out.records.push(record);
                at = next;
                out.valid_end = next;
            }
            None => match (at + 1..bytes.len()).find(|&o| record_at(bytes, o).is_some()) {
                Some(next) => {
                    out.skipped.push(at..next);
                    at = next;
                }
                None => break,
            },
        }
    }
    out
}

/// The valid record at `at`, and where the next one starts.
fn record_at(bytes: &[u8], at: usize) -> Option<(Record<'_>, usize)> {
    let head = bytes.get(at..at.checked_add(FRAME_LEN)?)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    if len == 0 || len > MAX_BODY {
        return None;
    }
    let end = at + FRAME_LEN + len;
    let body = bytes.get(at + FRAME_LEN..end)?;
    let crc = u32::from_le_bytes(head[4..8].try_into().ok()?);
    if crc32c::crc32c_append(crc32c::crc32c(&head[..4]), body) != crc
        && !super::canary::on(super::canary::NO_CHECKSUM)
    {
        return None;
    }
    parse_body(body).map(|r| (r, end))
}

fn parse_body(body: &[u8]) -> Option<Record<'_>> {
    let (&kind, rest) = body.split_first()?;
    match kind {
        KIND_ITEM_V1 => {
            let seq = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
            let (tenant, item) = tenant_item(rest.get(8..)?)?;
            let stamp = Stamp::default();
            Some(Record::Item {
                seq,
                stamp,
                tenant,
                item,
            })
        }
        KIND_ITEM => {
            let seq = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
            let staged_ms = u64::from_le_bytes(rest.get(8..16)?.try_into().ok()?);
            let version = u32::from_le_bytes(rest.get(16..20)?.try_into().ok()?);
            let (tenant, item) = tenant_item(rest.get(20..)?)?;
            let stamp = Stamp { version, staged_ms };
            Some(Record::Item {
                seq,
                stamp,
                tenant,
                item,
            })
        }
        KIND_SCHEMA => Some(Record::Schema {
            version: u32::from_le_bytes(rest.get(..4)?.try_into().ok()?),
            name: String::from_utf8_lossy(&rest[4..]).into_owned(),
        }),
        KIND_DONE if rest.len() % 8 == 0 => Some(Record::Done(
            rest.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        )),
        KIND_SEAL if rest.len() == 8 => {
            Some(Record::Seal(u64::from_le_bytes(rest.try_into().ok()?)))
        }
        KIND_ATTEMPTS | KIND_ENDED if rest.len() >= 8 && rest.len() % 8 == 0 => {
            let mut words = rest
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
            let life = words.next()?;
            let seqs = words.collect();
            Some(if kind == KIND_ATTEMPTS {
                Record::Attempts { life, seqs }
            } else {
                Record::Ended { life, seqs }
            })
        }
        KIND_LIFE if rest.len() >= 8 && (rest.len() - 8) % 12 == 0 => {
            let life = u64::from_le_bytes(rest[..8].try_into().ok()?);
            let counts = rest[8..]
                .chunks_exact(12)
                .map(|c| {
                    let seq = u64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
                    let n = u32::from_le_bytes(c[8..].try_into().expect("4 bytes"));
                    (seq, n)
                })
                .collect();
            Some(Record::Life { life, counts })
        }
        KIND_CLEAN if rest.len() == 8 => {
            Some(Record::Clean(u64::from_le_bytes(rest.try_into().ok()?)))
        }
        _ => None,
    }
}

/// A tenant's length, its bytes, then the item's bytes.
fn tenant_item(rest: &[u8]) -> Option<(&[u8], &[u8])> {
    let tlen = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let tenant = rest.get(4..4usize.checked_add(tlen)?)?;
    let item = rest.get(4 + tlen..)?;
    Some((tenant, item))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(t: u8) -> impl FnOnce(&mut Vec<u8>) -> Result<(), ()> {
        move |b| {
            b.push(t);
            Ok(())
        }
    }

    fn body(bytes: &'static [u8]) -> impl FnOnce(&mut Vec<u8>) -> Result<(), ()> {
        move |b| {
            b.extend_from_slice(bytes);
            Ok(())
        }
    }

    /// The item record's bytes, field by field as the format says: a
    /// change of layout fails here before it misreads a journal on disk.
    #[test]
    fn an_item_records_bytes_are_the_formats() {
        let mut run = EncodedRun::new();
        let stamp = Stamp {
            version: 0x0a0b_0c0d,
            staged_ms: 0x0102_0304_0506_0708,
        };
        let i = run
            .push(stamp, body(b"tenant"), body(&[0xac, 0x02]))
            .unwrap();
        let mut out = vec![0xee];
        run.get(i)
            .unwrap()
            .frame_unsealed(0x1122_3344_5566_7788, &mut out);
        let mut expected = vec![0xee];
        let body_len = 1 + 8 + 8 + 4 + 4 + 6 + 2;
        expected.extend_from_slice(&(body_len as u32).to_le_bytes()); // length
        expected.extend_from_slice(&[0; 4]); // checksum, left for the seal
        expected.push(KIND_ITEM);
        expected.extend_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
        expected.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        expected.extend_from_slice(&0x0a0b_0c0du32.to_le_bytes());
        expected.extend_from_slice(&6u32.to_le_bytes()); // the tenant's length
        expected.extend_from_slice(b"tenant");
        expected.extend_from_slice(&[0xac, 0x02]);
        assert_eq!(out, expected);
    }

    #[test]
    fn a_run_holds_each_record_as_an_item_would_and_skips_failed_ones() {
        let mut run = EncodedRun::new_in(vec![9; 100]);
        assert!(run.is_empty());
        assert!(matches!(
            run.push(Stamp::default(), tenant(1), body(b"abc")),
            Ok(0)
        ));
        // A codec failure after the tenant's bytes: no index, no bytes.
        assert!(matches!(
            run.push(Stamp::default(), tenant(2), |_| Err(())),
            Err(EncodeFailure::Codec(()))
        ));
        assert!(matches!(
            run.push(Stamp::default(), tenant(3), body(b"")),
            Ok(1)
        ));
        assert_eq!(run.len(), 2);
        assert_eq!(run.get(2), None);
        for (i, (t, bytes)) in [(1u8, &b"abc"[..]), (3, &b""[..])].into_iter().enumerate() {
            let alone = EncodedItem::new(tenant(t), |b| {
                b.extend_from_slice(bytes);
                Ok(())
            })
            .unwrap();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            run.get(i).unwrap().frame_unsealed(7, &mut a);
            alone.frame_unsealed(7, &mut b);
            assert_eq!(a, b, "record {i}");
            assert_eq!(run.get(i).unwrap().len(), alone.len());
        }
        // The failed record's bytes were cut: the buffer holds the two.
        let len = run.get(0).unwrap().len() + run.get(1).unwrap().len();
        assert_eq!(run.into_buffer().len(), len);
    }

    #[test]
    fn done_len_is_what_done_appends() {
        for n in [
            0,
            1,
            2,
            MARKS_PER_RECORD - 1,
            MARKS_PER_RECORD,
            MARKS_PER_RECORD + 1,
            20_000,
        ] {
            let seqs: Vec<u64> = (1..=n as u64).collect();
            let mut out = Vec::new();
            done(&mut out, &seqs);
            assert_eq!(out.len(), done_len(n), "{n} marks");
        }
    }

    /// S-J10, S-J17: the machine counts each record of the journal's
    /// lives, and each done record, at the bytes the format appends for
    /// it, across the record boundary too: the bound relies on it.
    #[test]
    fn s_j10_the_machine_counts_each_note_at_the_bytes_it_takes() {
        use crate::core::journal::Note;
        for n in [0, 1, 3, MARKS_PER_RECORD, MARKS_PER_RECORD + 1] {
            let seqs: Vec<u64> = (1..=n as u64).collect();
            let mut out = Vec::new();
            note(
                &mut out,
                &Note::Attempts {
                    life: 7,
                    seqs: seqs.clone(),
                },
            );
            assert_eq!(out.len() as u64, SIZES.attempts_len(n), "{n} attempt marks");
            let mut out = Vec::new();
            done(&mut out, &seqs);
            assert_eq!(out.len() as u64, SIZES.done_len(n), "{n} done marks");
            let counts: Vec<(u64, u32)> = seqs.iter().map(|&s| (s, 2)).collect();
            let mut out = Vec::new();
            note(&mut out, &Note::Life { life: 7, counts });
            assert_eq!(out.len() as u64, SIZES.life_len(n), "a life of {n} counts");
        }
        let mut out = Vec::new();
        note(&mut out, &Note::Clean { life: 7 });
        assert_eq!(out.len() as u64, SIZES.clean_len());
        let mut out = Vec::new();
        seal(&mut out, 9);
        assert_eq!(out.len() as u64, SIZES.seal);
    }

    /// S-J10, S-J17: the reserves hold the records they are kept for, at
    /// the bytes the format writes: the lone reserve two lives' starts (a
    /// roll's head and seal and a life record counting one crash each),
    /// one lone attempt mark and a clean-close record; the standing
    /// reserve adds the current segment's seal and two rolls.
    #[test]
    fn s_j10_the_reserves_hold_the_records_they_are_kept_for() {
        use crate::core::journal::Note;
        let schema = Schema::new(3, "an item type");
        let sizes = schema.sizes();
        let len = |n: Note| {
            let mut out = Vec::new();
            note(&mut out, &n);
            out.len() as u64
        };
        let head = schema.head(2, 1).len() as u64;
        let mut out = Vec::new();
        seal(&mut out, 9);
        let seal = out.len() as u64;
        let life = len(Note::Life {
            life: 2,
            counts: vec![(5, 1)],
        });
        let attempt = len(Note::Attempts {
            life: 2,
            seqs: vec![5],
        });
        let clean = len(Note::Clean { life: 2 });
        let lone = 2 * (head + seal + life) + attempt + clean;
        assert_eq!(sizes.lone_reserve(), lone);
        assert_eq!(sizes.standing(), seal + 2 * (head + seal) + lone);
    }

    #[test]
    fn attempt_end_marks_round_trip_and_ended_len_is_what_note_appends() {
        use crate::core::journal::Note;
        for n in [0, 1, 3, MARKS_PER_RECORD, MARKS_PER_RECORD + 1] {
            let seqs: Vec<u64> = (1..=n as u64).collect();
            let mut out = Vec::new();
            note(&mut out, &Note::Ended { life: 7, seqs });
            assert_eq!(out.len(), ended_len(n), "{n} marks");
            assert_eq!(SIZES.ended_len(n), ended_len(n) as u64, "{n} marks");
        }
        let mut bytes = header(1, 1).to_vec();
        let mut records = Vec::new();
        note(
            &mut records,
            &Note::Attempts {
                life: 7,
                seqs: vec![4, 5],
            },
        );
        note(
            &mut records,
            &Note::Ended {
                life: 7,
                seqs: vec![4],
            },
        );
        seal_records(&mut records);
        bytes.extend_from_slice(&records);
        assert_eq!(
            scan(&bytes, HEADER_LEN).records,
            [
                Record::Attempts {
                    life: 7,
                    seqs: vec![4, 5]
                },
                Record::Ended {
                    life: 7,
                    seqs: vec![4]
                },
            ]
        );
    }

    fn item(seq: u64, tenant: &[u8], body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        EncodedItem::new::<()>(
            |b| {
                b.extend_from_slice(tenant);
                Ok(())
            },
            |b| {
                b.extend_from_slice(body);
                Ok(())
            },
        )
        .unwrap()
        .frame_unsealed(seq, &mut out);
        seal_records(&mut out);
        out
    }

    #[test]
    fn records_round_trip() {
        let mut bytes = header(3, 10).to_vec();
        bytes.extend(item(10, b"t1", b"hello"));
        bytes.extend(item(11, b"", b""));
        done(&mut bytes, &[10, 11]);
        seal(&mut bytes, 12);
        assert_eq!(
            read_header(&bytes),
            Header::Valid {
                id: 3,
                first: 10,
                v1: false
            }
        );
        let scan = scan(&bytes, HEADER_LEN);
        assert_eq!(
            scan.records,
            [
                Record::Item {
                    seq: 10,
                    stamp: Stamp::default(),
                    tenant: b"t1",
                    item: b"hello"
                },
                Record::Item {
                    seq: 11,
                    stamp: Stamp::default(),
                    tenant: b"",
                    item: b""
                },
                Record::Done(vec![10, 11]),
                Record::Seal(12),
            ]
        );
        assert!(scan.skipped.is_empty());
        assert_eq!(scan.valid_end, bytes.len());
    }

    #[test]
    fn an_unsealed_record_is_invalid_until_its_checksum_is_computed() {
        // The stage path frames without the checksum; the committer seals
        // every record of the buffer, whatever its kind, before writing.
        let enc = EncodedItem::new::<()>(
            |b| {
                b.push(7);
                Ok(())
            },
            |b| {
                b.extend_from_slice(b"payload");
                Ok(())
            },
        )
        .unwrap();
        let mut bytes = header(1, 5).to_vec();
        let mut records = Vec::new();
        enc.frame_unsealed(5, &mut records);
        done(&mut records, &[3]);
        enc.frame_unsealed(6, &mut records);
        seal(&mut records, 7);
        let mut unsealed = bytes.clone();
        unsealed.extend_from_slice(&records);
        let found = scan(&unsealed, HEADER_LEN).records;
        assert_eq!(found, [Record::Done(vec![3]), Record::Seal(7)]);
        seal_records(&mut records);
        bytes.extend_from_slice(&records);
        let scan = scan(&bytes, HEADER_LEN);
        let item = |seq| Record::Item {
            seq,
            stamp: Stamp::default(),
            tenant: &[7],
            item: b"payload",
        };
        assert_eq!(
            scan.records,
            [item(5), Record::Done(vec![3]), item(6), Record::Seal(7)]
        );
        assert_eq!(scan.valid_end, bytes.len());
    }

    #[test]
    fn segment_names_round_trip_and_others_are_not_segments() {
        assert_eq!(parse_segment_name(&segment_name(0xabc)), Some(0xabc));
        for name in [
            "LOCK",
            "segment-1.journal",
            "segment-000000000000000g.journal",
            "x",
        ] {
            assert_eq!(parse_segment_name(name), None, "{name}");
        }
    }

    #[test]
    fn a_damaged_record_in_the_middle_costs_only_itself() {
        let mut bytes = header(1, 1).to_vec();
        bytes.extend(item(1, b"t", b"a"));
        let second = bytes.len();
        bytes.extend(item(2, b"t", b"b"));
        let third = bytes.len();
        bytes.extend(item(3, b"t", b"c"));
        bytes[second + 12] ^= 0x10;
        let scan = scan(&bytes, HEADER_LEN);
        let seqs: Vec<u64> = scan
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Item { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect();
        assert_eq!(seqs, [1, 3]);
        assert_eq!(scan.skipped, vec![second..third]);
    }

    #[test]
    fn headers_tell_short_damaged_foreign_and_other_versions_apart() {
        let h = header(1, 1);
        assert_eq!(read_header(&h[..10]), Header::Short);
        assert_eq!(read_header(&[]), Header::Short);
        assert_eq!(
            read_header(b"PK\x03\x04 a zip file, not a journal at all"),
            Header::Foreign
        );
        let mut d = h;
        d[0] ^= 1;
        assert_eq!(read_header(&d), Header::Damaged);
        let mut d = h;
        d[21] ^= 4;
        assert_eq!(read_header(&d), Header::Damaged);
        let mut v = h;
        v[8] = 9;
        let crc = crc32c::crc32c(&v[..28]);
        v[28..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(read_header(&v), Header::Version(9));
    }

    #[test]
    fn an_oversized_item_is_refused_not_framed() {
        let big = vec![0u8; MAX_BODY];
        let r = EncodedItem::new::<()>(
            |_| Ok(()),
            |b| {
                b.extend_from_slice(&big);
                Ok(())
            },
        );
        assert!(matches!(r, Err(EncodeFailure::TooLarge)));
        let r = EncodedItem::new(|_| Err("no"), |_| Ok(()));
        assert!(matches!(r, Err(EncodeFailure::Codec("no"))));
    }
}
