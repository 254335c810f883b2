//! What the lease policy asks of the store, as plain data (S-L2): the
//! driver runs each [`Request`] (SQL against the lease, heartbeat and
//! sink-epoch tables, or a model of them) and hands back one [`Reply`] or
//! a [`StoreError`] with the request's [`RequestId`].
//!
//! Every operation below is one statement, or one transaction, that the
//! store runs atomically; "the store's clock" is the database's
//! `clock_timestamp()`, never a clock of the instance. The policy never
//! compares the store's clock with its own (S-L4): it only learns whether
//! a conditional statement matched.

use std::fmt;
use std::time::Duration;

use super::id::{Epoch, Holder, InstanceId, Partition};

/// Names one request; the reply must carry it back
/// ([`LeasePolicy::handle_reply`](super::LeasePolicy::handle_reply)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}", self.0)
    }
}

/// A store operation to run, from
/// [`LeasePolicy::poll_request`](super::LeasePolicy::poll_request). Send it
/// at once: its deadline arithmetic takes the instant it was polled as the
/// instant it was sent (S-L4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Hand it back with the reply.
    pub id: RequestId,
    /// What to run.
    pub op: StoreOp,
}

/// The store operations (S-L2). Each variant says what it must do and what
/// its reply must say; each reply is a [`Reply`] of the variant named.
///
/// Non-exhaustive: new operations may come (a match needs a `_` arm).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreOp {
    /// Announce `instance` and read the fleet (S-L3). One transaction:
    /// upsert the instance's heartbeat row with `expiry = clock_timestamp()
    /// + member_ttl`; then read the instance ids of every heartbeat row
    /// with `expiry > clock_timestamp()` (this one included) and, for every
    /// lease row, its partition and `owner` (the last owner: a released or
    /// expired lease keeps it). Reply: [`Reply::Members`].
    Heartbeat {
        /// Who announces itself.
        instance: InstanceId,
        /// How long the row keeps the instance a member: `rejoin_grace`.
        member_ttl: Duration,
    },
    /// Read the highest epoch the sink has recorded for each partition
    /// (S-L10), from the sink's epoch table (the sink's own database, which
    /// may not be the lease table's). Reply: [`Reply::SinkEpochs`].
    SinkEpochs {
        /// The partitions to read.
        partitions: Vec<Partition>,
    },
    /// Take free leases (S-L10). One autocommit statement: for each
    /// `(partition, floor)`, insert the lease row or update it where it has
    /// no live owner (`expiry <= clock_timestamp()`, a released lease
    /// included; never where it is live, whoever holds it, this instance
    /// too), setting `owner = instance`, `epoch = greatest(epoch, floor) +
    /// 1` and `expiry = clock_timestamp() + ttl`. Reply:
    /// [`Reply::Acquired`] with the rows it took and their new epochs.
    Acquire {
        /// Who takes them.
        instance: InstanceId,
        /// The lease's ttl.
        ttl: Duration,
        /// Each partition with the sink's recorded epoch: the new epoch
        /// must exceed both it and the row's.
        leases: Vec<(Partition, Epoch)>,
    },
    /// Renew held leases (S-L5). One autocommit statement (or one per
    /// lease, sent together): `UPDATE ... SET expiry = clock_timestamp() +
    /// ttl WHERE partition = $p AND owner = $instance AND epoch = $e` for
    /// each `(partition, epoch)`, optionally `AND expiry >
    /// clock_timestamp()`. Reply: [`Reply::Renewed`] with the partitions
    /// whose row matched; any other was refused (taken over, released or
    /// lapsed).
    Renew {
        /// The holder.
        instance: InstanceId,
        /// The lease's ttl.
        ttl: Duration,
        /// The leases, each under the epoch it was acquired with.
        leases: Vec<(Partition, Epoch)>,
    },
    /// Install an epoch at the sink before anything of the partition is
    /// read, written, deleted or dead-lettered (S-L12). One statement at
    /// the sink's epoch table, under a `lock_timeout` well under the ttl
    /// (S-L14): set the partition's row to `(epoch, holder)` where its epoch
    /// is below `epoch` (or the row is absent); leave it where it already
    /// holds exactly `(epoch, holder)` (this install, retried). Then read
    /// the row. Reply: [`Reply::Installed`]. From its commit on, the sink
    /// refuses every write of an older epoch (S-L14).
    Install {
        /// The partition.
        partition: Partition,
        /// The epoch the acquire took.
        epoch: Epoch,
        /// Who installs it: an epoch is installed by one holder at most
        /// (S-L11).
        holder: Holder,
    },
    /// Give leases up (S-L17). One autocommit statement: `UPDATE ... SET
    /// expiry = clock_timestamp()` (or any instant not after it) `WHERE
    /// partition = $p AND owner = $instance AND epoch = $e`, keeping
    /// `owner` and `epoch` (the owner stays the last owner, which the plan
    /// reads, S-L21). Reply: [`Reply::Released`].
    Release {
        /// The holder.
        instance: InstanceId,
        /// The leases.
        leases: Vec<(Partition, Epoch)>,
    },
    /// Leave the fleet for good (S-L28): delete the instance's heartbeat
    /// row. Sent only by a shutdown that leaves, after every release.
    /// Reply: [`Reply::Left`].
    Leave {
        /// Who leaves.
        instance: InstanceId,
    },
}

