//! The model's state and its statements, synchronous and deterministic:
//! transactions with lazily assigned ids, visibility at commit, the
//! snapshot's xmin, `now()` as the transaction's start, share locks on the
//! sink's epoch rows, idle-in-transaction timeouts on the store's clock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::core::lease::Holder;
use crate::core::relay::{
    DeadReason, Fence, Fenced, InFlight, Page, PageRequest, Position, ReadOrder, Recorded, Removal,
    Removed, Row, StoreError, StoreErrorKind,
};
use crate::table::names::partition_of;
use crate::table::store::{
    Acquire, Acquired, DeadRow, Installed, LeaseKey, LeaseRow, Member, SinkEpoch,
};

/// A session: a stager's connection, or a sink transaction's.
pub type SessionId = u64;

#[derive(Clone, Debug)]
pub(crate) struct StoredRow {
    pub(crate) row: Row,
    pub(crate) staged_at: Duration,
}

#[derive(Debug, Default)]
pub(crate) struct Tx {
    pub(crate) xid: Option<u64>,
    pub(crate) start: Duration,
    pub(crate) rows: Vec<StoredRow>,
    pub(crate) notify: bool,
    pub(crate) failed: bool,
    pub(crate) last_active: Duration,
    pub(crate) idle_timeout: Option<Duration>,
    /// Sink epoch rows share-locked.
    pub(crate) locks: BTreeSet<u32>,
}

#[derive(Clone, Debug)]
pub(crate) struct Lease {
    owner: Option<String>,
    epoch: u64,
    expiry: Option<Duration>,
}

#[derive(Clone, Debug)]
pub(crate) struct Dead {
    row: StoredRow,
    reason: String,
    attempts: u32,
    crashes: u32,
    epoch: u64,
    dead_at: Duration,
}

#[derive(Debug)]
pub(crate) struct Db {
    pub(crate) partitions: u32,
    pub(crate) clock: Duration,
    pub(crate) next_xid: u64,
    next_id: i64,
    /// Committed rows by (xid, id).
    pub(crate) rows: BTreeMap<Position, StoredRow>,
    by_id: BTreeMap<i64, Position>,
    pub(crate) sessions: BTreeMap<SessionId, Option<Tx>>,
    pub(crate) next_session: SessionId,
    /// Sessions ended by the server (idle timeout): their next statement
    /// fails.
    pub(crate) terminated: BTreeSet<SessionId>,
    leases: BTreeMap<u32, Lease>,
    members: BTreeMap<String, Duration>,
    /// Per partition: the epoch installed and its holder.
    sink_epochs: BTreeMap<u32, (u64, Holder)>,
    in_flight: BTreeMap<i64, InFlight>,
    crashes: BTreeMap<i64, u32>,
    dead: BTreeMap<i64, Dead>,
    /// Listeners connected, each with a notification pending or not.
    pub(crate) listeners: BTreeMap<u64, bool>,
    pub(crate) next_listener: u64,
    pub(crate) schema_version: u32,
    pub(crate) min_reader: u32,
}

pub(crate) fn refused(why: &str) -> StoreError {
    StoreError::new(StoreErrorKind::Refused, None, why.to_owned())
}

impl Db {
    pub(crate) fn new(partitions: u32) -> Self {
        let partitions = partitions.max(1);
        let leases = (0..partitions)
            .map(|p| {
                let l = Lease {
                    owner: None,
                    epoch: 0,
                    expiry: None,
                };
                (p, l)
            })
            .collect();
        Db {
            partitions,
            clock: Duration::ZERO,
            // PostgreSQL's first normal transaction id is 3.
            next_xid: 3,
            next_id: 1,
            rows: BTreeMap::new(),
            by_id: BTreeMap::new(),
            sessions: BTreeMap::new(),
            next_session: 1,
            terminated: BTreeSet::new(),
            leases,
            members: BTreeMap::new(),
            sink_epochs: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            crashes: BTreeMap::new(),
            dead: BTreeMap::new(),
            listeners: BTreeMap::new(),
            next_listener: 1,
            schema_version: crate::table::schema::SCHEMA_VERSION,
            min_reader: 1,
        }
    }

