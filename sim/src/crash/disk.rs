//! [`SimDisk`]: the journal's [`Storage`] on turmoil's simulated file
//! system (`unstable-fs`), plus the storage faults turmoil cannot switch
//! off when the faults stop, drawn deterministically from the seed.
//!
//! Turmoil gives the durability model: a write is pending until
//! `sync_data`, a create or delete until the directory is synced; a host
//! crash ([`turmoil::Sim::crash`]) drops every pending operation, and with
//! a block size (a share of seeds) a pending write may survive torn at a
//! block boundary. Its EIO and read-corruption probabilities and its
//! capacity are fixed for the whole simulation, so they could never stop
//! for the liveness checks (D5); and its I/O latency applies only to
//! `tokio::fs`, while the journal's storage is synchronous. So this
//! adapter injects, while the weather is not healed and from a stream of
//! its own ([`DiskFaults`]):
//! - EIO on any call (an append may write a prefix first, as a real
//!   `write` may);
//! - a full disk in windows of time (`StorageFull` on appends and creates);
//! - bit rot: a read may find a byte rotten, and that byte stays rotten for
//!   every later read (a bad sector; never in a segment's header, whose
//!   damage the journal refuses by design);
//! - crash points: the world arms a trip on the next call of one kind (a
//!   `sync` in a group commit, a `delete` of a segment, a `read` in
//!   recovery, …); the call fails without taking effect (an append first
//!   writes a prefix) and the world crashes the host before its next step:
//!   the process died inside that call.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use outbox::journal::{format, Storage};
use rand::Rng;
use turmoil::fs::shim::std::fs::{self as simfs, File, OpenOptions};

use super::ledger::UnstartedMarks;
use crate::draw::SimRng;
use crate::net::book::{self, Ev, SharedBook};

/// The journal's directory on the app host's disk.
pub const DIR: &str = "/journal";

/// A storage call, for crash points and counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Call {
    /// `list` (recovery).
    List,
    /// `read` (recovery).
    Read,
    /// `create` (a new segment).
    Create,
    /// `append` (a group commit's write, a seal).
    Append,
    /// `sync` (a group commit's `fdatasync`).
    Sync,
    /// `truncate` (recovery cuts a torn tail).
    Truncate,
    /// `delete` (a segment whose items are all done).
    Delete,
}

impl Call {
    /// The name in traces.
    pub fn as_str(self) -> &'static str {
        match self {
            Call::List => "list",
            Call::Read => "read",
            Call::Create => "create",
            Call::Append => "append",
            Call::Sync => "sync",
            Call::Truncate => "truncate",
            Call::Delete => "delete",
        }
    }
}

/// The storage faults of one seed (rates in parts per 1,000 calls).
#[derive(Clone, Copy, Debug, Default)]
pub struct DiskPlan {
    /// EIO on any call.
    pub eio: u32,
    /// A read finds a new rotten byte.
    pub rot: u32,
    /// The disk is full in these windows (virtual time).
    pub full: [Option<(Duration, Duration)>; 3],
    /// The no-`fdatasync` canary: `sync` succeeds without syncing.
    pub skip_sync: bool,
}

/// A crash point: the call of kind `call` after `skip` more of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trip {
    /// Which call.
    pub call: Call,
    /// How many such calls pass first.
    pub skip: u32,
    /// What the crash stands for in the trace ("during a group commit", …).
    pub what: &'static str,
}

/// The faults' state, shared by every [`SimDisk`] of the run and the world.
#[derive(Debug)]
pub struct DiskFaults {
    rng: SimRng,
    plan: DiskPlan,
    healed: bool,
    locked: bool,
    /// Rotten bytes per file: (offset, xor mask).
    rot: BTreeMap<String, Vec<(usize, u8)>>,
    armed: Option<Trip>,
    /// The armed trip fired: the process is dying; every call fails until
    /// the world has crashed the host.
    tripped: Option<&'static str>,
    /// Rot events injected (each damages at most one record).
    pub rot_events: u64,
    /// The items whose record a rotten byte hit (its pristine bytes a
    /// valid item record): from that read on the journal must never hand
    /// them to the sink again, and may lose them (D1, D4).
    pub rotten_items: BTreeSet<u64>,
    /// The sequence numbers whose attempt mark (S-J17) a rotten byte made
    /// unreadable (the mark's pristine record valid, the rotten one not):
    /// no recovery can know an earlier life attempted them (S-J16).
    pub rotten_marks: BTreeSet<u64>,
    /// Per file, the bytes appended since its last sync that worked, in
    /// this process: on no disk yet, but a crash may keep them (torn
    /// writes) and a later sync of the file (a resume's seal) makes them
    /// durable.
    unsynced: BTreeMap<String, Vec<u8>>,
    /// The item id of each sequence number, from the item records
    /// appended (the latest record of a number wins: a number whose
    /// record a crash lost is given again).
    seq_items: BTreeMap<u64, u64>,
    /// The attempt marks (S-J17) this process appended in a commit whose
    /// storage call failed, `(journal life, sequence number)` to item:
    /// their attempts did not start (on a journal that is down, a
    /// suspect's waits for a new commit of its marks), yet the marks may
    /// be on disk after a crash.
    failed_marks: UnstartedMarks,
    book: SharedBook,
}

