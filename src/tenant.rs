//! The tenant key.

use std::fmt;
use std::hash::{Hash, Hasher};

use uuid::Uuid;

/// A tenant: the key items are grouped, ordered and written by (SPEC Terms).
/// A UUID v7 newtype, so ids sort by creation time and compare cheaply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TenantId(pub Uuid);

/// One 128-bit write: `Uuid` hashes as a byte slice (a length, then 16
/// bytes), a third more work for the engine's SipHash per lookup. Equal
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

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}
