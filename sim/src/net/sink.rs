//! `NetSink`: the application's sink, speaking the wire protocol to the
//! datastore over turmoil's simulated TCP.
//!
//! It keeps a pool of idle connections, connects when none is idle, and
//! drops every idle connection on any failure, so the next attempt
//! reconnects. Each call runs on its own task: an attempt the driver drops
//! (write timeout, cancellation) leaves its call running to its end, like
//! a statement already sent to a database. Every
//! call is bounded by its own RPC timeout (a lost segment or a partition
//! becomes an error); every per-call failure is `WriteError::retryable`,
//! a datastore rejection `WriteError::terminal`.
//!
//! It is also an observer: each attempt is logged in the book with its
//! slice (I2: every attempt of a slice identical), the attempts in flight
//! per tenant and in all are checked (I4), an attempt after the outbox
//! closed is a broken I8, and how each attempt ended feeds the end checks.
//!
//! Client-side faults, drawn per attempt from the seed while not healed:
//! panics while creating the future, while polling it and while rendering
//! its error (S-W5), hangs (S-B3), and errors before sending.

use std::fmt;
use std::future::Future;
use std::io;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use outbox::{Sink, Slice, TenantId, TenantKey, WriteError, Written};
use rand::Rng;
use turmoil::net::TcpStream;

use super::book::{self, End, Ev, SharedBook, SliceRec};
use super::check;
use super::datastore::{HOST, PORT};
use super::faults::Rates;
use super::protocol::{read_frame, write_frame, Reply, Request, WireItem};
use crate::draw::{log_uniform, SimRng};

/// An item of the net world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Item {
    /// Global id: the order items were staged in, across the run.
    pub id: u64,
    /// The tenant index it was staged for.
    pub tenant: u32,
    /// Payload bytes (the weigher's weight).
    pub size: u32,
}

/// A tenant key the net world runs with (drawn per seed, see the world):
/// tenant index `k` maps to a key and the key back to the wire's tenant,
/// `k + 1`, so the datastore sees the same bytes whatever the key type.
pub trait NetKey: TenantKey {
    /// The key type's name, for the run's setup line.
    const NAME: &'static str;
    /// The key of tenant index `k`.
    fn of(k: u32) -> Self;
    /// The wire's tenant of this key (`k + 1`); `None` for a key `of`
    /// never makes.
    fn wire(&self) -> Option<u128>;
}

/// The key the net world was built with: `k + 1` as a UUID.
impl NetKey for TenantId {
    const NAME: &'static str = "TenantId";
    fn of(k: u32) -> Self {
        TenantId::from_u128(u128::from(k) + 1)
    }
    fn wire(&self) -> Option<u128> {
        Some(self.as_uuid().as_u128())
    }
}

/// `k + 1`: a number whose order is the UUIDs' order.
impl NetKey for u64 {
    const NAME: &'static str = "u64";
    fn of(k: u32) -> Self {
        u64::from(k) + 1
    }
    fn wire(&self) -> Option<u128> {
        Some(u128::from(*self))
    }
}

/// `tenant-{k}`: a key ordered as text (`tenant-10` before `tenant-2`),
/// not as the index, and cloned by allocation.
impl NetKey for String {
    const NAME: &'static str = "String";
    fn of(k: u32) -> Self {
        format!("tenant-{k}")
    }
    fn wire(&self) -> Option<u128> {
        let k: u32 = self.strip_prefix("tenant-")?.parse().ok()?;
        Some(u128::from(k) + 1)
    }
}

/// XOR-ed into the seed for [`KeyType::draw`]'s generator: a stream of
/// its own, so the key draw shifted none of a seed's other draws.
pub const KEY_STREAM: u64 = 0x4B45_0000_5EED;

/// Which [`NetKey`] a run's outbox is keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyType {
    /// [`TenantId`], the key the net world had before keys were the user's.
    TenantId,
    /// `u64`.
    U64,
    /// `String`.
    String,
}

impl KeyType {
    /// Draws the key type of `seed`, one in three each, from its own
    /// stream ([`KEY_STREAM`]).
    pub fn draw(seed: u64) -> KeyType {
        match crate::draw::rng(seed ^ KEY_STREAM).random_range(0..3) {
            0 => KeyType::TenantId,
            1 => KeyType::U64,
            _ => KeyType::String,
        }
    }
}

