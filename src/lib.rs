//! outbox: record derived work (usage records, audit events) without
//! delaying the request that produced it, and write it per tenant, in
//! order, exactly once, with every lost item counted while the process
//! lives. Pending items are held in memory: a crash of the process loses
//! them uncounted unless the optional journal is on (feature `journal`,
//! module `journal`), which brings back every item an answered
//! `Outbox::sync` covered.
//!
//! - [`Outbox`]: the handle a service keeps. [`Outbox::stage`] never waits
//!   and never fails (S-W1); one writer task writes each tenant's items in
//!   staging order through your [`Sink`], retrying failed writes with the
//!   identical slice (S-W5) after a backoff (S-W7).
//! - [`Sink`]: where items go; its `write` must be idempotent. The sink
//!   chooses the tenant key ([`Sink::Tenant`]): any [`TenantKey`], e.g.
//!   `u64`, `i64`, `String`, `Arc<str>`, [`Uuid`](uuid::Uuid) or the
//!   ready-made [`TenantId`].
//! - [`core`]: the sans-IO engine, where every decision is made; configure
//!   it with [`Config`].
//! - [`contract`]: the rules the crate keeps; every rule id cited in these
//!   docs (S-W1, S-W5, I3, ...) is defined there.
//! - [`telemetry`]: the metrics and logs an outbox exports.
//! - [`sinks`]: reference sinks, PostgreSQL (feature `postgres`) and NATS
//!   JetStream (feature `nats`).
//!
//! # Embedding
//!
//! Build the outbox once, on the service's runtime, and keep a clone in
//! each request handler. Stage from the request path; flush where the
//! service needs its work durable (say at the end of a batch job); shut
//! down when the service stops, and hand the dead letters to whoever keeps
//! them.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::sync::Mutex;
//! use std::time::Duration;
//!
//! use outbox::{Config, Outbox, Sink, Staged, WriteError, Written};
//!
//! /// A tiny in-memory sink: one row per (tenant, usage record id), so a
//! /// repeated attempt leaves one copy (the idempotency duty). Tenants are
//! /// the service's own organisation ids, `i64`.
//! #[derive(Default)]
//! struct Memory(Mutex<BTreeMap<(i64, u64), u64>>);
//!
//! struct Usage {
//!     id: u64,
//!     units: u64,
//! }
//!
//! impl Sink for Memory {
//!     type Tenant = i64;
//!     type Item = Usage;
//!     fn name(&self) -> &str {
//!         "memory"
//!     }
//!     async fn write(&self, tenant: &i64, items: &[Usage]) -> Result<Written, WriteError> {
//!         let mut rows = self.0.lock().unwrap();
//!         for u in items {
//!             rows.insert((*tenant, u.id), u.units);
//!         }
//!         Ok(Written::ALL)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config::builder()
//!     .max_batch(500)
//!     .linger(Duration::from_millis(5))
//!     .capacity(100_000)
//!     .build()?;
//! let outbox = Outbox::new(Memory::default(), config)?;
//!
//! // In a request handler: never waits, never fails.
//! let tenant: i64 = 42;
//! for id in 0..3 {
//!     let staged = outbox.stage(tenant, Usage { id, units: 10 * id });
//!     assert_eq!(staged, Staged::Accepted);
//! }
//!
//! // Where the work must be durable: flush, waiting at most 5 s.
//! let report = outbox.flush(Duration::from_secs(5)).await;
//! assert_eq!((report.written, report.pending), (3, 0));
//!
//! // When the service stops: the fence goes up at once, pending items
//! // drain for at most 10 s, the rest comes back as dead letters.
//! let report = outbox.shutdown(Duration::from_secs(10)).await;
//! assert_eq!(report.lost, 0);
//! assert!(report.unwritten.is_empty());
//! assert_eq!(outbox.stage(tenant, Usage { id: 9, units: 1 }), Staged::ShuttingDown);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

#[cfg(feature = "codec")]
pub mod codec;
mod contain;
pub mod contract;
pub mod core;
mod driver;
mod handoff;
#[cfg(feature = "journal")]
pub mod journal;
pub mod sink;
pub mod sinks;
#[cfg(feature = "table")]
pub mod table;
pub mod telemetry;
mod tenant;
#[cfg(feature = "arbitrary")]
pub mod testkit;

pub use crate::core::{
    BreakerConfig, BreakerState, Config, ConfigBuilder, ConfigError, Counters, DeadLetter,
    DeadReason, DropReason, ErrorPolicy, LostReason, Report, ShutdownReport, Staged, Unwritten,
};
#[cfg(feature = "journal")]
pub use driver::SyncError;
pub use driver::{
    Answer, BuildError, DeadLetters, Health, Outbox, OutboxBuilder, StageError, StagedMany,
    DEFAULT_DROP_TIMEOUT,
};
pub use sink::{BoxError, ErrorKind, Sink, Slice, WriteEpoch, WriteError, Written};
pub use tenant::{TenantId, TenantKey};
