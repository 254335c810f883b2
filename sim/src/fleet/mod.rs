//! The fleet world (`--world fleet`): three to five application hosts,
//! each running the real driver with the outbox table's relay and lease
//! policy (`OutboxBuilder::table`) over the store interface, against one
//! store host's database (the model the conformance suite checks against
//! PostgreSQL, `outbox::table::model`, on the store's own clock), and a
//! datastore that logs every accepted write with its epoch
//! ([`sink`]). Stagers on every host commit and roll back transactions,
//! some long.
//!
//! Faults from the seed ([`faults`]): host crashes and restarts,
//! partitions between a host and the store or the datastore, pauses (some longer than the
//! lease ttl), slow links, lost replies after a call took effect, store
//! restarts (every session and listener ends, the store unreachable for
//! a while), a host joining late and one leaving for good; then a healed
//! phase. A pause holds the host's links ([`link`]): every call it
//! sends and every reply it waits for is held until it resumes, then goes
//! on, so its writes in flight land late; its runtime keeps running
//! (turmoil 0.7 cannot freeze one host's clock).
//!
//! Checks (docs/contract.md): S-FW1 every committed row delivered once or
//! dead-lettered, never both; S-FW2 no rolled-back row delivered; S-FW3
//! per-tenant causal order across hosts; S-FW4 no write of epoch e commits
//! once another epoch is installed; S-FW5 no write starts after the
//! store's expiry of its lease (store's clock); S-FW6 after the heal every
//! partition owned within one ttl plus one renewal plus one acquire poll,
//! and the table drained within a bound; S-FW8 a removal takes effect
//! only under the lease its fence names and deletes only rows the
//! datastore accepted; S-FW10 the store back to a small constant after
//! the settle; S-FW9 each host's lease clock skewed against the
//! store's within the drift bound ([`clock`]).

pub mod book;
pub mod canary;
pub mod check;
pub mod clock;
pub mod faults;
pub mod host;
pub mod lanes;
pub mod link;
pub mod sink;
pub mod world;

use std::time::Duration;

pub use world::run;

/// Whether S-FW5 (no write starts after the store's expiry of its lease)
/// fails a seed: it needs the driver to gate each write by the lease
/// policy's grant (S-L8).
pub const ENFORCE_S_F5: bool = true;

/// Whether a write without an epoch fails S-FW4: it needs the driver's
/// writer to pass every write's epoch (S-E8).
pub const EPOCHS_REQUIRED: bool = true;

/// What a seed draws for the fleet.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The seed.
    pub seed: u64,
    /// Application hosts.
    pub hosts: usize,
    /// P.
    pub partitions: u32,
    /// Tenants.
    pub tenants: u64,
    /// Stagers per host.
    pub stagers: u64,
    /// The mean gap between a stager's transactions.
    pub stage_gap: Duration,
    /// The faulty phase.
    pub phase: Duration,
    /// The lease ttl.
    pub ttl: Duration,
    /// The renewal period.
    pub renew: Duration,
    /// The drift the policy allows for.
    pub drift: Duration,
    /// The acquire poll.
    pub acquire_poll: Duration,
    /// The heartbeat period.
    pub heartbeat: Duration,
    /// The rejoin grace.
    pub grace: Duration,
    /// The relay's poll interval.
    pub poll: Duration,
    /// Each host's lease clock against the store's (S-FW9).
    pub skews: Vec<clock::Skew>,
    /// Items the datastore refuses as malformed (a terminal rejection,
    /// so they are dead-lettered), in thousandths.
    pub poison_per_mille: u32,
    /// The driver's write timeout: in half the seeds longer than any
    /// pause, so a paused host's writes in flight land when it wakes.
    pub write_timeout: Duration,
    /// The store's `idle_in_transaction_timeout`: the default in half the
    /// seeds, in the others a minute (a datastore that keeps a paused
    /// session's transaction, and its share locks, until it wakes).
    pub idle_timeout: Duration,
    /// When each host joins the fleet (`Duration::ZERO`: at the start; in
    /// half the seeds one host more than the three to five joins late).
    pub join_at: Vec<Duration>,
    /// A host that leaves the fleet for good (a graceful shutdown) at
    /// this instant, in half the seeds of four hosts or more.
    pub leave: Option<(usize, Duration)>,
    /// In half the seeds the datastore absorbs a repeat only within this
    /// window of the row's first acceptance (a repeat later is stored
    /// again: delivered twice, S-FW1); in the others, repeats of any age.
    pub repeat_window: Option<Duration>,
}

impl Setup {
    /// Whether host `h` has left the fleet by `now`.
    pub fn has_left(&self, h: usize, now: Duration) -> bool {
        self.leave.is_some_and(|(l, at)| l == h && now >= at)
    }
}

/// The answer of a call to the model, which answers when called (its
/// futures are ready); `None` on an error.
pub(crate) fn now<T, E>(fut: impl std::future::Future<Output = Result<T, E>>) -> Option<T> {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(r) => r.ok(),
        std::task::Poll::Pending => None,
    }
}

/// The lease table now.
pub(crate) fn lease_rows(model: &outbox::table::model::Model) -> Vec<outbox::table::LeaseRow> {
    use outbox::table::Store;
    now(model.store().leases()).unwrap_or_default()
}
