//! What the relay's policy and the outbox table's store say to each other:
//! rows and their positions, page reads, removals, conditional-write
//! fences and errors. Plain data: the store interface
//! (`outbox::table::Store`) takes and answers these, and the relay
//! ([`Relay`](super::Relay)) emits and handles them.

use std::fmt;
use std::time::Duration;

use crate::sink::BoxError;

/// A row's place in the order rule (S-T5): its staging transaction's id
/// (`pg_current_xact_id()`, 64 bits, never wraps), then its id (assigned
/// in staging order within a transaction). Ordered by `xid`, then `id`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// The staging transaction's id.
    pub xid: u64,
    /// The row's id.
    pub id: i64,
}

/// One row of the outbox table, as a page read returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The row's id (an identity column, from 1); the item's key when it is
    /// handed to the engine, and the idempotency key across restarts when
    /// the item carries none of its own (S-T14).
    pub id: i64,
    /// The staging transaction's id.
    pub xid: u64,
    /// The tenant's partition (S-T4).
    pub partition: u32,
    /// The tenant, as the codec encoded it.
    pub tenant: Vec<u8>,
    /// The item, as the codec encoded it.
    pub item: Vec<u8>,
    /// The codec's schema version the item was encoded with (S-T3).
    pub codec_version: u32,
    /// How long ago it was staged, on the database's clock
    /// (`clock_timestamp() - staged_at`, never negative): no local clock is
    /// compared with the database's.
    pub age: Duration,
    /// Crashed attempts recorded for it (S-T17).
    pub crashes: u32,
}

impl Row {
    /// The row's [`Position`].
    pub fn position(&self) -> Position {
        Position {
            xid: self.xid,
            id: self.id,
        }
    }
}

/// How a page read chooses and orders rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadOrder {
    /// The order rule (S-T5): rows of transactions older than the
    /// snapshot's xmin only, in (xid, id) order, after the cursor.
    #[default]
    Watermark,
    /// Wrong on purpose: every visible row with an id above the cursor's,
    /// in id order, the reader that skips late-committing rows (S-T6). For
    /// tests and canaries that prove the checks see it; never in a relay.
    IdAboveLastSeen,
}

/// Read one partition's rows after a cursor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionRead {
    /// The partition.
    pub partition: u32,
    /// Rows after this position (exclusive); `None`: from the oldest.
    pub after: Option<Position>,
    /// At most this many rows (at least 1).
    pub limit: u32,
}

/// Read one tenant's rows between two positions (a saturated or held
/// tenant catching up, S-T9).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantRead {
    /// The tenant's partition.
    pub partition: u32,
    /// The tenant, encoded.
    pub tenant: Vec<u8>,
    /// Rows after this position (exclusive); `None`: from the oldest.
    pub after: Option<Position>,
    /// Rows up to this position (inclusive).
    pub until: Position,
    /// At most this many rows (at least 1).
    pub limit: u32,
}

/// One page read: every read in one statement, so in one snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageRequest {
    /// Which rows and in what order.
    pub order: ReadOrder,
    /// Per partition, after its cursor.
    pub partitions: Vec<PartitionRead>,
    /// Per catching-up tenant, between two positions.
    pub tenants: Vec<TenantRead>,
}

/// A page: the rows of each read of the request, in the request's order,
/// each read's rows in (xid, id) order (id order under
/// [`ReadOrder::IdAboveLastSeen`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Page {
    /// The snapshot's xmin (`pg_snapshot_xmin(pg_current_snapshot())`):
    /// every transaction with a smaller id had ended when the page was read.
    pub xmin: u64,
    /// One entry per [`PageRequest::partitions`].
    pub partitions: Vec<Vec<Row>>,
    /// One entry per [`PageRequest::tenants`].
    pub tenants: Vec<Vec<Row>>,
}

/// The lease a conditional write of the outbox table runs under: it takes
/// effect for a row only while the row's partition's lease row still has
/// this owner and epoch (S-T11).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fence {
    /// The instance that owns the leases.
    pub owner: String,
    /// `(partition, epoch)` for each partition the write touches.
    pub epochs: Vec<(u32, u64)>,
}

/// Why a row left for the dead-letter table (S-T13): the loss reasons of
/// the engine a slice can be given up for, and the relay's own two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeadReason {
    /// The sink rejected it terminally.
    Terminal,
    /// `max_attempts` or `max_retry_duration` ran out.
    RetriesExhausted,
    /// Dropped by the `drop` error policy.
    SinkError,
    /// Older than `max_item_age`.
    Expired,
    /// Its writes took the relay down `max_crash_attempts` times (S-T18).
    Poisoned,
    /// Encoded with a codec version declared retired (S-T19).
    RetiredVersion,
}