/// [`DiskFaults`], shared.
pub type SharedFaults = Arc<Mutex<DiskFaults>>;

/// Locks the faults.
pub fn lock(f: &SharedFaults) -> MutexGuard<'_, DiskFaults> {
    f.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DiskFaults {
    /// The faults of `plan`, drawn from `rng`, logged in `book`.
    pub fn new(rng: SimRng, plan: DiskPlan, book: SharedBook) -> SharedFaults {
        Arc::new(Mutex::new(DiskFaults {
            rng,
            plan,
            healed: false,
            locked: false,
            rot: BTreeMap::new(),
            armed: None,
            tripped: None,
            rot_events: 0,
            rotten_items: BTreeSet::new(),
            rotten_marks: BTreeSet::new(),
            unsynced: BTreeMap::new(),
            seq_items: BTreeMap::new(),
            failed_marks: BTreeMap::new(),
            book,
        }))
    }

    /// Every fault stops (rotten bytes stay rotten: they are on the disk).
    pub fn heal(&mut self) {
        self.healed = true;
        self.armed = None;
    }

    /// Arms a crash point (replacing one not yet fired).
    pub fn arm(&mut self, trip: Trip) {
        if !self.healed {
            self.armed = Some(trip);
        }
    }

    /// Whether writes may fail in this run (EIO or a full disk drawn,
    /// and not healed yet): a failed commit's partial writes and one
    /// resume's segment may then pass the bound until a resume works
    /// (S-J10).
    pub fn writes_fail(&self) -> bool {
        !self.healed && (self.plan.eio > 0 || self.plan.full.iter().any(Option::is_some))
    }

    /// Whether a crash point is armed and not yet fired.
    pub fn is_armed(&self) -> bool {
        self.armed.is_some()
    }

    /// The crash point that fired, if one did since the last crash.
    pub fn tripped(&self) -> Option<&'static str> {
        self.tripped
    }

    /// The host crashed: the lock is free, the process no longer dying.
    pub fn crashed(&mut self) {
        self.locked = false;
        self.tripped = None;
        self.unsynced.clear();
        self.failed_marks.clear();
    }

    /// The attempt marks the process that just crashed appended in a
    /// commit that failed (S-J17), `(journal life, sequence number)` to
    /// item, taken once: the world counts the crash against such an item
    /// if its mark is on disk at the next start ([`attempt_marks`]).
    pub fn take_failed_marks(&mut self) -> UnstartedMarks {
        std::mem::take(&mut self.failed_marks)
    }

    /// `bytes` were appended to `name` (the whole record or a failed
    /// call's prefix): not durable until the file's next sync; the item
    /// records among them name their sequence numbers' items.
    fn appended(&mut self, name: &str, bytes: &[u8]) {
        for r in format::scan(bytes, 0).records {
            if let format::Record::Item { seq, item, .. } = r {
                if let Some(id) = item.get(..8).and_then(|b| b.try_into().ok()) {
                    self.seq_items.insert(seq, u64::from_le_bytes(id));
                }
            }
        }
        self.unsynced
            .entry(name.to_owned())
            .or_default()
            .extend_from_slice(bytes);
    }

    /// A storage call failed: the commit it belongs to failed, and the
    /// attempt marks in the bytes not synced yet are noted (S-J17).
    fn commit_failed(&mut self) {
        for bytes in self.unsynced.values() {
            for r in format::scan(bytes, 0).records {
                if let format::Record::Attempts { life, seqs } = r {
                    for seq in seqs {
                        if let Some(&id) = self.seq_items.get(&seq) {
                            self.failed_marks.insert((life, seq), id);
                        }
                    }
                }
            }
        }
    }

    fn fault(&mut self, kind: &'static str) {
        book::lock(&self.book).fault(book::now(), kind);
    }

    /// Before `call` on `name`: an error if the process is dead, the trip
    /// fires, or a fault is drawn. `Err(Some(n))`: write `n` bytes first.
    fn before(&mut self, call: Call, name: &str, len: usize) -> Result<(), (io::Error, usize)> {
        if self.tripped.is_some() {
            return Err((io::Error::other("the process is crashing"), 0));
        }
        if let Some(t) = self.armed.as_mut().filter(|t| t.call == call) {
            if t.skip == 0 {
                let what = t.what;
                self.armed = None;
                self.tripped = Some(what);
                let prefix = if len > 0 {
                    self.rng.random_range(0..len)
                } else {
                    0
                };
                book::lock(&self.book).record(
                    book::now(),
                    Ev::Note(format!(
                        "disk: the process dies inside {} `{name}` ({what})",
                        call.as_str()
                    )),
                );
                return Err((io::Error::other("the process died here"), prefix));
            }
            t.skip -= 1;
        }
        if self.healed {
            return Ok(());
        }
        if self.plan.eio > 0 && self.rng.random_range(0..1_000) < self.plan.eio {
            self.fault("eio");
            let prefix = if len > 0 {
                self.rng.random_range(0..=len)
            } else {
                0
            };
            return Err((
                io::Error::other(format!("EIO on {} `{name}`", call.as_str())),
                prefix,
            ));
        }
        if matches!(call, Call::Append | Call::Create) {
            let now = turmoil::sim_elapsed().unwrap_or_default();
            if self
                .plan
                .full
                .iter()
                .flatten()
                .any(|(from, to)| *from <= now && now < *to)
            {
                self.fault("disk_full");
                return Err((
                    io::Error::new(io::ErrorKind::StorageFull, "no space left on device"),
                    0,
                ));
            }
        }
        Ok(())
    }

    /// After a read of `name`: maybe a new rotten byte; every rotten byte
    /// applied.
    fn rot(&mut self, name: &str, bytes: &mut [u8]) {
        if !self.healed
            && self.plan.rot > 0
            && bytes.len() > format::HEADER_LEN
            && self.rng.random_range(0..1_000) < self.plan.rot
        {
            // Half the time near the end, where the records of pending
            // items are: a rotten record is only seen when it is read back
            // as an item not yet done.
            let from = if self.rng.random_bool(0.5) {
                bytes.len().saturating_sub(TAIL).max(format::HEADER_LEN)
            } else {
                format::HEADER_LEN
            };
            let at = self.rng.random_range(from..bytes.len());
            let mask = self.rng.random_range(1..=255u8);
            if let Some(id) = item_hit(bytes, at) {
                self.rotten_items.insert(id);
            }
            let rot = self.rot.entry(name.to_owned()).or_default();
            rot.push((at, mask));
            self.rotten_marks.extend(marks_lost(bytes, rot));
            self.rot_events += 1;
            self.fault("rot");
        }
        for &(at, mask) in self.rot.get(name).into_iter().flatten() {
            if let Some(b) = bytes.get_mut(at) {
                *b ^= mask;
            }
        }
    }

    fn forget(&mut self, name: &str, len: Option<usize>) {
        match len {
            None => {
                self.rot.remove(name);
            }
            Some(len) => {
                if let Some(r) = self.rot.get_mut(name) {
                    r.retain(|(at, _)| *at < len);
                }
            }
        }
    }
}

