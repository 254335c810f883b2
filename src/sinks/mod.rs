//! Reference sinks: PostgreSQL and NATS JetStream, each behind a cargo
//! feature (`postgres`, `nats`); the default build has neither.
//!
//! Both write [`Record`]s: an item that carries its own id (a UUID, minted
//! once when the item is created, e.g. [`Envelope::new`]) and a payload of
//! bytes. The pair (tenant, item id) is the item's **idempotency key**: the
//! engine may repeat a write after an outcome it could not see (S-W5,
//! the idempotency duty of [`Sink`](crate::Sink)), and the store absorbs
//! the repeat by that key, so a slice written twice leaves one copy (I1):
//!
//! | sink | key | how a repeat is absorbed |
//! | --- | --- | --- |
//! | `postgres` | primary key `(tenant, item_id)` | `INSERT … ON CONFLICT (tenant, item_id) DO NOTHING` |
//! | `nats` | header `Nats-Msg-Id: {tenant}:{item_id}` | JetStream's duplicate window |
//!
//! The key covers repeats of any age in PostgreSQL, and repeats within the
//! stream's duplicate window (2 minutes unless configured) in JetStream.
//! Because the key is per item, an id must never be reused for different
//! content within a tenant: the second item would be taken for a repeat of
//! the first and silently absorbed.
//!
//! Errors follow the [`Sink`](crate::Sink) contract (S-A5): what may pass
//! (a lost connection, a timeout, a serialization failure, an outage) is
//! [retryable](crate::WriteError::retryable); what the data itself makes
//! impossible (a constraint violation, an oversized payload) is
//! [terminal](crate::WriteError::terminal). Each sink's module documents its
//! table of causes.

#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "postgres")]
pub mod postgres;

use uuid::Uuid;

/// What the reference sinks write: an item with an id and a payload.
///
/// The id must be fixed when the item is created, never when it is written,
/// so that every attempt of a write presents the same ids (S-W5); with
/// [`tenant`](crate::TenantId) it forms the idempotency key (see the
/// [module docs](self)). UUID v7 ids ([`Uuid::now_v7`]) sort by creation
/// time, which keeps index inserts cheap.
pub trait Record: Send + Sync + 'static {
    /// The item's id, unique within its tenant.
    fn id(&self) -> Uuid;

    /// The bytes to store (PostgreSQL `bytea`, a JetStream message body).
    fn payload(&self) -> &[u8];
}

/// A ready-made [`Record`]: an id and a payload.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Envelope {
    /// The item's id (the second half of the idempotency key).
    pub id: Uuid,
    /// The bytes to store.
    pub payload: Vec<u8>,
}

impl Envelope {
    /// An envelope with a fresh UUID v7 id (reads the wall clock and the OS
    /// random source): call it once, where the item is created.
    pub fn new(payload: impl Into<Vec<u8>>) -> Self {
        Envelope {
            id: Uuid::now_v7(),
            payload: payload.into(),
        }
    }

    /// An envelope with a given id (e.g. derived from the event it records,
    /// so that recording the same event twice is absorbed too).
    pub fn with_id(id: Uuid, payload: impl Into<Vec<u8>>) -> Self {
        Envelope {
            id,
            payload: payload.into(),
        }
    }
}

impl Record for Envelope {
    fn id(&self) -> Uuid {
        self.id
    }

    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

impl<R: Record> Record for Box<R> {
    fn id(&self) -> Uuid {
        (**self).id()
    }

    fn payload(&self) -> &[u8] {
        (**self).payload()
    }
}

impl<R: Record> Record for std::sync::Arc<R> {
    fn id(&self) -> Uuid {
        (**self).id()
    }

    fn payload(&self) -> &[u8] {
        (**self).payload()
    }
}
