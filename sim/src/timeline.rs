//! What a traced run records for its picture: attempts, backoffs, stages,
//! controls and losses, on the virtual clock.

use outbox::core::Time;
use outbox::testkit::Loss;

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Still running when the run ended.
    Running,
    /// Written (perhaps with items discarded).
    Written,
    /// A retryable error (or a commit whose reply was lost).
    Failed,
    /// The sink panicked.
    Panicked,
    /// Cut by the write timeout.
    TimedOut,
    /// Rejected terminally.
    Rejected,
    /// Cancelled by the driver.
    Cancelled,
    /// Its task was lost (S-W13).
    TaskLost,
}

/// One attempt of one write.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// Whose write.
    pub tenant: u8,
    /// The write's id.
    pub write: u64,
    /// 1, 2, …
    pub attempt: u32,
    /// Items in the slice.
    pub items: usize,
    /// Started.
    pub start: Time,
    /// Ended (equal to `start` while running).
    pub end: Time,
    /// How.
    pub result: AttemptEnd,
}

/// A flush, settle, shutdown or abandon call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlKind {
    /// `flush(deadline)`.
    Flush,
    /// `settle(deadline)`.
    Settle,
    /// `shutdown(deadline)`.
    Shutdown,
    /// `abandon()`.
    Abandon,
}

impl ControlKind {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ControlKind::Flush => "flush",
            ControlKind::Settle => "settle",
            ControlKind::Shutdown => "shutdown",
            ControlKind::Abandon => "abandon",
        }
    }
}

/// What happened to the application host or its journal (crash world).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostMark {
    /// The host crashed.
    Crash,
    /// The host started again on the same disk.
    Restart,
    /// The journal was read back: items recovered.
    Recovery(u64),
    /// A `sync` answered: Ok, or not.
    Sync(bool),
}

impl HostMark {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            HostMark::Crash => "crash",
            HostMark::Restart => "restart",
            HostMark::Recovery(_) => "recovery",
            HostMark::Sync(true) => "sync ok",
            HostMark::Sync(false) => "sync not durable",
        }
    }
}

/// Everything a traced run draws.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// Tenants in play.
    pub tenants: u8,
    /// Every attempt, in start order.
    pub attempts: Vec<Attempt>,
    /// Backoff waits: (tenant, failed at, retried at).
    pub backoffs: Vec<(u8, Time, Time)>,
    /// Stage calls: (at, tenant, items accepted, items refused or dropped).
    pub stages: Vec<(Time, u8, u32, u32)>,
    /// Controls: (at, kind, deadline).
    pub controls: Vec<(Time, ControlKind, Option<Time>)>,
    /// Drops and losses, as the engine reported them.
    pub losses: Vec<Loss>,
    /// Storms: (from, to).
    pub storms: Vec<(Time, Time)>,
    /// Crashes, restarts, recoveries and syncs of the application host.
    pub host: Vec<(Time, HostMark)>,
    /// When the healed phase began, if it ran.
    pub healed_at: Option<Time>,
    /// The fleet world's lanes, a lane per host (drawn instead of the
    /// tenants' lanes).
    pub fleet: Option<crate::fleet::lanes::FleetLanes>,
    /// The end of the run.
    pub end: Time,
}