/// The bytes at a segment's end a rotten byte lands in half the time.
const TAIL: usize = 512;

/// The crash world's item record in format version 2 (S-J14): kind,
/// sequence, staging time (ms), codec version, tenant length, a 16-byte
/// tenant and a 16-byte item (see [`super::codec`]). The item's id is the
/// item's first 8 bytes.
const ITEM_BODY: usize = 1 + 8 + 8 + 4 + 4 + 16 + 16;
/// Where the item starts in that body.
const ITEM_AT: usize = 1 + 8 + 8 + 4 + 4 + 16;
/// The kind byte of a version-2 item record.
const KIND_ITEM: u8 = 5;

/// The id of the item whose record holds byte `at` of the segment
/// `bytes` (pristine), if a valid item record does. Walks the records
/// with the format's framing and its own checksum test (not the
/// journal's, which a canary may break), skipping damage byte by byte as
/// the journal's scanner does.
fn item_hit(bytes: &[u8], at: usize) -> Option<u64> {
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let mut o = format::HEADER_LEN;
    while o + format::FRAME_LEN <= bytes.len() && o <= at {
        let len = u32_at(o) as usize;
        let end = o + format::FRAME_LEN + len;
        let valid = len > 0
            && end <= bytes.len()
            && crc32c::crc32c_append(crc32c::crc32c(&bytes[o..o + 4]), &bytes[o + 8..end])
                == u32_at(o + 4);
        if !valid {
            o += 1;
            continue;
        }
        if at < end {
            let body = &bytes[o + format::FRAME_LEN..end];
            return (body[0] == KIND_ITEM && len == ITEM_BODY)
                .then(|| u64::from_le_bytes(body[ITEM_AT..][..8].try_into().expect("8 bytes")));
        }
        o = end;
    }
    None
}

