//! What a run leaves behind besides its verdict: the trace hash (S-C1,
//! S-B4), the optional one-line-per-op-and-event trace, and the drops and
//! losses seen (for timelines).

use std::hash::{Hash, Hasher};

use super::Harness;
use crate::core::{Event, Outcome, Time};

/// Items dropped or lost, as an event reported them (kept with a trace, for
/// timelines).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loss {
    /// When.
    pub at: Time,
    /// Whose items.
    pub tenant: u8,
    /// How many.
    pub items: u64,
    /// The reason label (`buffer_full`, `deadline`, ...).
    pub reason: &'static str,
    /// Dropped by a policy (else lost).
    pub dropped: bool,
}

impl Harness {
    /// Hashes an event into the trace hash and, with a trace, writes its
    /// line and keeps its drop or loss.
    pub(super) fn record_event(&mut self, ev: &Event<u8, u64>) {
        ev.hash(&mut self.hasher);
        let Some(t) = self.trace.as_mut() else {
            return;
        };
        t.push(format!("{}   {}", self.now, short_event(ev)));
        let (tenant, items, reason, dropped) = match ev {
            Event::Lost {
                tenant,
                items,
                reason,
                ..
            } => (*tenant, *items, reason.as_str(), false),
            Event::Dropped {
                tenant,
                items,
                reason,
                ..
            } => (*tenant, *items, reason.as_str(), true),
            _ => return,
        };
        self.losses.push(Loss {
            at: self.now,
            tenant,
            items,
            reason,
            dropped,
        });
    }
}

/// The label a failed attempt is counted under in [`Stats::faults`](super::Stats::faults).
pub(super) fn fault_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Written { .. } => "written",
        Outcome::Failed(failure) => failure.as_str(),
    }
}

/// One line for an event in a trace.
pub(super) fn short_event(ev: &Event<u8, u64>) -> String {
    match ev {
        Event::Written {
            id,
            tenant,
            items,
            attempt,
            ..
        } => format!("written {id} tenant {tenant} items {items} attempt {attempt}"),
        Event::AttemptFailed {
            id,
            tenant,
            attempt,
            failure,
            next,
            ..
        } => format!(
            "failed {id} tenant {tenant} attempt {attempt} {} -> {next:?}",
            failure.as_str()
        ),
        Event::Lost {
            tenant,
            items,
            reason,
            ..
        } => format!("lost {items} tenant {tenant} reason {reason}"),
        Event::Dropped {
            tenant,
            items,
            reason,
            ..
        } => format!("dropped {items} tenant {tenant} reason {reason}"),
        Event::HandedOver { tenant, items } => format!("handed over {items} tenant {tenant}"),
        Event::DeadLetter(dl) => format!(
            "dead letter tenant {} items {:?} reason {}",
            dl.tenant,
            dl.items,
            dl.reason.as_str()
        ),
        Event::CancelInFlight => "cancel in-flight writes".to_string(),
        Event::KeyDone { key, written, .. } => format!("key {key} done written={written}"),
        Event::WaitDone { id, report } => format!("wait {} done {report:?}", id.0),
        Event::ShutdownDone { id, report } => format!(
            "shutdown {} done first={} {:?} unwritten runs {}",
            id.0,
            report.first,
            report.report(),
            report.unwritten.len()
        ),
    }
}

/// FNV-1a, 64-bit: a fixed, portable hash for trace hashes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fnv(pub(super) u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}
