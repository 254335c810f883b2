//! The one decoding of fuzz input shared by the `engine` fuzz target and
//! the crate's `tests/fuzz_regressions.rs` (included there with `#[path]`),
//! so a crash input replays without libFuzzer under `cargo test`.
//!
//! Input layout (via `arbitrary`): a [`ConfigDraw`], a tenant count in
//! 1..=8, then `Op`s until the data runs out (at most [`MAX_OPS`]).
//! An input whose first byte is [`FAN_IN`] has, after the `ConfigDraw`,
//! two more bytes: `max_slices` and `max_group_items` (S-F1, S-F2); any
//! other input decodes as it did before fan-in (one slice per write).

use arbitrary::{Arbitrary, Unstructured};
use outbox::testkit::{ConfigDraw, Harness, Op, Violation};

/// Ops replayed at most per input, so one input stays fast.
pub const MAX_OPS: usize = 4_096;

/// One decoded fuzz input.
#[derive(Debug)]
pub struct Case {
    /// The engine's config.
    pub draw: ConfigDraw,
    /// Tenants the ops' tenant indexes are taken modulo.
    pub tenants: u8,
    /// The inputs.
    pub ops: Vec<Op>,
}

/// The format byte of an input that draws the fan-in knobs.
pub const FAN_IN: u8 = 0xF1;

/// Decodes `data`; `None` when it is too short to hold a config.
pub fn decode(data: &[u8]) -> Option<Case> {
    let fan_in = data.first() == Some(&FAN_IN);
    let mut u = Unstructured::new(if fan_in { &data[1..] } else { data });
    let mut draw = ConfigDraw::arbitrary(&mut u).ok()?;
    if fan_in {
        draw.max_slices = u8::arbitrary(&mut u).ok()?;
        draw.max_group_items = u8::arbitrary(&mut u).ok()?;
    }
    let tenants = u.int_in_range(1..=8u8).ok()?;
    let mut ops: Vec<Op> = Vec::arbitrary_take_rest(u).ok()?;
    ops.truncate(MAX_OPS);
    Some(Case { draw, tenants, ops })
}

/// Runs one input through the invariant-checking [`Harness`]; when the
/// engine was neither shut down nor abandoned, then drives it with a
/// healthy sink and checks that everything gets written (I6).
///
/// # Errors
/// The first [`Violation`] the harness saw.
pub fn run(data: &[u8]) -> Result<(), Violation> {
    let Some(case) = decode(data) else {
        return Ok(());
    };
    let mut h = Harness::new(case.draw.config(), case.tenants, case.draw.weighs());
    h.run(&case.ops)?;
    if !h.is_finished() {
        // Every pending item needs at most a poll, a finish and a jump to
        // its linger or backoff timer; anything beyond that is a livelock.
        let bound = 8 * (h.engine().pending() as usize + h.in_flight()) + 64;
        h.drain_healthy(bound)?;
    }
    Ok(())
}
