//! The destination of items: the `Sink` trait and its errors (S-A5,
//! S-W5, S-W12).

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;

use crate::tenant::TenantKey;

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
    /// The tenant key: [`TenantId`](crate::TenantId), [`Uuid`](uuid::Uuid),
    /// `u64`, `i64`, `String`, `Arc<str>`, or any type of the application's
    /// that is a [`TenantKey`]. The sink chooses it because the sink maps a
    /// tenant to the store; [`Outbox::stage`](crate::Outbox::stage) takes
    /// this type.
    type Tenant: TenantKey;

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
        tenant: &Self::Tenant,
        items: &[Self::Item],
    ) -> impl Future<Output = Result<Written, WriteError>> + Send;

    /// Whether this sink takes groups of slices through
    /// [`write_group`](Sink::write_group) (fan-in, S-F1). Default `false`:
    /// the outbox then writes one tenant's slice per call, whatever
    /// [`max_slices_per_write`](crate::ConfigBuilder::max_slices_per_write)
    /// says, exactly as before fan-in existed. Return `true` from a sink
    /// that overrides `write_group`.
    fn takes_groups(&self) -> bool {
        false
    }

    /// Writes a group of two or more slices of distinct tenants in one
    /// call (fan-in, S-F1): one round trip, one transaction, one request
    /// for many tenants. The outbox calls it only when
    /// [`takes_groups`](Sink::takes_groups) is `true` and the config sets
    /// [`max_slices_per_write`](crate::ConfigBuilder::max_slices_per_write)
    /// above 1 (a group of one slice goes to [`write`](Sink::write)).
    ///
    /// Returns one outcome per slice, in the order of `slices`: each slice
    /// is written, retried or lost on its own (S-F3), so one slice's bad
    /// data (a terminal error) need not cost the others. Every slice obeys
    /// the rules of [`write`](Sink::write): all-or-nothing, idempotent,
    /// and a retry re-sends the identical slice, possibly in another group
    /// or alone. Fewer outcomes than slices: the missing ones count as
    /// retryable failures; extra ones are ignored.
    ///
    /// A panic, the `write_timeout` and a cancellation apply to the whole
    /// group: every slice of it fails so (S-F4), then follows its own
    /// rules.
    ///
    /// Under leases the outbox calls
    /// [`write_group_with_epochs`](Sink::write_group_with_epochs) instead.
    ///
    /// # Why methods with defaults
    /// Fan-in is an opt-in override of two provided methods rather than a
    /// second trait: a second trait would have needed a second outbox
    /// type, or a specialisation the language lacks, to pick the group
    /// path; two methods keep one `Outbox<S>`, and every existing sink
    /// compiles and behaves as before (`takes_groups` is `false`). The
    /// default `write_group`, for a direct caller, writes one slice per
    /// [`write`](Sink::write) call: it makes every slice's future first
    /// (so it holds no borrow of the items and `Item` need not be `Sync`),
    /// then awaits them one after another; a `write` that does work
    /// before its future is polled sees every slice begun at once.
    fn write_group(
        &self,
        slices: &[Slice<Self::Tenant, Self::Item>],
    ) -> impl Future<Output = Vec<Result<Written, WriteError>>> + Send {
        // The futures are made first so the async block holds only them
        // (each `Send` by `write`'s signature), not a borrow of the items:
        // `Item` need not be `Sync`. None starts before it is awaited.
        let writes: Vec<_> = slices
            .iter()
            .map(|s| self.write(&s.tenant, &s.items))
            .collect();
        async move {
            let mut outcomes = Vec::with_capacity(writes.len());
            for write in writes {
                outcomes.push(write.await);
            }
            outcomes
        }
    }

    /// Writes `items` of `tenant`, as [`write`](Sink::write) does, under
    /// `epoch` (S-E8): the outbox calls this instead of `write` when it
    /// relays an outbox table under partition leases, so a sink can check
    /// the epoch where it commits. A sink that checks epochs commits
    /// nothing if `epoch` is not the one installed for its partition, and
    /// returns [`WriteError::stale_epoch`]. With an outbox table the slice
    /// is then neither retried nor lost, but handed over to the partition's
    /// new owner; without one nothing can take it over, so it is a terminal
    /// loss, counted `stale_epoch` and dead-lettered (S-E7).
    ///
    /// # Why a provided method
    /// The epoch is an input of the write, like the tenant, but only some
    /// sinks can use it and only an outbox under leases has one: a provided
    /// method keeps every existing sink compiling and behaving as before
    /// (the default ignores the epoch and calls `write`, the right answer
    /// for a sink that absorbs repeats of any age, S-L26), and a sink that
    /// checks epochs overrides this one method (and
    /// [`write_group_with_epochs`](Sink::write_group_with_epochs) if it
    /// takes groups). [`Slice`] and the items stay as they are.
    fn write_with_epoch(
        &self,
        epoch: WriteEpoch,
        tenant: &Self::Tenant,
        items: &[Self::Item],
    ) -> impl Future<Output = Result<Written, WriteError>> + Send {
        let _ = epoch;
        self.write(tenant, items)
    }

    /// Writes a group of slices, as [`write_group`](Sink::write_group)
    /// does, each under its epoch (S-E8): `epochs[i]` is the lease of
    /// `slices[i]` (the same length). The outbox calls this instead of
    /// `write_group` under leases. Each slice's outcome is its own (S-F3):
    /// a sink that checks epochs fails with [`WriteError::stale_epoch`]
    /// only the slices whose epoch is stale and writes the others. The
    /// default ignores the epochs and calls `write_group`.
    fn write_group_with_epochs(
        &self,
        slices: &[Slice<Self::Tenant, Self::Item>],
        epochs: &[WriteEpoch],
    ) -> impl Future<Output = Vec<Result<Written, WriteError>>> + Send {
        let _ = epochs;
        self.write_group(slices)
    }
}

