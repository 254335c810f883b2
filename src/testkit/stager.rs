//! Stages into an [`Engine`] the way the driver does (S-W19), in one
//! thread: the request path's admission by reservation and hand-off, then
//! the intake; or, with a `tenant_capacity` or past the fence, the engine's
//! own decision under the lock. The harness and the model test stage
//! through it, so they drive the staging path the outbox runs.

use std::hash::Hash;

use crate::core::{Admission, DropReason, Engine, Handoff, LazyStaged, Staged, Time};

/// The driver's staging path, for one engine.
#[derive(Debug)]
pub struct Stager {
    admission: Admission,
    /// The engine's share of the reservations (items, bytes).
    held: (u64, u64),
}

impl Stager {
    /// A stager for `engine` (fresh, or with recovered items pending).
    pub fn new<K: Ord + Hash + Clone, I>(engine: &Engine<K, I>) -> Self {
        let admission = Admission::new(engine.config());
        let held = (engine.pending(), engine.pending_bytes());
        admission.add(held.0, held.1);
        Stager { admission, held }
    }

    /// Stages `item` for `tenant` at `now` as `Outbox::stage` does; `wake`
    /// says whether the driver would drain (a refusal always wakes it).
    /// `now` is read only where the driver reads its clock.
    pub fn stage<K: Ord + Hash + Clone, I>(
        &mut self,
        engine: &mut Engine<K, I>,
        now: Time,
        tenant: K,
        item: I,
    ) -> LazyStaged {
        // What settled since the last stage gives its room back, as after
        // every input of the driver.
        self.admission
            .follow(&mut self.held, engine.pending(), engine.pending_bytes());
        let config = engine.config();
        if config.tenant_capacity().is_some() || engine.is_shutting_down() {
            // The engine decides under the lock (S-B7), or the hand-off is
            // closed (S-W9).
            let staged = engine.stage_lazy(|| now, tenant, item);
            self.admission
                .follow(&mut self.held, engine.pending(), engine.pending_bytes());
            return staged;
        }
        let stamps = !config.linger().is_zero() || config.max_item_age().is_some();
        let weight = engine.weigh_item(&item);
        if let Err(reason) = self.admission.reserve(weight) {
            let at = engine.now();
            let staged = engine.refuse(at, tenant, reason);
            debug_assert_eq!(staged, Staged::Dropped(DropReason::BufferFull));
            return LazyStaged { staged, wake: true };
        }
        // As the driver's lanes (S-W19): the weight travels only when bytes
        // were reserved for it, else the engine weighs the item at intake.
        let full = stamps || config.capacity_bytes().is_some();
        let handoff = Handoff {
            tenant,
            item,
            weight: full.then_some(weight),
            at: stamps.then_some(now),
        };
        let intake = engine.stage_batch([handoff]);
        self.held.0 += intake.accepted;
        self.held.1 = self.held.1.saturating_add(intake.accepted_bytes);
        self.admission.release(intake.refused, intake.refused_bytes);
        LazyStaged {
            staged: if intake.accepted > 0 {
                Staged::Accepted
            } else {
                Staged::Refused
            },
            wake: intake.wake,
        }
    }

    /// Stages `items` at `now` as the driver does when they reach the
    /// writer together: each is admitted on its own (a refusal is counted
    /// at once), and the admitted ones are taken in as one chunk, in
    /// order (S-W19, S-C10). Returns each item's verdict, in order, and
    /// whether the driver would drain. With a `tenant_capacity`, or past
    /// the fence, each goes through the engine under the lock, as
    /// [`stage`](Self::stage) does.
    pub fn stage_chunk<K: Ord + Hash + Clone, I>(
        &mut self,
        engine: &mut Engine<K, I>,
        now: Time,
        items: Vec<(K, I)>,
    ) -> (Vec<Staged>, bool) {
        let config = engine.config();
        if config.tenant_capacity().is_some() || engine.is_shutting_down() {
            let mut wake = false;
            let verdicts = items
                .into_iter()
                .map(|(tenant, item)| {
                    let staged = self.stage(engine, now, tenant, item);
                    wake |= staged.wake;
                    staged.staged
                })
                .collect();
            return (verdicts, wake);
        }
        self.admission
            .follow(&mut self.held, engine.pending(), engine.pending_bytes());
        let stamps = !config.linger().is_zero() || config.max_item_age().is_some();
        let full = stamps || config.capacity_bytes().is_some();
        let mut verdicts = Vec::with_capacity(items.len());
        let mut chunk = Vec::with_capacity(items.len());
        let mut wake = false;
        for (tenant, item) in items {
            let weight = engine.weigh_item(&item);
            if let Err(reason) = self.admission.reserve(weight) {
                let at = engine.now();
                verdicts.push(engine.refuse(at, tenant, reason));
                wake = true;
                continue;
            }
            verdicts.push(Staged::Accepted);
            chunk.push(Handoff {
                tenant,
                item,
                weight: full.then_some(weight),
                at: stamps.then_some(now),
            });
        }
        let intake = engine.stage_batch(chunk);
        // Open (checked above): the intake refuses nothing.
        debug_assert_eq!(intake.refused, 0);
        self.held.0 += intake.accepted;
        self.held.1 = self.held.1.saturating_add(intake.accepted_bytes);
        (verdicts, wake | intake.wake)
    }
}
