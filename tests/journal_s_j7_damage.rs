//! The journal's format through damage (S-J7, D4): round trips, a torn
//! tail cut at every byte, a single bit flipped anywhere, empty, missing,
//! truncated and foreign files; every recovery exact about what it counts.
#![cfg(feature = "journal")]

use std::collections::BTreeSet;
use std::io;

use outbox::core::journal::Seq;
use outbox::journal::format::{self, Header, Record, HEADER_LEN};
use outbox::journal::{recover, Codec, FsStorage, JournalError, MemStorage, Postcard};
use support::hand::{limits, Back, Hand};

mod support;

type Tenant = u64;
type Item = (u64, String);
type Recovered = Back<Tenant, Item>;

/// The sample's segment size: about three items each, after the 73 bytes
/// a segment starts with (its header, and the schema record naming
/// `(u64, alloc::string::String)`, S-J14).
const SEGMENT: u64 = 200;

/// What a segment starts with: its header and its schema record.
fn head_len() -> usize {
    format::Schema::new(0, std::any::type_name::<Item>()).head_len()
}

/// A journal driven by hand: stage, mark done, commit, as the outbox does.
struct Journal(Hand<Tenant, MemStorage>);

impl Journal {
    fn open(disk: &MemStorage, segment_bytes: u64) -> (Journal, Recovered) {
        Self::try_open(disk, segment_bytes).expect("recovers")
    }

    fn try_open(
        disk: &MemStorage,
        segment_bytes: u64,
    ) -> Result<(Journal, Recovered), JournalError> {
        let (hand, back) = Hand::open(disk.clone(), &Postcard, limits(segment_bytes))?;
        let mut j = Journal(hand);
        j.commit().expect("creates its segment");
        Ok((j, back))
    }

    fn stage(&mut self, tenant: Tenant, item: &Item) {
        let enc = format::EncodedItem::new(
            |b| Codec::<Tenant, Item>::encode_tenant(&Postcard, &tenant, b),
            |b| Codec::<Tenant, Item>::encode_item(&Postcard, item, b),
        )
        .map_err(|_| ())
        .expect("encodes");
        assert!(self.0.append(tenant, &enc));
    }

    fn commit(&mut self) -> io::Result<()> {
        self.0.round()
    }
}

fn item(tenant: Tenant, n: u64) -> Item {
    (n, format!("t{tenant}-n{n}"))
}

fn recovered_ids(rec: &Recovered) -> Vec<(Seq, Tenant, u64)> {
    rec.items.iter().map(|(s, t, i)| (*s, *t, i.0)).collect()
}

#[test]
fn a_journal_round_trips_pending_items_per_tenant_in_order() {
    // D2: recovery stages again in sequence order, so per tenant in
    // staging order; done items are not staged again.
    let disk = MemStorage::new();
    let (mut j, rec) = Journal::open(&disk, 200);
    assert_eq!(rec.report.segments, 0);
    for n in 0..30 {
        j.stage(n % 3, &item(n % 3, n));
    }
    j.commit().unwrap();
    // Tenant 0's first four items are done.
    j.0.done(&0, 4);
    j.commit().unwrap();
    drop(j);
    disk.crash();
    let (_, rec) = Journal::open(&disk, 200);
    let ids: Vec<u64> = rec.items.iter().map(|x| x.2 .0).collect();
    let expected: Vec<u64> = (0..30).filter(|n| !(n % 3 == 0 && *n < 12)).collect();
    assert_eq!(ids, expected);
    for (_, t, (n, text)) in &rec.items {
        assert_eq!(text, &format!("t{t}-n{n}"), "the payload decodes as staged");
    }
    assert_eq!(rec.report.recovered, 26);
    assert_eq!(rec.report.done, 4);
    assert_eq!(rec.report.unreadable, 0);
    assert!(rec.report.segments > 1, "{:?}", rec.report);
}

