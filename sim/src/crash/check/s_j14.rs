//! S-J14: a recovery never decodes an item record of another codec
//! version than its codec's: such items, not known done, are counted lost
//! under `other_version` (`Refuse`), counted and handed over as their
//! bytes (`Hand`), or fail the build with nothing on disk changed
//! (`Fail`); they are never handed to the sink of a life of another
//! version (a misread).

use std::collections::BTreeSet;

use outbox::journal::{Codec, OtherRecord};
use outbox::TenantId;

use super::Broken;
use crate::crash::codec::ItemCodec;
use crate::crash::ledger::Ledger;
use crate::net::book::{Admit, Book};

/// The items of earlier lives a recovery of version `version` may and
/// must refuse.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refusable {
    /// Accepted in an earlier life with another version: at most these.
    pub may: BTreeSet<u64>,
    /// Of those, the ones certainly pending: synced (their records are
    /// durable), never written (no done mark can exist), not hit by rot,
    /// not refused before (their segments may be gone), not poisoned nor
    /// handed back.
    pub must: BTreeSet<u64>,
}

/// What a recovery in the ledger's current life, of codec `version`, may
/// and must refuse; `written`: the datastore's items now; `rotten`: the
/// items whose records a rotten byte hit.
pub fn refusable(
    book: &Book,
    l: &Ledger,
    version: u32,
    written: &BTreeSet<u64>,
    rotten: &BTreeSet<u64>,
) -> Refusable {
    let mut r = Refusable::default();
    for (id, item) in book.items.iter().enumerate() {
        let id = id as u64;
        let earlier = l.item_life.get(id as usize).is_some_and(|&b| b < l.life);
        let other = l.version_of(id).is_some_and(|v| v != version);
        if item.admit != Admit::Accepted || !earlier || !other {
            continue;
        }
        r.may.insert(id);
        let certain = l.synced.contains(&id)
            && !written.contains(&id)
            && !rotten.contains(&id)
            && !l.refused.contains(&id)
            && !l.poisoned.contains(&id)
            && !l.expired.contains(&id)
            && !item.handed_back;
        if certain {
            r.must.insert(id);
        }
    }
    r
}

/// A recovery of `version` in `life` counted `lost` items under
/// `other_version`, between what it must and may refuse; under `Hand`
/// (`handed`: the items whose bytes it handed over) exactly those, each
/// once, every certain one among them.
pub fn refused_as_told(
    life: u32,
    version: u32,
    lost: u64,
    handed: Option<&[u64]>,
    r: &Refusable,
) -> Vec<Broken> {
    let mut broken = Vec::new();
    let mut fail =
        |d: String| broken.push(("S-J14", format!("life {life} (version {version}): {d}")));
    if lost > r.may.len() as u64 {
        fail(format!(
            "recovery counted {lost} items lost under other_version, but only {} items of \
             another version were ever accepted",
            r.may.len()
        ));
    }
    if lost < r.must.len() as u64 {
        fail(format!(
            "recovery counted {lost} items lost under other_version, but {} synced items of \
             another version were pending (first {:?})",
            r.must.len(),
            r.must.iter().take(8).collect::<Vec<_>>()
        ));
    }
    let Some(handed) = handed else {
        return broken;
    };
    let set: BTreeSet<u64> = handed.iter().copied().collect();
    if handed.len() as u64 != lost || set.len() != handed.len() {
        fail(format!(
            "recovery counted {lost} items lost under other_version and handed over {} \
             records ({} items)",
            handed.len(),
            set.len()
        ));
    }
    if let Some(id) = set.iter().find(|id| !r.may.contains(id)) {
        fail(format!(
            "item #{id} was handed over as of another version, but was not accepted in an \
             earlier life of another version"
        ));
    }
    let missing: Vec<u64> = r.must.difference(&set).copied().collect();
    if !missing.is_empty() {
        fail(format!(
            "{} synced pending items of another version were not handed over (first {:?})",
            missing.len(),
            &missing[..missing.len().min(8)]
        ));
    }
    broken
}

/// A record handed over by a recovery of `version` is an item the world
/// staged, byte for byte, with the version it was staged with (never
/// `version`): its id, else what is wrong.
pub fn handed_record(
    book: &Book,
    l: &Ledger,
    version: u32,
    rec: &OtherRecord,
) -> Result<u64, Broken> {
    let bad = |d: String| {
        (
            "S-J14",
            format!("a record handed over as of another version: {d}"),
        )
    };
    let item = ItemCodec
        .decode_item(&rec.item)
        .map_err(|e| bad(format!("its item bytes do not decode: {e}")))?;
    let tenant = ItemCodec
        .decode_tenant(&rec.tenant)
        .map_err(|e| bad(format!("its tenant bytes do not decode: {e}")))?;
    let staged = book.items.get(item.id as usize);
    let same = staged.is_some_and(|s| {
        s.admit == Admit::Accepted
            && s.tenant == item.tenant
            && TenantId::from_u128(u128::from(item.tenant) + 1) == tenant
    });
    if !same {
        return Err(bad(format!("{item:?} for {tenant} was never staged so")));
    }
    let was = l.version_of(item.id);
    if rec.version == version || was != Some(rec.version) {
        return Err(bad(format!(
            "item #{} says version {}, it was staged with {was:?}, the recovery reads {version}",
            item.id, rec.version
        )));
    }
    Ok(item.id)
}

/// A build of `version` under `Fail` failed with `OtherVersion { file,
/// version: met, expected, items }`: it names the build's version, a
/// version items were staged with, a segment, and a count between what
/// it must and may refuse; `unchanged`: the journal's files are as before
/// the build.
pub fn failed_as_told(
    life: u32,
    version: u32,
    (file, met, expected, items): (&str, u32, u32, u64),
    r: &Refusable,
    l: &Ledger,
    unchanged: bool,
) -> Vec<Broken> {
    let mut broken = Vec::new();
    let mut fail = |d: String| {
        broken.push((
            "S-J14",
            format!("life {life}: the build of version {version} failed with OtherVersion: {d}"),
        ));
    };
    if expected != version {
        fail(format!("it names the expected version {expected}"));
    }
    if met == version || !r.may.iter().any(|&id| l.version_of(id) == Some(met)) {
        fail(format!("it names version {met}, no pending item's"));
    }
    if items == 0 || items > r.may.len() as u64 || items < r.must.len() as u64 {
        fail(format!(
            "it counts {items} items, not between {} and {}",
            r.must.len().max(1),
            r.may.len()
        ));
    }
    if !file.starts_with("segment-") {
        fail(format!("it names the file {file:?}"));
    }
    if !unchanged {
        fail("the journal's files changed".to_owned());
    }
    broken
}

/// An item handed to the sink in a life of `version` was staged with
/// that version (else its record was decoded by a codec of another
/// version: a misread).
pub fn read_by_its_version(l: &Ledger, ids: impl IntoIterator<Item = u64>) -> Option<Broken> {
    let version = l.version;
    ids.into_iter()
        .find(|&id| l.version_of(id).is_some_and(|v| v != version))
        .map(|id| {
            (
                "S-J14",
                format!(
                    "life {}: item #{id}, staged with codec version {:?}, was handed to the sink \
                     of a life of version {version}: a record of another version was decoded",
                    l.life,
                    l.version_of(id)
                ),
            )
        })
}