/// The request frame writing `items` for the wire's `tenant` (both worlds'
/// sinks).
pub fn write_frame_of(tenant: u128, items: &[Item]) -> Vec<u8> {
    Request {
        tenant,
        items: items
            .iter()
            .map(|i| WireItem {
                id: i.id,
                tenant: i.tenant,
                size: i.size,
            })
            .collect(),
    }
    .encode()
}

/// The payload of a deliberate panic; the world's panic hook keeps quiet
/// about it.
#[derive(Debug)]
pub struct Injected;

/// An error whose `Display` panics (S-W5).
#[derive(Debug)]
struct PanickyError;

impl fmt::Display for PanickyError {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        std::panic::panic_any(Injected)
    }
}

impl std::error::Error for PanickyError {}

/// What the sink does wrong in one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    Ok,
    PanicCreate,
    PanicPoll,
    PanicDisplay,
    Hang(Duration),
    Error,
}

struct Inner {
    book: SharedBook,
    idle: Mutex<Vec<TcpStream>>,
    rng: Mutex<SimRng>,
    rates: Rates,
    storm_factor: u32,
    rpc_timeout: Duration,
    /// Calls in progress at most (the pool's size), attempts and calls
    /// left running by dropped attempts together.
    calls: Arc<tokio::sync::Semaphore>,
    /// After a failed connect, no new one before this virtual time (a
    /// circuit breaker; turmoil also keeps a socket entry per failed
    /// connect, so each one costs every later connect a little).
    connect_after: Mutex<Duration>,
}

/// How long the sink waits after a failed connect before the next.
pub const RECONNECT_DELAY: Duration = Duration::from_millis(100);

/// The sink (see the module docs), for tenants keyed by `K`.
pub struct NetSink<K> {
    inner: Arc<Inner>,
    /// Held by the sink the outbox was built with and by no clone: it dies
    /// with the outbox's own sink, which only the writer task (and its
    /// write tasks) keep once every handle is dropped, so the application
    /// sees the writer exit (S-W16). The clones a write makes for its
    /// calls may outlive the writer and must not keep it alive.
    alive: Option<Arc<()>>,
    _key: PhantomData<fn() -> K>,
}

impl<K> Clone for NetSink<K> {
    fn clone(&self) -> Self {
        NetSink {
            inner: Arc::clone(&self.inner),
            alive: None,
            _key: PhantomData,
        }
    }
}

impl<K: NetKey> NetSink<K> {
    /// A sink logging to `book`, with client faults from `rng` at `rates`,
    /// each call bounded by `rpc_timeout`, at most `connections` calls
    /// in progress.
    pub fn new(
        book: SharedBook,
        rng: SimRng,
        rates: Rates,
        storm_factor: u32,
        rpc_timeout: Duration,
        connections: usize,
    ) -> Self {
        NetSink {
            inner: Arc::new(Inner {
                book,
                idle: Mutex::new(Vec::new()),
                rng: Mutex::new(rng),
                rates,
                storm_factor,
                rpc_timeout,
                calls: Arc::new(tokio::sync::Semaphore::new(connections.max(1))),
                connect_after: Mutex::new(Duration::ZERO),
            }),
            alive: Some(Arc::new(())),
            _key: PhantomData,
        }
    }

    /// The same sink for tenants keyed by `K2` (the world builds it, then
    /// keys it by the type drawn for the run).
    pub fn keyed<K2: NetKey>(self) -> NetSink<K2> {
        NetSink {
            inner: self.inner,
            alive: self.alive,
            _key: PhantomData,
        }
    }

    /// A token that dies when this very sink (not a clone) is dropped:
    /// `None` for a clone.
    pub fn alive(&self) -> Option<Weak<()>> {
        self.alive.as_ref().map(Arc::downgrade)
    }

    fn draw(&self) -> Act {
        let weather = book::lock(&self.inner.book).weather;
        if weather.healed {
            return Act::Ok;
        }
        let r = if weather.storm {
            self.inner.rates.times(self.inner.storm_factor)
        } else {
            self.inner.rates
        };
        let mut rng = self
            .inner
            .rng
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut x = rng.random_range(0..1_000u32);
        let table = [
            (r.panic_create, Act::PanicCreate),
            (r.panic_poll, Act::PanicPoll),
            (r.panic_display, Act::PanicDisplay),
            (r.hang_client, Act::Hang(Duration::ZERO)),
            (r.client_error, Act::Error),
        ];
        for (rate, act) in table {
            if x < rate {
                return match act {
                    Act::Hang(_) => {
                        Act::Hang(Duration::from_millis(log_uniform(&mut rng, 2_000, 120_000)))
                    }
                    a => a,
                };
            }
            x -= rate;
        }
        Act::Ok
    }

