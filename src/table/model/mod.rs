//! An in-memory model of the outbox table's database behind the
//! [`Store`] interface (feature `testkit`, S-T25..S-T27), for the
//! simulation: what the conformance suite checks against PostgreSQL, so
//! the simulation can trust it.
//!
//! # Semantics
//! - Transactions take an id (`xid`) at their first write, as
//!   PostgreSQL's do; a page read's xmin is the oldest id still running
//!   (a sink transaction that share-locked its epoch rows holds one too).
//! - A staged row is visible to reads from its transaction's commit on;
//!   a rolled-back one never. Its `staged_at` is `now()`: the
//!   transaction's start on the store's clock, so a long transaction's
//!   rows are old when they commit.
//! - A statement that fails aborts its transaction: COMMIT then rolls
//!   back (answers `false`), as PostgreSQL's COMMIT of an aborted
//!   transaction does.
//! - Notifications of a transaction are delivered at its commit to the
//!   listeners connected then; a listener that is away misses them.
//! - A sink transaction's epoch check share-locks the rows until it ends;
//!   an install waits for them, at most `lock_timeout` on the store's
//!   clock; a transaction idle for `idle_in_transaction_timeout` on that
//!   clock is ended by the server (its locks go, its next statement
//!   fails).
//! - Every autocommit call is atomic at the store's clock when it runs;
//!   expiries are set and compared on that clock.
//!
//! # Knobs (all explicit, nothing random, no clock of its own)
//! [`Model::advance`] moves the store's clock (the simulation drives it),
//! [`Model::fail_next`] makes the next calls fail without effect,
//! [`Model::lose_next_reply`] lets the next call (or commit) take effect
//! and answer an error of kind `Unknown`, [`Model::disconnect_listeners`]
//! takes every listener away, [`Model::fail_statement`] fails a
//! statement in a stager's transaction.

mod db;

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use db::Db;
pub use db::SessionId;

use super::store::{
    Acquire, Acquired, DeadRow, EpochTx, Horizon, Installed, LeaseKey, LeaseRow, Listener, Member,
    SchemaInfo, SinkEpoch, Store,
};
use crate::core::lease::Holder;
use crate::core::relay::{
    DeadReason, Fence, Fenced, InFlight, Page, PageRequest, Recorded, Removal, Removed, Row,
    StoreError, StoreErrorKind,
};

/// The model's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// P (at least 1).
    pub partitions: u32,
    /// How long an epoch install waits for share locks.
    pub lock_timeout: Duration,
    /// How long a sink transaction may sit idle before it is ended.
    pub idle_in_transaction_timeout: Duration,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            partitions: 8,
            lock_timeout: crate::table::DEFAULT_LOCK_TIMEOUT,
            idle_in_transaction_timeout: crate::table::DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
        }
    }
}

#[derive(Debug, Default)]
struct Faults {
    fail: u32,
    lose: u32,
}

#[derive(Debug)]
struct Inner {
    db: Db,
    faults: Faults,
    config: ModelConfig,
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    /// Woken whenever the state or the clock changes (lock waits and
    /// listeners re-check).
    changed: Notify,
}

/// What the model's database holds, by kind ([`Model::footprint`]): a
/// settled outbox holds a small constant of each but `dead`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Committed rows in the outbox table.
    pub rows: usize,
    /// Open sessions (stagers' and sink transactions).
    pub sessions: usize,
    /// Sessions the server ended whose client has not closed them yet.
    pub terminated: usize,
    /// Listeners connected.
    pub listeners: usize,
    /// In-flight records of writes (S-T17: each goes with its rows).
    pub in_flight: usize,
    /// Rows with a crash count.
    pub crash_counts: usize,
    /// Heartbeat rows of the membership table.
    pub members: usize,
    /// Rows in the dead-letter table.
    pub dead: usize,
}

/// The model: a handle shared by the store, the stagers and the
/// simulation. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Model {
    shared: Arc<Shared>,
}

