//! The tenant key: any type of the application's ([`TenantKey`]), with
//! [`TenantId`] as one ready-made choice.

use std::fmt;
use std::hash::{Hash, Hasher};

use uuid::Uuid;

/// What a tenant key must be: the key items are grouped, ordered and
/// written by (contract: Terms). Implemented for every type that is
/// `Ord + Hash + Clone + Send + Sync + Debug + 'static`, so a service uses
/// the key it already has: [`TenantId`], [`Uuid`], `u64`, `i64`, `String`,
/// `Arc<str>`, or a type of its own.
///
/// The [`Sink`](crate::Sink) chooses the key, as its associated type
/// [`Sink::Tenant`](crate::Sink::Tenant): the sink is what maps a tenant to
/// the store (a column, a subject), so it knows which keys it can write;
/// [`Outbox::stage`](crate::Outbox::stage) then takes that type. The
/// engine only compares, hashes and clones keys: `Ord` decides the order
/// of per-tenant runs in reports (dead letters, abandoned items); `Hash`
/// only finds a tenant's backlog and never decides an order. The engine
/// clones a key on every stage and for every
/// write and event it hands out, so a key that clones cheaply (an
/// integer, a UUID, `Arc<str>` rather than `String`) keeps
/// [`stage`](crate::Outbox::stage) cheap; `Debug` renders it in logs (the
/// `tenant` field).
///
/// # Panics
/// The key's `Hash`, `Eq`, `Ord`, `Clone` and `Debug` must not panic, and must agree
/// with each other (equal keys hash equal), as for any std collection's key
/// (contract: Terms, *tenant*). The outbox contains panics in the code it
/// calls on items and writes (sink, weigher, codec, destructors: S-W5,
/// S-W13) but not in the key's comparisons: the engine's tables are
/// updated between them, and a panic half-way would leave them
/// inconsistent, so such a panic unwinds through the caller of the
/// stage, flush or shutdown that took the item in, or ends the writer.
/// `Debug` runs inside the writer's log calls (when a subscriber renders
/// the `tenant` field): a panic there ends the writer too, and the items
/// it held are counted lost as `abandoned` (S-A7); it never aborts the
/// process.
pub trait TenantKey: Ord + Hash + Clone + Send + Sync + fmt::Debug + 'static {}

impl<T: Ord + Hash + Clone + Send + Sync + fmt::Debug + 'static> TenantKey for T {}

/// A tenant as a UUID v7 newtype, so ids sort by creation time and compare
/// cheaply: one [`TenantKey`] among others.
///
/// Aligned to 8 bytes (a `Uuid` alone is aligned to 1): in the enums and
/// tuples a stage moves (a hand-off, a verdict) the id then sits at an
/// aligned offset, so the processor forwards its stores to the loads that
/// follow instead of stalling on a misaligned overlap. Its size stays 16
/// bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(align(8))]
pub struct TenantId(pub Uuid);

/// One 128-bit write: `Uuid` hashes as a byte slice (a length, then 16
/// bytes), more work for the tenant map's hasher per lookup. Equal
/// ids still hash equal.
impl Hash for TenantId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u128(self.0.as_u128());
    }
}

impl TenantId {
    /// A fresh UUID v7 (reads the wall clock and the OS random source; for
    /// applications, never called by the engine).
    pub fn new_v7() -> Self {
        TenantId(Uuid::now_v7())
    }

    /// A tenant from a number, for tests and simulations (deterministic).
    pub const fn from_u128(n: u128) -> Self {
        TenantId(Uuid::from_u128(n))
    }

    /// The UUID.
    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }
}

impl From<Uuid> for TenantId {
    fn from(id: Uuid) -> Self {
        TenantId(id)
    }
}

/// The bare hyphenated UUID, as [`Display`](fmt::Display): logs render a
/// tenant key with `Debug`, and a UUID reads best as itself.
impl fmt::Debug for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A tenant is its UUID's 16 bytes.
#[cfg(feature = "codec")]
impl serde::Serialize for crate::TenantId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(self.0.as_bytes(), s)
    }
}

#[cfg(feature = "codec")]
impl<'de> serde::Deserialize<'de> for crate::TenantId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes = <[u8; 16]>::deserialize(d)?;
        Ok(crate::TenantId(uuid::Uuid::from_bytes(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_is_16_bytes_aligned_to_8_and_a_plain_hand_off_stays_24() {
        // Aligned so that a stage's moves of it do not stall; no more than
        // 8, so a hand-off of a `u64` item (what a stalled writer holds per
        // item) is not padded: aligned to 16 it would be 32 bytes.
        assert_eq!(std::mem::size_of::<TenantId>(), 16);
        assert_eq!(std::mem::align_of::<TenantId>(), 8);
        assert_eq!(std::mem::size_of::<(TenantId, u64)>(), 24);
    }

    #[test]
    fn a_tenant_shows_as_its_hyphenated_uuid() {
        let t = TenantId::from_u128(0x0192_3456_789a_7bcd_8ef0_1234_5678_9abc);
        assert_eq!(t.to_string(), "01923456-789a-7bcd-8ef0-123456789abc");
        assert_eq!(
            format!("{t:>40}"),
            format!("{:>40}", t.0),
            "width passes through"
        );
        assert_eq!(TenantId::from(*t.as_uuid()), t);
        assert_eq!(format!("{t:?}"), t.to_string(), "logs show the bare UUID");
    }

    #[test]
    fn fresh_tenants_are_v7_and_sort_by_creation() {
        let a = TenantId::new_v7();
        let b = TenantId::new_v7();
        assert_eq!(a.as_uuid().get_version_num(), 7);
        assert!(a < b, "v7 ids from one process sort by creation");
    }
}
