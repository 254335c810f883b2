//! The sans-IO engine: every decision the outbox makes (S-C1..S-C4).
//!
//! Nothing here does IO, reads a clock, spawns, sleeps or draws unseeded
//! randomness. Time comes in as [`Time`]; writes go out as [`Write`]s whose
//! items are moved out and back (S-C2); what the driver must count, log or
//! answer comes out as [`Event`]s. The same config, seed and inputs give
//! the same outputs, bit for bit.
//!
//! ```
//! use outbox::core::{Config, Engine, Event, Outcome, Time};
//!
//! let mut engine: Engine<u32, &str> = Engine::new(Config::default()).unwrap();
//! let now = Time::ZERO;
//! let _ = engine.stage(now, 7, "a");
//! let _ = engine.stage(now, 7, "b");
//! let write = engine.poll_write(now).expect("tenant 7 is ready");
//! assert_eq!(write.items, ["a", "b"]);
//! // ... the driver runs the sink, then hands the items back:
//! engine.finish(Time::from_millis(3), write, Outcome::WRITTEN).unwrap();
//! assert_eq!(engine.pending(), 0);
//! assert!(matches!(engine.poll_event(), Some(Event::Written { items: 2, .. })));
//! ```

mod accounting;
mod admission;
mod ages;
mod backlog;
mod backoff;
mod breaker;
pub(crate) mod canary;
mod config;
mod engine;
mod group;
#[cfg(all(feature = "journal", feature = "testkit"))]
pub mod journal;
#[cfg(all(feature = "journal", not(feature = "testkit")))]
pub(crate) mod journal;
pub mod lease;
pub mod relay;
mod schedule;
mod shrink;
pub(crate) mod stage_answers;
mod suspects;
mod tenants;
mod time;
mod wait;
mod write;

pub use accounting::{Counters, DropReason, LostReason, LOG_EVERY};
pub use admission::{decide, recheck, Admission, Checks, Handoff, OnRefusal, Refusal, Stager};
pub(crate) use admission::{hand_off, Append, Commit, Facts, Prepared};
pub use ages::{ItemAge, ItemOutcome};
pub use breaker::{BreakerConfig, BreakerState};
pub use config::{Config, ConfigBuilder, ConfigError, ErrorPolicy};
pub(crate) use engine::weight;
pub use engine::{Durable, Engine, Intake, LazyStaged, Staged, UnknownWrite, Weigher, MAX_WEIGHT};
pub(crate) use stage_answers::{Tally, Verdict};
pub use time::Time;
pub use write::{
    AfterFailure, DeadLetter, DeadReason, Event, Failure, Outcome, Report, ShutdownReport,
    Unwritten, WaitId, Write, WriteId,
};
