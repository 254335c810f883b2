//! The PostgreSQL outbox table (feature `table`): items staged in the
//! caller's own transaction, so the derived work exists if and only if the
//! business change committed (S-T1..S-T29).
//!
//! - [`OutboxTable`]: the handle that stages, in a tokio-postgres
//!   transaction (or any client) and, with the feature `sqlx`, in sqlx's.
//! - [`schema`]: the numbered migrations and [`migrate`], which applies
//!   the missing ones under an advisory lock.
//! - [`Store`]: the one interface every operation of the relay, the lease
//!   policy and the sink's epoch check goes through; [`PgStore`] is the
//!   SQL, and `model::ModelStore` (feature `testkit`) the simulation's
//!   model of PostgreSQL's semantics, checked against the real server by
//!   one conformance suite.
//! - The relay's policy is sans-IO, in [`core::relay`](crate::core::relay).
//!
//! How to run it (migrations, pgbouncer, failover, changing P): see
//! `docs/table.md`.
//!
//! # Tables
//! For an outbox table `name`: `name` (the rows), `name_dead` (dead
//! letters), `name_in_flight` and `name_crashes` (poison detection),
//! `name_lease` and `name_member` (ownership), `name_sink_epoch` (the
//! sink's epochs), `name_schema` (migrations), and the functions
//! `name_partition(bytea)` and `name_partitions()`.

mod names;
mod pg;
mod relayed;
pub mod schema;
#[cfg(feature = "sqlx")]
mod sqlx;
mod stage;
pub mod store;

#[cfg(feature = "testkit")]
pub mod model;

pub use crate::driver::{ListenerState, SchemaState, TableHealth, TableRelay};
pub use names::{partition_of, TableNames, MAX_NAME_BYTES};
pub use pg::{
    PgEpochTx, PgListener, PgStore, DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT, DEFAULT_LOCK_TIMEOUT,
};
pub use relayed::Relayed;
pub use schema::{check, migrate, Migrated, SchemaError, DEFAULT_PARTITIONS, SCHEMA_VERSION};
#[cfg(feature = "sqlx")]
pub use sqlx::sqlx_crate;
pub use stage::{OutboxTable, StageError, Wakeup};
pub use store::{
    Acquire, Acquired, DeadRow, EpochTx, Horizon, Installed, LeaseKey, LeaseRow, Listener, Member,
    SchemaInfo, SinkEpoch, Store,
};
