//! The store interface (S-T24): every operation the relay, the lease
//! policy and the sink's epoch check run against the outbox table's
//! database. Two implementations: [`PgStore`](super::PgStore), the SQL,
//! and (feature `testkit`) `model::ModelStore`,
//! an in-memory model of PostgreSQL's semantics for the simulation; one
//! conformance suite (`tests/table_conformance.rs`) runs against both
//! (S-T27).
//!
//! # Timing facts
//! - Every expiry (lease, member) is set from the database's
//!   `clock_timestamp()` when the statement runs, never from the caller's
//!   clock, and every remaining time the store reports (`expires_in`) is
//!   computed on that clock too: the caller never compares its clock with
//!   the database's.
//! - [`renew`](Store::renew) is one autocommit statement. If it answers
//!   `true`, the lease's expiry is at least `ttl` after some instant
//!   between the call being sent and its answer arriving; the caller's
//!   safe deadline is therefore the local instant just *before it sent*
//!   the renewal, plus `ttl`, minus the clock drift it allows for. An
//!   error of kind `Unknown` proves nothing either way.
//! - [`acquire`](Store::acquire) likewise sets the expiry from the
//!   statement's `clock_timestamp()`.
//!
//! # Cancellation
//! Dropping a future of a single-statement call either leaves the
//! statement unsent, or sent (it may then commit): the same as an error of
//! kind `Unknown`. Dropping an [`EpochTx`] without `commit` rolls it back
//! (PostgreSQL: when its connection is recycled or closed).

use std::future::Future;
use std::time::Duration;

use crate::core::lease::Holder;
use crate::core::relay::{
    Fence, Fenced, InFlight, Page, PageRequest, Recorded, Removal, Removed, StoreError,
};
pub use crate::sinks::postgres::epochs::{Installed, SinkEpoch};
pub use epoch_tx::EpochTx;

mod epoch_tx;

/// The schema a store's tables are at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchemaInfo {
    /// The highest migration applied.
    pub version: u32,
    /// The oldest crate schema version that can still run against it
    /// (S-T3: migrations are additive).
    pub min_reader: u32,
    /// P, the number of partitions (S-T4).
    pub partitions: u32,
}

/// An acquire of one partition's lease (S-T20).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acquire {
    /// The partition.
    pub partition: u32,
    /// The instance taking it.
    pub owner: String,
    /// The highest epoch the sink has recorded for the partition: the new
    /// epoch is above both it and the lease row's.
    pub above: u64,
    /// How long the lease lasts from the statement's `clock_timestamp()`.
    pub ttl: Duration,
}

/// What an [`Acquire`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// Taken under this epoch: the row was never taken, released, or
    /// expired on the database's clock (S-T20, S-L10).
    Taken {
        /// The new epoch.
        epoch: u64,
    },
    /// Live for `expires_in` more, on the database's clock: held by another
    /// owner, or by this one (a live lease is never taken again, not even
    /// by its own owner: a rejoin waits for its old lease to lapse).
    Held {
        /// The holder.
        owner: String,
        /// Its epoch.
        epoch: u64,
        /// Time left, on the database's clock.
        expires_in: Duration,
    },
}

/// One lease as an owner holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseKey {
    /// The partition.
    pub partition: u32,
    /// The owner.
    pub owner: String,
    /// The epoch it was taken under.
    pub epoch: u64,
}

/// One row of the lease table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    /// The partition.
    pub partition: u32,
    /// The last owner: kept by a release and by an expiry (the plan reads
    /// it, S-L21); `None` when never taken.
    pub owner: Option<String>,
    /// The highest epoch taken.
    pub epoch: u64,
    /// Time left, on the database's clock; zero when expired, released or
    /// never taken.
    pub expires_in: Duration,
}

/// One instance of the heartbeat table (S-T22).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The instance.
    pub instance: String,
    /// Time left before it counts as gone, on the database's clock; zero
    /// when gone.
    pub expires_in: Duration,
}

/// One row of the dead-letter table (S-T13).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadRow {
    /// The outbox row's id.
    pub id: i64,
    /// The tenant, encoded.
    pub tenant: Vec<u8>,
    /// The item, encoded.
    pub item: Vec<u8>,
    /// The codec version.
    pub codec_version: u32,
    /// Why it was given up (`terminal`, `expired`, `poisoned`, ...).
    pub reason: String,
    /// Attempts made in the life that gave it up.
    pub attempts: u32,
    /// Crashed attempts recorded for it.
    pub crashes: u32,
    /// The epoch it was moved under.
    pub epoch: u64,
}

/// A notification listener: a connection of its own (S-T15).
pub trait Listener: Send {
    /// Resolves at the next notification on the outbox's channel. An error
    /// means the connection is gone: notifications sent meanwhile are
    /// lost, so listen again and read at once.
    ///
    /// # Cancel safety
    /// Cancel safe: a notification not yet returned stays queued.
    fn next(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// What holds the relay's delivery back, read in one statement on the
/// database's clock (S-T7, S-T36).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Horizon {
    /// The age of the oldest open transaction in the whole cluster that
    /// holds back the xmin watermark (`pg_stat_activity`'s
    /// `backend_xmin`/`backend_xid` with its `xact_start`, prepared
    /// transactions from `pg_prepared_xacts` included), the asking
    /// statement's own session excluded; `None` if there is none.
    pub oldest_transaction: Option<Duration>,
    /// The relay's lag: the age of the oldest row still in the outbox
    /// table (`clock_timestamp() - staged_at`); `None` if it is empty.
    pub lag: Option<Duration>,
}

/// The store interface: see the [module docs](self).
///
/// Every fenced call (`remove`, `record_attempts`, `record_crashes`) takes
/// effect for a partition only while its lease row has the fence's owner
/// and epoch, checked in the same statement under a shared lock on the
/// lease row (S-T11).
pub trait Store: Send + Sync + 'static {
    /// A notification listener.
    type Listener: Listener;
    /// A sink transaction fenced by epochs.
    type EpochTx: EpochTx;