    async fn rpc(&self, frame: Vec<u8>) -> io::Result<Reply> {
        let result = match tokio::time::timeout(self.inner.rpc_timeout, self.call(frame)).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the datastore did not answer in time",
            )),
        };
        if result.is_err() {
            // The datastore may have restarted or the link broken: every
            // idle connection is suspect, so the next attempt reconnects.
            self.idle().clear();
        }
        result
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<TcpStream>> {
        self.inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    async fn call(&self, frame: Vec<u8>) -> io::Result<Reply> {
        let pooled = self
            .inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                let now = turmoil::sim_elapsed().unwrap_or_default();
                let after = *self
                    .inner
                    .connect_after
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if now < after {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        "the datastore was unreachable a moment ago",
                    ));
                }
                let connect = TcpStream::connect((HOST, PORT));
                let timeout = self.inner.rpc_timeout / 2;
                let connected = tokio::time::timeout(timeout, connect)
                    .await
                    .unwrap_or_else(|_| {
                        Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))
                    });
                match connected {
                    Ok(c) => c,
                    Err(e) => {
                        let now = turmoil::sim_elapsed().unwrap_or_default();
                        *self
                            .inner
                            .connect_after
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner) = now + RECONNECT_DELAY;
                        return Err(e);
                    }
                }
            }
        };
        write_frame(&mut conn, &frame).await?;
        let body = read_frame(&mut conn)
            .await?
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "the datastore hung up"))?;
        let reply = Reply::decode(&body)?;
        self.inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(conn);
        Ok(reply)
    }
}

/// One attempt in flight, as the book sees it; dropping it ends the
/// attempt (as `Dropped` unless an end was set).
struct InFlight {
    book: SharedBook,
    tenant: u32,
    first: u64,
    end: End,
    /// One slice of a group: its end reaches the breaker's model with the
    /// group's (I10), not as it happens.
    in_group: bool,
}

impl InFlight {
    /// Logs the attempt's start, checked by [`check::attempt::on_start`]
    /// (S-W4, I1, I2, I4, I7, I8) and [`check::i4::in_flight_within_bounds`].
    /// `in_group`: the slice is one of a group whose start was already
    /// checked for the age limit and the breaker (I12, I10) as a whole.
    fn begin<K: NetKey>(book: &SharedBook, tenant: &K, items: &[Item], in_group: bool) -> InFlight {
        let now = book::now();
        let first = items.first().map_or(u64::MAX, |i| i.id);
        let tenant_ix = items.first().map_or(u32::MAX, |i| i.tenant);
        let mut b = book::lock(book);
        let ids: Vec<u64> = items.iter().map(|i| i.id).collect();
        let start = check::attempt::Start {
            now,
            tenant,
            tenant_ix,
            wrong_tenant: K::of(tenant_ix) != *tenant
                || items.iter().any(|i| i.tenant != tenant_ix),
            ids: &ids,
            first,
            in_group,
        };
        for (rule, detail) in check::attempt::on_start(&b, &start) {
            b.fail(rule, detail);
        }
        if !in_group {
            if let Some((rule, detail)) = b.breaker.on_start(first, now) {
                b.fail(rule, detail);
            }
        }
        let attempt = match b.slices.get_mut(&first) {
            Some(s) => {
                s.attempts += 1;
                s.last = End::Running;
                s.attempts
            }
            None => {
                b.slices.insert(
                    first,
                    SliceRec {
                        tenant: tenant_ix,
                        ids,
                        attempts: 1,
                        last: End::Running,
                        ended_at: None,
                    },
                );
                1
            }
        };
        *b.in_flight.entry(tenant_ix).or_default() += 1;
        b.in_flight_total += 1;
        b.in_flight_max = b.in_flight_max.max(b.in_flight_total);
        for (rule, detail) in check::i4::in_flight_within_bounds(&b, tenant_ix) {
            b.fail(rule, detail);
        }
        b.record(
            now,
            Ev::Attempt {
                tenant: tenant_ix,
                first,
                len: items.len(),
                attempt,
            },
        );
        drop(b);
        InFlight {
            book: Arc::clone(book),
            tenant: tenant_ix,
            first,
            end: End::Dropped,
            in_group,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = book::now();
        let mut b = book::lock(&self.book);
        if let Some(n) = b.in_flight.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                b.in_flight.remove(&self.tenant);
            }
        }
        b.in_flight_total -= 1;
        if !self.in_group {
            b.breaker.on_end(self.first, self.end, now);
        }
        if let Some(s) = b.slices.get_mut(&self.first) {
            s.last = self.end;
            s.ended_at = Some(now);
        }
        b.record(
            now,
            Ev::AttemptEnd {
                first: self.first,
                end: self.end,
            },
        );
    }
}

