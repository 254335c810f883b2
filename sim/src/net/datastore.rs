//! The datastore host: an idempotent store behind the wire protocol.
//!
//! A write commits once per slice identity (the tenant and the slice's first
//! item id, like a unique key); a repeated attempt of a committed slice is
//! answered `Committed` again and changes nothing. The store keeps every
//! attempt's slice it saw per identity (I2: all identical) and each tenant's
//! committed items in commit order (I1). Its state lives outside the host's
//! software, so it survives a crash and restart like a durable database.
//!
//! Faults, drawn per request from the seed while the weather is not healed:
//! a retryable error, a commit whose reply is lost (the connection drops
//! after the commit), a terminal rejection, items consumed without writing
//! (S-W12), slow and hung commits.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::Rng;
use turmoil::net::{TcpListener, TcpStream};

use super::book::{self, Ev, SharedBook};
use super::faults::Rates;
use super::protocol::{read_frame, write_frame, Reply, Request, WireItem};
use crate::draw::{log_uniform, SimRng};

/// The datastore's host name.
pub const HOST: &str = "datastore";
/// The datastore's port.
pub const PORT: u16 = 5432;

/// What the datastore knows of one slice identity.
#[derive(Clone, Debug)]
pub struct SliceSeen {
    /// The slice of the first attempt that reached the store.
    pub items: Vec<WireItem>,
    /// Attempts that reached the store.
    pub attempts: u32,
    /// Committed, with this many items discarded.
    pub committed: Option<u32>,
    /// Rejected for good.
    pub rejected: bool,
}

/// The durable state: survives crashes and restarts.
#[derive(Debug)]
pub struct Durable {
    /// Per tenant index, the committed item ids in commit order.
    pub by_tenant: BTreeMap<u32, Vec<u64>>,
    /// Per identity (tenant, first item id), what was seen.
    pub slices: BTreeMap<(u128, u64), SliceSeen>,
    /// Every item id committed, to catch one committed twice.
    committed_items: BTreeSet<u64>,
    /// Idempotent per item rather than per slice (the crash world: after
    /// a crash the journal stages items again in slices of other shapes,
    /// and an item written twice is absorbed, as a unique key on the item
    /// id would absorb it).
    pub per_item: bool,
    /// Items that reached the store again after their first commit and
    /// changed nothing (per-item mode).
    pub repeats: u64,
    rng: SimRng,
    rates: Rates,
    storm_factor: u32,
}

/// The datastore's state, shared with the world for the end checks.
pub type SharedStore = Arc<Mutex<Durable>>;

/// Locks the store.
pub fn lock(store: &SharedStore) -> MutexGuard<'_, Durable> {
    store.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Durable {
    /// An empty store whose faults come from `rng` at `rates`.
    pub fn new(rng: SimRng, rates: Rates, storm_factor: u32) -> Durable {
        Durable {
            by_tenant: BTreeMap::new(),
            slices: BTreeMap::new(),
            committed_items: BTreeSet::new(),
            per_item: false,
            repeats: 0,
            rng,
            rates,
            storm_factor,
        }
    }
}

/// What the datastore does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    Ok,
    Error,
    Ghost,
    Reject,
    Discard(u32),
    Wait(Duration, &'static str),
}

/// The host software: accepts connections and serves each on its own task
/// until the host crashes.
pub async fn serve(store: SharedStore, book: SharedBook) -> turmoil::Result {
    let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
    book::lock(&book).record(book::now(), Ev::Net("datastore listening"));
    loop {
        let (conn, _) = listener.accept().await?;
        let store = Arc::clone(&store);
        let book = Arc::clone(&book);
        // On the host's local set, not the runtime: a crash drops a
        // runtime's tasks in an order of tokio's global task ids (which
        // differ between two runs of a seed in one process), and each
        // dropped connection sends its peer a message; a local set drops
        // its tasks in the order they were spawned.
        tokio::task::spawn_local(async move {
            // A connection error only ends this connection.
            let _ = connection(conn, store, book).await;
        });
    }
}

async fn connection(
    mut conn: TcpStream,
    store: SharedStore,
    book: SharedBook,
) -> std::io::Result<()> {
    while let Some(body) = read_frame(&mut conn).await? {
        let Some(req) = Request::decode(&body)? else {
            book::lock(&book).fail(
                "protocol",
                "a request reached the datastore with a wrong payload byte".to_string(),
            );
            write_frame(&mut conn, &Reply::Corrupt.encode()).await?;
            continue;
        };
        match handle(&req, &store, &book).await {
            Some(reply) => write_frame(&mut conn, &reply.encode()).await?,
            // The reply is lost: the connection drops after the commit.
            None => return Ok(()),
        }
    }
    Ok(())
}

