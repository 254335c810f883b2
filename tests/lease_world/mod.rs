//! A deterministic world for the lease policy (S-L1-S-L29): several
//! policy instances against a tiny in-memory lease table with its own
//! clock, each instance's clock skewed in rate and stepped within
//! `max_clock_drift`, over links with delays and lost messages, with
//! pauses longer than the ttl, crashes, restarts, joins and leaves.
//!
//! Event-driven on the world's real time; every draw comes from the seed.
//! At every write start it checks that the store still takes the lease the
//! write started under for live (on the store's clock) and that its epoch
//! is installed at the sink for that holder; at every store operation, that
//! epochs only grow.

#![allow(dead_code)] // each test binary uses its own part

pub mod clock;
pub mod store;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Duration;

use outbox::core::lease::{
    Departure, Epoch, Holder, InstanceId, LeaseConfig, LeaseEvent, LeasePolicy, Partition, Plan,
    Reply, ReplyError, Request, RequestId, StopCause, StoreError, StoreOp, WriteGrant,
};
use outbox::core::Time;

use clock::Clock;
use store::{Store, Tables};

pub const MS: Duration = Duration::from_millis(1);

pub fn ms(n: u64) -> Time {
    Time::from_millis(n)
}

/// A seeded SplitMix64: the world's only source of draws.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5eed_1ea5_e000_0000)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    pub fn duration(&mut self, (lo, hi): (Duration, Duration)) -> Duration {
        Duration::from_nanos(self.between(lo.as_nanos() as u64, hi.as_nanos() as u64))
    }
    pub fn percent(&mut self, pct: u32) -> bool {
        self.next() % 100 < u64::from(pct)
    }
}

/// The world's shape: the policy's timing, the links, the writes.
#[derive(Clone, Debug)]
pub struct Setup {
    pub partitions: u32,
    pub ttl: Duration,
    pub renew: Duration,
    /// The drift the world's clocks stay within (S-L7).
    pub drift: Duration,
    /// The drift the policies are configured with (normally `drift`).
    pub assumed_drift: Duration,
    pub acquire_poll: Duration,
    pub heartbeat: Duration,
    pub grace: Duration,
    pub write_timeout: Option<Duration>,
    /// One way, per message.
    pub delay: (Duration, Duration),
    /// The driver gives a statement up after this (on its own clock).
    pub stmt_timeout: Duration,
    /// Between two write attempts of one host.
    pub write_gap: (Duration, Duration),
    /// How long a write runs before its commit.
    pub write_len: (Duration, Duration),
    pub seed: u64,
}

impl Setup {
    /// ttl 1 s, renew 200 ms, drift 100 ms, heartbeat and acquire poll
    /// 100 ms, grace 1 s; links 1-3 ms each way.
    pub fn fast(partitions: u32, seed: u64) -> Setup {
        Setup {
            partitions,
            ttl: 1_000 * MS,
            renew: 200 * MS,
            drift: 100 * MS,
            assumed_drift: 100 * MS,
            acquire_poll: 100 * MS,
            heartbeat: 100 * MS,
            grace: 1_000 * MS,
            write_timeout: Some(400 * MS),
            delay: (MS, 3 * MS),
            stmt_timeout: 100 * MS,
            write_gap: (2 * MS, 20 * MS),
            write_len: (MS, 30 * MS),
            seed,
        }
    }

    pub fn config(&self, name: &str, incarnation: u64) -> LeaseConfig {
        let mut b = LeaseConfig::builder(name)
            .incarnation(incarnation)
            .partitions(self.partitions)
            .lease_ttl(self.ttl)
            .renew_every(self.renew)
            .max_clock_drift(self.assumed_drift)
            .acquire_poll(self.acquire_poll)
            .heartbeat_every(self.heartbeat)
            .rejoin_grace(self.grace);
        if let Some(t) = self.write_timeout {
            b = b.write_timeout(t);
        }
        b.build().expect("a valid world config")
    }

    /// The largest rate error a clock may have, in ppm: a quarter of the
    /// drift over two ttls (S-L7), leaving room for one step of a quarter
    /// drift at the store and one back at the instance.
    pub fn max_ppm(&self) -> u64 {
        (self.drift.as_nanos() * 1_000_000 / (8 * self.ttl.as_nanos())) as u64
    }
}