/// The sequence numbers of the attempt marks (S-J17) in the segment
/// `bytes` (pristine) that the rotten bytes `rot` make unreadable, as the
/// journal's scanner reads them.
fn marks_lost(bytes: &[u8], rot: &[(usize, u8)]) -> BTreeSet<u64> {
    let marks = |b: &[u8]| -> BTreeSet<u64> {
        let mut seqs = BTreeSet::new();
        for r in format::scan(b, format::HEADER_LEN).records {
            if let format::Record::Attempts { seqs: s, .. } = r {
                seqs.extend(s);
            }
        }
        seqs
    };
    let mut rotten = bytes.to_vec();
    for &(at, mask) in rot {
        if let Some(b) = rotten.get_mut(at) {
            *b ^= mask;
        }
    }
    let kept = marks(&rotten);
    marks(bytes).difference(&kept).copied().collect()
}

/// The journal's storage on the app host's simulated disk (see the module
/// docs). Must be used on the simulation's thread (the journal runs with
/// `inline_io`).
pub struct SimDisk {
    dir: PathBuf,
    open: BTreeMap<String, File>,
    faults: SharedFaults,
    holds_lock: bool,
}

impl SimDisk {
    /// The storage of the journal in [`DIR`].
    pub fn new(faults: SharedFaults) -> SimDisk {
        SimDisk {
            dir: PathBuf::from(DIR),
            open: BTreeMap::new(),
            faults,
            holds_lock: false,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn check(&mut self, call: Call, name: &str) -> io::Result<()> {
        let mut f = lock(&self.faults);
        f.before(call, name, 0).map_err(|(e, _)| {
            f.commit_failed();
            e
        })
    }

    fn file(&mut self, name: &str) -> io::Result<&mut File> {
        if !self.open.contains_key(name) {
            let f = OpenOptions::new().append(true).open(self.path(name))?;
            self.open.insert(name.to_owned(), f);
        }
        Ok(self.open.get_mut(name).expect("inserted above"))
    }
}

impl Drop for SimDisk {
    fn drop(&mut self) {
        if self.holds_lock {
            lock(&self.faults).locked = false;
        }
    }
}

impl Storage for SimDisk {
    fn lock(&mut self) -> io::Result<()> {
        {
            let mut f = lock(&self.faults);
            if f.locked && !self.holds_lock {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "journal is locked by another process",
                ));
            }
            f.locked = true;
        }
        self.holds_lock = true;
        if !simfs::exists(&self.dir) {
            simfs::create_dir_all(&self.dir)?;
            simfs::sync_dir("/")?;
        }
        Ok(())
    }

    fn list(&mut self) -> io::Result<Vec<String>> {
        self.check(Call::List, ".")?;
        let mut names = Vec::new();
        for entry in simfs::read_dir(&self.dir)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        self.check(Call::Read, name)?;
        let mut bytes = simfs::read(self.path(name))?;
        lock(&self.faults).rot(name, &mut bytes);
        Ok(bytes)
    }

