//! The fleet's faults, drawn from the seed: a schedule of timed events
//! over the faulty phase, at least one pause longer than the lease ttl.
//!
//! Partitions cut one pair of hosts: an application host and the store
//! (its relay's and lease task's calls), an application host and the
//! datastore (its sink's), or both pairs at once (the host isolated).
//! Application hosts send each other nothing (they coordinate only
//! through the store's lease table), so a cut between two of them would
//! change nothing and is not drawn; nor is one between the store and the
//! datastore, which share one database (S-T23).

use std::time::Duration;

use rand::Rng;

use super::Setup;
use crate::draw::SimRng;

/// One fault event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The host's process dies (its transactions end, its leases lapse).
    Crash(usize),
    /// The host starts again (next incarnation).
    Restart(usize),
    /// The host's link to the peer is cut.
    Cut(usize, Peer),
    /// The host's link to the peer is back.
    Mend(usize, Peer),
    /// The host freezes (its links held).
    Pause(usize),
    /// The host resumes.
    Resume(usize),
    /// The host freezes for this long at its next sink commit (its
    /// commit held, its transaction open: a process paused mid-write),
    /// or with `true` at its next removal that moves a dead letter.
    PauseAt(usize, Duration, bool),
    /// The host's link gets this one-way latency.
    Latency(usize, Duration),
    /// The store restarts: every session and listener ends, and it is
    /// unreachable for this long.
    StoreRestart(Duration),
}

/// The far end of an application host's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Peer {
    /// The store host (outbox, lease and epoch tables): the relay's and
    /// the lease task's calls.
    Store = 0,
    /// The datastore host: the sink's transactions.
    Datastore = 1,
}

/// The schedule, in time order (ties in draw order).
#[derive(Clone, Debug, Default)]
pub struct Schedule {
    /// `(at, fault)`.
    pub events: Vec<(Duration, Fault)>,
    /// Pauses longer than the lease ttl.
    pub long_pauses: u64,
    /// Lost replies, per mille of calls.
    pub lose_per_mille: u32,
}

fn window(rng: &mut SimRng, phase: Duration, lo: Duration, hi: Duration) -> (Duration, Duration) {
    let len =
        Duration::from_millis(rng.random_range(lo.as_millis() as u64..=hi.as_millis() as u64));
    let latest = phase.saturating_sub(len).as_millis().max(1) as u64;
    let at = Duration::from_millis(rng.random_range(0..latest));
    (at, at + len)
}

impl Schedule {
    /// Draws the schedule of `setup`.
    pub fn draw(rng: &mut SimRng, s: &Setup) -> Schedule {
        let mut out = Schedule {
            lose_per_mille: rng.random_range(0..=20),
            ..Schedule::default()
        };
        let ms = Duration::from_millis;
        for _ in 0..rng.random_range(1..=3) {
            let h = rng.random_range(0..s.hosts);
            let (at, until) = window(rng, s.phase, ms(200), s.ttl * 3);
            out.events.push((at, Fault::Crash(h)));
            out.events.push((until, Fault::Restart(h)));
        }
        for _ in 0..rng.random_range(1..=4) {
            let h = rng.random_range(0..s.hosts);
            let (at, until) = window(rng, s.phase, ms(100), s.ttl * 3);
            out.events.push((at, Fault::Cut(h, Peer::Store)));
            out.events.push((until, Fault::Mend(h, Peer::Store)));
        }
        for i in 0..rng.random_range(1..=3) {
            let h = rng.random_range(0..s.hosts);
            // The first pause outlasts the ttl.
            let lo = if i == 0 { s.ttl + ms(100) } else { ms(50) };
            let (at, until) = window(rng, s.phase, lo, s.ttl * 3);
            out.long_pauses += u64::from(until - at > s.ttl);
            if rng.random_range(0..2) == 0 {
                let at_dead = rng.random_range(0..2) == 0;
                let mut len = until - at;
                if at_dead && i == 0 {
                    // Just past the lease: the zombie wakes while the
                    // partition's new owner is taking over.
                    let extra =
                        rng.random_range(0..=(s.ttl / 2 + s.acquire_poll).as_millis() as u64);
                    len = s.ttl + ms(extra);
                }
                out.events.push((at, Fault::PauseAt(h, len, at_dead)));
            } else {
                out.events.push((at, Fault::Pause(h)));
                out.events.push((until, Fault::Resume(h)));
            }
        }
        for _ in 0..rng.random_range(0..=3) {
            let h = rng.random_range(0..s.hosts);
            let (at, until) = window(rng, s.phase, ms(500), ms(5_000));
            let slow = ms(rng.random_range(5..=150));
            out.events.push((at, Fault::Latency(h, slow)));
            out.events.push((until, Fault::Latency(h, ms(1))));
        }
        out.events.sort_by_key(|e| e.0);
        out
    }

    /// Adds 0-2 store restarts, each unreachable for 0.2-2 s (drawn
    /// apart from the rest, so the other faults of a seed stay).
    pub fn draw_store_restarts(&mut self, rng: &mut SimRng, s: &Setup) {
        let ms = Duration::from_millis;
        for _ in 0..rng.random_range(0..=2u32) {
            let (at, until) = window(rng, s.phase, ms(200), ms(2_000));
            self.events.push((at, Fault::StoreRestart(until - at)));
        }
        self.events.sort_by_key(|e| e.0);
    }

    /// Draws the peers of each partition (drawn apart, so the other
    /// faults of a seed stay): of the host's links to the store (a
    /// third), to the datastore (a third) or both (a third). Each cut is
    /// paired with its host's first unclaimed mend after it.
    pub fn draw_partition_peers(&mut self, rng: &mut SimRng) {
        let mut claimed = vec![false; self.events.len()];
        let mut more = Vec::new();
        for i in 0..self.events.len() {
            let (at, Fault::Cut(h, _)) = self.events[i] else {
                continue;
            };
            let mend = (i + 1..self.events.len())
                .find(|&j| !claimed[j] && matches!(self.events[j].1, Fault::Mend(m, _) if m == h));
            let Some(j) = mend else { continue };
            claimed[j] = true;
            let until = self.events[j].0;
            match rng.random_range(0..3u32) {
                0 => {}
                1 => {
                    self.events[i].1 = Fault::Cut(h, Peer::Datastore);
                    self.events[j].1 = Fault::Mend(h, Peer::Datastore);
                }
                _ => {
                    more.push((at, Fault::Cut(h, Peer::Datastore)));
                    more.push((until, Fault::Mend(h, Peer::Datastore)));
                }
            }
        }
        self.events.extend(more);
        self.events.sort_by_key(|e| e.0);
    }
}
