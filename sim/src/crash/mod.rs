//! The crash world: the real journal, driver and sink under turmoil's
//! simulated network, clock, hosts and disk, with the application host
//! crashing and restarting on its disk (issue 13; contract D1-D6).
//!
//! Two hosts: `app` runs one life of the process per start ([`app`]): a
//! journaled `outbox::Outbox` on [`disk::SimDisk`] (turmoil's simulated
//! file system plus deterministic faults) writing through
//! [`sink::CrashSink`] to the net world's `datastore` host, here per item
//! idempotent. The seed draws the config, the workload, the crashes (at
//! plain moments, inside a group commit, inside a segment deletion, inside
//! recovery, during a shutdown) and the storage faults ([`faults`]), each
//! on a stream of its own. The world ([`world`]) crashes and restarts the
//! application on that schedule, heals at the end of the faulty phase, and
//! the last life settles, checks and shuts down. The checks are gathered by
//! rule in [`check`]; what outlives a crash in the world's memory is the
//! [`ledger`]; every event goes into the net world's book, whose hash is
//! the determinism self-check.

pub mod app;
pub mod check;
pub mod codec;
pub mod disk;
pub mod faults;
pub mod ledger;
pub mod sink;
pub mod versions;
pub mod world;

pub use world::{run, FAULT_KINDS};