#[test]
fn what_was_not_synced_is_not_recovered_and_not_counted() {
    // D1's window: staged but not committed when the process dies.
    let disk = MemStorage::new();
    let (mut j, _) = Journal::open(&disk, 10_000);
    j.stage(1, &item(1, 1));
    j.commit().unwrap();
    j.stage(1, &item(1, 2));
    drop(j);
    disk.crash();
    let (_, rec) = Journal::open(&disk, 10_000);
    assert_eq!(recovered_ids(&rec), [(1, 1, 1)]);
    assert_eq!((rec.report.unreadable, rec.report.torn_bytes), (0, 0));
}

#[test]
fn segments_whose_items_are_all_done_are_deleted() {
    // D6.
    let disk = MemStorage::new();
    let (mut j, _) = Journal::open(&disk, 150);
    for n in 0..40 {
        j.stage(7, &item(7, n));
        j.commit().unwrap();
    }
    let before = disk.files().len();
    assert!(before > 5, "{before} files");
    j.0.done(&7, 40);
    j.commit().unwrap();
    j.commit().unwrap();
    let segments: Vec<String> = disk.files().into_keys().filter(|n| n != "LOCK").collect();
    assert_eq!(segments.len(), 1, "only the current segment: {segments:?}");
    assert_eq!(j.0.machine.ledger().live(), 0);
    drop(j);
    disk.crash();
    let (_, rec) = Journal::open(&disk, 150);
    assert!(rec.items.is_empty());
}

/// Builds a journal of two sealed segments and an unsealed last one, as a
/// crash leaves it; tenant 2's first item is marked done.
fn sample() -> MemStorage {
    let disk = MemStorage::new();
    let (mut j, _) = Journal::open(&disk, SEGMENT);
    for n in 0..9 {
        j.stage(1 + n % 2, &item(1 + n % 2, n));
        j.commit().unwrap();
    }
    j.0.done(&2, 1);
    j.commit().unwrap();
    j.stage(1, &item(1, 9));
    j.commit().unwrap();
    drop(j);
    disk.crash();
    disk
}