    fn create(&mut self, name: &str) -> io::Result<()> {
        self.check(Call::Create, name)?;
        let f = OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(self.path(name))?;
        self.open.insert(name.to_owned(), f);
        simfs::sync_dir(&self.dir)
    }

    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let before = lock(&self.faults).before(Call::Append, name, bytes.len());
        match before {
            Ok(()) => {
                self.file(name)?.write_all(bytes)?;
                lock(&self.faults).appended(name, bytes);
                Ok(())
            }
            Err((e, prefix)) => {
                if prefix > 0 {
                    self.file(name)?.write_all(&bytes[..prefix])?;
                    lock(&self.faults).appended(name, &bytes[..prefix]);
                }
                lock(&self.faults).commit_failed();
                Err(e)
            }
        }
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.check(Call::Sync, name)?;
        {
            let mut f = lock(&self.faults);
            if f.plan.skip_sync {
                // The canary's commit worked, as far as the journal knows.
                f.unsynced.remove(name);
                return Ok(());
            }
        }
        self.file(name)?.sync_data()?;
        lock(&self.faults).unsynced.remove(name);
        Ok(())
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.check(Call::Truncate, name)?;
        let f = self.file(name)?;
        f.set_len(len)?;
        f.sync_data()?;
        let mut faults = lock(&self.faults);
        faults.unsynced.remove(name);
        faults.forget(name, Some(usize::try_from(len).unwrap_or(usize::MAX)));
        Ok(())
    }

    fn delete(&mut self, name: &str) -> io::Result<()> {
        self.check(Call::Delete, name)?;
        self.open.remove(name);
        simfs::remove_file(self.path(name))?;
        simfs::sync_dir(&self.dir)?;
        let mut faults = lock(&self.faults);
        faults.unsynced.remove(name);
        faults.forget(name, None);
        Ok(())
    }
}

/// The bytes of the journal's files on the disk now (D6), inside the
/// host, and the files with their sizes, by name.
///
/// # Errors
/// The directory cannot be read.
pub fn disk_use() -> io::Result<(u64, BTreeMap<String, u64>)> {
    let mut files = BTreeMap::new();
    if !simfs::exists(DIR) {
        return Ok((0, files));
    }
    for entry in simfs::read_dir(DIR)? {
        let entry = entry?;
        files.insert(
            entry.file_name().to_string_lossy().into_owned(),
            entry.metadata()?.len(),
        );
    }
    Ok((files.values().sum(), files))
}

/// The journal's files and their bytes on the disk now, inside the host
/// (S-J14: a build that fails with `OtherVersion` changes none).
///
/// # Errors
/// The directory or a file cannot be read.
pub fn snapshot() -> io::Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    if !simfs::exists(DIR) {
        return Ok(files);
    }
    for entry in simfs::read_dir(DIR)? {
        let entry = entry?;
        files.insert(
            entry.file_name().to_string_lossy().into_owned(),
            simfs::read(entry.path())?,
        );
    }
    Ok(files)
}

/// The items with an attempt mark (S-J17) in the journal's files on the
/// disk now, inside the host, by sequence number, read from the pristine
/// bytes: what a recovery can know an earlier life attempted (S-J16)
/// once the caller leaves out the marks a rotten byte hid from it
/// ([`DiskFaults::rotten_marks`]; a number also marked in a record the
/// rot spared is left out too, which only spares the check a case).
///
/// # Errors
/// The directory or a file cannot be read.
pub fn marked_items() -> io::Result<BTreeMap<u64, u64>> {
    let (mut ids, mut marked) = (BTreeMap::new(), BTreeSet::new());
    for bytes in snapshot()?.values() {
        for r in format::scan(bytes, format::HEADER_LEN).records {
            match r {
                format::Record::Item { seq, item, .. } => {
                    if let Some(id) = item.get(..8).and_then(|b| b.try_into().ok()) {
                        ids.insert(seq, u64::from_le_bytes(id));
                    }
                }
                format::Record::Attempts { seqs, .. } => marked.extend(seqs),
                _ => {}
            }
        }
    }
    Ok(marked
        .iter()
        .filter_map(|s| ids.get(s).map(|id| (*s, *id)))
        .collect())
}

/// `(journal life, sequence number)` of every attempt mark (S-J17) in the
/// journal's files on the disk now, inside the host.
///
/// # Errors
/// The directory or a file cannot be read.
pub fn attempt_marks() -> io::Result<BTreeSet<(u64, u64)>> {
    let mut marks = BTreeSet::new();
    for bytes in snapshot()?.values() {
        for r in format::scan(bytes, format::HEADER_LEN).records {
            if let format::Record::Attempts { life, seqs } = r {
                marks.extend(seqs.into_iter().map(|s| (life, s)));
            }
        }
    }
    Ok(marks)
}