    fn take_xid(&mut self) -> u64 {
        let x = self.next_xid;
        self.next_xid += 1;
        x
    }

    /// The oldest transaction id still running (or the next one).
    pub(crate) fn xmin(&self) -> u64 {
        self.sessions
            .values()
            .flatten()
            .filter_map(|tx| tx.xid)
            .min()
            .unwrap_or(self.next_xid)
    }

    /// The oldest open transaction holding an id, and the oldest row's
    /// age, on the model's clock (`Store::horizon`).
    pub(crate) fn horizon(&self) -> crate::table::store::Horizon {
        let age = |t: Duration| self.clock.saturating_sub(t);
        let oldest = self
            .sessions
            .values()
            .flatten()
            .filter(|tx| tx.xid.is_some());
        crate::table::store::Horizon {
            oldest_transaction: oldest.map(|tx| tx.start).min().map(age),
            lag: self.rows.values().map(|r| r.staged_at).min().map(age),
        }
    }

    pub(crate) fn begin(&mut self, idle_timeout: Option<Duration>) -> SessionId {
        let s = self.next_session;
        self.next_session += 1;
        let tx = Tx {
            start: self.clock,
            last_active: self.clock,
            idle_timeout,
            ..Tx::default()
        };
        self.sessions.insert(s, Some(tx));
        s
    }

    pub(crate) fn tx(&mut self, s: SessionId) -> Result<&mut Tx, StoreError> {
        if self.terminated.contains(&s) {
            return Err(StoreError::new(
                StoreErrorKind::Refused,
                Some("25P03".into()),
                "terminating connection due to idle-in-transaction timeout",
            ));
        }
        let clock = self.clock;
        let tx = self
            .sessions
            .get_mut(&s)
            .and_then(Option::as_mut)
            .ok_or_else(|| refused("no transaction in progress"))?;
        tx.last_active = clock;
        Ok(tx)
    }

    /// Inserts one row in `s`'s transaction: `now()` is the transaction's
    /// start, the xid is assigned at the first write.
    pub(crate) fn stage(
        &mut self,
        s: SessionId,
        tenant: &[u8],
        item: &[u8],
        version: u32,
        notify: bool,
    ) -> Result<i64, StoreError> {
        let id = self.next_id;
        let partitions = self.partitions;
        let needs_xid = self.tx(s)?.xid.is_none();
        let fresh = if needs_xid {
            Some(self.take_xid())
        } else {
            None
        };
        let tx = self.tx(s)?;
        if tx.failed {
            return Err(StoreError::new(
                StoreErrorKind::Refused,
                Some("25P02".into()),
                "current transaction is aborted",
            ));
        }
        if let Some(x) = fresh {
            tx.xid = Some(x);
        }
        let row = Row {
            id,
            xid: tx.xid.unwrap_or_default(),
            partition: partition_of(tenant, partitions),
            tenant: tenant.to_vec(),
            item: item.to_vec(),
            codec_version: version,
            age: Duration::ZERO,
            crashes: 0,
        };
        tx.rows.push(StoredRow {
            row,
            staged_at: tx.start,
        });
        tx.notify |= notify;
        self.next_id += 1;
        Ok(id)
    }

    /// Ends `s`'s transaction: committed (`true`) unless a statement of it
    /// failed, in which case it rolls back, as PostgreSQL's COMMIT of an
    /// aborted transaction does.
    pub(crate) fn commit(&mut self, s: SessionId) -> Result<bool, StoreError> {
        self.tx(s)?;
        let Some(tx) = self.sessions.remove(&s).flatten() else {
            return Err(refused("no transaction in progress"));
        };
        if tx.failed {
            return Ok(false);
        }
        for r in tx.rows {
            self.insert_committed(r);
        }
        if tx.notify {
            self.deliver_notifications();
        }
        Ok(true)
    }

    pub(crate) fn rollback(&mut self, s: SessionId) {
        self.sessions.remove(&s);
        self.terminated.remove(&s);
    }