/// A segment file's records, each with its byte range.
type Layout = Vec<(String, Vec<(std::ops::Range<usize>, Record<'static>)>)>;

/// What each record of each segment file is, with its byte range.
fn layout(disk: &MemStorage) -> Layout {
    disk.files()
        .into_iter()
        .filter(|(n, _)| n != "LOCK")
        .map(|(name, bytes)| {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            let mut at = HEADER_LEN;
            let mut out = Vec::new();
            for r in format::scan(bytes, HEADER_LEN).records {
                let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
                out.push((at..at + 8 + len, r));
                at += 8 + len;
            }
            (name, out)
        })
        .collect()
}

#[test]
fn a_torn_tail_is_cut_at_every_byte_and_never_counted() {
    // S-J7: a crash tears the last segment's last records at any byte;
    // recovery keeps the whole records before the cut, counts nothing
    // lost (never synced), and a second recovery finds a clean journal.
    let base = sample();
    let layout = layout(&base);
    let (last_name, records) = layout.last().unwrap().clone();
    let full = base.files()[&last_name].clone();
    let tail_from = records[records.len().saturating_sub(3)].0.start;
    let all: Vec<u64> = {
        let (_, rec) = Journal::open(&clone_disk(&base), SEGMENT);
        rec.items.iter().map(|x| x.2 .0).collect()
    };
    for cut in tail_from..full.len() {
        let disk = clone_disk(&base);
        disk.put(&last_name, full[..cut].to_vec());
        let whole: BTreeSet<u64> = records
            .iter()
            .filter(|(r, _)| r.end <= cut)
            .filter_map(|(_, rec)| match rec {
                Record::Item { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect();
        let (j, rec) = Journal::open(&disk, SEGMENT);
        let got: Vec<Seq> = rec.items.iter().map(|x| x.0).collect();
        let last_seqs: Vec<Seq> = records
            .iter()
            .filter_map(|(_, r)| match r {
                Record::Item { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect();
        for s in &last_seqs {
            assert_eq!(got.contains(s), whole.contains(s), "cut {cut}: seq {s}");
        }
        assert_eq!(rec.report.unreadable, 0, "cut {cut}");
        let valid_end = records
            .iter()
            .map(|(r, _)| r.end)
            .filter(|e| *e <= cut)
            .max()
            .unwrap_or(HEADER_LEN);
        assert_eq!(rec.report.torn_bytes, (cut - valid_end) as u64, "cut {cut}");
        assert!(got.len() <= all.len());
        drop(j);
        disk.crash();
        let (_, again) = Journal::open(&disk, SEGMENT);
        assert_eq!(
            again.items.iter().map(|x| x.0).collect::<Vec<_>>(),
            got,
            "cut {cut}: stable"
        );
        assert_eq!((again.report.torn_bytes, again.report.unreadable), (0, 0));
    }
}

fn clone_disk(disk: &MemStorage) -> MemStorage {
    let copy = MemStorage::new();
    for (name, bytes) in disk.files() {
        copy.put(&name, bytes);
    }
    copy
}

#[test]
fn a_single_bit_flip_anywhere_costs_exactly_what_it_hit() {
    // D4: a flipped bit in an item record loses that item (counted
    // unreadable) unless it is the last segment's last record (a torn tail:
    // cut, uncounted); in a done record it stages its items again
    // (duplicates the sink absorbs); in a header or a seal it costs
    // nothing; the bytes it hit are counted either way.
    let base = sample();
    let layout = layout(&base);
    let (_, baseline) = Journal::open(&clone_disk(&base), SEGMENT);
    let base_seqs: BTreeSet<Seq> = baseline.items.iter().map(|x| x.0).collect();
    assert_eq!(baseline.report.done, 1);
    let names: Vec<String> = layout.iter().map(|l| l.0.clone()).collect();
    let mut flips = 0;
    for (fi, (name, records)) in layout.iter().enumerate() {
        let bytes = base.files()[name].clone();
        let last_file = fi + 1 == names.len();
        for at in 0..bytes.len() {
            for bit in 0..8 {
                let disk = clone_disk(&base);
                let mut b = bytes.clone();
                b[at] ^= 1 << bit;
                disk.put(name, b);
                let (_, rec) = Journal::open(&disk, SEGMENT);
                let got: BTreeSet<Seq> = rec.items.iter().map(|x| x.0).collect();
                let hit = records
                    .iter()
                    .enumerate()
                    .find(|(_, (r, _))| r.contains(&at));
                let ctx = format!("{name} byte {at} bit {bit}: {:?}", rec.report);
                match hit {
                    None => {
                        assert!(at < HEADER_LEN, "{ctx}");
                        assert_eq!(got, base_seqs, "{ctx}");
                        assert_eq!(rec.report.unreadable, 0, "{ctx}");
                        assert_eq!(rec.report.damaged_headers, 1, "{ctx}");
                    }
                    Some((ri, (_, Record::Item { seq, .. }))) => {
                        let mut want = base_seqs.clone();
                        want.remove(seq);
                        assert_eq!(got, want, "{ctx}");
                        let torn = last_file && ri + 1 == records.len();
                        let done = !base_seqs.contains(seq);
                        let counted = u64::from(!torn && !done);
                        assert_eq!(rec.report.unreadable, counted, "{ctx}");
                    }
                    Some((_, (_, Record::Done(seqs)))) => {
                        let mut want = base_seqs.clone();
                        want.extend(seqs.iter().copied());
                        assert_eq!(got, want, "{ctx}");
                        assert_eq!(rec.report.unreadable, 0, "{ctx}");
                    }
                    Some((
                        _,
                        (
                            _,
                            Record::Seal(_)
                            | Record::Schema { .. }
                            | Record::Attempts { .. }
                            | Record::Life { .. }
                            | Record::Clean(_)
                            | Record::Ended { .. },
                        ),
                    )) => {
                        // A damaged schema record costs no item: each item
                        // record carries its version (S-J14).
                        assert_eq!(got, base_seqs, "{ctx}");
                        assert_eq!(rec.report.unreadable, 0, "{ctx}");
                    }
                }
                // D4: the hit record's bytes are counted, cut as the torn
                // tail of the last segment, skipped as damaged elsewhere.
                let bytes_counted = match hit {
                    Some((ri, (r, _))) if last_file && ri + 1 == records.len() => (r.len(), 0),
                    Some((_, (r, _))) => (0, r.len()),
                    None => (0, 0),
                };
                assert_eq!(
                    (rec.report.torn_bytes, rec.report.damaged_bytes),
                    (bytes_counted.0 as u64, bytes_counted.1 as u64),
                    "{ctx}"
                );
                flips += 1;
            }
        }
    }
    assert!(flips > 3_000, "{flips} flips");
}

#[test]
fn an_empty_last_segment_is_a_crash_while_creating_it() {
    let disk = sample();
    disk.put(&format::segment_name(99), Vec::new());
    let (_, rec) = Journal::open(&disk, SEGMENT);
    assert_eq!(rec.report.empty_segments, 1);
    assert_eq!(rec.report.unreadable, 0);
    assert!(!rec.items.is_empty());
}

#[test]
fn an_empty_or_truncated_segment_in_the_middle_is_counted() {
    // Segment 2 cut inside its header: its items are unreadable and
    // counted (its range is known from segment 1's seal and segment 3's
    // header).
    let base = sample();
    let layout = layout(&base);
    let (_, baseline) = Journal::open(&clone_disk(&base), SEGMENT);
    let (name, records) = &layout[1];
    let in_it: Vec<Seq> = records
        .iter()
        .filter_map(|(_, r)| match r {
            Record::Item { seq, .. } => Some(*seq),
            _ => None,
        })
        .collect();
    assert!(!in_it.is_empty());
    for len in [0, 5, HEADER_LEN - 1] {
        let disk = clone_disk(&base);
        disk.put(name, base.files()[name][..len].to_vec());
        let (_, rec) = Journal::open(&disk, SEGMENT);
        let lost = in_it
            .iter()
            .filter(|s| baseline.items.iter().any(|x| x.0 == **s))
            .count();
        assert_eq!(rec.report.unreadable, lost as u64, "len {len}");
        assert_eq!(rec.items.len(), baseline.items.len() - lost, "len {len}");
        assert_eq!(rec.report.damaged_headers, 1);
    }
}

#[test]
fn a_missing_directory_is_created_and_an_empty_one_is_a_fresh_journal() {
    let dir = std::env::temp_dir().join(format!("outbox-journal-missing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut s = FsStorage::new(dir.join("a/b")).unwrap();
    let rec = recover::<Tenant, Item, _, _>(&mut s, &Postcard, limits(1_000)).unwrap();
    assert_eq!(rec.report, Default::default());
    assert_eq!(rec.ledger.next_seq(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_foreign_file_is_a_clear_error() {
    let disk = sample();
    disk.put("notes.txt", b"hello".to_vec());
    let err = Journal::try_open(&disk, SEGMENT).err().expect("refused");
    assert!(matches!(&err, JournalError::Foreign { file } if file == "notes.txt"));
    assert!(err.to_string().contains("notes.txt"), "{err}");

    let disk = sample();
    disk.put(
        &format::segment_name(50),
        b"PK\x03\x04 not a journal, a zip file".to_vec(),
    );
    let err = Journal::try_open(&disk, SEGMENT).err().expect("refused");
    assert!(matches!(&err, JournalError::Foreign { .. }), "{err}");

    // A valid header with another segment's id: a copied file.
    let disk = sample();
    let files = disk.files();
    let first = files
        .keys()
        .find(|n| n.starts_with("segment-"))
        .unwrap()
        .clone();
    disk.put(&format::segment_name(77), files[&first].clone());
    let err = Journal::try_open(&disk, SEGMENT).err().expect("refused");
    assert!(matches!(&err, JournalError::Foreign { .. }), "{err}");
}

#[test]
fn another_format_version_is_a_clear_error() {
    let disk = sample();
    let name = format::segment_name(1);
    let mut b = disk.files()[&name].clone();
    b[8] = 3;
    let crc = crc(&b[..28]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(format::read_header(&b), Header::Version(3));
    disk.put(&name, b);
    let err = Journal::try_open(&disk, SEGMENT).err().expect("refused");
    assert!(
        matches!(err, JournalError::Version { version: 3, .. }),
        "{err}"
    );
}

fn crc(b: &[u8]) -> u32 {
    // crc32c (Castagnoli), bitwise: the test does not trust the crate it
    // checks.
    let mut crc = !0u32;
    for &byte in b {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn a_second_opener_of_one_directory_is_refused() {
    // S-J6.
    let disk = MemStorage::new();
    let (_j, _) = Journal::open(&disk, 1_000);
    let err = Journal::try_open(&disk, 1_000).err().expect("refused");
    assert!(matches!(err, JournalError::Locked(_)), "{err}");
}

#[test]
fn an_undecodable_item_is_counted_unreadable() {
    // D4: the checksum holds but the codec cannot read the item back (a
    // changed item type).
    struct Raw;
    impl Codec<Tenant, Item> for Raw {
        fn encode_tenant(&self, t: &Tenant, out: &mut Vec<u8>) -> Result<(), outbox::BoxError> {
            out.extend_from_slice(&t.to_le_bytes());
            Ok(())
        }
        fn decode_tenant(&self, b: &[u8]) -> Result<Tenant, outbox::BoxError> {
            Ok(u64::from_le_bytes(b.try_into()?))
        }
        fn encode_item(&self, i: &Item, out: &mut Vec<u8>) -> Result<(), outbox::BoxError> {
            out.extend_from_slice(&i.0.to_le_bytes());
            Ok(())
        }
        fn decode_item(&self, b: &[u8]) -> Result<Item, outbox::BoxError> {
            let n = u64::from_le_bytes(b.try_into()?);
            if n == 1 {
                return Err("item 1 is of an older type".into());
            }
            Ok((n, String::new()))
        }
    }
    let disk = MemStorage::new();
    let (mut hand, _) = Hand::open(disk.clone(), &Raw, limits(1_000)).unwrap();
    for n in 0..3u64 {
        let e = format::EncodedItem::new(
            |b| Raw.encode_tenant(&5, b),
            |b| Raw.encode_item(&(n, String::new()), b),
        )
        .map_err(|_| ())
        .unwrap();
        hand.append(5, &e);
    }
    hand.round().unwrap();
    drop(hand);
    disk.crash();
    let (_, rec) = Hand::open(disk.clone(), &Raw, limits(1_000)).unwrap();
    assert_eq!(rec.items.iter().map(|x| x.2 .0).collect::<Vec<_>>(), [0, 2]);
    assert_eq!(rec.report.unreadable, 1);
}

#[test]
fn a_failed_commit_leaves_a_journal_that_recovers_what_was_synced() {
    // S-J5: a commit fails (disk full); what was synced before survives a
    // crash, what the failed commit held is not counted (never promised),
    // and after a resume new items are journaled again.
    let disk = MemStorage::new();
    let (mut j, _) = Journal::open(&disk, 10_000);
    j.stage(1, &item(1, 1));
    j.commit().unwrap();
    j.stage(1, &item(1, 2));
    disk.fail(Some(io::ErrorKind::StorageFull));
    assert!(j.commit().is_err());
    assert!(j.0.is_down());
    assert_eq!(j.0.machine.ledger().undurable(), 1);
    let enc = format::EncodedItem::new::<()>(|_| Ok(()), |_| Ok(())).unwrap();
    assert!(!j.0.append(1, &enc), "down: not journaled");
    assert_eq!(j.0.machine.ledger().undurable(), 2);
    assert!(j.commit().is_err(), "still full: the resume fails");
    disk.fail(None);
    j.commit().unwrap();
    assert!(!j.0.is_down());
    j.stage(1, &item(1, 4));
    j.commit().unwrap();
    drop(j);
    disk.crash();
    let (_, rec) = Journal::open(&disk, 10_000);
    let ids: Vec<u64> = rec.items.iter().map(|x| x.2 .0).collect();
    assert_eq!(ids, [1, 4]);
    assert_eq!(rec.report.unreadable, 0);
}

/// A storage call, as [`Recording`] logs it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Create(String),
    Append(String, usize),
    Sync(String),
    Delete(String),
}

/// A [`MemStorage`] that logs its mutating calls, can cut the next
/// header written to a new segment to `fail_header` bytes and fail it (a
/// short write, then EIO), and refuses deletes while `refuse_deletes`.
struct Recording {
    disk: MemStorage,
    log: std::sync::Arc<std::sync::Mutex<Vec<Call>>>,
    fail_header: Option<usize>,
    refuse_deletes: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Recording {
    fn new(disk: &MemStorage) -> Recording {
        Recording {
            disk: disk.clone(),
            log: Default::default(),
            fail_header: None,
            refuse_deletes: Default::default(),
        }
    }

    fn note(&self, call: Call) {
        self.log.lock().unwrap().push(call);
    }
}

impl outbox::journal::Storage for Recording {
    fn lock(&mut self) -> io::Result<()> {
        self.disk.lock()
    }
    fn list(&mut self) -> io::Result<Vec<String>> {
        self.disk.list()
    }
    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        self.disk.read(name)
    }
    fn create(&mut self, name: &str) -> io::Result<()> {
        self.note(Call::Create(name.to_owned()));
        self.disk.create(name)
    }
    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let created = self.log.lock().unwrap().last() == Some(&Call::Create(name.to_owned()));
        if let Some(prefix) = self.fail_header.filter(|_| created) {
            self.fail_header = None;
            self.disk.append(name, &bytes[..prefix])?;
            return Err(io::Error::other("EIO after a short write"));
        }
        self.note(Call::Append(name.to_owned(), bytes.len()));
        self.disk.append(name, bytes)
    }
    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.note(Call::Sync(name.to_owned()));
        self.disk.sync(name)
    }
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.disk.truncate(name, len)
    }
    fn delete(&mut self, name: &str) -> io::Result<()> {
        if self
            .refuse_deletes
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(io::Error::other("EIO on delete"));
        }
        self.note(Call::Delete(name.to_owned()));
        self.disk.delete(name)
    }
}

/// Opens a journal on `storage` (recovery, then the first commit, which
/// creates the current segment).
fn open_on(storage: Recording, segment_bytes: u64) -> (Hand<Tenant, Recording>, Recovered) {
    let (mut hand, back) = Hand::open(storage, &Postcard, limits(segment_bytes)).expect("recovers");
    hand.round().expect("creates its segment");
    (hand, back)
}

fn encoded(tenant: Tenant, n: u64) -> format::EncodedItem {
    format::EncodedItem::new(
        |b| Codec::<Tenant, Item>::encode_tenant(&Postcard, &tenant, b),
        |b| Codec::<Tenant, Item>::encode_item(&Postcard, &item(tenant, n), b),
    )
    .map_err(|_| ())
    .expect("encodes")
}

#[test]
fn a_segment_header_is_synced_before_any_record_goes_in() {
    // S-J7 (crash seed 118 of the simulation): a disk may keep a later
    // unsynced write and lose an earlier one; a segment whose header was
    // lost while its records survived read as a foreign file and the
    // journal never opened again. So every segment's header is written and
    // synced on its own before anything else is appended to it.
    let disk = MemStorage::new();
    let storage = Recording::new(&disk);
    let log = std::sync::Arc::clone(&storage.log);
    let (mut j, _) = open_on(storage, 150);
    for n in 0..40 {
        assert!(j.append(3, &encoded(3, n)));
        if n % 3 == 0 {
            j.round().unwrap();
        }
    }
    let log = log.lock().unwrap().clone();
    let created: Vec<&String> = log
        .iter()
        .filter_map(|c| match c {
            Call::Create(n) => Some(n),
            _ => None,
        })
        .collect();
    assert!(created.len() > 5, "{} segments", created.len());
    for name in created {
        let of_it: Vec<&Call> = log
            .iter()
            .filter(|c| match c {
                Call::Create(n) | Call::Sync(n) | Call::Delete(n) => n == name,
                Call::Append(n, _) => n == name,
            })
            .collect();
        assert_eq!(of_it[1], &Call::Append(name.clone(), head_len()), "{name}");
        assert_eq!(of_it[2], &Call::Sync(name.clone()), "{name}: {of_it:?}");
    }
}

#[test]
fn a_segment_whose_header_write_failed_is_deleted_or_headed_again_before_anything_else() {
    // A short write of a new segment's header, then EIO (S-J5): the
    // segment is deleted (or, while deletes are refused, headed again in
    // place) before the journal writes again, never sealed behind a torn
    // header, and the journal reopens with what was synced.
    for prefix in [0, 3, 8, 20, HEADER_LEN - 1] {
        let disk = MemStorage::new();
        let storage = Recording::new(&disk);
        let (mut j, _) = open_on(storage, 150);
        assert!(j.append(1, &encoded(1, 0)));
        j.round().unwrap();
        // The next append (a record) works; the header of the segment the
        // roll creates is cut short. Deletes fail for a while.
        j.committer.storage().fail_header = Some(prefix);
        j.committer
            .storage()
            .refuse_deletes
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut n = 1;
        let failed = loop {
            assert!(j.append(1, &encoded(1, n)));
            n += 1;
            if j.round().is_err() {
                break n;
            }
        };
        assert!(j.is_down(), "prefix {prefix}");
        // The resume cannot delete the torn segment (deletes are refused):
        // it writes its header again in place, then goes on (S-J5, S-J7).
        j.round().unwrap();
        j.committer
            .storage()
            .refuse_deletes
            .store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(j.append(1, &encoded(1, 100)));
        j.round().unwrap();
        for (name, bytes) in disk.files() {
            if name != "LOCK" {
                assert!(
                    matches!(format::read_header(&bytes), Header::Valid { .. }),
                    "prefix {prefix}: {name} has a bad header"
                );
            }
        }
        drop(j);
        disk.crash();
        let (_, rec) = open_on(Recording::new(&disk), 150);
        let ids: Vec<u64> = rec.items.iter().map(|x| x.2 .0).collect();
        // Everything synced before the fault and after the resume; the
        // failed commit's items were never promised.
        assert_eq!(ids.first(), Some(&0), "prefix {prefix}");
        assert_eq!(ids.last(), Some(&100), "prefix {prefix}");
        assert!(!ids.contains(&(failed - 1)), "prefix {prefix}: {ids:?}");
        assert_eq!(rec.report.unreadable, 0, "prefix {prefix}");
    }
}

#[test]
fn a_last_segment_torn_while_being_created_is_deleted_and_counted() {
    // A crash inside a segment's creation, before its header was synced:
    // the file holds a prefix of its header, or zeros where the header's
    // blocks were lost. It never held a record: deleted, counted.
    let mut header = format::header(99, 1).to_vec();
    header[28] ^= 0xff;
    let torn: [Vec<u8>; 5] = [
        Vec::new(),
        format::header(99, 1)[..9].to_vec(),
        vec![0; HEADER_LEN],
        vec![0; 12],
        header,
    ];
    for bytes in torn {
        let disk = sample();
        let (_, baseline) = Journal::open(&clone_disk(&disk), SEGMENT);
        disk.put(&format::segment_name(99), bytes.clone());
        let (_, rec) = Journal::open(&disk, SEGMENT);
        assert_eq!(rec.report.empty_segments, 1, "{bytes:?}");
        assert_eq!(recovered_ids(&rec), recovered_ids(&baseline), "{bytes:?}");
        assert_eq!(rec.report.unreadable, 0);
        assert!(!disk.files().contains_key(&format::segment_name(99)));
    }
    // Zeros in place of a header with records after it: not what a crash
    // can leave any more, and not guessed at.
    let disk = sample();
    let mut bytes = vec![0; HEADER_LEN];
    bytes.extend_from_slice(&[1; 40]);
    disk.put(&format::segment_name(99), bytes);
    let err = Journal::try_open(&disk, SEGMENT).err().expect("refused");
    assert!(matches!(&err, JournalError::Foreign { .. }), "{err}");
}
