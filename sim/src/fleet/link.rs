//! The link between an application host and the store host: every store
//! call of the host's relay, lease task and sink crosses it, so the
//! world's network faults apply to each (S-FW7): a latency each way, a cut
//! (a partition of the host from the store, for its relay's and lease
//! task's calls, or from the datastore, for its sink's: the call waits the
//! driver's statement timeout and fails with an unknown outcome, or its
//! reply is lost if the cut came while it ran), a pause (the host's calls and replies are held until it resumes,
//! then go on: a frozen process whose writes were in flight), and lost
//! replies after the call took effect.
//!
//! The link is in-process (the store host's model is shared by pointer),
//! not turmoil's TCP: every store call would otherwise need a wire codec.
//! Delays and holds use the host's runtime clock (turmoil's).

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use outbox::core::lease::Holder;
use outbox::core::relay::{
    Fence, Fenced, InFlight, Page, PageRequest, Recorded, Removal, Removed, StoreError,
    StoreErrorKind,
};
use outbox::table::model::{ModelEpochTx, ModelListener, ModelStore};
use outbox::table::{
    Acquire, Acquired, DeadRow, EpochTx, Installed, LeaseKey, LeaseRow, Listener, Member,
    SchemaInfo, SinkEpoch, Store,
};
use rand::Rng;

use super::book::{self, Book, SharedBook};
use super::faults::Peer;
use crate::draw::SimRng;

/// How long a call to a cut-off store waits before it fails.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_millis(500);

/// The state of every host's link.
#[derive(Debug)]
pub struct Links {
    /// Cut off, by host, from the store and from the datastore
    /// (indexed by [`Peer`]).
    pub cut: Vec<[bool; 2]>,
    /// Paused (calls and replies held), by host.
    pub paused: Vec<bool>,
    /// A pause armed for the host's next sink commit (`false`) or
    /// dead-letter move (`true`): its length.
    pub armed: Vec<Option<(Duration, bool)>>,
    /// Frozen (as paused) until this instant of the store's clock.
    pub frozen_until: Vec<Duration>,
    /// One-way latency, by host.
    pub latency: Vec<Duration>,
    /// The store is restarting (unreachable) until this instant of its
    /// clock.
    pub store_down_until: Duration,
    /// Chance, in thousandths, that a reply is lost after the call took
    /// effect.
    pub lose_per_mille: u32,
    /// The draws for lost replies.
    pub rng: SimRng,
    /// Replies lost so far.
    pub lost: u64,
}

/// The links behind a lock.
pub type SharedLinks = Arc<Mutex<Links>>;

fn lock(links: &SharedLinks) -> MutexGuard<'_, Links> {
    links.lock().unwrap_or_else(|e| e.into_inner())
}

impl Links {
    /// Whether host `h`'s calls and replies are held when the store's
    /// clock reads `now`.
    pub fn held(&self, h: usize, now: Duration) -> bool {
        self.paused[h] || self.frozen_until[h] > now
    }

    /// Whether host `h`'s stagers wait: it is held or the store restarts.
    pub fn stagers_wait(&self, h: usize, now: Duration) -> bool {
        self.held(h, now) || self.store_down_until > now
    }
}

/// The store as one host reaches it: for its relay and lease task (the
/// store host), or for its sink (the datastore host, [`LinkStore::to_datastore`]).
#[derive(Clone, Debug)]
pub struct LinkStore {
    host: usize,
    peer: Peer,
    inner: ModelStore,
    links: SharedLinks,
    book: SharedBook,
}

fn unknown(why: &str) -> StoreError {
    StoreError::new(StoreErrorKind::Unknown, None, why.to_owned())
}

impl LinkStore {
    /// Host `host`'s link to `inner`; removals are checked into `book`
    /// (S-FW8).
    pub fn new(host: usize, inner: ModelStore, links: SharedLinks, book: SharedBook) -> Self {
        LinkStore {
            host,
            peer: Peer::Store,
            inner,
            links,
            book,
        }
    }

    /// The same host's link to the datastore (its sink's calls cross it).
    pub fn to_datastore(&self) -> LinkStore {
        LinkStore {
            peer: Peer::Datastore,
            ..self.clone()
        }
    }

