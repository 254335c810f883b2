//! S-W18 from the exported metrics: every attempt ends in exactly one
//! counted outcome. At a quiet point (nothing in flight) the attempts
//! started (`outbox_attempts_total`) equal the writes
//! (`outbox_writes_total`) plus the failed attempts of every kind
//! (`outbox_write_failures_total{kind}`), and the latency histogram holds
//! one sample per ended attempt.

use std::time::Duration;

use super::book::{self, SharedBook};
use super::metrics::SimRecorder;

/// How long the given-up writes an abandon or a shutdown deadline cancelled
/// may take to come back once the run has ended (they are cancelled at
/// once; this only bounds the wait in virtual time).
const QUIET_WITHIN: Duration = Duration::from_secs(5);

/// Checks S-W18 once the run has ended, waiting (virtual time) for the
/// writes still in flight to come back; records a failure in the book if
/// the identity does not hold within 5 s.
pub async fn check_quiet(recorder: &SimRecorder, book: &SharedBook) {
    let step = Duration::from_millis(10);
    let mut waited = Duration::ZERO;
    while let Some(m) = unbalanced(recorder) {
        if waited >= QUIET_WITHIN {
            book::lock(book).fail("S-W18", format!("at the end: {m}"));
            return;
        }
        tokio::time::sleep(step).await;
        waited += step;
    }
}

/// The identity as the metrics tell it, or what breaks it.
fn unbalanced(recorder: &SimRecorder) -> Option<String> {
    let c = match recorder.counters(0) {
        Ok(c) => c,
        Err(e) => return Some(e),
    };
    let ended = c.attempts_ended();
    let samples = recorder.latency_samples();
    (c.attempts != ended || samples != ended).then(|| {
        format!(
            "attempts {} but writes {} + failed attempts {} (by kind {:?}) = {ended}, and \
             {samples} latency samples",
            c.attempts,
            c.writes,
            c.failed_attempts,
            outbox::core::Failure::ALL.map(|k| c.failed(k))
        )
    })
}
