//! The names the lease policy uses: partitions, epochs, instances.

use std::fmt;

/// One of the outbox table's P partitions, `0..P` (S-L1). Tenants hash
/// into partitions by the table's own SQL function; the lease policy only
/// ever sees the numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Partition(pub u32);

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

/// A lease's epoch (S-L10, S-L11): every acquire of a partition takes an
/// epoch above both the lease row's and the highest the sink has recorded,
/// so a write carrying an older epoch can be refused where it commits.
/// Epoch 0 is "never acquired": the first acquire takes 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The epoch below every acquired one.
    pub const NONE: Epoch = Epoch(0);

    /// The next epoch (saturating: 2^64 acquires of one partition do not
    /// happen).
    pub fn next(self) -> Epoch {
        Epoch(self.0.saturating_add(1))
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

/// The longest [`InstanceId`], in bytes.
pub const MAX_INSTANCE_ID_BYTES: usize = 255;

/// Who an instance is in the lease and heartbeat tables (S-L3, S-L21): a
/// stable name that survives restarts (a StatefulSet pod's name, a host
/// name plus a slot), 1 to [`MAX_INSTANCE_ID_BYTES`] bytes of UTF-8
/// without control characters. An instance that restarts under the same
/// id within `rejoin_grace` gets its partitions back; two live processes
/// must never share one (epochs still keep the sink safe if they do,
/// S-L11, but the two would take turns at every partition).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceId(String);

impl InstanceId {
    /// Checks and wraps `id`.
    ///
    /// # Errors
    /// [`BadInstanceId`] if it is empty, longer than
    /// [`MAX_INSTANCE_ID_BYTES`], or holds a control character.
    pub fn new(id: impl Into<String>) -> Result<InstanceId, BadInstanceId> {
        let id = id.into();
        if id.is_empty() {
            return Err(BadInstanceId::Empty);
        }
        if id.len() > MAX_INSTANCE_ID_BYTES {
            return Err(BadInstanceId::TooLong { bytes: id.len() });
        }
        if id.chars().any(char::is_control) {
            return Err(BadInstanceId::ControlCharacter);
        }
        Ok(InstanceId(id))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a string is not an [`InstanceId`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BadInstanceId {
    /// The id is empty.
    Empty,
    /// The id is longer than [`MAX_INSTANCE_ID_BYTES`].
    TooLong {
        /// Its length in bytes.
        bytes: usize,
    },
    /// The id holds a control character (it would garble logs).
    ControlCharacter,
}

impl fmt::Display for BadInstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadInstanceId::Empty => f.write_str("lease config: `instance_id` must not be empty"),
            BadInstanceId::TooLong { bytes } => write!(
                f,
                "lease config: `instance_id` is {bytes} bytes, at most {MAX_INSTANCE_ID_BYTES} are allowed"
            ),
            BadInstanceId::ControlCharacter => {
                f.write_str("lease config: `instance_id` must not hold control characters")
            }
        }
    }
}

impl std::error::Error for BadInstanceId {}

/// Who holds an installed epoch at the sink (S-L11): the instance and the
/// run of it (its `incarnation`), so that two runs of one instance id that
/// were handed the same epoch (possible only after the lease table was
/// rolled back by a database failover) can never both install it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Holder {
    /// The instance.
    pub instance: InstanceId,
    /// Its run ([`LeaseConfigBuilder::incarnation`](super::LeaseConfigBuilder::incarnation)).
    pub incarnation: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_ids_are_checked() {
        assert_eq!(InstanceId::new(""), Err(BadInstanceId::Empty));
        assert_eq!(
            InstanceId::new("x".repeat(256)),
            Err(BadInstanceId::TooLong { bytes: 256 })
        );
        assert_eq!(
            InstanceId::new("relay\n1"),
            Err(BadInstanceId::ControlCharacter)
        );
        let id = InstanceId::new("relay-0").unwrap();
        assert_eq!(id.as_str(), "relay-0");
        assert_eq!(id.to_string(), "relay-0");
        assert!(InstanceId::new("é".repeat(127)).is_ok(), "254 bytes");
        assert!(BadInstanceId::Empty.to_string().contains("instance_id"));
    }

    #[test]
    fn epochs_grow() {
        assert_eq!(Epoch::NONE.next(), Epoch(1));
        assert_eq!(Epoch(u64::MAX).next(), Epoch(u64::MAX));
        assert_eq!(Epoch(3).to_string(), "e3");
        assert_eq!(Partition(7).to_string(), "p7");
    }
}
