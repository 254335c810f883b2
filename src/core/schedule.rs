//! The schedule: which tenant writes next and when timers fall due
//! (S-B1, S-A3, S-W7, S-W17, S-C4).
//!
//! Ready tenants wait in one FIFO in the order they became ready (S-B1).
//! Timers sit in ordered maps keyed by (instant, arming sequence), so ties
//! break the same way every run and a cancelled timer is removed exactly:
//! no stale entries, no scan. Lingers are kept apart from backoffs and
//! deadlines so a flush can release them without looking at the rest.
//! Every operation is O(log n) or O(1).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::backlog::{Phase, TimerKey};
use super::time::Time;
use super::write::WaitId;

/// A timer that is not a linger.
#[derive(Clone, Debug)]
enum Timer<K> {
    Backoff(K),
    Deadline(WaitId),
}

/// A timer that fell due.
#[derive(Debug)]
pub(crate) enum Due<K> {
    /// A tenant's linger or backoff ended: it is ready.
    Tenant(K),
    /// A flush, settle or shutdown deadline passed.
    Deadline(WaitId),
    /// A tenant's oldest item not in flight may be past `max_item_age`
    /// (S-R3).
    Expiry(K),
}

#[derive(Debug)]
pub(crate) struct Schedule<K> {
    ready: VecDeque<K>,
    lingering: BTreeMap<TimerKey, K>,
    timers: BTreeMap<TimerKey, Timer<K>>,
    /// Age timers (S-R3), by (instant, tenant): at one instant, in tenant
    /// order, after every other timer due then.
    expiries: BTreeSet<(Time, K)>,
    seq: u64,
}

impl<K> Default for Schedule<K> {
    fn default() -> Self {
        Schedule {
            ready: VecDeque::new(),
            lingering: BTreeMap::new(),
            timers: BTreeMap::new(),
            expiries: BTreeSet::new(),
            seq: 0,
        }
    }
}

impl<K> Schedule<K> {
    fn key(&mut self, at: Time) -> TimerKey {
        self.seq += 1;
        (at, self.seq)
    }

    /// Appends a tenant to the ready FIFO.
    pub(crate) fn ready(&mut self, tenant: K, phase: &mut Phase) {
        *phase = Phase::Ready;
        self.ready.push_back(tenant);
    }

    /// Lets a tenant linger until `until` (S-A3).
    pub(crate) fn linger(&mut self, tenant: K, phase: &mut Phase, until: Time) {
        let key = self.key(until);
        *phase = Phase::Lingering(key);
        self.lingering.insert(key, tenant);
    }

    /// Holds a tenant's retry until `until` (S-W7).
    pub(crate) fn backoff(&mut self, tenant: K, phase: &mut Phase, until: Time) {
        let key = self.key(until);
        *phase = Phase::BackingOff(key);
        self.timers.insert(key, Timer::Backoff(tenant));
    }

    /// Arms a wait's deadline.
    pub(crate) fn deadline(&mut self, id: WaitId, at: Time) -> TimerKey {
        let key = self.key(at);
        self.timers.insert(key, Timer::Deadline(id));
        key
    }

    /// Disarms a deadline.
    pub(crate) fn cancel_deadline(&mut self, key: TimerKey) {
        self.timers.remove(&key);
    }

    /// Takes a lingering or backing-off tenant off its timer; it is idle.
    pub(crate) fn unschedule(&mut self, phase: &mut Phase) {
        match *phase {
            Phase::Lingering(key) => {
                self.lingering.remove(&key);
            }
            Phase::BackingOff(key) => {
                self.timers.remove(&key);
            }
            Phase::Ready | Phase::Idle | Phase::InFlight(_) => return,
        }
        *phase = Phase::Idle;
    }

    /// The next ready tenant, first come first served (S-B1).
    pub(crate) fn pop_ready(&mut self) -> Option<K> {
        let tenant = self.ready.pop_front();
        super::shrink::deque(&mut self.ready);
        tenant
    }

    /// The next ready tenant, left in place (S-F2: a group looks before it
    /// takes).
    pub(crate) fn peek_ready(&self) -> Option<&K> {
        self.ready.front()
    }

    /// Whether a tenant is ready.
    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Forgets every ready tenant (the engine closed).
    pub(crate) fn clear_ready(&mut self) {
        self.ready.clear();
        super::shrink::deque(&mut self.ready);
    }

    /// Takes every ready tenant out, in order (the engine closes).
    pub(crate) fn take_ready(&mut self) -> VecDeque<K> {
        std::mem::take(&mut self.ready)
    }

    /// Every lingering tenant, in the order their lingers would end
    /// (a flush or shutdown sends them at once, S-A4).
    pub(crate) fn take_lingering(&mut self) -> impl Iterator<Item = K> {
        std::mem::take(&mut self.lingering).into_values()
    }

    /// The earliest timer but an age timer due at `now`, removed.
    fn pop_due_other(&mut self, now: Time) -> Option<Due<K>> {
        let linger = self.lingering.first_key_value().map(|(k, _)| *k);
        let timer = self.timers.first_key_value().map(|(k, _)| *k);
        let due = |k: Option<TimerKey>| k.filter(|k| k.0 <= now);
        match (due(linger), due(timer)) {
            (Some(l), Some(t)) if l < t => self.lingering.remove(&l).map(Due::Tenant),
            (Some(l), None) => self.lingering.remove(&l).map(Due::Tenant),
            (_, Some(t)) => self.timers.remove(&t).map(|timer| match timer {
                Timer::Backoff(tenant) => Due::Tenant(tenant),
                Timer::Deadline(id) => Due::Deadline(id),
            }),
            (None, None) => None,
        }
    }

    /// When the next timer but an age timer falls due.
    fn next_other(&self) -> Option<Time> {
        let a = self.lingering.first_key_value().map(|(k, _)| k.0);
        let b = self.timers.first_key_value().map(|(k, _)| k.0);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl<K: Ord + Clone> Schedule<K> {
    /// Moves `tenant`'s age timer (S-R3) from `from` to `to` (either
    /// `None`: not armed).
    pub(crate) fn move_expiry(&mut self, tenant: &K, from: Option<Time>, to: Option<Time>) {
        if from == to {
            return;
        }
        if let Some(at) = from {
            self.expiries.remove(&(at, tenant.clone()));
        }
        if let Some(at) = to {
            self.expiries.insert((at, tenant.clone()));
        }
    }

    /// The earliest timer due at `now`, removed; each fires once (S-W17).
    /// An age timer goes after the other timers of its instant.
    pub(crate) fn pop_due(&mut self, now: Time) -> Option<Due<K>> {
        let expiry = self.expiries.first().map(|e| e.0).filter(|&at| at <= now);
        match (expiry, self.next_other()) {
            (Some(e), other) if other.is_none_or(|o| e < o) => {
                self.expiries.pop_first().map(|(_, t)| Due::Expiry(t))
            }
            _ => self.pop_due_other(now),
        }
    }

    /// When the next timer falls due.
    pub(crate) fn next_timeout(&self) -> Option<Time> {
        let e = self.expiries.first().map(|e| e.0);
        match (self.next_other(), e) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
