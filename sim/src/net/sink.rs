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
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use outbox::{Sink, TenantId, WriteError, Written};
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

/// The request frame writing `items` for `tenant` (both worlds' sinks).
pub fn write_frame_of(tenant: TenantId, items: &[Item]) -> Vec<u8> {
    Request {
        tenant: tenant.as_uuid().as_u128(),
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

/// The sink (see the module docs).
pub struct NetSink {
    inner: Arc<Inner>,
    /// Held by the sink the outbox was built with and by no clone: it dies
    /// with the outbox's own sink, which only the writer task (and its
    /// write tasks) keep once every handle is dropped, so the application
    /// sees the writer exit (S-W16). The clones a write makes for its
    /// calls may outlive the writer and must not keep it alive.
    alive: Option<Arc<()>>,
}

impl Clone for NetSink {
    fn clone(&self) -> Self {
        NetSink {
            inner: Arc::clone(&self.inner),
            alive: None,
        }
    }
}

impl NetSink {
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
    ) -> NetSink {
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
}

impl InFlight {
    /// Logs the attempt's start, checked by [`check::attempt::on_start`]
    /// (S-W4, I1, I2, I4, I7, I8) and [`check::i4::in_flight_within_bounds`].
    fn begin(book: &SharedBook, tenant: TenantId, items: &[Item]) -> InFlight {
        let now = book::now();
        let first = items.first().map_or(u64::MAX, |i| i.id);
        let tenant_ix = items.first().map_or(u32::MAX, |i| i.tenant);
        let mut b = book::lock(book);
        let ids: Vec<u64> = items.iter().map(|i| i.id).collect();
        let start = check::attempt::Start {
            now,
            tenant: &tenant,
            tenant_ix,
            wrong_tenant: TenantId::from_u128(u128::from(tenant_ix) + 1) != tenant
                || items.iter().any(|i| i.tenant != tenant_ix),
            ids: &ids,
            first,
        };
        for (rule, detail) in check::attempt::on_start(&b, &start) {
            b.fail(rule, detail);
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

impl Sink for NetSink {
    type Item = Item;

    fn name(&self) -> &str {
        "datastore"
    }

    fn write(
        &self,
        tenant: TenantId,
        items: &[Item],
    ) -> impl Future<Output = Result<Written, WriteError>> + Send {
        let act = self.draw();
        let mut attempt = InFlight::begin(&self.inner.book, tenant, items);
        if act == Act::PanicCreate {
            attempt.end = End::Failed;
            book::lock(&self.inner.book).fault(book::now(), "panic_create");
            drop(attempt);
            std::panic::panic_any(Injected);
        }
        let frame = write_frame_of(tenant, items);
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
