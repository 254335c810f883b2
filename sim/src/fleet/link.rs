//! The link between an application host and the store host: every store
//! call of the host's relay, lease task and sink crosses it, so the
//! world's network faults apply to each (S-FW7): a latency each way, a cut
//! (a partition: the call waits the driver's statement timeout and fails
//! with an unknown outcome, or its reply is lost if the cut came while it
//! ran), a pause (the host's calls and replies are held until it resumes,
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
    Fence, Fenced, InFlight, Page, PageRequest, Removal, Removed, StoreError, StoreErrorKind,
};
use outbox::table::model::{ModelEpochTx, ModelListener, ModelStore};
use outbox::table::{
    Acquire, Acquired, DeadRow, EpochTx, Installed, LeaseKey, LeaseRow, Listener, Member,
    SchemaInfo, SinkEpoch, Store,
};
use rand::Rng;

use crate::draw::SimRng;

/// How long a call to a cut-off store waits before it fails.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_millis(500);

/// The state of every host's link.
#[derive(Debug)]
pub struct Links {
    /// Cut off from the store, by host.
    pub cut: Vec<bool>,
    /// Paused (calls and replies held), by host.
    pub paused: Vec<bool>,
    /// One-way latency, by host.
    pub latency: Vec<Duration>,
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

/// The store as one host reaches it.
#[derive(Clone, Debug)]
pub struct LinkStore {
    host: usize,
    inner: ModelStore,
    links: SharedLinks,
}

fn unknown(why: &str) -> StoreError {
    StoreError::new(StoreErrorKind::Unknown, None, why.to_owned())
}

impl LinkStore {
    /// Host `host`'s link to `inner`.
    pub fn new(host: usize, inner: ModelStore, links: SharedLinks) -> Self {
        LinkStore { host, inner, links }
    }

    /// Waits one latency, then while the host is paused.
    async fn cross(&self) {
        let latency = lock(&self.links).latency[self.host];
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        loop {
            let paused = lock(&self.links).paused[self.host];
            if !paused {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The request's way: fails (after the timeout) while cut.
    async fn send(&self) -> Result<(), StoreError> {
        self.cross().await;
        let cut = lock(&self.links).cut[self.host];
        if cut {
            tokio::time::sleep(STATEMENT_TIMEOUT).await;
            return Err(unknown("the store is unreachable (partition)"));
        }
        Ok(())
    }

    /// The reply's way: lost while cut, or by the draw.
    async fn reply<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        self.cross().await;
        let mut links = lock(&self.links);
        let per_mille = links.lose_per_mille;
        let lost = links.cut[self.host]
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

    /// Whether the host is cut off now.
    pub fn is_cut(&self) -> bool {
        lock(&self.links).cut[self.host]
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
        self.call(|s| s.remove(fence, removal)).await
    }
    async fn record_attempt(
        &self,
        fence: &Fence,
        record: &InFlight,
    ) -> Result<Fenced<()>, StoreError> {
        self.call(|s| s.record_attempt(fence, record)).await
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
