//! The destination of items: the `Sink` trait and its errors (S-A5,
//! S-W5, S-W12).

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;

use crate::tenant::TenantId;

/// A boxed error from a sink.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Where items go: a database, a stream.
///
/// # The idempotency duty
/// [`write`](Sink::write) writes one tenant's slice all-or-nothing. The
/// engine may call it again with the identical slice after an outcome it
/// could not see (a timeout, a lost reply, a panic after commit), so a write
/// must be idempotent: writing a slice twice leaves one copy. Every attempt
/// of one write presents the identical items in the identical order (S-W5),
/// so either key each item (a unique key on `(tenant, item id)` with
/// `ON CONFLICT DO NOTHING`, a JetStream message id derived from it), or
/// derive one key for the slice from its contents, e.g. a hash of the
/// tenant and of every item's id, in order.
///
/// # Failures
/// Return [`WriteError::retryable`] for what may pass (connection lost,
/// timeout, serialization failure): the slice is retried after a backoff
/// (S-W7), or dropped under the drop policy (S-A5). Return
/// [`WriteError::terminal`] for what never will (bad data): the slice is
/// counted lost under `terminal` and never retried. A panic, in creating
/// the future, in polling it or in rendering the error, counts as a
/// retryable failure (S-W5); the writer survives it.
///
/// # Cancellation
/// The future may be dropped at any await point: on a `write_timeout`
/// (S-B3) or at the shutdown deadline (S-W9). A dropped write must leave
/// the store as if it either committed or never ran.
pub trait Sink: Send + Sync + 'static {
    /// What is written.
    type Item: Send + 'static;

    /// The sink's name: the `outbox` label of every metric (S-W11) and the
    /// name in logs.
    fn name(&self) -> &str;

    /// Writes `items`, all of one `tenant`, in order, all-or-nothing.
    ///
    /// # Errors
    /// [`WriteError`]: retryable or terminal, see the trait docs.
    fn write(
        &self,
        tenant: TenantId,
        items: &[Self::Item],
    ) -> impl Future<Output = Result<Written, WriteError>> + Send;
}

/// A successful write (S-W12).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Written {
    /// Items of the slice consumed without being written (filtered out,
    /// say): counted lost under `discarded`. Usually 0.
    pub discarded: usize,
}

impl Written {
    /// The whole slice is written.
    pub const ALL: Written = Written { discarded: 0 };

    /// The slice was consumed, but `n` of its items were not written.
    pub const fn discarding(n: usize) -> Written {
        Written { discarded: n }
    }
}

/// Whether a failed write may be retried (S-A5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Retried after a backoff (or dropped under the drop policy).
    Retryable,
    /// Never retried: the slice is counted lost under `terminal`.
    Terminal,
}

/// A failed write: its kind and its cause.
#[derive(Debug)]
pub struct WriteError {
    kind: ErrorKind,
    source: BoxError,
}

impl WriteError {
    /// A failure that may pass: retry the identical slice.
    pub fn retryable(source: impl Into<BoxError>) -> Self {
        WriteError {
            kind: ErrorKind::Retryable,
            source: source.into(),
        }
    }

    /// A failure that never will: the slice is lost under `terminal`.
    pub fn terminal(source: impl Into<BoxError>) -> Self {
        WriteError {
            kind: ErrorKind::Terminal,
            source: source.into(),
        }
    }

    /// Retryable or terminal.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether the slice is never retried.
    pub fn is_terminal(&self) -> bool {
        self.kind == ErrorKind::Terminal
    }

    /// The cause.
    pub fn cause(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.source
    }
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ErrorKind::Retryable => "retryable",
            ErrorKind::Terminal => "terminal",
        };
        write!(f, "{kind} write error: {}", self.source)
    }
}

impl StdError for WriteError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}
