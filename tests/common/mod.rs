//! Helpers shared by the integration tests: a fault-injecting TCP proxy,
//! the test-server environment switches and a local metrics recorder. Each
//! test binary uses a part.
#![allow(dead_code)]

pub mod proxy;
pub mod recorder;
pub mod servers;