    fn insert_committed(&mut self, r: StoredRow) {
        let at = r.row.position();
        self.by_id.insert(r.row.id, at);
        self.rows.insert(at, r);
    }

    pub(crate) fn deliver_notifications(&mut self) {
        for pending in self.listeners.values_mut() {
            *pending = true;
        }
    }

    /// Ends every transaction idle past its timeout (the server terminates
    /// its session).
    pub(crate) fn expire_idle(&mut self) {
        let clock = self.clock;
        let idle: Vec<SessionId> = self
            .sessions
            .iter()
            .filter_map(|(s, tx)| {
                let tx = tx.as_ref()?;
                let limit = tx.idle_timeout?;
                (clock.saturating_sub(tx.last_active) >= limit).then_some(*s)
            })
            .collect();
        for s in idle {
            self.sessions.remove(&s);
            self.terminated.insert(s);
        }
    }

    /// Sink epoch rows share-locked by any open transaction other than
    /// `except`.
    pub(crate) fn share_locked(&self, partition: u32) -> bool {
        self.sessions
            .values()
            .flatten()
            .any(|tx| tx.locks.contains(&partition))
    }

    fn row_out(&self, r: &StoredRow) -> Row {
        let mut row = r.row.clone();
        row.age = self.clock.saturating_sub(r.staged_at);
        row.crashes = self.crashes.get(&row.id).copied().unwrap_or(0);
        row
    }

    pub(crate) fn read_page(&self, request: &PageRequest) -> Page {
        let xmin = self.xmin();
        let pick = |filter: &dyn Fn(&Row) -> bool, limit: u32| -> Vec<Row> {
            let mut rows: Vec<Row> = self
                .rows
                .values()
                .filter(|r| filter(&r.row))
                .map(|r| self.row_out(r))
                .collect();
            if request.order == ReadOrder::IdAboveLastSeen {
                rows.sort_by_key(|r| r.id);
            }
            rows.truncate(limit.max(1) as usize);
            rows
        };
        let below = |r: &Row| request.order == ReadOrder::IdAboveLastSeen || r.xid < xmin;
        let after = |r: &Row, a: Option<Position>| match (request.order, a) {
            (_, None) => true,
            (ReadOrder::Watermark, Some(a)) => r.position() > a,
            (ReadOrder::IdAboveLastSeen, Some(a)) => r.id > a.id,
        };
        let until = |r: &Row, u: Position| match request.order {
            ReadOrder::Watermark => r.position() <= u,
            ReadOrder::IdAboveLastSeen => r.id <= u.id,
        };
        let partitions = request
            .partitions
            .iter()
            .map(|p| {
                let f = |r: &Row| r.partition == p.partition && below(r) && after(r, p.after);
                pick(&f, p.limit)
            })
            .collect();
        let tenants = request
            .tenants
            .iter()
            .map(|t| {
                let f = |r: &Row| {
                    r.tenant == t.tenant && below(r) && after(r, t.after) && until(r, t.until)
                };
                pick(&f, t.limit)
            })
            .collect();
        Page {
            xmin,
            partitions,
            tenants,
        }
    }

    fn held(&self, fence: &Fence) -> BTreeMap<u32, u64> {
        fence
            .epochs
            .iter()
            .filter(|(p, e)| {
                self.leases
                    .get(p)
                    .is_some_and(|l| l.epoch == *e && l.owner.as_deref() == Some(&fence.owner))
            })
            .map(|&(p, e)| (p, e))
            .collect()
    }

    fn take_row(&mut self, id: i64, held: &BTreeMap<u32, u64>) -> Option<StoredRow> {
        let at = *self.by_id.get(&id)?;
        if !held.contains_key(&self.rows.get(&at)?.row.partition) {
            return None;
        }
        self.by_id.remove(&id);
        self.rows.remove(&at)
    }

