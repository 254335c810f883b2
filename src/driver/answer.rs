//! The future a flush, settle or shutdown caller awaits (S-A4, S-W10,
//! S-W9, S-B6).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::core::{Report, ShutdownReport};
use crate::TenantId;

/// The answer to a [`flush`](crate::Outbox::flush),
/// [`settle`](crate::Outbox::settle) or [`shutdown`](crate::Outbox::shutdown)
/// already under way: resolves to its report.
///
/// The call takes effect when it is made, not when this future is first
/// polled: the flush has released its items, the shutdown fence is up.
///
/// # Cancellation
/// Dropping an `Answer` only stops waiting for the report. The flush,
/// settle or shutdown goes on in the writer exactly as if it were awaited
/// (a shutdown still drains until its deadline and counts what is left
/// lost); the report is discarded. It is cancel safe in `select!`.
#[must_use = "the call is under way; await the answer to get its report"]
pub struct Answer<T> {
    rx: oneshot::Receiver<T>,
}

impl<T> Answer<T> {
    pub(crate) fn new(rx: oneshot::Receiver<T>) -> Self {
        Answer { rx }
    }
}

impl<T> fmt::Debug for Answer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Answer").finish_non_exhaustive()
    }
}

/// What a report says when the writer cannot answer: its runtime is gone,
/// so everything was given up (abandoned) and nothing is pending.
pub(crate) trait Unanswered {
    /// A report with nothing counted, deadline passed.
    fn unanswered() -> Self;
}

impl Unanswered for Report {
    fn unanswered() -> Self {
        Report {
            deadline_passed: true,
            ..Report::default()
        }
    }
}

impl<I> Unanswered for ShutdownReport<TenantId, I> {
    fn unanswered() -> Self {
        ShutdownReport {
            report: Report::unanswered(),
            first: false,
            unwritten: Vec::new(),
        }
    }
}

impl<T: Unanswered> Future for Answer<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|_| T::unanswered()))
    }
}