fn draw(d: &mut Durable, book: &SharedBook, len: usize) -> Act {
    let weather = book::lock(book).weather;
    if weather.healed {
        return Act::Ok;
    }
    let r = if weather.storm {
        d.rates.times(d.storm_factor)
    } else {
        d.rates
    };
    let mut x = d.rng.random_range(0..1_000u32);
    let table = [
        (r.error, 0),
        (r.ghost, 1),
        (r.reject, 2),
        (r.discard, 3),
        (r.slow, 4),
        (r.hang, 5),
    ];
    for (rate, which) in table {
        if x < rate {
            return match which {
                0 => Act::Error,
                1 => Act::Ghost,
                2 => Act::Reject,
                3 => Act::Discard(d.rng.random_range(1..=len.min(3) as u32)),
                4 => Act::Wait(
                    Duration::from_millis(log_uniform(&mut d.rng, 10, 2_000)),
                    "slow_commit",
                ),
                _ => Act::Wait(
                    Duration::from_millis(log_uniform(&mut d.rng, 5_000, 120_000)),
                    "hung_commit",
                ),
            };
        }
        x -= rate;
    }
    Act::Ok
}

/// Per-item mode: commits every item not committed yet, in the request's
/// order, and counts the others as repeats; never a fault. Returns the
/// items committed now, for the crash world's checks (D2, D3), which the
/// book's `on_commit` hook runs.
fn commit_per_item(req: &Request, d: &mut Durable, book: &SharedBook) -> Reply {
    let now = book::now();
    let mut fresh = Vec::new();
    for item in &req.items {
        if d.committed_items.insert(item.id) {
            d.by_tenant.entry(item.tenant).or_default().push(item.id);
            fresh.push(*item);
        } else {
            d.repeats += 1;
        }
    }
    let mut b = book::lock(book);
    if let Some(hook) = b.on_commit {
        for (rule, detail) in hook(&b, req.tenant, &fresh, d) {
            b.fail(rule, detail);
        }
    }
    b.record(
        now,
        Ev::Commit {
            tenant: req.items[0].tenant,
            first: req.items[0].id,
            len: req.items.len(),
            fresh: !fresh.is_empty(),
        },
    );
    Reply::Committed { discarded: 0 }
}

/// Serves one request; `None` drops the reply.
async fn handle(req: &Request, store: &SharedStore, book: &SharedBook) -> Option<Reply> {
    let Some(first) = req.items.first().map(|i| i.id) else {
        book::lock(book).fail("protocol", "an empty write reached the datastore".into());
        return Some(Reply::Corrupt);
    };
    let key = (req.tenant, first);
    let act = {
        let mut d = lock(store);
        if d.per_item {
            // The crash world's store: only retryable errors, never a
            // reject, discard or lost reply.
            if draw(&mut d, book, req.items.len()) == Act::Error {
                book::lock(book).fault(book::now(), "datastore_error");
                return Some(Reply::Busy);
            }
            return Some(commit_per_item(req, &mut d, book));
        }
        let act = draw(&mut d, book, req.items.len());
        let seen = d.slices.entry(key).or_insert_with(|| SliceSeen {
            items: req.items.clone(),
            attempts: 0,
            committed: None,
            rejected: false,
        });
        seen.attempts += 1;
        if seen.items != req.items {
            let (a, b) = (seen.items.len(), req.items.len());
            book::lock(book).fail(
                "I2",
                format!(
                    "two attempts of slice #{first} (tenant {}) differ at the datastore: \
                     {a} items then {b} items",
                    req.tenant
                ),
            );
        }
        act
    };
    if let Act::Wait(d, kind) = act {
        book::lock(book).fault(book::now(), kind);
        tokio::time::sleep(d).await;
    }
    let mut d = lock(store);
    let d = &mut *d;
    let now = book::now();
    match act {
        Act::Error => {
            book::lock(book).fault(now, "datastore_error");
            return Some(Reply::Busy);
        }
        Act::Reject => {
            let seen = d.slices.get_mut(&key).expect("seen above");
            if seen.committed.is_none() {
                if !seen.rejected {
                    book::lock(book).fault(now, "reject");
                }
                seen.rejected = true;
            }
        }
        _ => {}
    }
    let seen = d.slices.get_mut(&key).expect("seen above");
    if seen.rejected {
        return Some(Reply::Rejected);
    }
    let fresh = seen.committed.is_none();
    if fresh {
        let discarded = match act {
            Act::Discard(n) => {
                book::lock(book).fault(now, "discard");
                n
            }
            _ => 0,
        };
        seen.committed = Some(discarded);
        let keep = req.items.len() - discarded as usize;
        let mut bk = book::lock(book);
        for item in &req.items {
            if u128::from(item.tenant) + 1 != req.tenant {
                bk.fail(
                    "I1",
                    format!(
                        "item #{} of tenant {} reached the datastore in a write for tenant {}",
                        item.id,
                        item.tenant,
                        req.tenant - 1
                    ),
                );
            }
        }
        let tenant = req.items[0].tenant;
        let rows = d.by_tenant.entry(tenant).or_default();
        for item in &req.items[..keep] {
            if !d.committed_items.insert(item.id) {
                bk.fail(
                    "I1",
                    format!("item #{} committed by two different slices", item.id),
                );
            }
            rows.push(item.id);
        }
        bk.record(
            now,
            Ev::Commit {
                tenant,
                first,
                len: req.items.len(),
                fresh: true,
            },
        );
    } else {
        book::lock(book).record(
            now,
            Ev::Commit {
                tenant: req.items[0].tenant,
                first,
                len: req.items.len(),
                fresh: false,
            },
        );
    }
    let discarded = seen.committed.unwrap_or(0);
    if act == Act::Ghost {
        book::lock(book).fault(now, "lost_reply");
        return None;
    }
    Some(Reply::Committed { discarded })
}