    /// The schema version and P.
    fn schema(&self) -> impl Future<Output = Result<SchemaInfo, StoreError>> + Send;

    /// What holds delivery back, both ages on the database's clock
    /// (S-T7, S-T36): see [`Horizon`].
    fn horizon(&self) -> impl Future<Output = Result<Horizon, StoreError>> + Send;

    /// Reads a page: every read of `request` in one statement, so one
    /// snapshot, with that snapshot's xmin (S-T5, S-T7).
    fn read_page(
        &self,
        request: &PageRequest,
    ) -> impl Future<Output = Result<Page, StoreError>> + Send;

    /// Deletes rows by their exact ids and moves rows to the dead-letter
    /// table, and drops the in-flight records `removal.records` names, in
    /// one transaction (S-T12, S-T13, S-T17); a row's crash count goes with
    /// it, but a record goes only when named (it may cover rows still in
    /// the table). Idempotent: a row or record already gone is skipped.
    fn remove(
        &self,
        fence: &Fence,
        removal: &Removal,
    ) -> impl Future<Output = Result<Removed, StoreError>> + Send;

    /// Writes in-flight records (S-T17) in one statement: each record of a
    /// partition whose lease row still has the fence's owner and epoch is
    /// written (replacing one with the same first row); the records of
    /// the others are not, and their partitions are answered `stale`. The
    /// fence names every record's partition; a record with no rows is
    /// skipped.
    ///
    /// # Errors
    /// The store's; two records with the same first row are refused
    /// (kind `Refused`, nothing written).
    fn record_attempts(
        &self,
        fence: &Fence,
        records: &[InFlight],
    ) -> impl Future<Output = Result<Recorded, StoreError>> + Send;

    /// Turns every in-flight record of `partition` (left by an owner that
    /// did not release it) into one crashed attempt for each of its rows
    /// still in the table, and deletes the records (S-T17). Answers how
    /// many rows gained a crash.
    fn record_crashes(
        &self,
        fence: &Fence,
        partition: u32,
    ) -> impl Future<Output = Result<Fenced<u64>, StoreError>> + Send;

    /// Sends a notification on the outbox's channel from the store's own
    /// connection (autocommit: delivered at once).
    fn notify(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Opens a listener on the outbox's channel.
    fn listen(&self) -> impl Future<Output = Result<Self::Listener, StoreError>> + Send;

    /// Acquires a partition's lease (S-T20): one autocommit statement that
    /// takes it only where its expiry has passed on the database's clock
    /// (never taken, released or lapsed), never a live one, whoever holds
    /// it.
    fn acquire(
        &self,
        request: &Acquire,
    ) -> impl Future<Output = Result<Acquired, StoreError>> + Send;

    /// Renews a lease: one autocommit statement that sets the expiry to
    /// `clock_timestamp() + ttl` where owner and epoch match and the lease
    /// is still live (a released or lapsed lease is never revived); `true`
    /// if a row matched (S-T21).
    fn renew(
        &self,
        lease: &LeaseKey,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Releases a lease: one autocommit statement that sets its expiry to
    /// `clock_timestamp()` (never later than it was), keeping the owner as
    /// the last owner and the epoch, where owner and epoch match, and drops
    /// the partition's in-flight records: a clean hand-over is no crash
    /// (S-T21). `true` if a row matched; a repeat matches again.
    fn release(&self, lease: &LeaseKey) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The lease table, by partition.
    fn leases(&self) -> impl Future<Output = Result<Vec<LeaseRow>, StoreError>> + Send;

    /// Announces `instance` for `ttl` from the statement's
    /// `clock_timestamp()` (S-T22).
    fn heartbeat(
        &self,
        instance: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Removes `instance` from the heartbeat table (it leaves).
    fn leave(&self, instance: &str) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The heartbeat table, by instance.
    fn members(&self) -> impl Future<Output = Result<Vec<Member>, StoreError>> + Send;

    /// The epochs installed at the sink and their holders, by partition.
    fn sink_epochs(&self) -> impl Future<Output = Result<Vec<SinkEpoch>, StoreError>> + Send;

    /// Installs `epoch` for `partition` at the sink for `holder` (S-T23,
    /// S-L11): where the row's epoch is lower or the row is absent; a
    /// repeat of this very install (same epoch and holder) answers
    /// `Installed` again; a higher epoch, or this epoch for another holder,
    /// answers `Superseded`. Waits at most the store's `lock_timeout` for a
    /// sink transaction's shared lock (an error of kind `LockTimeout`).
    fn install_epoch(
        &self,
        partition: u32,
        epoch: u64,
        holder: &Holder,
    ) -> impl Future<Output = Result<Installed, StoreError>> + Send;

    /// Begins a sink transaction fenced by epochs (S-T23), running under
    /// the store's `idle_in_transaction_session_timeout`.
    fn begin_epoch_tx(&self) -> impl Future<Output = Result<Self::EpochTx, StoreError>> + Send;

    /// The dead-letter table's rows, oldest first, at most `limit`.
    fn dead_letters(
        &self,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<DeadRow>, StoreError>> + Send;

    /// Moves dead-letter rows back into the outbox table as new stages
    /// (new ids and transaction id: delivered after what is already
    /// staged), in one transaction; answers how many moved (S-T13).
    fn redrive(&self, ids: &[i64]) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes dead-letter rows moved there longer than `older_than` ago
    /// (on the database's clock); answers how many (S-T13).
    fn purge_dead(
        &self,
        older_than: Duration,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}