impl DeadReason {
    /// The name stored in the dead-letter table's `reason` column.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::Terminal => "terminal",
            DeadReason::RetriesExhausted => "retries_exhausted",
            DeadReason::SinkError => "sink_error",
            DeadReason::Expired => "expired",
            DeadReason::Poisoned => "poisoned",
            DeadReason::RetiredVersion => "retired_version",
        }
    }

    /// The reason named `name` ([`as_str`](Self::as_str)).
    pub fn from_name(name: &str) -> Option<DeadReason> {
        [
            DeadReason::Terminal,
            DeadReason::RetriesExhausted,
            DeadReason::SinkError,
            DeadReason::Expired,
            DeadReason::Poisoned,
            DeadReason::RetiredVersion,
        ]
        .into_iter()
        .find(|r| r.as_str() == name)
    }
}

impl fmt::Display for DeadReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row to move to the dead-letter table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterRow {
    /// The row.
    pub id: i64,
    /// Why.
    pub reason: DeadReason,
    /// Attempts made in this life (0 for a row never handed to the engine).
    pub attempts: u32,
}

/// Rows leaving the outbox table, in one transaction (S-T12, S-T13):
/// deleted by their exact ids, or moved to the dead-letter table; and the
/// in-flight records whose last rows are settled by it, or were before
/// (S-T17).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removal {
    /// Rows to delete.
    pub delete: Vec<i64>,
    /// Rows to move to the dead-letter table.
    pub dead: Vec<DeadLetterRow>,
    /// In-flight records to drop, each named by its first row
    /// ([`InFlight::first_id`]); only records of the fence's partitions
    /// still held are dropped, and one already gone is skipped.
    pub records: Vec<i64>,
}

impl Removal {
    /// Whether it removes nothing and drops no record.
    pub fn is_empty(&self) -> bool {
        self.delete.is_empty() && self.dead.is_empty() && self.records.is_empty()
    }
}

/// What a [`Removal`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Ids deleted (absent: already gone, or under a stale fence).
    pub deleted: Vec<i64>,
    /// Ids moved to the dead-letter table.
    pub dead: Vec<i64>,
    /// Partitions of the fence whose lease row no longer has its owner and
    /// epoch: nothing of theirs was touched.
    pub stale: Vec<u32>,
}

/// An in-flight record (S-T17): the rows of one partition that one page
/// read delivered towards the engine, written before the first attempt of
/// any of them and kept until the last of them is settled (removed, or no
/// longer this relay's). A crash while it exists counts one crashed
/// attempt for each of its rows still in the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// The partition of its rows.
    pub partition: u32,
    /// Its rows, in delivery order; never empty when the relay sends it.
    pub ids: Vec<i64>,
}

impl InFlight {
    /// The record's key in the store: its first row (`None` if it has no
    /// rows; S-T17).
    pub fn first_id(&self) -> Option<i64> {
        self.ids.first().copied()
    }
}

/// What a [`StoreOp::RecordAttempts`] did (S-T17, S-T11): every record of
/// a partition still held is written; those of `stale` partitions are
/// not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Partitions of the fence whose lease row no longer has its owner and
    /// epoch: nothing of theirs was written.
    pub stale: Vec<u32>,
}

/// What a store call's failure means for what it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// The connection failed or the reply was lost: the statement may or
    /// may not have taken effect (a commit whose reply is lost).
    Unknown,
    /// The database refused the statement (an error with a SQLSTATE): it
    /// took no effect, and its transaction is rolled back.
    Refused,
    /// A lock was not granted within `lock_timeout` (SQLSTATE `55P03`):
    /// no effect.
    LockTimeout,
    /// A serialisation failure or deadlock (class `40`): no effect; try
    /// again.
    Conflict,
    /// The pool or the configuration cannot reach the database at all
    /// (closed pool, timeout waiting for a connection): no effect.
    Unavailable,
}

/// A store call that failed: its [kind](StoreErrorKind), the SQLSTATE if
/// the database sent one, and the cause.
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    sqlstate: Option<String>,
    source: BoxError,
}

impl StoreError {
    /// An error of `kind` caused by `source`, with the database's SQLSTATE.
    pub fn new(
        kind: StoreErrorKind,
        sqlstate: Option<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        StoreError {
            kind,
            sqlstate,
            source: source.into(),
        }
    }

    /// What the failure means for what the call did.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The database's SQLSTATE, if it sent one.
    pub fn sqlstate(&self) -> Option<&str> {
        self.sqlstate.as_deref()
    }

