//! The tokio driver (S-C3): a thin layer that feeds the engine
//! inputs and time, runs sink writes, and exports what the engine decided.
//!
//! - `build`: the [`OutboxBuilder`] and [`BuildError`];
//! - `outbox`: the [`Outbox`] handle: control calls and reads;
//! - `stage`: the staging pipeline: `stage`, `try_stage`, `stage_wait`
//!   (S-W21), each a thin wrapper over one pipeline;
//! - `stage_many`: staging a run of items under one lock (S-W20), through
//!   the same pipeline;
//! - `shared`: the engine and waiting callers behind one short lock;
//! - `journal`: the one journal adapter (a stub of the same names without
//!   the `journal` feature); outside it only `BuildError::Journal` and the
//!   `SyncError` re-export name the feature;
//! - `table`: the outbox table's lease and relay tasks (feature `table`);
//! - `writer`: the one writer task (drain, spawn, join, timer);
//! - `task`: one write attempt with timeout and cancellation;
//! - `contain`: panic containment for sink code;
//! - `dead_letters`: the run-time dead-letter hand-off (S-R4);
//! - `health`: the health snapshot and its gauges (S-R6);
//! - `answer`: the future a flush, settle or shutdown caller awaits.
//!
//! Control never queues behind data (S-W15): `flush`, `settle`, `shutdown`
//! and `abandon` act on the engine directly under the lock, and the writer
//! is woken to carry out what the engine decided.

mod answer;
pub(crate) use crate::contain;
mod build;
mod dead_letters;
mod health;
pub(crate) mod journal;
mod outbox;
mod shared;
mod stage;
mod stage_many;
#[cfg(feature = "table")]
pub(crate) mod table;
mod task;
mod writer;

pub use crate::core::stage_answers::{StageError, StagedMany};
pub use answer::Answer;
pub use build::{BuildError, OutboxBuilder, DEFAULT_DROP_TIMEOUT};
pub use dead_letters::DeadLetters;
pub use health::Health;
#[cfg(feature = "journal")]
pub use journal::SyncError;
pub use outbox::Outbox;
#[cfg(feature = "table")]
pub use table::health::{ListenerState, SchemaState, TableHealth};
#[cfg(feature = "table")]
pub use table::TableRelay;

/// `now + after`, or a point far enough away to be never (about 30 years)
/// when `after` is so large the sum would overflow: a caller's
/// `Duration::MAX` means "no deadline", never a panic.
pub(crate) fn deadline(
    now: tokio::time::Instant,
    after: std::time::Duration,
) -> tokio::time::Instant {
    const NEVER: std::time::Duration = std::time::Duration::from_secs(30 * 365 * 24 * 3600);
    now.checked_add(after.min(NEVER)).unwrap_or(now)
}