/// A group's slices as the book must see them if the group fails as a
/// whole (S-F4: a later slice's panic, the group's timeout or
/// cancellation): the driver then reports every slice failed. The slices
/// the datastore already answered are taken as of unknown outcome
/// (`Dropped`: their items may be in the store, as after a cut reply);
/// the slices never sent are entered as attempted and failed, so their
/// items count as sliced (a slice may fail, and be lost, without ever
/// reaching the datastore).
///
/// The breaker's model (I10) learns the slices' ends here, in slice order,
/// when the group returns: the driver hands the engine a group's outcomes
/// together, so a run of failed slices the sink saw one by one opens the
/// engine's breaker only then, if a later slice of the group did not
/// answer and close it first (seed 695 of the net world). A group that
/// fails as a whole (a panic, the timeout, a cancellation) ends every
/// slice with that outcome, the answered ones too (S-F4): before any
/// cancellation could come, every slice failed; after, each counts
/// neither way, as the engine's verdict (failed, or cancelled) is not the
/// sink's to know.
struct GroupEnds {
    book: SharedBook,
    /// Per slice, its items' (id, tenant index).
    slices: Vec<Vec<(u64, u32)>>,
    /// Slices whose `write` was called.
    started: usize,
    /// Slices whose `write` returned.
    answered: usize,
    finished: bool,
}

impl Drop for GroupEnds {
    fn drop(&mut self) {
        let now = book::now();
        let mut b = book::lock(&self.book);
        let whole = if b.breaker.cancels() {
            End::Dropped
        } else {
            End::Failed
        };
        for (k, items) in self.slices.iter().enumerate() {
            let Some(&(first, _)) = items.first() else {
                continue;
            };
            let end = match b.slices.get(&first) {
                Some(s) if self.finished && k < self.answered => s.last,
                _ => whole,
            };
            b.breaker.on_end(first, end, now);
        }
        if self.finished {
            return;
        }
        for (k, items) in self.slices.iter().enumerate() {
            let Some(&(first, tenant)) = items.first() else {
                continue;
            };
            if k < self.answered {
                if let Some(s) = b.slices.get_mut(&first) {
                    s.last = End::Dropped;
                }
            } else if k >= self.started {
                let rec = b.slices.entry(first).or_insert_with(|| SliceRec {
                    tenant,
                    ids: items.iter().map(|(id, _)| *id).collect(),
                    attempts: 0,
                    last: End::Dropped,
                    ended_at: None,
                });
                rec.last = End::Dropped;
                rec.ended_at = Some(now);
            }
        }
    }
}

impl<K: NetKey> Sink for NetSink<K> {
    type Tenant = K;
    type Item = Item;

    fn name(&self) -> &str {
        "datastore"
    }

    /// Yes (S-F1): a group's slices go one call after another, each an
    /// attempt of its own in the book, so the sink never has more calls
    /// in flight than the driver has groups.
    fn takes_groups(&self) -> bool {
        true
    }

    async fn write_group(&self, slices: &[Slice<K, Item>]) -> Vec<Result<Written, WriteError>> {
        let mut ends = GroupEnds {
            book: Arc::clone(&self.inner.book),
            slices: slices
                .iter()
                .map(|s| s.items.iter().map(|i| (i.id, i.tenant)).collect())
                .collect(),
            started: 0,
            answered: 0,
            finished: false,
        };
        // The engine started every slice of the group at once: its age
        // limit and its breaker are checked at the group's start, not as
        // each slice's call comes up in turn (I12, I10).
        {
            let now = book::now();
            let mut b = book::lock(&self.inner.book);
            for slice in slices {
                let ids: Vec<u64> = slice.items.iter().map(|i| i.id).collect();
                let first = ids.first().copied().unwrap_or(u64::MAX);
                let mut broken: Vec<_> = check::i12::no_item_too_old(&b, &ids, now)
                    .into_iter()
                    .collect();
                broken.extend(b.breaker.on_start(first, now));
                for (rule, detail) in broken {
                    b.fail(rule, detail);
                }
            }
        }
        let mut outcomes = Vec::with_capacity(slices.len());
        for (k, slice) in slices.iter().enumerate() {
            // `write_slice` begins the attempt in the book as it is called.
            ends.started = k + 1;
            outcomes.push(self.write_slice(&slice.tenant, &slice.items, true).await);
            ends.answered = k + 1;
        }
        ends.finished = true;
        outcomes
    }

