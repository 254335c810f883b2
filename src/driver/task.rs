//! One attempt of one write, run as its own task (S-W5, S-B3, S-W9,
//! S-C2): the sink's future under panic containment, a write timeout and
//! the writer's cancellation; the items always travel back with the outcome.

use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use super::contain::{self, Contained};
use crate::core::{Failure, Outcome, Write};
use crate::sink::{ErrorKind, Sink, Slice, WriteEpoch, WriteError, Written};

/// What a write task hands back to the writer: the write with its very
/// items (S-C2), how the attempt ended, and the sink's error as text for
/// the log (rendered inside the task, under containment).
#[derive(Debug)]
pub(crate) struct Finished<K, I> {
    pub(crate) write: Write<K, I>,
    pub(crate) outcome: Outcome,
    pub(crate) error: Option<String>,
}

/// What a write task of the sink `S` hands back.
pub(crate) type SinkFinished<S> = Finished<<S as Sink>::Tenant, <S as Sink>::Item>;

/// Runs one attempt of `write` on `sink`.
///
/// - The sink's `write` returned `Ok`: [`Outcome::Written`] with the
///   sink's `discarded` count (S-W12).
/// - Otherwise [`Outcome::Failed`], by kind: a retryable error:
///   [`Failure::Error`]; a terminal one: [`Failure::Rejected`] (S-A5); a
///   stale epoch: [`Failure::StaleEpoch`] (S-E7).
/// - A panic creating the future, polling it, or rendering or dropping a
///   retryable error: [`Failure::Panic`] (S-W5); a terminal error that
///   panics as it is rendered or dropped is still [`Failure::Rejected`].
/// - Not finished by `deadline`: the future is dropped, [`Failure::Timeout`]
///   (S-B3).
/// - `cancel` fired first: the future is dropped, [`Failure::Cancelled`]
///   (S-W9 deadline, S-A7).
///
/// The write carries `epoch` when the outbox relays a table under leases
/// (S-E8): the sink's `write_with_epoch` then, else its `write`.
pub(crate) async fn run_with_epoch<S: Sink>(
    sink: Arc<S>,
    write: Write<S::Tenant, S::Item>,
    epoch: Option<WriteEpoch>,
    deadline: Option<Instant>,
    cancel: CancellationToken,
) -> Finished<S::Tenant, S::Item> {
    // Only the sink's future (`Send` by the trait) may hold a borrow of the
    // items across an await, so `Item` need not be `Sync`.
    let (outcome, error) = match contain::call(|| match epoch {
        Some(epoch) => Either::Left(sink.write_with_epoch(epoch, &write.tenant, &write.items)),
        None => Either::Right(sink.write(&write.tenant, &write.items)),
    }) {
        Err(contain::Panicked) => (
            Outcome::Failed(Failure::Panic),
            Some("the sink panicked creating the write".to_owned()),
        ),
        Ok(future) => match bounded(future, deadline, &cancel).await {
            Bounded::Cancelled => (Outcome::Failed(Failure::Cancelled), None),
            Bounded::TimedOut => (
                Outcome::Failed(Failure::Timeout),
                Some("the write timed out".to_owned()),
            ),
            Bounded::Panicked => (
                Outcome::Failed(Failure::Panic),
                Some("the sink panicked in the write".to_owned()),
            ),
            Bounded::Done(Ok(written)) => (
                Outcome::Written {
                    discarded: written.discarded,
                },
                None,
            ),
            Bounded::Done(Err(error)) => outcome_of_error(error),
        },
    };
    Finished {
        write,
        outcome,
        error,
    }
}

