//! The net world: the real tokio driver and a real network sink under
//! turmoil's simulated network, clock and hosts.
//!
//! Two hosts: `app` runs `outbox::Outbox` with [`sink::NetSink`], which
//! speaks a length-prefixed protocol ([`protocol`]) over simulated TCP to
//! `datastore` ([`datastore`]), an idempotent store whose committed data
//! survives crashes. Everything is drawn from the seed: the config (the
//! fast world's draw), the workload ([`workload`]), the faults
//! ([`faults`]); turmoil's own generator is seeded from it too. The world
//! ([`world`]) steps the simulation and applies the network schedule
//! (partitions, repairs, slow links, crashes, restarts, storms) between
//! steps, then heals everything at the end of the faulty phase.
//!
//! The checker is split as TigerBeetle does: safety during the run where
//! each thing is seen ([`sink`], [`datastore`], [`app`]) and at the end,
//! liveness (I6, or the writer's drain and exit after every handle is
//! dropped, S-W16) in the healed phase ([`app`]). The checks themselves are
//! gathered by rule in [`check`], whose docs say where each rule is
//! checked. Every event goes into the [`book`], whose hash is the
//! determinism self-check.

pub mod app;
pub mod book;
pub mod check;
pub mod datastore;
pub mod faults;
pub mod metrics;
pub mod protocol;
pub mod sink;
pub mod workload;
pub mod world;

pub use world::{run, FAULT_KINDS};
