//! Admission by reservation: the `capacity` and `capacity_bytes` checks of
//! a stage, decided without the engine's lock (S-A1, S-B5, S-W19).
//!
//! A stage reserves one item and its weight before it hands the item to
//! the engine's intake; the engine's holder gives back what settled. The
//! reservation counts every item admitted and not yet settled: the ones
//! still on their way to the engine and the engine's pending ones, so a
//! capacity is never exceeded, whatever the interleaving. Atomics only: no
//! IO, no clock; the same sequence of calls gives the same answers.

use std::sync::atomic::{AtomicU64, Ordering};

use super::accounting::DropReason;
use super::config::Config;
use super::time::Time;

/// An item admitted on the request path, on its way to the engine's
/// intake ([`Engine::stage_batch`](super::Engine::stage_batch), S-W19). Its
/// reservation is held until it settles.
#[derive(Debug)]
pub struct Handoff<K, I> {
    /// Its tenant.
    pub tenant: K,
    /// The item.
    pub item: I,
    /// Its clamped weight in bytes (0 without a weigher), as
    /// [`Engine::weigh_item`](super::Engine::weigh_item) gives it, if the
    /// request path weighed it (to reserve bytes); `None`: the engine
    /// weighs it at intake.
    pub weight: Option<u64>,
    /// When it was staged, if the engine reads that (a linger or a
    /// `max_item_age`, S-A3, S-R3); `None`: stamped at intake.
    pub at: Option<Time>,
}

/// The reservations against the buffer's capacities (S-A1, S-B5). Without
/// either capacity configured, every call is free: nothing is counted.
#[derive(Debug)]
pub struct Admission {
    capacity: Option<u64>,
    capacity_bytes: Option<u64>,
    /// Items admitted and not yet settled.
    items: AtomicU64,
    /// Their clamped weights, in bytes, saturating.
    bytes: AtomicU64,
}

impl Admission {
    /// The admission of `config`'s capacities, with nothing reserved.
    pub fn new(config: &Config) -> Self {
        Admission {
            capacity: config.capacity.map(|c| c as u64),
            capacity_bytes: config.capacity_bytes,
            items: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// Whether a capacity is configured: without one, nothing is counted.
    pub fn is_bounded(&self) -> bool {
        self.capacity.is_some() || self.capacity_bytes.is_some()
    }

    /// Reserves room for one item weighing `weight` bytes (already clamped,
    /// see [`MAX_WEIGHT`](super::MAX_WEIGHT)), the engine's rule: refused when
    /// `capacity` items are admitted, or when the bytes admitted plus
    /// `weight` exceed `capacity_bytes` (S-A1, S-B5).
    ///
    /// # Errors
    /// [`DropReason::BufferFull`]: nothing was reserved.
    pub fn reserve(&self, weight: u64) -> Result<(), DropReason> {
        if let Some(cap) = self.capacity {
            // A compare-exchange, not an add-then-undo: two racing stages
            // at the edge never both fail for want of one slot.
            self.items
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < cap).then_some(n + 1)
                })
                .map_err(|_| DropReason::BufferFull)?;
        }
        if let Some(cap) = self.capacity_bytes {
            let took = self
                .bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                    let after = b.saturating_add(weight);
                    (after <= cap).then_some(after)
                });
            if took.is_err() {
                if self.capacity.is_some() {
                    self.items.fetch_sub(1, Ordering::AcqRel);
                }
                return Err(DropReason::BufferFull);
            }
        }
        Ok(())
    }

    /// Gives back `items` weighing `bytes` that settled (or were refused
    /// after their reservation).
    pub fn release(&self, items: u64, bytes: u64) {
        if self.capacity.is_some() {
            self.items.fetch_sub(items, Ordering::AcqRel);
        }
        if self.capacity_bytes.is_some() {
            // Saturating: byte sums saturate in the engine too (S-B5).
            let _ = self
                .bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                    Some(b.saturating_sub(bytes))
                });
        }
    }

    /// Counts `items` weighing `bytes` that became pending without a
    /// reservation (a recovery, D4, or a stage decided under the lock).
    pub fn add(&self, items: u64, bytes: u64) {
        if self.capacity.is_some() {
            self.items.fetch_add(items, Ordering::AcqRel);
        }
        if self.capacity_bytes.is_some() {
            let _ = self
                .bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                    Some(b.saturating_add(bytes))
                });
        }
    }

    /// Brings the engine's share of the reservations, `held` (items,
    /// bytes), to what the engine has pending now: gives back what settled
    /// since, adds what became pending without a reservation (a stage
    /// decided under the engine's lock, a recovery). Call after every
    /// engine input, once the items it took in from hand-offs were added to
    /// `held` ([`Intake`](super::Intake)).
    pub fn follow(&self, held: &mut (u64, u64), pending: u64, pending_bytes: u64) {
        if self.is_bounded() {
            let (items, bytes) = *held;
            self.release(
                items.saturating_sub(pending),
                bytes.saturating_sub(pending_bytes),
            );
            self.add(
                pending.saturating_sub(items),
                pending_bytes.saturating_sub(bytes),
            );
        }
        *held = (pending, pending_bytes);
    }

    /// Items admitted and not yet settled (0 when unbounded).
    pub fn items(&self) -> u64 {
        self.items.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_refuses_the_item_past_it_and_release_makes_room() {
        let a = Admission::new(&Config::builder().capacity(2).build().unwrap());
        assert_eq!(a.reserve(0), Ok(()));
        assert_eq!(a.reserve(0), Ok(()));
        assert_eq!(a.reserve(0), Err(DropReason::BufferFull));
        a.release(1, 0);
        assert_eq!(a.reserve(0), Ok(()));
        assert_eq!(a.items(), 2);
    }

    #[test]
    fn capacity_bytes_refuses_what_would_exceed_it_and_keeps_no_item() {
        // A byte limit needs a weigher in `build`; the admission only
        // needs the numbers.
        let config = Config {
            capacity: Some(10),
            capacity_bytes: Some(100),
            ..Config::default()
        };
        let a = Admission::new(&config);
        assert_eq!(a.reserve(60), Ok(()));
        assert_eq!(a.reserve(41), Err(DropReason::BufferFull));
        assert_eq!(a.items(), 1, "the refused item's slot is given back");
        assert_eq!(a.reserve(40), Ok(()));
        a.release(2, 100);
        assert_eq!(a.items(), 0);
    }

    #[test]
    fn unbounded_counts_nothing() {
        let a = Admission::new(&Config::default());
        assert!(!a.is_bounded());
        for _ in 0..10 {
            assert_eq!(a.reserve(u64::MAX), Ok(()));
        }
        a.add(3, 3);
        assert_eq!(a.items(), 0);
    }
}
