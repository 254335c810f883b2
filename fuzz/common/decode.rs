//! The one decoding of fuzz input shared by the `engine` fuzz target and
//! the crate's `tests/fuzz_regressions.rs` (included there with `#[path]`),
//! so a crash input replays without libFuzzer under `cargo test`.
//!
//! Input layout (via `arbitrary`): a [`ConfigDraw`], every knob beyond its
//! derived fields (fan-in: `max_slices`, `max_group_items`, S-F1, S-F2;
//! the breaker, `max_item_age` and dead letters, S-R1-S-R4), a tenant
//! count in 1..=8, then `Op`s until the data runs out (at most
//! [`MAX_OPS`]). Two format bytes keep older inputs decoding as they were
//! made: an input led by [`LEGACY`] decodes the rest as before fan-in (no
//! knob beyond the derived fields), one led by [`FAN_IN`] as before the
//! outage knobs (the two fan-in bytes only).

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

/// The format byte of an input made before fan-in: no knob beyond the
/// derived fields.
pub const LEGACY: u8 = 0xF0;

/// The format byte of an input made before the outage knobs: the fan-in
/// knobs only.
pub const FAN_IN: u8 = 0xF1;

/// Decodes `data`; `None` when it is too short to hold a config.
pub fn decode(data: &[u8]) -> Option<Case> {
    let format = data
        .first()
        .copied()
        .filter(|b| [LEGACY, FAN_IN].contains(b));
    let mut u = Unstructured::new(if format.is_some() { &data[1..] } else { data });
    let mut draw = ConfigDraw::arbitrary(&mut u).ok()?;
    if format != Some(LEGACY) {
        draw.max_slices = u8::arbitrary(&mut u).ok()?;
        draw.max_group_items = u8::arbitrary(&mut u).ok()?;
    }
    if format.is_none() {
        draw.breaker_failures = u8::arbitrary(&mut u).ok()?;
        draw.probe_interval_ms = u8::arbitrary(&mut u).ok()?;
        draw.max_probe_extra_10ms = u8::arbitrary(&mut u).ok()?;
        draw.max_item_age_5ms = u8::arbitrary(&mut u).ok()?;
        draw.dead_letters = bool::arbitrary(&mut u).ok()?;
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
