//! The one failure type of the harness and of both simulation worlds.

use std::fmt;

/// A broken invariant, with the rule it breaks and what was seen: the one
/// failure type of the harness and of both simulation worlds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The invariant or rule id of docs/contract.md, e.g. `"I2"` or
    /// `"S-A4"`; the simulation also uses `"panic"` (a panic escaped the
    /// run) and `"determinism"` (two runs of a seed differ).
    pub rule: &'static str,
    /// What was seen.
    pub detail: String,
    /// Where it was seen: the op index in the harness, the step of the run
    /// in the simulation.
    pub step: usize,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} broken at step {}: {}",
            self.rule, self.step, self.detail
        )
    }
}

impl std::error::Error for Violation {}

impl super::Harness {
    /// A violation of `rule` at the current op.
    pub(super) fn violation(&self, rule: &'static str, detail: String) -> Violation {
        Violation {
            rule,
            detail,
            step: self.step,
        }
    }

    /// `Ok` when `ok`, else a violation of `rule` described by `detail`
    /// (built only on failure).
    pub(super) fn expect(
        &self,
        ok: bool,
        rule: &'static str,
        detail: impl FnOnce() -> String,
    ) -> Result<(), Violation> {
        if ok {
            Ok(())
        } else {
            Err(self.violation(rule, detail()))
        }
    }
}
