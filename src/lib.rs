//! outbox: record derived work without delaying the request that produced
//! it, and write it per tenant, in order, exactly once, with every lost
//! item counted.
//!
//! - [`core`]: the sans-IO engine, where every decision is made.
//! - [`Sink`]: where items go.

#![warn(missing_docs)]

pub mod core;
pub mod sink;
mod tenant;
#[cfg(feature = "arbitrary")]
pub mod testkit;

pub use sink::{BoxError, ErrorKind, Sink, WriteError, Written};
pub use tenant::TenantId;
