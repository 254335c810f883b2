//! The tenant key.

use std::fmt;
use std::hash::{Hash, Hasher};

use uuid::Uuid;

/// A tenant: the key items are grouped, ordered and written by (contract: Terms).
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

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn fresh_tenants_are_v7_and_sort_by_creation() {
        let a = TenantId::new_v7();
        let b = TenantId::new_v7();
        assert_eq!(a.as_uuid().get_version_num(), 7);
        assert!(a < b, "v7 ids from one process sort by creation");
    }
}