    fn write(
        &self,
        tenant: &K,
        items: &[Item],
    ) -> impl Future<Output = Result<Written, WriteError>> + Send {
        self.write_slice(tenant, items, false)
    }
}

impl<K: NetKey> NetSink<K> {
    /// One slice's call; `in_group` as in [`InFlight::begin`].
    fn write_slice(
        &self,
        tenant: &K,
        items: &[Item],
        in_group: bool,
    ) -> impl Future<Output = Result<Written, WriteError>> + Send {
        let act = self.draw();
        let mut attempt = InFlight::begin(&self.inner.book, tenant, items, in_group);
        if act == Act::PanicCreate {
            attempt.end = End::Failed;
            book::lock(&self.inner.book).fault(book::now(), "panic_create");
            drop(attempt);
            std::panic::panic_any(Injected);
        }
        let frame = write_frame_of(tenant.wire().unwrap_or(u128::MAX), items);
        let sink = self.clone();
        async move {
            let mut attempt = attempt;
            let book = Arc::clone(&sink.inner.book);
            match act {
                Act::Hang(d) => {
                    book::lock(&book).fault(book::now(), "hang");
                    tokio::time::sleep(d).await;
                }
                Act::Error => {
                    book::lock(&book).fault(book::now(), "client_error");
                    attempt.end = End::Failed;
                    return Err(WriteError::retryable(
                        "no connection to the datastore available",
                    ));
                }
                _ => {}
            }
            // The call runs on its own task, so a dropped attempt (write
            // timeout, cancellation) lets it finish and give its connection
            // back, as a database client lets a sent statement run: the
            // outcome stays unknown to the driver, the connection is reused.
            let permit = Arc::clone(&sink.inner.calls)
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let call = {
                let sink = sink.clone();
                tokio::spawn(async move {
                    let reply = sink.rpc(frame).await;
                    drop(permit);
                    reply
                })
            };
            let reply = call
                .await
                .unwrap_or_else(|_| Err(io::Error::other("the call's task failed")));
            let result = match reply {
                Err(e) => Err(WriteError::retryable(e)),
                Ok(Reply::Committed { discarded }) => Ok(Written::discarding(discarded as usize)),
                Ok(Reply::Busy) => Err(WriteError::retryable("the datastore is busy")),
                Ok(Reply::Rejected) => {
                    Err(WriteError::terminal("the datastore rejected the slice"))
                }
                Ok(Reply::Corrupt) => Err(WriteError::retryable(
                    "the datastore found the request corrupt",
                )),
            };
            match act {
                Act::PanicPoll => {
                    attempt.end = End::Failed;
                    book::lock(&book).fault(book::now(), "panic_poll");
                    drop(attempt);
                    std::panic::panic_any(Injected);
                }
                Act::PanicDisplay => {
                    attempt.end = End::Failed;
                    book::lock(&book).fault(book::now(), "panic_display");
                    return Err(WriteError::retryable(PanickyError));
                }
                _ => {}
            }
            attempt.end = match &result {
                Ok(w) => End::Ok(w.discarded as u32),
                Err(e) if e.is_terminal() => End::Terminal,
                Err(_) => End::Failed,
            };
            result
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_type_maps_an_index_to_the_same_wire_tenant() {
        fn check<K: NetKey>() {
            for k in [0, 1, 9, 10, 9_999] {
                assert_eq!(K::of(k).wire(), Some(u128::from(k) + 1), "{}", K::NAME);
            }
        }
        check::<TenantId>();
        check::<u64>();
        check::<String>();
        assert_eq!("other".to_owned().wire(), None);
        assert!(
            String::of(10) < String::of(2),
            "text order, not the index's"
        );
        let kinds: std::collections::BTreeSet<_> =
            (0..30).map(|s| format!("{:?}", KeyType::draw(s))).collect();
        assert_eq!(kinds.len(), 3, "every key type is drawn");
    }
}