    /// Whether the call may have taken effect (its reply was lost).
    pub fn outcome_unknown(&self) -> bool {
        self.kind == StoreErrorKind::Unknown
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.source.to_string();
        match &self.sqlstate {
            // A cause that names its SQLSTATE already (the PostgreSQL
            // client's errors do) is not given it twice.
            Some(code) if !text.contains(&format!("SQLSTATE {code}")) => {
                write!(f, "{:?}: {text} (SQLSTATE {code})", self.kind)
            }
            _ => write!(f, "{:?}: {text}", self.kind),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// The answer of a fenced call that touches one partition: done, or its
/// lease row no longer has the fence's owner and epoch (nothing changed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fenced<T> {
    /// It took effect.
    Done(T),
    /// The fence was stale: nothing changed.
    Stale,
}

/// Names one store call the relay asked for, so its answer finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

/// A store call the relay asks its driver to run (S-T24), then answer with
/// the matching `handle_*` of [`Relay`](super::Relay).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreOp {
    /// `Store::read_page`; answer with `handle_page`.
    ReadPage {
        /// The call.
        op: OpId,
        /// What to read.
        request: PageRequest,
    },
    /// `Store::remove`; answer with `handle_removed`.
    Remove {
        /// The call.
        op: OpId,
        /// The leases it runs under.
        fence: Fence,
        /// The rows.
        removal: Removal,
    },
    /// `Store::record_crashes` for a partition just gained, before its
    /// first read; answer with `handle_crashes_recorded`.
    RecordCrashes {
        /// The call.
        op: OpId,
        /// The lease it runs under.
        fence: Fence,
        /// The partition.
        partition: u32,
    },
    /// `Store::record_attempts` for the rows a page read delivers (one
    /// record per partition, in one statement), before any of them goes
    /// to the engine; answer with `handle_attempt_recorded` (S-T17).
    RecordAttempts {
        /// The call.
        op: OpId,
        /// The lease it runs under: every partition of its records.
        fence: Fence,
        /// The records, one per partition, first rows distinct.
        records: Vec<InFlight>,
    },
}

impl StoreOp {
    /// The call's id.
    pub fn id(&self) -> OpId {
        match self {
            StoreOp::ReadPage { op, .. }
            | StoreOp::Remove { op, .. }
            | StoreOp::RecordCrashes { op, .. }
            | StoreOp::RecordAttempts { op, .. } => *op,
        }
    }
}

/// How a row handed to the engine ended, as the engine reports it through
/// its key (the row's id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    /// Written: the row is deleted.
    Written,
    /// Given up by policy: the row moves to the dead-letter table.
    GivenUp {
        /// Why.
        reason: DeadReason,
        /// Attempts made in this life.
        attempts: u32,
    },
    /// Left for the next owner or the next start (a shutdown's deadline, a
    /// lost partition): the row, and every later row of its tenant, stays.
    HandedOver,
}

/// What the relay tells its driver, beside store calls and deliveries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RelayEvent {
    /// A row's codec version is neither known nor retired: it and its
    /// tenant's later rows stay in the table (S-T19), for `health()` and a
    /// metric.
    UnknownVersion {
        /// The row.
        id: i64,
        /// Its partition.
        partition: u32,
        /// Its version.
        version: u32,
    },
    /// A fenced call found the partition's lease taken: the relay has
    /// forgotten the partition; the lease policy must treat it as lost.
    PartitionStale {
        /// The partition.
        partition: u32,
    },
    /// The in-flight records of a page's rows are durable: `rows` rows go
    /// to the engine (S-T17).
    AttemptsRecorded {
        /// Rows released towards the engine.
        rows: u64,
    },
    /// Rows left the table.
    Removed {
        /// Deleted after their write.
        deleted: u64,
        /// Moved to the dead-letter table.
        dead: u64,
    },
    /// A suspect of a crash is delivered alone (S-T18).
    Quarantined {
        /// The row.
        id: i64,
    },
    /// The answer to [`Relay::handle_suspect_retry`](super::Relay::handle_suspect_retry)
    /// (S-T18): `recorded`, the suspect's in-flight record for its retry is
    /// durable and the retry may reach the sink; else the retry must not
    /// (the row is no longer this relay's, or not waiting for a retry).
    SuspectRetry {
        /// The row.
        id: i64,
        /// Whether its record is durable.
        recorded: bool,
    },
    /// A store call failed; it is tried again after a backoff.
    StoreFailed {
        /// What failed.
        kind: StoreErrorKind,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_error_names_its_sqlstate_once() {
        let bare = StoreError::new(
            StoreErrorKind::Refused,
            Some("42P01".into()),
            "relation \"x\" does not exist",
        );
        let named = StoreError::new(
            StoreErrorKind::Refused,
            Some("42P01".into()),
            "ERROR: relation \"x\" does not exist (SQLSTATE 42P01)",
        );
        for e in [bare, named] {
            let text = e.to_string();
            assert_eq!(text.matches("SQLSTATE").count(), 1, "{text}");
            assert!(text.ends_with("(SQLSTATE 42P01)"), "{text}");
        }
        let none = StoreError::new(StoreErrorKind::Unknown, None, "connection closed");
        assert_eq!(none.to_string(), "Unknown: connection closed");
    }
}