/// What the world does at a moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Start the host: its first run, or a restart under the same name
    /// with a new incarnation.
    Start(usize),
    /// Kill it: its state is gone, its messages and writes in flight too.
    Crash(usize),
    Shutdown(usize, Departure),
    /// Freeze it for a while: it handles nothing; its clock runs on.
    Pause(usize, Duration),
    /// Cut it off the store for a while, both ways.
    CutOff(usize, Duration),
    /// The store refuses or ignores every request for a while.
    StoreDown(Duration),
    /// Each message is lost with this chance, in percent.
    Loss(u32),
    /// Each message takes this much longer.
    Slow(Duration),
    /// Step a clock (`None`: the store's) by nanoseconds.
    Step(Option<usize>, i128),
    /// Remember the lease and heartbeat tables.
    Snapshot,
    /// A database failover: the lease and heartbeat tables go back to the
    /// snapshot (the sink's epochs, elsewhere, do not).
    Rollback,
}

#[derive(Debug)]
enum Ev {
    Arrive {
        host: usize,
        inc: u64,
        req: Request,
    },
    Answer {
        host: usize,
        inc: u64,
        id: RequestId,
        result: Result<Reply, StoreError>,
    },
    Wake {
        host: usize,
        inc: u64,
        gen: u64,
    },
    StmtTimeout {
        host: usize,
        inc: u64,
        id: RequestId,
    },
    WriteTry {
        host: usize,
        inc: u64,
    },
    WriteEnd {
        host: usize,
        inc: u64,
        write: u64,
    },
    Do(Action),
}

impl Ev {
    fn host(&self) -> Option<(usize, u64)> {
        match *self {
            Ev::Answer { host, inc, .. }
            | Ev::Wake { host, inc, .. }
            | Ev::StmtTimeout { host, inc, .. }
            | Ev::WriteTry { host, inc }
            | Ev::WriteEnd { host, inc, .. } => Some((host, inc)),
            Ev::Arrive { .. } | Ev::Do(_) => None,
        }
    }
}

struct Entry {
    at: Time,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

pub struct Host {
    pub name: String,
    pub policy: Option<LeasePolicy>,
    pub incarnation: u64,
    pub clock: Clock,
    pub paused_until: Time,
    pub cut_until: Time,
    /// Partitions announced writable and not stopped since.
    pub writable: BTreeMap<Partition, Epoch>,
    writes: BTreeMap<u64, WriteGrant>,
    next_write: u64,
    wake_gen: u64,
    /// Requests sent and not yet answered to the policy.
    waiting: BTreeSet<RequestId>,
    /// When this run's first heartbeat was sent.
    pub first_heartbeat: Option<Time>,
}

impl Host {
    pub fn up(&self) -> bool {
        self.policy.as_ref().is_some_and(|p| !p.is_shut_down())
    }
}

/// One thing that happened, for the timing checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Event {
        t: Time,
        host: usize,
        event: LeaseEvent,
    },
    Write {
        t: Time,
        host: usize,
        partition: Partition,
        epoch: Epoch,
    },
}

pub struct World {
    pub setup: Setup,
    pub t: Time,
    pub store: Store,
    pub hosts: Vec<Host>,
    queue: BinaryHeap<Reverse<Entry>>,
    seq: u64,
    pub rng: Rng,
    pub loss: u32,
    pub slow: Duration,
    pub store_down_until: Time,
    snapshot: Option<Tables>,
    pub rolled_back: Option<Time>,
    pub log: Vec<Record>,
    pub violations: Vec<String>,
    /// The highest epoch granted per partition.
    granted: BTreeMap<Partition, u64>,
    /// When each (partition, epoch, owner) lease was first granted.
    granted_at: BTreeMap<(Partition, u64, String), Time>,
    /// Who each (partition, epoch) was installed for.
    installs: BTreeMap<(Partition, u64), Holder>,
    /// The highest epoch a committed write carried, per partition.
    committed: BTreeMap<Partition, u64>,
    pub commits: u64,
    pub stale: u64,
    pub writes_started: u64,
    /// Pauses longer than the ttl of a host that was up, and of those, the
    /// ones that froze a write in flight.
    pub long_pauses: u64,
    pub long_pauses_with_writes_open: u64,
}

mod run;
