//! I10: while the breaker is open, an attempt starts only as its one
//! probe (S-R1, S-R2), from what the sink saw.
//!
//! The model counts the sink's ends as S-R1 does: a failure (error or
//! panic) and a timeout add to the run, a committed write or a terminal
//! rejection resets it and closes, a cancelled attempt counts neither way.
//! The sink sees an attempt cut short (its future dropped) and cannot tell
//! a timeout from a cancellation by itself, but the driver cancels only
//! once a shutdown, an abandon or the drop of the last handle began
//! ([`Model::may_cancel`]): before that, an attempt cut short timed out and
//! is a failure; after, it counts neither way. A group's slices end at the
//! sink one by one, but the engine learns their outcomes together when the
//! group returns: the model takes them then, in slice order (`GroupEnds`
//! in `net::sink`). So the model never counts more failures than the
//! engine, and opens no sooner than the engine does.
//! Starts within [`SLACK`] of its opening may have been decided before
//! (the engine learns of an end after the sink), so they are not checked.
//! After the model's probe ends without an answer, the next probe may not
//! start within the first probe interval of that end (S-R2): the engine
//! learns of the end no sooner than the sink and waits at least that long.

use std::time::Duration;

use outbox::core::{BreakerConfig, Time};

use super::Broken;
use crate::net::book::End;

/// How long after the model opens an attempt may still have been decided
/// while the breaker was closed.
pub const SLACK: Duration = Duration::from_millis(20);

/// The sink's model of the breaker.
#[derive(Clone, Debug, Default)]
pub struct Model {
    config: Option<BreakerConfig>,
    failures: u32,
    /// When it opened, while open.
    open_since: Option<Time>,
    /// The probe in flight (its slice's first item).
    probe: Option<u64>,
    /// After the model's probe ended without an answer, no probe before
    /// this (S-R2): the engine learns of that end no sooner than the sink
    /// and waits at least the first probe interval from then.
    probe_after: Option<Time>,
    /// A shutdown, an abandon or the drop began: the driver may cancel
    /// attempts from now on, so an attempt cut short counts neither way.
    cancels: bool,
    /// Probes seen, for the report.
    pub probes: u64,
    /// Times it opened, for the report.
    pub opened: u64,
}

impl Model {
    /// A model of the breaker `config` (none: never opens).
    pub fn new(config: Option<BreakerConfig>) -> Model {
        Model {
            config,
            ..Model::default()
        }
    }

    /// An attempt of slice `first` starts at `now`.
    pub fn on_start(&mut self, first: u64, now: Time) -> Option<Broken> {
        let since = self.open_since?;
        if now <= since + SLACK {
            return None;
        }
        if let Some(after) = self.probe_after {
            if now < after {
                return Some((
                    "I10",
                    format!(
                        "probe #{first} starts at {now} while the breaker is open (since {since}), \
                         before the probe interval after the last probe failed ({after})"
                    ),
                ));
            }
        }
        if let Some(p) = self.probe {
            return Some((
                "I10",
                format!(
                    "slice #{first} starts at {now} while the breaker is open (since {since}) \
                     and probe #{p} is in flight"
                ),
            ));
        }
        self.probe = Some(first);
        self.probes += 1;
        None
    }

    /// A shutdown, an abandon or the drop of the last handle began: the
    /// driver may cancel the attempts in flight from now on (S-W9, S-A7,
    /// S-W16).
    pub fn may_cancel(&mut self) {
        self.cancels = true;
    }

    /// Whether an attempt cut short may have been cancelled (else it timed
    /// out, or its group failed as a whole: a failure, S-R1, S-F4).
    pub fn cancels(&self) -> bool {
        self.cancels
    }

    /// An attempt of slice `first` ended with `end`.
    pub fn on_end(&mut self, first: u64, end: End, now: Time) {
        let Some(config) = self.config else {
            return;
        };
        // Cut short before any cancellation could come: the write timeout
        // (S-B3), a failed attempt (S-R1).
        let end = match end {
            End::Dropped if !self.cancels => End::Failed,
            end => end,
        };
        match end {
            End::Ok(_) | End::Terminal => {
                self.failures = 0;
                self.open_since = None;
                self.probe = None;
                self.probe_after = None;
            }
            End::Failed if self.open_since.is_none() => {
                self.failures += 1;
                if self.failures >= config.failures_to_open() {
                    self.open_since = Some(now);
                    self.probe_after = None;
                    self.opened += 1;
                }
            }
            End::Failed | End::Dropped | End::Running => {
                if self.probe == Some(first) {
                    self.probe = None;
                    self.probe_after = Some(now + config.first_probe_interval());
                }
            }
        }
    }
}
