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
//! # Tenant keys
//! Each sink is generic over its tenant key `K` (the
//! [`Sink::Tenant`](crate::Sink::Tenant) it declares), [`TenantId`] by
//! default, and maps it to the store through a small trait:
//!
//! | key | `postgres` column (`postgres::PgTenant`) | `nats` subject token and message id (`nats::NatsTenant`) |
//! | --- | --- | --- |
//! | [`TenantId`], [`Uuid`] | `uuid` | the hyphenated UUID |
//! | `i64` | `bigint` | the decimal number, e.g. `-7` |
//! | `u64` | `bigint`; a key above `i64::MAX` is rejected terminally ([`InvalidTenant`]) | the decimal number |
//! | `String`, `Arc<str>` | `text` | the text itself, if it is a valid subject token, else rejected terminally ([`InvalidTenant`]) |
//!
//! A key the store cannot hold is never changed to fit (no wrap, no
//! truncation, no encoding that could make two tenants one): the write is
//! rejected as [terminal](crate::WriteError::terminal) with an
//! [`InvalidTenant`] cause before any I/O, so the slice is counted lost
//! under `terminal` and logged. Check keys up front where they are minted
//! (`postgres::PgTenant::param`, `nats::NatsTenant::token`;
//! the modules exist with their features).
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

use std::error::Error as StdError;
use std::fmt;

use uuid::Uuid;

#[cfg(doc)]
use crate::TenantId;

/// A tenant key a sink cannot map to its store (a `u64` above `i64::MAX`
/// for a `bigint` column, a string that is not a NATS subject token): the
/// cause of a terminal [`WriteError`](crate::WriteError), raised before any
/// I/O.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidTenant {
    tenant: String,
    reason: &'static str,
}

impl InvalidTenant {
    /// `tenant` (rendered with `Debug`) cannot be stored, because of
    /// `reason`.
    pub fn new(tenant: &impl fmt::Debug, reason: &'static str) -> Self {
        InvalidTenant {
            tenant: format!("{tenant:?}"),
            reason,
        }
    }

    /// The tenant, as `Debug` renders it.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Why it cannot be stored.
    pub fn reason(&self) -> &str {
        self.reason
    }
}

impl fmt::Display for InvalidTenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tenant {} cannot be stored: {}",
            self.tenant, self.reason
        )
    }
}

impl StdError for InvalidTenant {}

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

/// An envelope is its id's 16 bytes and its payload's bytes, so that the
/// reference sinks' item journals with the default codec.
#[cfg(feature = "codec")]
impl serde::Serialize for Envelope {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&(self.id.as_bytes(), self.payload.as_slice()), s)
    }
}

#[cfg(feature = "codec")]
impl<'de> serde::Deserialize<'de> for Envelope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (id, payload) = <([u8; 16], Vec<u8>)>::deserialize(d)?;
        Ok(Envelope::with_id(uuid::Uuid::from_bytes(id), payload))
    }
}