/// Runs one attempt of a group of slices (S-F1, S-F4): a group of one is
/// [`run_with_epoch`], the sink's `write`; a larger one is one call to the sink's
/// `write_group`, under one containment, one timeout (the slices share
/// their start, so their deadline) and the writer's cancellation.
///
/// A panic, the timeout or the cancellation ends every slice of the group
/// with that outcome; otherwise each slice takes its own outcome from the
/// sink's list, as [`run_with_epoch`] maps one (S-F3). A list shorter than the group
/// fails the slices it leaves out, retryably.
///
/// Each write carries its epoch (`epochs[i]` for `writes[i]`) when the
/// outbox relays a table under leases (S-E8, S-T37): the sink's
/// `write_group_with_epochs` (or `write_with_epoch` for a group of one),
/// else its `write_group`.
pub(crate) async fn run_group_with_epochs<S: Sink>(
    sink: Arc<S>,
    mut writes: Vec<Write<S::Tenant, S::Item>>,
    epochs: Option<Vec<WriteEpoch>>,
    deadline: Option<Instant>,
    cancel: CancellationToken,
) -> Vec<Finished<S::Tenant, S::Item>> {
    if writes.len() == 1 {
        let write = writes.pop().expect("one write");
        let epoch = epochs.and_then(|e| e.first().copied());
        return vec![run_with_epoch(sink, write, epoch, deadline, cancel).await];
    }
    // The slices travel to the sink as `Slice`s and back into their
    // writes with their ids, attempts and deadlines (S-C2).
    let mut heads = Vec::with_capacity(writes.len());
    let slices: Vec<Slice<S::Tenant, S::Item>> = writes
        .into_iter()
        .map(|w| {
            heads.push((w.id, w.attempt, w.deadline));
            Slice::new(w.tenant, w.items)
        })
        .collect();
    let n = slices.len();
    let outcomes: Vec<(Outcome, Option<String>)> = match contain::call(|| match &epochs {
        Some(epochs) => Either::Left(sink.write_group_with_epochs(&slices, epochs)),
        None => Either::Right(sink.write_group(&slices)),
    }) {
        Err(contain::Panicked) => all(
            n,
            Outcome::Failed(Failure::Panic),
            "the sink panicked creating the group write",
        ),
        Ok(future) => match bounded(future, deadline, &cancel).await {
            Bounded::Cancelled => vec![(Outcome::Failed(Failure::Cancelled), None); n],
            Bounded::TimedOut => all(
                n,
                Outcome::Failed(Failure::Timeout),
                "the group write timed out",
            ),
            Bounded::Panicked => all(
                n,
                Outcome::Failed(Failure::Panic),
                "the sink panicked in the group write",
            ),
            Bounded::Done(results) => per_slice(n, results),
        },
    };
    slices
        .into_iter()
        .zip(heads)
        .zip(outcomes)
        .map(
            |((slice, (id, attempt, deadline)), (outcome, error))| Finished {
                write: Write {
                    id,
                    tenant: slice.tenant,
                    items: slice.items,
                    attempt,
                    deadline,
                },
                outcome,
                error,
            },
        )
        .collect()
}

/// The same outcome and log text for each of `n` slices (S-F4).
fn all(n: usize, outcome: Outcome, text: &str) -> Vec<(Outcome, Option<String>)> {
    vec![(outcome, Some(text.to_owned())); n]
}

/// Each of `n` slices' outcome from the sink's list (S-F3): missing ones
/// fail retryably, extra ones are dropped (contained, like every error).
fn per_slice(
    n: usize,
    results: Vec<Result<Written, WriteError>>,
) -> Vec<(Outcome, Option<String>)> {
    let given = results.len();
    let mut results = results.into_iter();
    let outcomes = (0..n)
        .map(|_| match results.next() {
            Some(Ok(written)) => (
                Outcome::Written {
                    discarded: written.discarded,
                },
                None,
            ),
            Some(Err(error)) => outcome_of_error(error),
            None => (
                Outcome::Failed(Failure::Error),
                Some(format!(
                    "the sink returned {given} outcomes for a group of {n} slices"
                )),
            ),
        })
        .collect();
    contain::drop_each(results);
    outcomes
}

/// Renders a sink error for the log and picks its outcome. A panic while
/// rendering or dropping a retryable error makes the attempt a panicked
/// one (S-W5); a terminal rejection stays one whatever its rendering does
/// (S-A5: the sink answered, and its answer is never retried).
fn outcome_of_error(error: WriteError) -> (Outcome, Option<String>) {
    if error.kind() == ErrorKind::StaleEpoch {
        // The sink answered: whatever rendering does, the write is stale.
        let text = contain::call(move || error.to_string())
            .unwrap_or_else(|_| "a stale epoch (it panicked while rendering)".into());
        return (Outcome::Failed(Failure::StaleEpoch), Some(text));
    }
    let terminal = error.is_terminal();
    match (contain::call(move || error.to_string()), terminal) {
        (Ok(text), true) => (Outcome::Failed(Failure::Rejected), Some(text)),
        (Ok(text), false) => (Outcome::Failed(Failure::Error), Some(text)),
        (Err(contain::Panicked), true) => (
            Outcome::Failed(Failure::Rejected),
            Some("a terminal error (it panicked while rendering)".into()),
        ),
        (Err(contain::Panicked), false) => (
            Outcome::Failed(Failure::Panic),
            Some("the sink's error panicked while rendering".into()),
        ),
    }
}

/// How a sink's future ended under the task's bounds.
enum Bounded<T> {
    /// The writer's cancellation fired first (S-W9, S-A7).
    Cancelled,
    /// Not finished by the deadline (S-B3).
    TimedOut,
    /// It panicked while polled (S-W5).
    Panicked,
    /// It finished with this.
    Done(T),
}

/// Polls `future` contained, until `deadline` and unless `cancel` fires
/// (checked first: `biased;`); on a timeout or a cancellation the future is
/// dropped.
async fn bounded<F: std::future::Future>(
    future: F,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
) -> Bounded<F::Output> {
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
        None => Bounded::Cancelled,
        Some(None) => Bounded::TimedOut,
        Some(Some(Err(contain::Panicked))) => Bounded::Panicked,
        Some(Some(Ok(out))) => Bounded::Done(out),
    }
}