    /// A removal at the store, checked the instant it takes effect
    /// (S-FW8): only rows of partitions whose lease row the fence names
    /// (owner and epoch), and deleted only once the datastore accepted
    /// them.
    async fn checked_remove(
        &self,
        fence: &Fence,
        removal: &Removal,
    ) -> Result<Removed, StoreError> {
        if !removal.dead.is_empty() {
            self.freeze_if_armed(true);
        }
        self.send().await?;
        // The model answers at once: the lease table and the removal are
        // read and applied at one instant.
        let leases = super::now(self.inner.leases()).unwrap_or_default();
        let result = self.inner.remove(fence, removal).await;
        if let Ok(removed) = &result {
            let stale: Vec<u32> = fence
                .epochs
                .iter()
                .filter(|(p, e)| {
                    !leases.iter().any(|l| {
                        l.partition == *p
                            && l.epoch == *e
                            && l.owner.as_deref() == Some(&fence.owner)
                    })
                })
                .map(|(p, _)| *p)
                .collect();
            check_removed(&mut book::lock(&self.book), fence, &stale, removed);
        }
        self.reply(result).await
    }

    /// Waits one latency, then while the host is paused.
    async fn cross(&self) {
        let latency = lock(&self.links).latency[self.host];
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        loop {
            let now = self.inner.model().now();
            let paused = lock(&self.links).held(self.host, now);
            if !paused {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The request's way: fails (after the timeout) while cut, at once
    /// (a refused connection) while the store restarts.
    async fn send(&self) -> Result<(), StoreError> {
        self.cross().await;
        let now = self.inner.model().now();
        let (cut, down) = {
            let links = lock(&self.links);
            (
                links.cut[self.host][self.peer as usize],
                links.store_down_until > now,
            )
        };
        if cut {
            tokio::time::sleep(STATEMENT_TIMEOUT).await;
            return Err(unknown("the store is unreachable (partition)"));
        }
        if down {
            return Err(unknown("the store is restarting (connection refused)"));
        }
        Ok(())
    }

    /// The reply's way: lost while cut or while the store restarts, or by
    /// the draw.
    async fn reply<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        self.cross().await;
        let now = self.inner.model().now();
        let mut links = lock(&self.links);
        let per_mille = links.lose_per_mille;
        let lost = links.cut[self.host][self.peer as usize]
            || links.store_down_until > now
            || (result.is_ok() && per_mille > 0 && links.rng.random_range(0..1000) < per_mille);
        if lost {
            links.lost += 1;
            return Err(unknown("the reply was lost"));
        }
        result
    }

    async fn call<'a, T, F>(&'a self, f: impl FnOnce(&'a ModelStore) -> F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>> + 'a,
    {
        self.send().await?;
        let result = f(&self.inner).await;
        self.reply(result).await
    }

    /// A pause armed for this host's next sink commit (`at_dead`
    /// false) or dead-letter move starts now.
    fn freeze_if_armed(&self, at_dead: bool) {
        let now = self.inner.model().now();
        let mut links = lock(&self.links);
        let armed = &mut links.armed[self.host];
        if let Some((len, _)) = armed.take_if(|a| a.1 == at_dead) {
            links.frozen_until[self.host] = now + len;
            drop(links);
            let mut b = book::lock(&self.book);
            b.count(if at_dead {
                "pause_at_dead_letter"
            } else {
                "pause_at_write"
            });
            b.note("freeze", self.host as u64, len.as_millis() as u64, 0);
        }
    }

    /// Whether the host is cut off from this link's peer now.
    pub fn is_cut(&self) -> bool {
        lock(&self.links).cut[self.host][self.peer as usize]
    }
}

/// S-FW8 of one removal that took effect: `stale`, the fence's
/// partitions whose lease row it does not name.
fn check_removed(b: &mut Book, fence: &Fence, stale: &[u32], removed: &Removed) {
    let moved = removed.deleted.iter().chain(&removed.dead);
    for id in moved {
        let partition = b.rows.get(id).map(|r| r.partition);
        if partition.is_none_or(|p| stale.contains(&p) || !fence.epochs.iter().any(|e| e.0 == p)) {
            let detail = format!(
                "{} removed row {id} (partition {partition:?}) under the fence {:?}, not the lease \
                 the store holds for it",
                fence.owner, fence.epochs
            );
            b.fail("S-FW8", detail);
            return;
        }
    }
    for id in &removed.deleted {
        if !b.delivered.contains_key(id) {
            let detail = format!(
                "{} deleted row {id} before the datastore accepted it",
                fence.owner
            );
            b.fail("S-FW8", detail);
            return;
        }
    }
    b.faults
        .entry("dead_letter")
        .and_modify(|n| *n += removed.dead.len() as u64);
    if !removed.dead.is_empty() {
        let seq = b.next_seq();
        for id in &removed.dead {
            b.dead_moved.insert(*id, seq);
        }
    }
}

/// A listener across the link: a cut closes it.
pub struct LinkListener {
    inner: ModelListener,
    link: LinkStore,
}

impl Listener for LinkListener {
    async fn next(&mut self) -> Result<(), StoreError> {
        self.inner.next().await?;
        self.link.cross().await;
        if self.link.is_cut() {
            return Err(unknown("the listener's connection broke (partition)"));
        }
        Ok(())
    }
}

/// A sink transaction across the link.
pub struct LinkTx {
    inner: ModelEpochTx,
    link: LinkStore,
}

impl LinkTx {
    /// Commits; `then` runs the instant the store committed (the
    /// datastore's log of the write is part of the transaction), before
    /// the reply crosses back (and may be lost).
    pub async fn commit_then(self, then: impl FnOnce()) -> Result<(), StoreError> {
        let LinkTx { inner, link } = self;
        link.freeze_if_armed(false);
        if let Err(e) = link.send().await {
            drop(inner);
            return Err(e);
        }
        let result = inner.commit().await;
        if result.is_ok() {
            then();
        }
        link.reply(result).await
    }
}

impl EpochTx for LinkTx {
    async fn check_epochs(&mut self, epochs: &[(u32, u64)]) -> Result<Fenced<()>, StoreError> {
        self.link.send().await?;
        let result = self.inner.check_epochs(epochs).await;
        self.link.reply(result).await
    }

    async fn commit(self) -> Result<(), StoreError> {
        self.commit_then(|| {}).await
    }

    async fn rollback(self) -> Result<(), StoreError> {
        let LinkTx { inner, link } = self;
        link.send().await?;
        let result = inner.rollback().await;
        link.reply(result).await
    }
}

impl Store for LinkStore {
    type Listener = LinkListener;
    type EpochTx = LinkTx;

    async fn schema(&self) -> Result<SchemaInfo, StoreError> {
        self.call(|s| s.schema()).await
    }
    async fn read_page(&self, request: &PageRequest) -> Result<Page, StoreError> {
        self.call(|s| s.read_page(request)).await
    }
    async fn remove(&self, fence: &Fence, removal: &Removal) -> Result<Removed, StoreError> {
        self.checked_remove(fence, removal).await
    }
    async fn record_attempts(
        &self,
        fence: &Fence,
        records: &[InFlight],
    ) -> Result<Recorded, StoreError> {
        self.call(|s| s.record_attempts(fence, records)).await
    }
    async fn record_crashes(
        &self,
        fence: &Fence,
        partition: u32,
    ) -> Result<Fenced<u64>, StoreError> {
        self.call(|s| s.record_crashes(fence, partition)).await
    }
    async fn notify(&self) -> Result<(), StoreError> {
        self.call(|s| s.notify()).await
    }
    async fn listen(&self) -> Result<LinkListener, StoreError> {
        let inner = self.call(|s| s.listen()).await?;
        Ok(LinkListener {
            inner,
            link: self.clone(),
        })
    }
    async fn acquire(&self, request: &Acquire) -> Result<Acquired, StoreError> {
        self.call(|s| s.acquire(request)).await
    }
    async fn renew(&self, lease: &LeaseKey, ttl: Duration) -> Result<bool, StoreError> {
        self.call(|s| s.renew(lease, ttl)).await
    }
    async fn release(&self, lease: &LeaseKey) -> Result<bool, StoreError> {
        self.call(|s| s.release(lease)).await
    }
    async fn leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        self.call(|s| s.leases()).await
    }
    async fn heartbeat(&self, instance: &str, ttl: Duration) -> Result<(), StoreError> {
        self.call(|s| s.heartbeat(instance, ttl)).await
    }
    async fn leave(&self, instance: &str) -> Result<(), StoreError> {
        self.call(|s| s.leave(instance)).await
    }
    async fn members(&self) -> Result<Vec<Member>, StoreError> {
        self.call(|s| s.members()).await
    }
    async fn sink_epochs(&self) -> Result<Vec<SinkEpoch>, StoreError> {
        self.call(|s| s.sink_epochs()).await
    }
    async fn horizon(&self) -> Result<outbox::table::Horizon, StoreError> {
        self.call(|s| s.horizon()).await
    }
    async fn install_epoch(
        &self,
        partition: u32,
        epoch: u64,
        holder: &Holder,
    ) -> Result<Installed, StoreError> {
        self.call(|s| s.install_epoch(partition, epoch, holder))
            .await
    }
    async fn begin_epoch_tx(&self) -> Result<LinkTx, StoreError> {
        let inner = self.call(|s| s.begin_epoch_tx()).await?;
        Ok(LinkTx {
            inner,
            link: self.clone(),
        })
    }
    async fn dead_letters(&self, limit: u32) -> Result<Vec<DeadRow>, StoreError> {
        self.call(|s| s.dead_letters(limit)).await
    }
    async fn redrive(&self, ids: &[i64]) -> Result<u64, StoreError> {
        self.call(|s| s.redrive(ids)).await
    }
    async fn purge_dead(&self, older_than: Duration) -> Result<u64, StoreError> {
        self.call(|s| s.purge_dead(older_than)).await
    }
}
