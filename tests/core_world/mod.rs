//! A hand-driven world for core tests: the engine, a virtual clock the test
//! moves by hand, and a record of what the "sink" saw. No runtime, no wall
//! clock, no randomness.

#![allow(dead_code)] // each test file uses its own subset

use std::collections::BTreeMap;
use std::time::Duration;

use outbox::core::{
    Config, ConfigBuilder, Counters, DropReason, Engine, Event, Failure, LostReason, Outcome,
    Report, ShutdownReport, Staged, Time, Unwritten, WaitId, Write,
};

pub type Tenant = u32;
pub type Item = u32;
pub type W = Write<Tenant, Item>;

pub const fn ms(n: u64) -> Time {
    Time::from_millis(n)
}

pub const fn dur(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The engine plus what a sink and a driver would have seen.
pub struct World {
    pub e: Engine<Tenant, Item>,
    pub now: Time,
    /// Every attempt handed out: (tenant, items, attempt), in order.
    pub attempts: Vec<(Tenant, Vec<Item>, u32)>,
    /// Items committed per tenant, in commit order.
    pub written: BTreeMap<Tenant, Vec<Item>>,
    /// Every event, in order.
    pub events: Vec<Event<Tenant, Item>>,
    last: Counters,
}

impl World {
    pub fn new(b: ConfigBuilder) -> Self {
        Self::with_engine(Engine::new(b.build().expect("valid config")).expect("no weigher needed"))
    }

    /// An engine relaying an outbox table (S-E7: a stale epoch hands its
    /// tenant over).
    pub fn table(b: ConfigBuilder) -> Self {
        let e = Engine::new(b.build().expect("valid config")).expect("no weigher needed");
        Self::with_engine(e.with_outbox_table())
    }

    pub fn config(c: Config) -> Self {
        Self::with_engine(Engine::new(c).expect("no weigher needed"))
    }

    /// Items weigh their own value in bytes (S-B5).
    pub fn weighed(b: ConfigBuilder) -> Self {
        Self::with_engine(
            Engine::with_weigher(b.build().expect("valid config"), |i: &Item| u64::from(*i))
                .expect("weigher given"),
        )
    }

    pub fn with_engine(e: Engine<Tenant, Item>) -> Self {
        World {
            e,
            now: Time::ZERO,
            attempts: Vec::new(),
            written: BTreeMap::new(),
            events: Vec::new(),
            last: Counters::default(),
        }
    }

    /// Drains events and checks S-W14 (balance, monotonic counters).
    fn after(&mut self) {
        while let Some(ev) = self.e.poll_event() {
            self.events.push(ev);
        }
        let c = self.e.counters().clone();
        assert!(c.balanced(), "S-W14: counters unbalanced: {c:?}");
        let l = &self.last;
        assert!(
            c.staged >= l.staged
                && c.written >= l.written
                && c.writes >= l.writes
                && c.attempts >= l.attempts
                && c.failed_attempts >= l.failed_attempts
                && LostReason::ALL.iter().all(|&r| c.lost(r) >= l.lost(r))
                && DropReason::ALL
                    .iter()
                    .all(|&r| c.dropped(r) >= l.dropped(r)),
            "S-W14: a counter decreased: {l:?} -> {c:?}"
        );
        self.last = c;
    }

    /// Moves the clock to `t` (absolute ms) and fires what is due.
    pub fn at(&mut self, t: u64) {
        self.now = ms(t);
        self.e.handle_timeout(self.now);
        self.after();
    }

    pub fn at_time(&mut self, t: Time) {
        self.now = t;
        self.e.handle_timeout(self.now);
        self.after();
    }

    pub fn stage(&mut self, tenant: Tenant, item: Item) -> Staged {
        let s = self.e.stage(self.now, tenant, item);
        self.after();
        s
    }

    /// Stages items that must all be accepted.
    pub fn stage_ok(&mut self, tenant: Tenant, items: impl IntoIterator<Item = Item>) {
        for i in items {
            assert_eq!(self.stage(tenant, i), Staged::Accepted, "item {i}");
        }
    }

    /// Every write the engine hands out now.
    pub fn poll(&mut self) -> Vec<W> {
        let mut out = Vec::new();
        while let Some(w) = self.e.poll_write(self.now) {
            self.attempts.push((w.tenant, w.items.clone(), w.attempt));
            out.push(w);
        }
        self.after();
        out
    }

    /// The single write handed out now.
    pub fn poll_one(&mut self) -> W {
        let mut ws = self.poll();
        assert_eq!(ws.len(), 1, "expected exactly one write, got {ws:?}");
        ws.pop().expect("one")
    }

    pub fn finish(&mut self, w: W, outcome: Outcome) {
        if let Outcome::Written { discarded } = outcome {
            let keep = w.items.len() - discarded.min(w.items.len());
            self.written
                .entry(w.tenant)
                .or_default()
                .extend_from_slice(&w.items[..keep]);
        }
        self.e
            .finish(self.now, w, outcome)
            .expect("write is in flight");
        self.after();
    }

    pub fn ok(&mut self, w: W) {
        self.finish(w, Outcome::WRITTEN);
    }

    pub fn fail(&mut self, w: W) {
        self.finish(w, Outcome::Failed(Failure::Error));
    }

    /// The write's task ended without giving its items back (S-W13).
    pub fn finish_lost(&mut self, id: outbox::core::WriteId) -> bool {
        let known = self.e.finish_lost(self.now, id);
        self.after();
        known
    }

    pub fn flush(&mut self, deadline: u64) -> WaitId {
        let id = self.e.flush(self.now, ms(deadline));
        self.after();
        id
    }

    pub fn settle(&mut self, deadline: u64) -> WaitId {
        let id = self.e.settle(self.now, ms(deadline));
        self.after();
        id
    }

    pub fn shutdown(&mut self, deadline: u64) -> WaitId {
        let id = self.e.shutdown(self.now, ms(deadline));
        self.after();
        id
    }

    pub fn abandon(&mut self) -> Vec<Unwritten<Tenant, Item>> {
        let held = self.e.abandon(self.now);
        self.after();
        held
    }

    /// The answer to flush or settle `id`, if given.
    pub fn wait_done(&self, id: WaitId) -> Option<Report> {
        self.events.iter().find_map(|e| match e {
            Event::WaitDone { id: i, report } if *i == id => Some(*report),
            _ => None,
        })
    }

    /// The answer to shutdown `id`, if given.
    pub fn shutdown_done(&self, id: WaitId) -> Option<&ShutdownReport<Tenant, Item>> {
        self.events.iter().find_map(|e| match e {
            Event::ShutdownDone { id: i, report } if *i == id => Some(report),
            _ => None,
        })
    }

    pub fn c(&self) -> &Counters {
        self.e.counters()
    }

    pub fn lost(&self, r: LostReason) -> u64 {
        self.c().lost(r)
    }

    pub fn dropped(&self, r: DropReason) -> u64 {
        self.c().dropped(r)
    }

    pub fn written_of(&self, tenant: Tenant) -> Vec<Item> {
        self.written.get(&tenant).cloned().unwrap_or_default()
    }

    /// Retry waits announced so far, in order (S-W7).
    pub fn backoffs(&self) -> Vec<Duration> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::AttemptFailed {
                    next: outbox::core::AfterFailure::RetryIn(d),
                    ..
                } => Some(*d),
                _ => None,
            })
            .collect()
    }

    pub fn count_events(&self, f: impl Fn(&Event<Tenant, Item>) -> bool) -> usize {
        self.events.iter().filter(|e| f(e)).count()
    }
}
