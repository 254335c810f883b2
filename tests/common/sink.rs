//! What the sink and end-to-end tests share: items, and checks of a write.

use outbox::sinks::Envelope;
use outbox::{ErrorKind, Sink, WriteError, Written};
use std::time::Duration;

/// `n` envelopes with the unique payloads `{tag}-0`, `{tag}-1`, ….
pub fn items(tag: &str, n: usize) -> Vec<Envelope> {
    (0..n)
        .map(|i| Envelope::new(format!("{tag}-{i}").into_bytes()))
        .collect()
}

/// Writes like the outbox's driver would: a retryable failure is retried
/// with the identical slice after a short backoff (S-W5, S-W7), up to
/// `attempts` times.
pub async fn write_retrying<S: Sink>(
    sink: &S,
    tenant: &S::Tenant,
    slice: &[S::Item],
    attempts: usize,
) {
    let mut backoff = Duration::from_millis(50);
    for _ in 0..attempts {
        match sink.write(tenant, slice).await {
            Ok(w) => return assert_eq!(w, Written::ALL),
            Err(e) if !e.is_terminal() => eprintln!("retrying after: {e}"),
            Err(e) => panic!("terminal: {e}"),
        }
        tokio::time::sleep(backoff).await;
        backoff *= 2;
    }
    panic!("the write did not succeed in {attempts} attempts");
}

/// The error of a write that must fail retryably.
pub fn retryable(r: Result<Written, WriteError>) -> WriteError {
    let e = r.expect_err("the write should fail");
    assert_eq!(e.kind(), ErrorKind::Retryable, "{e}");
    e
}

/// The error of a write that must fail terminally.
pub fn terminal(r: Result<Written, WriteError>) -> WriteError {
    let e = r.expect_err("the write should fail");
    assert_eq!(e.kind(), ErrorKind::Terminal, "{e}");
    e
}