impl Model {
    /// A fresh database at the current schema, clock zero.
    pub fn new(config: ModelConfig) -> Self {
        Model {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    db: Db::new(config.partitions),
                    faults: Faults::default(),
                    config,
                }),
                changed: Notify::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic under the lock leaves consistent state (every statement
        // applies whole or not at all); keep going.
        self.shared
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The store over this model.
    pub fn store(&self) -> ModelStore {
        ModelStore {
            model: self.clone(),
        }
    }

    /// The store's clock.
    pub fn now(&self) -> Duration {
        self.lock().db.clock
    }

    /// Moves the store's clock forward by `by`: idle transactions past
    /// their timeout end, and waits re-check.
    pub fn advance(&self, by: Duration) {
        {
            let mut inner = self.lock();
            inner.db.clock += by;
            inner.db.expire_idle();
        }
        self.shared.changed.notify_waiters();
    }

    /// The next `n` store calls fail with an error of kind `Unknown` and
    /// no effect (a connection that broke before the statement arrived).
    pub fn fail_next(&self, n: u32) {
        self.lock().faults.fail += n;
    }

    /// The next `n` store calls or commits take effect and answer an error
    /// of kind `Unknown` (their reply is lost).
    pub fn lose_next_reply(&self, n: u32) {
        self.lock().faults.lose += n;
    }

    /// Every listener is taken away: its next `next` fails; notifications
    /// until it listens again are lost.
    pub fn disconnect_listeners(&self) {
        self.lock().db.listeners.clear();
        self.shared.changed.notify_waiters();
    }

    /// The server restarts (S-T25): every session ends, its transaction
    /// rolled back and its share locks gone, and its next statement is
    /// refused as a broken connection's would be; every listener is
    /// disconnected, so notifications until it listens again are lost.
    /// Committed rows, leases, epochs, memberships and dead letters stay.
    pub fn restart(&self) {
        self.lock().db.restart();
        self.shared.changed.notify_waiters();
    }

    /// What the database holds now, by kind (a settle's memory check).
    pub fn footprint(&self) -> Footprint {
        self.lock().db.footprint()
    }

    /// Sets the schema the store reports (to test refusals).
    pub fn set_schema(&self, version: u32, min_reader: u32) {
        let mut inner = self.lock();
        inner.db.schema_version = version;
        inner.db.min_reader = min_reader;
    }

    /// Begins a stager's transaction (its `now()` is the store's clock now).
    pub fn begin(&self) -> SessionId {
        self.lock().db.begin(None)
    }

    /// Stages a row in `session`'s transaction; answers its id.
    ///
    /// # Errors
    /// The transaction is aborted or gone.
    pub fn stage(
        &self,
        session: SessionId,
        tenant: &[u8],
        item: &[u8],
        codec_version: u32,
        notify: bool,
    ) -> Result<i64, StoreError> {
        self.lock()
            .db
            .stage(session, tenant, item, codec_version, notify)
    }

    /// A statement of `session`'s transaction fails: the transaction is
    /// aborted, its COMMIT rolls back.
    pub fn fail_statement(&self, session: SessionId) {
        if let Ok(tx) = self.lock().db.tx(session) {
            tx.failed = true;
        }
    }

    /// Commits `session`'s transaction: `true` if committed, `false` if it
    /// rolled back (a statement had failed). A lost reply
    /// ([`lose_next_reply`](Self::lose_next_reply)) commits and answers an
    /// error of kind `Unknown`.
    ///
    /// # Errors
    /// The session is gone, or the reply was lost.
    pub fn commit(&self, session: SessionId) -> Result<bool, StoreError> {
        let result = {
            let mut inner = self.lock();
            let result = inner.db.commit(session);
            lose_reply(&mut inner, result)
        };
        self.shared.changed.notify_waiters();
        result
    }

    /// Rolls `session`'s transaction back.
    pub fn rollback(&self, session: SessionId) {
        self.lock().db.rollback(session);
        self.shared.changed.notify_waiters();
    }

    /// Every committed row still in the outbox table, in (xid, id) order.
    pub fn rows(&self) -> Vec<Row> {
        self.lock().db.committed()
    }

    /// The reason a dead-letter row was moved for.
    pub fn dead_reason(&self, id: i64) -> Option<DeadReason> {
        self.lock().db.dead_reason(id)
    }

    /// The oldest transaction id still running (a page read's xmin now).
    pub fn xmin(&self) -> u64 {
        self.lock().db.xmin()
    }

    /// A synchronous page read, for core-level tests.
    pub fn read_page_now(&self, request: &PageRequest) -> Page {
        self.lock().db.read_page(request)
    }

    /// A synchronous removal, for core-level tests.
    pub fn remove_now(&self, fence: &Fence, removal: &Removal) -> Removed {
        self.lock().db.remove(fence, removal)
    }

    /// Runs one autocommit call with the fault knobs applied.
    fn call<T>(&self, f: impl FnOnce(&mut Db) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let result = {
            let mut inner = self.lock();
            if inner.faults.fail > 0 {
                inner.faults.fail -= 1;
                return Err(unknown("the connection broke before the statement arrived"));
            }
            let result = f(&mut inner.db);
            lose_reply(&mut inner, result)
        };
        self.shared.changed.notify_waiters();
        result
    }
}

fn unknown(why: &str) -> StoreError {
    StoreError::new(StoreErrorKind::Unknown, None, why.to_owned())
}

fn lose_reply<T>(inner: &mut Inner, result: Result<T, StoreError>) -> Result<T, StoreError> {
    if result.is_ok() && inner.faults.lose > 0 {
        inner.faults.lose -= 1;
        return Err(unknown("the reply was lost"));
    }
    result
}

/// The [`Store`] over a [`Model`].
#[derive(Clone, Debug)]
pub struct ModelStore {
    model: Model,
}

impl ModelStore {
    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Waits until `attempt` answers `Some`, re-trying whenever the model
    /// changes; `None` from `deadline` on (on the store's clock).
    async fn wait_for<T>(
        &self,
        deadline: Duration,
        mut attempt: impl FnMut(&mut Db) -> Option<T>,
    ) -> Option<T> {
        loop {
            let notified = self.model.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut inner = self.model.lock();
                if let Some(v) = attempt(&mut inner.db) {
                    return Some(v);
                }
                if inner.db.clock >= deadline {
                    return None;
                }
            }
            notified.await;
        }
    }
}

