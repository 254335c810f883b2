//! Helpers shared by the integration tests: a fault-injecting TCP proxy and
//! the test-server environment switches. Each test binary uses a part.
#![allow(dead_code)]

pub mod proxy;
pub mod servers;
