//! `outbox-sim`: the deterministic simulation of the outbox (S-B4,
//! in the spirit of TigerBeetle's VOPR and FoundationDB's simulator).
//!
//! A seed draws a config, a workload and faults; a world runs them and the
//! checker judges every step:
//! - [`fast`]: the sans-IO core alone under a virtual clock, through
//!   `outbox::testkit::Harness`, a faulty phase checked for safety after
//!   every step, then a healed phase checked for liveness (I6) and the
//!   datastore (I1);
//! - [`net`]: the tokio driver (`outbox::Outbox`) and a network sink over
//!   turmoil's simulated TCP to a datastore host, with network faults, a
//!   healed phase for liveness (I6) and the end checks (I1, I5);
//! - [`crash`]: the net world's datastore and a journaled outbox on a
//!   simulated disk, the application host crashing and restarting on it,
//!   storage faults, and the durability checks (D1-D6).
//!
//! The CLI (`outbox-sim run`, `outbox-sim replay SEED`) and the tests share
//! this library.

pub mod campaign;
pub mod crash;
pub mod draw;
pub mod fast;
pub mod fleet;
pub mod net;
pub mod regressions;
pub mod report;
pub mod svg;
pub mod timeline;
pub mod world;

pub use outbox::testkit::Violation;
pub use world::{replay_command, run_seed, RunOptions, RunResult, WorldError, WorldKind};