/// The lease a write runs under (S-E8): the partition its tenant hashes
/// into in the outbox table and the epoch its owner holds that partition
/// by. Handed to [`Sink::write_with_epoch`] and
/// [`Sink::write_group_with_epochs`] when the outbox relays a table under
/// leases; a sink that checks epochs commits the write only while the
/// epoch is the one installed for the partition (S-E4), else returns
/// [`WriteError::stale_epoch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteEpoch {
    /// The partition, `0..P`.
    pub partition: u32,
    /// The owner's epoch for it (from 1).
    pub epoch: u64,
}

impl WriteEpoch {
    /// The epoch `epoch` of `partition`.
    pub const fn new(partition: u32, epoch: u64) -> Self {
        WriteEpoch { partition, epoch }
    }
}

/// One tenant's slice in a group handed to
/// [`Sink::write_group`] (S-F1): its items in staging order, never empty.
/// Every attempt of the slice carries the identical items (S-W5).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Slice<K, I> {
    /// The tenant every item belongs to.
    pub tenant: K,
    /// The items, in staging order.
    pub items: Vec<I>,
}

impl<K, I> Slice<K, I> {
    /// A slice of `tenant`'s `items` (for a sink's own tests).
    pub fn new(tenant: K, items: Vec<I>) -> Self {
        Slice { tenant, items }
    }
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
///
/// Non-exhaustive: new kinds may come (a match needs a `_` arm).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Retried after a backoff (or dropped under the drop policy).
    Retryable,
    /// Never retried: the slice is counted lost under `terminal`.
    Terminal,
    /// The write's epoch is not the one installed for its partition: a
    /// newer owner took the partition over (S-E7). Never retried. With an
    /// outbox table never lost: the items are handed over to the new
    /// owner, which delivers them from the table; without one, lost under
    /// `stale_epoch` (see [`WriteError::stale_epoch`]). Only a sink that
    /// checks epochs returns it.
    StaleEpoch,
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

    /// The write committed nothing because its epoch is stale (S-E7): a
    /// newer epoch is installed for its partition. Return it only after
    /// the epoch check failed and the transaction rolled back.
    ///
    /// Never retried. What becomes of the slice depends on where its items
    /// live (S-E7):
    /// - an outbox built with an outbox table (`OutboxBuilder::table`,
    ///   feature `table`): not lost;
    ///   the slice and its tenant's waiting items are counted
    ///   `handed_over` and stay in the table for the partition's new
    ///   owner;
    /// - any other outbox (in memory, or with the journal): nothing can
    ///   take them over, so it is a terminal failure of the write, as
    ///   [`terminal`](Self::terminal) is: the slice is lost under
    ///   `stale_epoch` ([`LostReason::StaleEpoch`](crate::LostReason::StaleEpoch)),
    ///   handed to the run-time dead letters with
    ///   [`DeadReason::StaleEpoch`](crate::DeadReason::StaleEpoch)
    ///   when they are on, and never counted handed over.
    pub fn stale_epoch(source: impl Into<BoxError>) -> Self {
        WriteError {
            kind: ErrorKind::StaleEpoch,
            source: source.into(),
        }
    }

    /// Retryable, terminal or stale.
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
            ErrorKind::StaleEpoch => "stale epoch",
        };
        write!(f, "{kind} write error: {}", self.source)
    }
}

impl StdError for WriteError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}
