//! outbox: record derived work without delaying the request that produced
//! it, and write it per tenant, in order, exactly once, with every lost
//! item counted.
//!
//! - [`core`]: the sans-IO engine, where every decision is made.
//! - [`Sink`]: where items go.
//! - [`sinks`]: reference sinks, PostgreSQL (feature `postgres`) and NATS
//!   JetStream (feature `nats`).

#![warn(missing_docs)]

pub mod core;
pub mod sink;
pub mod sinks;
mod tenant;

pub use sink::{BoxError, ErrorKind, Sink, WriteError, Written};
pub use tenant::TenantId;
