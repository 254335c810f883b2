//! `CrashSink`: the application's sink in the crash world, speaking the net
//! world's wire protocol ([`crate::net::protocol`]) to its datastore
//! host, which runs per item idempotent here. No client faults: the crash
//! world is about crashes and disks. Each call is bounded by an RPC
//! timeout; every failure is retryable.
//!
//! It notes every item of an earlier life it is handed ([`Ledger::replayed`]):
//! the journal recovered it, so it must be counted recovered (D4). An item
//! whose journal record a rotten byte hit must never be handed to it again
//! (D4: a corrupt record's item is counted lost, never read back), nor an
//! item staged with another codec version than the life's (S-J14: never
//! decoded by another version).
//!
//! [`Ledger::replayed`]: super::ledger::Ledger::replayed

use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use outbox::{Sink, TenantId, WriteError, Written};
use turmoil::net::TcpStream;

use super::disk::{self, SharedFaults};
use super::ledger::{self, SharedLedger};
use crate::net::book::{self, Admit, End, Ev, SharedBook};
use crate::net::datastore::{HOST, PORT};
use crate::net::protocol::{read_frame, write_frame, Reply};
use crate::net::sink::{write_frame_of, Item};

/// A call to the datastore gives up after this long.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(2);

/// The sink (see the module docs).
#[derive(Clone)]
pub struct CrashSink {
    book: SharedBook,
    ledger: SharedLedger,
    faults: SharedFaults,
    idle: Arc<Mutex<Vec<TcpStream>>>,
}

impl CrashSink {
    /// A sink logging to `book` and `ledger`, knowing the disk's rotten
    /// records from `faults`.
    pub fn new(book: SharedBook, ledger: SharedLedger, faults: SharedFaults) -> CrashSink {
        CrashSink {
            book,
            ledger,
            faults,
            idle: Arc::new(Mutex::new(Vec::new())),
        }
    }

    async fn call(&self, frame: Vec<u8>) -> io::Result<Reply> {
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => TcpStream::connect((HOST, PORT)).await?,
        };
        write_frame(&mut conn, &frame).await?;
        let body = read_frame(&mut conn)
            .await?
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "the datastore hung up"))?;
        let reply = Reply::decode(&body)?;
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(conn);
        Ok(reply)
    }

    /// Notes `items` handed to the sink for `tenant`; `false` when one
    /// of them was never staged so (D3) or comes from a rotten record
    /// (D4): then nothing is sent (an item read back from a corrupt record
    /// may ask for gigabytes of payload).
    fn note(&self, tenant: &TenantId, items: &[Item]) -> bool {
        let invented = {
            let b = book::lock(&self.book);
            items.iter().copied().find(|i| {
                let staged = b.items.get(i.id as usize);
                !staged.is_some_and(|s| {
                    s.admit == Admit::Accepted
                        && s.tenant == i.tenant
                        && TenantId::from_u128(u128::from(i.tenant) + 1) == *tenant
                })
            })
        };
        if let Some(i) = invented {
            book::lock(&self.book).fail(
                "D3",
                format!(
                    "the sink was handed item #{} (tenant {}, {} bytes) for tenant {tenant}, \
                     never staged so",
                    i.id, i.tenant, i.size
                ),
            );
            return false;
        }
        let rotten: Vec<u64> = {
            let f = disk::lock(&self.faults);
            items
                .iter()
                .map(|i| i.id)
                .filter(|id| f.rotten_items.contains(id))
                .collect()
        };
        if !rotten.is_empty() {
            book::lock(&self.book).fail(
                "D4",
                format!(
                    "items {rotten:?} were handed to the sink after a rotten byte hit their \
                     journal records: a corrupt record was read back as an item"
                ),
            );
            return false;
        }
        let mut l = ledger::lock(&self.ledger);
        if let Some((rule, detail)) =
            super::check::s_j14::read_by_its_version(&l, items.iter().map(|i| i.id))
        {
            drop(l);
            book::lock(&self.book).fail(rule, detail);
            return false;
        }
        let life = l.life;
        // S-R3: an item of an earlier life already past its age at this
        // life's recovery is expired, never written.
        let born_before: Vec<u64> = items
            .iter()
            .map(|i| i.id)
            .filter(|&id| l.item_life.get(id as usize).is_some_and(|&b| b < life))
            .collect();
        if let Some(at) = l.recovered_at.filter(|_| !born_before.is_empty()) {
            // The book after the ledger is let go, as everywhere here.
            drop(l);
            let mut b = book::lock(&self.book);
            let broken = super::check::s_r3::not_written_past_its_age(&b, &born_before, at);
            if let Some((rule, detail)) = broken {
                b.fail(rule, detail);
                return false;
            }
            drop(b);
            l = ledger::lock(&self.ledger);
        }
        l.handed.extend(items.iter().map(|i| i.id));
        for i in items {
            if l.item_life
                .get(i.id as usize)
                .is_some_and(|&born| born < life)
            {
                l.replayed.insert(i.id);
            }
        }
        true
    }
}

impl Sink for CrashSink {
    type Tenant = TenantId;
    type Item = Item;

    fn name(&self) -> &str {
        "datastore"
    }

    fn write(
        &self,
        tenant: &TenantId,
        items: &[Item],
    ) -> impl Future<Output = Result<Written, WriteError>> + Send {
        let staged = self.note(tenant, items);
        let first = items.first().map_or(u64::MAX, |i| i.id);
        let tenant_ix = items.first().map_or(u32::MAX, |i| i.tenant);
        book::lock(&self.book).record(
            book::now(),
            Ev::Attempt {
                tenant: tenant_ix,
                first,
                len: items.len(),
                attempt: 1,
            },
        );
        let frame = staged.then(|| write_frame_of(tenant.as_uuid().as_u128(), items));
        // S-J17: a poison item takes the process down in its write (the
        // world crashes the host); the write never ends.
        let poison = {
            let mut l = ledger::lock(&self.ledger);
            let hit = items.iter().map(|i| i.id).find(|id| l.poison.contains(id));
            if let Some(id) = hit {
                l.poison_hit.get_or_insert(id);
            }
            hit.is_some()
        };
        let sink = self.clone();
        async move {
            if poison {
                std::future::pending::<()>().await;
            }
            let Some(frame) = frame else {
                return Err(WriteError::retryable("an item never staged (D3 broken)"));
            };
            let reply = match tokio::time::timeout(RPC_TIMEOUT, sink.call(frame)).await {
                Ok(r) => r,
                Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time")),
            };
            if reply.is_err() {
                sink.idle
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clear();
            }
            let (result, end) = match reply {
                Ok(Reply::Committed { discarded }) => (
                    Ok(Written::discarding(discarded as usize)),
                    End::Ok(discarded),
                ),
                Ok(other) => (
                    Err(WriteError::retryable(format!(
                        "the datastore answered {other:?}"
                    ))),
                    End::Failed,
                ),
                Err(e) => (Err(WriteError::retryable(e)), End::Failed),
            };
            book::lock(&sink.book).record(book::now(), Ev::AttemptEnd { first, end });
            result
        }
    }
}
