//! The tokio driver (S-C3): a thin layer that feeds the engine
//! inputs and time, runs sink writes, and exports what the engine decided.
//!
//! - `outbox`: the [`Outbox`] handle and its builder;
//! - `shared`: the engine and waiting callers behind one short lock;
//! - `writer`: the one writer task (drain, spawn, join, timer);
//! - `task`: one write attempt with timeout and cancellation;
//! - `contain`: panic containment for sink code;
//! - `answer`: the future a flush, settle or shutdown caller awaits.
//!
//! Control never queues behind data (S-W15): `flush`, `settle`, `shutdown`
//! and `abandon` act on the engine directly under the lock, and the writer
//! is woken to carry out what the engine decided.

mod answer;
mod contain;
#[cfg(feature = "journal")]
pub(crate) mod journal;
mod outbox;
mod shared;
mod task;
mod writer;

pub use answer::Answer;
#[cfg(feature = "journal")]
pub use journal::SyncError;
pub use outbox::{BuildError, Outbox, OutboxBuilder, DEFAULT_DROP_DEADLINE};
