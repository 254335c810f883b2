//! Which external test servers to use.
//!
//! A test that needs a server reads its URL from the environment:
//! `OUTBOX_TEST_POSTGRES_URL` (e.g. `postgres://postgres@127.0.0.1:5432/test`)
//! or `OUTBOX_TEST_NATS_URL` (e.g. `nats://127.0.0.1:4222`). When the
//! variable is unset the test prints that it was skipped and why, and
//! returns; when it is set the server must answer, or the test fails.

use std::time::{Duration, Instant};

/// The URL in `var`, or `None` after printing why the test is skipped.
pub fn url(var: &str, test: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            eprintln!("SKIPPED {test}: {var} is not set (set it to run against a real server)");
            None
        }
    }
}

/// A unique, identifier-safe name for this test's table or stream:
/// `{base}_{pid}_{nanos}`, lower case, so parallel and repeated runs never
/// share state.
pub fn unique_name(base: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{base}_{}_{nanos}", std::process::id())
}

/// Polls `check` until it returns `Some` or `deadline` passes (a bounded
/// poll for external servers, whose progress we cannot await directly).
///
/// # Panics
/// When the deadline passes: `what` names the awaited condition.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let until = Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < until,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
