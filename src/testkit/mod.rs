//! Test kit (feature `arbitrary`): the [`Op`] type and the invariant-checking
//! [`Harness`] shared by the model test, the fuzz target and the
//! simulation's fast world, so a failure found by one replays in the others.

mod harness;
mod op;

/// The driver's staging decision for one engine (S-W21), from the core.
pub use crate::core::Stager;
pub use harness::{Fate, Harness, Loss, Stats, Violation};
pub use op::{weight_of, ConfigDraw, Op, OpOutcome};