impl StoreOp {
    /// The operation's name, for logs and metrics: `heartbeat`,
    /// `sink_epochs`, `acquire`, `renew`, `install`, `release`, `leave`.
    pub fn name(&self) -> &'static str {
        match self {
            StoreOp::Heartbeat { .. } => "heartbeat",
            StoreOp::SinkEpochs { .. } => "sink_epochs",
            StoreOp::Acquire { .. } => "acquire",
            StoreOp::Renew { .. } => "renew",
            StoreOp::Install { .. } => "install",
            StoreOp::Release { .. } => "release",
            StoreOp::Leave { .. } => "leave",
        }
    }
}

/// What a [`StoreOp`] that ran reports, one variant per operation.
///
/// Non-exhaustive: new replies may come with new operations.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply {
    /// [`StoreOp::Heartbeat`]'s.
    Members {
        /// The live members, in any order.
        members: Vec<InstanceId>,
        /// Each lease row's partition and last owner, in any order; a
        /// partition without a row is absent.
        owners: Vec<(Partition, InstanceId)>,
    },
    /// [`StoreOp::SinkEpochs`]'s: the recorded epochs, in any order; a
    /// partition the sink has none for is absent (taken as
    /// [`Epoch::NONE`]).
    SinkEpochs {
        /// `(partition, highest recorded epoch)`.
        epochs: Vec<(Partition, Epoch)>,
    },
    /// [`StoreOp::Acquire`]'s: the leases taken, with their new epochs; a
    /// partition asked for and absent is held by someone.
    Acquired {
        /// `(partition, new epoch)`.
        granted: Vec<(Partition, Epoch)>,
    },
    /// [`StoreOp::Renew`]'s: the partitions whose row matched.
    Renewed {
        /// The renewed partitions.
        renewed: Vec<Partition>,
    },
    /// [`StoreOp::Install`]'s: the sink's row after the statement.
    Installed {
        /// The epoch the sink now holds for the partition.
        epoch: Epoch,
        /// Whether it holds it for this install's holder.
        ours: bool,
    },
    /// [`StoreOp::Release`]'s.
    Released,
    /// [`StoreOp::Leave`]'s.
    Left,
}

impl Reply {
    /// The operation this reply answers (see [`StoreOp::name`]).
    pub fn answers(&self) -> &'static str {
        match self {
            Reply::Members { .. } => "heartbeat",
            Reply::SinkEpochs { .. } => "sink_epochs",
            Reply::Acquired { .. } => "acquire",
            Reply::Renewed { .. } => "renew",
            Reply::Installed { .. } => "install",
            Reply::Released => "release",
            Reply::Left => "leave",
        }
    }
}

/// A request that did not come back with a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum StoreError {
    /// It did not take effect: the connection was refused, the statement
    /// failed or rolled back (a `lock_timeout` included).
    Failed,
    /// Whether it took effect is unknown: the reply was lost, or the
    /// statement timed out after it was sent. The policy assumes the worst
    /// either way (a renewal did not extend, an acquire may hold a lease
    /// it will let expire).
    Unknown,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreError::Failed => "failed",
            StoreError::Unknown => "unknown",
        })
    }
}

/// A reply [`LeasePolicy::handle_reply`](super::LeasePolicy::handle_reply)
/// did not take. The policy is unchanged but for what it says here.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplyError {
    /// No request with this id is waiting: it was answered already, given
    /// up after [`request_timeout`](super::LeaseConfig::request_timeout),
    /// or never handed out. A late grant is released all the same
    /// (S-L10), so a driver may ignore this.
    Unknown(RequestId),
    /// The reply is not of the request's operation: a driver bug. The
    /// request is taken as failed.
    Mismatch {
        /// The request.
        id: RequestId,
        /// Its operation.
        expected: &'static str,
        /// What the reply answers.
        got: &'static str,
    },
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::Unknown(id) => write!(f, "lease policy: no request {id} is waiting"),
            ReplyError::Mismatch { id, expected, got } => write!(
                f,
                "lease policy: request {id} is a {expected}, its reply answers a {got}"
            ),
        }
    }
}

impl std::error::Error for ReplyError {}
