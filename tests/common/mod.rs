//! Helpers shared by the integration tests: a fault-injecting TCP proxy,
//! the test-server environment switches, connections to each server, a
//! local metrics recorder, and what the sink and end-to-end tests share.
//! Each test binary uses a part.
#![allow(dead_code)]

pub mod e2e;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod proxy;
pub mod recorder;
pub mod servers;
pub mod sink;
#[cfg(feature = "table")]
pub mod table;
