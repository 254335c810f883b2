//! The crash world's faults, drawn from the seed on streams of their own:
//! when the application host crashes and where it is then (a plain moment,
//! inside a group commit, inside a segment deletion, inside recovery,
//! during a shutdown), how long it stays down, and the storage faults
//! (lost unsynced writes always; torn writes, EIO, bit rot and a full disk
//! each in a share of seeds).

use std::time::Duration;

use rand::Rng;

use super::disk::{Call, DiskPlan, Trip};
use crate::draw::{chance, log_uniform, SimRng};

/// The stream of the crash schedule (xored into the seed).
pub const CRASH_STREAM: u64 = 0xC4A5_4000_0000_0001;
/// The stream of the storage faults.
pub const DISK_STREAM: u64 = 0xD15C_0000_0000_0002;
/// The stream the disk's own draws (EIO, rot, prefixes) come from.
pub const DISK_RNG_STREAM: u64 = 0xD15C_0000_0000_0003;

/// How one crash comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// At a moment drawn from the seed, wherever the process is.
    Now,
    /// Inside a storage call, armed at the moment: the next `sync` or
    /// `append` (a group commit), `delete` (a segment deletion).
    Inside(Trip),
    /// Now, and again inside the recovery of the restart (its `skip`-th
    /// `read`, its `truncate` or its seal's `append`/`sync`).
    Recovery(Trip),
    /// The application starts a clean shutdown and crashes this long
    /// after, unless it exited first (then it restarts cleanly).
    Shutdown(Duration),
}

impl How {
    /// The name in the summary's fault counts.
    pub fn kind(self) -> &'static str {
        match self {
            How::Now => "crash",
            How::Inside(t) if t.call == Call::Delete => "crash_in_deletion",
            How::Inside(_) => "crash_in_commit",
            How::Recovery(_) => "crash_in_recovery",
            How::Shutdown(_) => "crash_in_shutdown",
        }
    }
}

/// Everything the seed draws about crashes and disks.
#[derive(Clone, Debug)]
pub struct CrashFaults {
    /// Crashes in time order: (when, how).
    pub crashes: Vec<(Duration, How)>,
    /// How long the host stays down after a crash, at most.
    pub max_downtime: Duration,
    /// Turmoil's torn-write block size, in a share of seeds.
    pub block_size: Option<u64>,
    /// The adapter's faults.
    pub disk: DiskPlan,
}

fn trip(r: &mut SimRng, call: Call, what: &'static str) -> Trip {
    Trip {
        call,
        skip: if chance(r, 1, 2) {
            0
        } else {
            r.random_range(0..4)
        },
        what,
    }
}

impl CrashFaults {
    /// Draws the faults of a faulty phase of `phase`.
    pub fn draw(seed: u64, phase: Duration) -> CrashFaults {
        let mut r = crate::draw::rng(seed ^ CRASH_STREAM);
        let n = r.random_range(2..=8);
        let phase_ms = u64::try_from(phase.as_millis()).unwrap_or(u64::MAX).max(2);
        let mut crashes = Vec::new();
        for _ in 0..n {
            let at = Duration::from_millis(r.random_range(1..phase_ms));
            let how = match r.random_range(0..10) {
                0 | 1 => How::Now,
                2 => How::Inside(trip(&mut r, Call::Append, "during a group commit's write")),
                3 | 4 => How::Inside(trip(
                    &mut r,
                    Call::Sync,
                    "during a group commit's fdatasync",
                )),
                5 | 6 => How::Inside(trip(&mut r, Call::Delete, "during a segment deletion")),
                7 | 8 => {
                    let call = match r.random_range(0..4) {
                        0 | 1 => Call::Read,
                        2 => Call::List,
                        _ => Call::Sync,
                    };
                    How::Recovery(trip(&mut r, call, "during recovery"))
                }
                _ => How::Shutdown(Duration::from_millis(log_uniform(&mut r, 1, 200))),
            };
            crashes.push((at, how));
        }
        crashes.sort_by_key(|c| c.0);
        let max_downtime = Duration::from_millis(log_uniform(&mut r, 1, 2_000));

        let mut d = crate::draw::rng(seed ^ DISK_STREAM);
        let block_size = chance(&mut d, 1, 2).then(|| [8, 64, 512][d.random_range(0..3)]);
        let eio = if chance(&mut d, 1, 3) {
            log_uniform(&mut d, 1, 30) as u32
        } else {
            0
        };
        let rot = if chance(&mut d, 1, 4) {
            log_uniform(&mut d, 20, 300) as u32
        } else {
            0
        };
        let mut full = [None; 3];
        if chance(&mut d, 1, 4) {
            for w in &mut full {
                if chance(&mut d, 2, 3) {
                    let from = Duration::from_millis(d.random_range(0..phase_ms));
                    let len = Duration::from_millis(log_uniform(&mut d, 10, 3_000));
                    *w = Some((from, from + len));
                }
            }
        }
        CrashFaults {
            crashes,
            max_downtime,
            block_size,
            disk: DiskPlan {
                eio,
                rot,
                full,
                skip_sync: no_fsync_canary(),
            },
        }
    }
}

/// The `no_fsync` canary (feature `canary`, `OUTBOX_CANARY=no_fsync`): the
/// disk's `sync` answers without syncing.
#[cfg(feature = "canary")]
fn no_fsync_canary() -> bool {
    std::env::var("OUTBOX_CANARY").is_ok_and(|v| v == "no_fsync")
}

#[cfg(not(feature = "canary"))]
fn no_fsync_canary() -> bool {
    false
}