fn ready<T>(v: T) -> impl Future<Output = T> + Send
where
    T: Send,
{
    std::future::ready(v)
}

impl Store for ModelStore {
    type Listener = ModelListener;
    type EpochTx = ModelEpochTx;

    fn schema(&self) -> impl Future<Output = Result<SchemaInfo, StoreError>> + Send {
        ready(self.model.call(|db| {
            Ok(SchemaInfo {
                version: db.schema_version,
                min_reader: db.min_reader,
                partitions: db.partitions,
            })
        }))
    }

    fn horizon(&self) -> impl Future<Output = Result<Horizon, StoreError>> + Send {
        ready(self.model.call(|db| Ok(db.horizon())))
    }

    fn read_page(
        &self,
        request: &PageRequest,
    ) -> impl Future<Output = Result<Page, StoreError>> + Send {
        ready(self.model.call(|db| Ok(db.read_page(request))))
    }

    fn remove(
        &self,
        fence: &Fence,
        removal: &Removal,
    ) -> impl Future<Output = Result<Removed, StoreError>> + Send {
        ready(self.model.call(|db| Ok(db.remove(fence, removal))))
    }

    fn record_attempts(
        &self,
        fence: &Fence,
        records: &[InFlight],
    ) -> impl Future<Output = Result<Recorded, StoreError>> + Send {
        ready(self.model.call(|db| db.record_attempts(fence, records)))
    }

    fn record_crashes(
        &self,
        fence: &Fence,
        partition: u32,
    ) -> impl Future<Output = Result<Fenced<u64>, StoreError>> + Send {
        ready(
            self.model
                .call(|db| Ok(db.record_crashes(fence, partition))),
        )
    }

    fn notify(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        ready(self.model.call(|db| {
            db.deliver_notifications();
            Ok(())
        }))
    }

    fn listen(&self) -> impl Future<Output = Result<ModelListener, StoreError>> + Send {
        let result = self.model.call(|db| {
            let id = db.next_listener;
            db.next_listener += 1;
            db.listeners.insert(id, false);
            Ok(id)
        });
        ready(result.map(|id| ModelListener {
            model: self.model.clone(),
            id,
        }))
    }

    fn acquire(
        &self,
        request: &Acquire,
    ) -> impl Future<Output = Result<Acquired, StoreError>> + Send {
        ready(self.model.call(|db| db.acquire(request)))
    }

    fn renew(
        &self,
        lease: &LeaseKey,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        ready(self.model.call(|db| Ok(db.renew(lease, ttl))))
    }

    fn release(&self, lease: &LeaseKey) -> impl Future<Output = Result<bool, StoreError>> + Send {
        ready(self.model.call(|db| Ok(db.release(lease))))
    }

    fn leases(&self) -> impl Future<Output = Result<Vec<LeaseRow>, StoreError>> + Send {
        ready(self.model.call(|db| Ok(db.leases())))
    }

    fn heartbeat(
        &self,
        instance: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        ready(self.model.call(|db| {
            db.heartbeat(instance, ttl);
            Ok(())
        }))
    }