    pub(crate) fn remove(&mut self, fence: &Fence, removal: &Removal) -> Removed {
        let held = self.held(fence);
        let mut out = Removed::default();
        let delete = self.planted_delete_range(&removal.delete, &held);
        for &id in delete.as_ref().unwrap_or(&removal.delete) {
            if self.take_row(id, &held).is_some() {
                self.crashes.remove(&id);
                out.deleted.push(id);
            }
        }
        let everyone = self.planted_unfenced_dead(fence);
        for d in &removal.dead {
            if let Some(row) = self.take_row(d.id, everyone.as_ref().unwrap_or(&held)) {
                let dead = Dead {
                    epoch: held.get(&row.row.partition).copied().unwrap_or(0),
                    row,
                    reason: d.reason.as_str().to_owned(),
                    attempts: d.attempts,
                    crashes: self.crashes.remove(&d.id).unwrap_or(0),
                    dead_at: self.clock,
                };
                self.dead.insert(d.id, dead);
                out.dead.push(d.id);
            }
        }
        // Only the records named: a record may cover rows still here.
        for first in &removal.records {
            let here = self.in_flight.get(first).map(|r| r.partition);
            if here.is_some_and(|p| held.contains_key(&p)) {
                self.in_flight.remove(first);
            }
        }
        out.deleted.sort_unstable();
        out.dead.sort_unstable();
        out.stale = fence
            .epochs
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| !held.contains_key(p))
            .collect();
        out.stale.sort_unstable();
        out.stale.dedup();
        out
    }

    /// The canary `delete_by_id_range`: every row of the held partitions
    /// with an id from the lowest to the highest of `ids`.
    fn planted_delete_range(&self, ids: &[i64], held: &BTreeMap<u32, u64>) -> Option<Vec<i64>> {
        use crate::core::canary;
        if !canary::on(canary::DELETE_BY_ID_RANGE) {
            return None;
        }
        let (lo, hi) = (ids.iter().min()?, ids.iter().max()?);
        let range = self.by_id.range(lo..=hi);
        let rows = range.filter(|(_, at)| {
            let partition = self.rows.get(at).map(|r| r.row.partition);
            partition.is_some_and(|p| held.contains_key(&p))
        });
        Some(rows.map(|(id, _)| *id).collect())
    }

    /// The canary `dead_letter_no_epoch`: every partition of the fence
    /// counts as held for the dead-letter move, at the epoch it names.
    fn planted_unfenced_dead(&self, fence: &Fence) -> Option<BTreeMap<u32, u64>> {
        use crate::core::canary;
        canary::on(canary::DEAD_LETTER_NO_EPOCH).then(|| fence.epochs.iter().copied().collect())
    }

    /// `Store::record_attempts`: every record of a held partition is
    /// written, in one statement; two of them with one first row refuse
    /// the whole statement (PostgreSQL's ON CONFLICT cannot touch a row
    /// twice).
    pub(crate) fn record_attempts(
        &mut self,
        fence: &Fence,
        records: &[InFlight],
    ) -> Result<Recorded, StoreError> {
        let held = self.held(fence);
        let mut writes: BTreeMap<i64, InFlight> = BTreeMap::new();
        for r in records.iter().filter(|r| held.contains_key(&r.partition)) {
            let Some(first) = r.first_id() else { continue };
            if writes.insert(first, r.clone()).is_some() {
                return Err(refused("two in-flight records with one first row"));
            }
        }
        self.in_flight.extend(writes);
        let mut stale: Vec<u32> = fence
            .epochs
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| !held.contains_key(p))
            .collect();
        stale.sort_unstable();
        stale.dedup();
        Ok(Recorded { stale })
    }

    pub(crate) fn record_crashes(&mut self, fence: &Fence, partition: u32) -> Fenced<u64> {
        if self.held(fence).is_empty() {
            return Fenced::Stale;
        }
        let records: Vec<i64> = self
            .in_flight
            .iter()
            .filter(|(_, r)| r.partition == partition)
            .map(|(k, _)| *k)
            .collect();
        let mut gained = BTreeMap::<i64, u32>::new();
        for k in records {
            if let Some(r) = self.in_flight.remove(&k) {
                for id in r.ids.into_iter().filter(|id| self.by_id.contains_key(id)) {
                    *gained.entry(id).or_default() += 1;
                }
            }
        }
        for (id, n) in &gained {
            *self.crashes.entry(*id).or_default() += n;
        }
        Fenced::Done(gained.len() as u64)
    }

    pub(crate) fn acquire(&mut self, a: &Acquire) -> Result<Acquired, StoreError> {
        let clock = self.clock;
        let l = self
            .leases
            .get_mut(&a.partition)
            .ok_or_else(|| refused("no such partition in the lease table"))?;
        // A live lease is never taken, not even by its own owner (S-L10).
        let free = l.expiry.is_none_or(|e| e <= clock);
        if !free {
            return Ok(Acquired::Held {
                owner: l.owner.clone().unwrap_or_default(),
                epoch: l.epoch,
                expires_in: l.expiry.map_or(Duration::ZERO, |e| e.saturating_sub(clock)),
            });
        }
        l.epoch = l.epoch.max(a.above) + 1;
        l.owner = Some(a.owner.clone());
        l.expiry = Some(clock + a.ttl);
        Ok(Acquired::Taken { epoch: l.epoch })
    }

    fn lease_of(&mut self, k: &LeaseKey) -> Option<&mut Lease> {
        self.leases
            .get_mut(&k.partition)
            .filter(|l| l.epoch == k.epoch && l.owner.as_deref() == Some(&k.owner))
    }

    /// Only a live lease is renewed: a released or lapsed one stays so.
    pub(crate) fn renew(&mut self, k: &LeaseKey, ttl: Duration) -> bool {
        let clock = self.clock;
        self.lease_of(k)
            .filter(|l| l.expiry.is_some_and(|e| e > clock))
            .map(|l| l.expiry = Some(clock + ttl))
            .is_some()
    }

    /// The owner stays, as the last owner (S-L17, S-L21); the expiry
    /// becomes now unless it is already past.
    pub(crate) fn release(&mut self, k: &LeaseKey) -> bool {
        let clock = self.clock;
        let Some(l) = self.lease_of(k) else {
            return false;
        };
        l.expiry = Some(l.expiry.map_or(clock, |e| e.min(clock)));
        self.in_flight.retain(|_, r| r.partition != k.partition);
        true
    }

    pub(crate) fn leases(&self) -> Vec<LeaseRow> {
        self.leases
            .iter()
            .map(|(p, l)| LeaseRow {
                partition: *p,
                owner: l.owner.clone(),
                epoch: l.epoch,
                expires_in: l
                    .expiry
                    .map_or(Duration::ZERO, |e| e.saturating_sub(self.clock)),
            })
            .collect()
    }

    pub(crate) fn heartbeat(&mut self, instance: &str, ttl: Duration) {
        self.members.insert(instance.to_owned(), self.clock + ttl);
    }

    pub(crate) fn leave(&mut self, instance: &str) {
        self.members.remove(instance);
    }

    pub(crate) fn members(&self) -> Vec<Member> {
        self.members
            .iter()
            .map(|(i, e)| Member {
                instance: i.clone(),
                expires_in: e.saturating_sub(self.clock),
            })
            .collect()
    }

    pub(crate) fn sink_epochs(&self) -> Vec<SinkEpoch> {
        self.sink_epochs
            .iter()
            .map(|(p, (e, h))| SinkEpoch {
                partition: *p,
                epoch: *e,
                holder: Some(h.instance.as_str().to_owned()),
                incarnation: h.incarnation,
            })
            .collect()
    }

    /// `None` while a sink transaction share-locks the row (an install
    /// that would change nothing waits too: PostgreSQL's `ON CONFLICT`
    /// locks the row either way).
    pub(crate) fn try_install(
        &mut self,
        partition: u32,
        epoch: u64,
        holder: &Holder,
    ) -> Option<Installed> {
        if self.share_locked(partition) {
            return None;
        }
        match self.sink_epochs.get(&partition) {
            Some((current, h)) if *current == epoch && h == holder => {
                return Some(Installed::Installed)
            }
            Some((current, _)) if *current >= epoch => {
                return Some(Installed::Superseded { current: *current })
            }
            _ => {}
        }
        self.sink_epochs.insert(partition, (epoch, holder.clone()));
        let _ = self.take_xid();
        Some(Installed::Installed)
    }

    /// Checks the epochs under share locks (which assign the transaction
    /// an id, as `FOR SHARE` does).
    pub(crate) fn check_epochs(
        &mut self,
        s: SessionId,
        epochs: &[(u32, u64)],
    ) -> Result<Fenced<()>, StoreError> {
        let ok = epochs
            .iter()
            .all(|(p, e)| self.sink_epochs.get(p).is_some_and(|(at, _)| at == e));
        let needs_xid = self.tx(s)?.xid.is_none();
        let fresh = if needs_xid {
            Some(self.take_xid())
        } else {
            None
        };
        let tx = self.tx(s)?;
        if let Some(x) = fresh {
            tx.xid = Some(x);
        }
        tx.locks.extend(epochs.iter().map(|(p, _)| *p));
        Ok(if ok { Fenced::Done(()) } else { Fenced::Stale })
    }

    pub(crate) fn dead_letters(&self, limit: u32) -> Vec<DeadRow> {
        let mut all: Vec<&Dead> = self.dead.values().collect();
        all.sort_by_key(|d| (d.dead_at, d.row.row.id));
        all.into_iter()
            .take(limit as usize)
            .map(|d| DeadRow {
                id: d.row.row.id,
                tenant: d.row.row.tenant.clone(),
                item: d.row.row.item.clone(),
                codec_version: d.row.row.codec_version,
                reason: d.reason.clone(),
                attempts: d.attempts,
                crashes: d.crashes,
                epoch: d.epoch,
            })
            .collect()
    }

    /// Moves dead rows back as new stages of one autocommit transaction.
    pub(crate) fn redrive(&mut self, ids: &[i64]) -> u64 {
        let mut back: Vec<Dead> = ids.iter().filter_map(|id| self.dead.remove(id)).collect();
        back.sort_by_key(|d| d.row.row.position());
        if back.is_empty() {
            return 0;
        }
        let xid = self.take_xid();
        let n = back.len() as u64;
        for d in back {
            let mut row = d.row.row;
            row.id = self.next_id;
            self.next_id += 1;
            row.xid = xid;
            self.insert_committed(StoredRow {
                row,
                staged_at: self.clock,
            });
        }
        n
    }

    pub(crate) fn purge_dead(&mut self, older_than: Duration) -> u64 {
        let before = self.dead.len();
        let clock = self.clock;
        self.dead
            .retain(|_, d| clock.saturating_sub(d.dead_at) <= older_than);
        (before - self.dead.len()) as u64
    }

    /// The server restarts: every session ends (its transaction rolled
    /// back, its locks gone, its next statement refused) and every
    /// listener is disconnected; committed state stays.
    pub(crate) fn restart(&mut self) {
        let open: Vec<SessionId> = self.sessions.keys().copied().collect();
        self.sessions.clear();
        self.terminated.extend(open);
        self.listeners.clear();
    }

    /// What the database holds now, by kind (rows and entries).
    pub(crate) fn footprint(&self) -> super::Footprint {
        super::Footprint {
            rows: self.rows.len(),
            sessions: self.sessions.len(),
            terminated: self.terminated.len(),
            listeners: self.listeners.len(),
            in_flight: self.in_flight.len(),
            crash_counts: self.crashes.len(),
            members: self.members.len(),
            dead: self.dead.len(),
        }
    }

    /// Every committed row, by (xid, id).
    pub(crate) fn committed(&self) -> Vec<Row> {
        self.rows.values().map(|r| self.row_out(r)).collect()
    }

    /// A reason string back as a [`DeadReason`], for checks.
    pub(crate) fn dead_reason(&self, id: i64) -> Option<DeadReason> {
        self.dead
            .get(&id)
            .and_then(|d| DeadReason::from_name(&d.reason))
    }
}
