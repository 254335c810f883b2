//! The tenant key.

use std::fmt;

use uuid::Uuid;

/// A tenant: the key items are grouped, ordered and written by (SPEC Terms).
/// A UUID v7 newtype, so ids sort by creation time and compare cheaply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantId(pub Uuid);

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