    fn leave(&self, instance: &str) -> impl Future<Output = Result<(), StoreError>> + Send {
        ready(self.model.call(|db| {
            db.leave(instance);
            Ok(())
        }))
    }

    fn members(&self) -> impl Future<Output = Result<Vec<Member>, StoreError>> + Send {
        ready(self.model.call(|db| Ok(db.members())))
    }

    fn sink_epochs(&self) -> impl Future<Output = Result<Vec<SinkEpoch>, StoreError>> + Send {
        ready(self.model.call(|db| Ok(db.sink_epochs())))
    }

    async fn install_epoch(
        &self,
        partition: u32,
        epoch: u64,
        holder: &Holder,
    ) -> Result<Installed, StoreError> {
        let deadline = {
            let mut inner = self.model.lock();
            if inner.faults.fail > 0 {
                inner.faults.fail -= 1;
                return Err(unknown("the connection broke before the statement arrived"));
            }
            inner.db.clock + inner.config.lock_timeout
        };
        let installed = self
            .wait_for(deadline, |db| db.try_install(partition, epoch, holder))
            .await;
        self.model.shared.changed.notify_waiters();
        match installed {
            Some(answer) => {
                let mut inner = self.model.lock();
                lose_reply(&mut inner, Ok(answer))
            }
            None => Err(StoreError::new(
                StoreErrorKind::LockTimeout,
                Some("55P03".into()),
                "canceling statement due to lock timeout",
            )),
        }
    }

    fn begin_epoch_tx(&self) -> impl Future<Output = Result<ModelEpochTx, StoreError>> + Send {
        let result = self.model.call(|db| Ok(db.begin(None)));
        let result = result.map(|session| {
            let mut inner = self.model.lock();
            let timeout = inner.config.idle_in_transaction_timeout;
            if let Ok(tx) = inner.db.tx(session) {
                tx.idle_timeout = Some(timeout);
            }
            ModelEpochTx {
                model: self.model.clone(),
                session,
            }
        });
        ready(result)
    }

    fn dead_letters(
        &self,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<DeadRow>, StoreError>> + Send {
        ready(self.model.call(|db| Ok(db.dead_letters(limit))))
    }

    fn redrive(&self, ids: &[i64]) -> impl Future<Output = Result<u64, StoreError>> + Send {
        ready(self.model.call(|db| Ok(db.redrive(ids))))
    }

    fn purge_dead(
        &self,
        older_than: Duration,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        ready(self.model.call(|db| Ok(db.purge_dead(older_than))))
    }
}

/// A listener on the model: see [`Listener`].
#[derive(Debug)]
pub struct ModelListener {
    model: Model,
    id: u64,
}

impl Listener for ModelListener {
    async fn next(&mut self) -> Result<(), StoreError> {
        loop {
            let notified = self.model.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut inner = self.model.lock();
                match inner.db.listeners.get_mut(&self.id) {
                    None => return Err(unknown("the listener's connection closed")),
                    Some(pending) if *pending => {
                        *pending = false;
                        return Ok(());
                    }
                    Some(_) => {}
                }
            }
            notified.await;
        }
    }
}

impl Drop for ModelListener {
    fn drop(&mut self) {
        self.model.lock().db.listeners.remove(&self.id);
    }
}

/// A sink transaction on the model: see [`EpochTx`].
#[derive(Debug)]
pub struct ModelEpochTx {
    model: Model,
    session: SessionId,
}

impl ModelEpochTx {
    /// The transaction's session (to pause it, simply stop using it).
    pub fn session(&self) -> SessionId {
        self.session
    }
}

impl EpochTx for ModelEpochTx {
    fn check_epochs(
        &mut self,
        epochs: &[(u32, u64)],
    ) -> impl Future<Output = Result<Fenced<()>, StoreError>> + Send {
        let session = self.session;
        ready(self.model.call(|db| db.check_epochs(session, epochs)))
    }

    fn commit(self) -> impl Future<Output = Result<(), StoreError>> + Send {
        let result = self.model.commit(self.session).and_then(|committed| {
            if committed {
                Ok(())
            } else {
                Err(db::refused(
                    "a statement of the transaction failed: rolled back",
                ))
            }
        });
        ready(result)
    }

    fn rollback(self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.model.rollback(self.session);
        ready(Ok(()))
    }
}

impl Drop for ModelEpochTx {
    fn drop(&mut self) {
        self.model.rollback(self.session);
    }
}
