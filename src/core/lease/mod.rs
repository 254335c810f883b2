//! The lease policy: which instance of a fleet relays which partitions of
//! the outbox table, under which epoch, until when (S-L1-S-L29).
//!
//! A sans-IO state machine ([`LeasePolicy`]) like the engine: it reads no
//! clock, does no IO and draws no randomness (S-C1). Time comes in as the
//! instance's monotonic [`Time`](super::Time), which the simulation may
//! skew; store operations go out as plain data ([`Request`]: a
//! [`StoreOp`]), and their results come back as plain data ([`Reply`] or
//! [`StoreError`]); what the driver and the engine must act on comes out as
//! [`LeaseEvent`]s. The same config and inputs give the same outputs.
//!
//! What it decides:
//! - **Membership and shares.** It heartbeats every `heartbeat_every`
//!   (S-L3); each heartbeat reads the live members and the lease table's
//!   last owners, from which every instance computes the same [`Plan`]:
//!   shares counted in partitions, balanced to within one, a membership
//!   change moving only the partitions it must, instances beyond P
//!   standing by (S-L18, S-L19). An instance restarting under the same id
//!   within `rejoin_grace` is still a member, so its partitions wait for it
//!   (S-L21).
//! - **Acquire and epochs.** A partition of its share that it does not
//!   hold is acquired: first the sink's recorded epoch is read, then the
//!   lease is taken with an epoch above both it and the row's (S-L10), then
//!   the epoch is installed at the sink; only then is the partition
//!   [`Writable`](LeaseEvent::Writable) (S-L12).
//! - **Deadlines.** Every held lease is renewed every `renew_every`, all in
//!   one statement (S-L5, S-L6). A lease's local deadline is the instant its
//!   last successful renewal (or its acquire) was *sent*, plus `lease_ttl`,
//!   minus `max_clock_drift` (S-L4); no write starts at or after it
//!   ([`begin_write`](LeasePolicy::begin_write), S-L8).
//! - **Stops and releases.** A partition stops
//!   ([`Stopped`](LeaseEvent::Stopped)) when the plan gives it away or the
//!   instance shuts down, and is lost when its deadline passes, its renewal
//!   is refused, a write of it comes back `stale_epoch` or its install is
//!   superseded (S-L15, S-L16). It is released only once its writes in
//!   flight have ended or passed `write_timeout` (S-L17).
//!
//! # What the store must provide
//! Each [`StoreOp`] variant documents its statement; in short, with
//! `now` the database's `clock_timestamp()`:
//!
//! | operation | statement | reply |
//! |---|---|---|
//! | heartbeat | upsert `(instance, expiry = now + member_ttl)`; read live members and every lease row's `(partition, owner)` | members, owners |
//! | sink epochs | read the sink's epoch row of each partition | `(partition, epoch)` |
//! | acquire | autocommit: take each row with no live owner (`expiry <= now`), `epoch = greatest(epoch, floor) + 1`, `expiry = now + ttl` | granted `(partition, epoch)` |
//! | renew | autocommit: `expiry = now + ttl` where owner and epoch match (`expiry > now` optional) | renewed partitions |
//! | install | at the sink, under `lock_timeout`: set `(epoch, holder)` where the row's epoch is lower; keep it where it is exactly this | the row's epoch, whether it is this holder's |
//! | release | autocommit: `expiry = now` where owner and epoch match (owner and epoch kept) | done |
//! | leave | delete the heartbeat row | done |
//!
//! # A run loop
//! ```
//! use outbox::core::lease::{LeaseConfig, LeasePolicy, Reply, StoreOp};
//! use outbox::core::Time;
//!
//! let config = LeaseConfig::builder("relay-0").partitions(4).build().unwrap();
//! let mut policy = LeasePolicy::new(config, Time::ZERO);
//! let now = Time::ZERO;
//! // The driver runs each request and feeds the reply back. Here the
//! // store is a stand-in that knows one member and no lease rows.
//! while let Some(request) = policy.poll_request(now) {
//!     let reply = match request.op {
//!         StoreOp::Heartbeat { instance, .. } => Reply::Members {
//!             members: vec![instance],
//!             owners: vec![],
//!         },
//!         StoreOp::SinkEpochs { .. } => Reply::SinkEpochs { epochs: vec![] },
//!         _ => break,
//!     };
//!     policy.handle_reply(now, request.id, Ok(reply)).unwrap();
//! }
//! // Alone in the fleet, it wants every partition.
//! assert_eq!(policy.share().len(), 4);
//! assert!(policy.poll_timeout().is_some());
//! ```

mod config;
mod event;
mod health;
mod id;
mod phase;
mod plan;
mod policy;
mod replies;
mod requests;
mod store;
mod writes;

pub use config::{LeaseConfig, LeaseConfigBuilder, LeaseConfigError, MAX_PARTITIONS};
pub use event::{LeaseEvent, NotWritable, PartitionState, StopCause};
pub use health::{LeaseCounters, LeaseHealth, LeaseState};
pub use id::{BadInstanceId, Epoch, Holder, InstanceId, Partition, MAX_INSTANCE_ID_BYTES};
pub use plan::{score, Plan};
pub use policy::{Departure, LeasePolicy};
pub use store::{Reply, ReplyError, Request, RequestId, StoreError, StoreOp};
pub use writes::WriteGrant;

#[cfg(test)]
mod tests;
