//! One attempt of one write, run as its own task (S-W5, S-B3, S-W9,
//! S-C2): the sink's future under panic containment, a write timeout and
//! the writer's cancellation; the items always travel back with the outcome.

use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::contain::{self, Contained};
use crate::core::{Outcome, Write};
use crate::sink::{Sink, WriteError};
use crate::TenantId;

/// What a write task hands back to the writer: the write with its very
/// items (S-C2), how the attempt ended, and the sink's error as text for
/// the log (rendered inside the task, under containment).
#[derive(Debug)]
pub(crate) struct Finished<I> {
    pub(crate) write: Write<TenantId, I>,
    pub(crate) outcome: Outcome,
    pub(crate) error: Option<String>,
}

/// Runs one attempt of `write` on `sink`.
///
/// - The sink's `write` returned `Ok`: [`Outcome::Written`] with the
///   sink's `discarded` count (S-W12).
/// - A retryable error: [`Outcome::Failed`]; a terminal one:
///   [`Outcome::Rejected`] (S-A5).
/// - A panic creating the future, polling it, or rendering or dropping the
///   error: [`Outcome::Panicked`] (S-W5).
/// - Not finished by `deadline`: the future is dropped, [`Outcome::TimedOut`]
///   (S-B3).
/// - `cancel` fired first: the future is dropped, [`Outcome::Cancelled`]
///   (S-W9 deadline, S-A7).
pub(crate) async fn run<S: Sink>(
    sink: Arc<S>,
    write: Write<TenantId, S::Item>,
    deadline: Option<Instant>,
    cancel: CancellationToken,
) -> Finished<S::Item> {
    // Only the sink's future (`Send` by the trait) may hold a borrow of the
    // items across an await, so `Item` need not be `Sync`.
    let (outcome, error) = match contain::call(|| sink.write(write.tenant, &write.items)) {
        Err(contain::Panicked) => (
            Outcome::Panicked,
            Some("the sink panicked creating the write".to_owned()),
        ),
        Ok(future) => {
            let future = Contained::new(future);
            let timed = async {
                match deadline {
                    Some(at) => tokio::time::timeout_at(at, future).await.ok(),
                    None => Some(future.await),
                }
            };
            let result = tokio::select! {
                biased;
                () = cancel.cancelled() => None,
                result = timed => Some(result),
            };
            match result {
                None => (Outcome::Cancelled, None),
                Some(None) => (Outcome::TimedOut, Some("the write timed out".to_owned())),
                Some(Some(Err(contain::Panicked))) => (
                    Outcome::Panicked,
                    Some("the sink panicked in the write".to_owned()),
                ),
                Some(Some(Ok(Ok(written)))) => (
                    Outcome::Written {
                        discarded: written.discarded,
                    },
                    None,
                ),
                Some(Some(Ok(Err(error)))) => judge(error),
            }
        }
    };
    Finished {
        write,
        outcome,
        error,
    }
}

/// Renders a sink error for the log and picks its outcome; a panic while
/// rendering or dropping it is a panicked attempt (S-W5).
fn judge(error: WriteError) -> (Outcome, Option<String>) {
    let outcome = if error.is_terminal() {
        Outcome::Rejected
    } else {
        Outcome::Failed
    };
    match contain::call(move || error.to_string()) {
        Ok(text) => (outcome, Some(text)),
        Err(contain::Panicked) => (
            Outcome::Panicked,
            Some("the sink's error panicked while rendering".into()),
        ),
    }
}
