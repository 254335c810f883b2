//! What an outbox built with an outbox table hands its sink: the item
//! with the id of the row it came from (S-T14).

use uuid::Uuid;

use crate::sinks::Record;

/// An item relayed from the outbox table, with its row's id: the sink's
/// [`Item`](crate::Sink::Item) for an outbox built with
/// [`OutboxBuilder::table`](crate::OutboxBuilder::table) (S-T14, S-T31).
///
/// The row id identifies the item across restarts of the relay (a row not
/// yet deleted at a crash is delivered again with the same id), so a
/// sink may key its idempotency on `(tenant, row_id)`; a key derived
/// from a slice's contents does not survive a restart, because slices are
/// cut anew. A redriven dead letter gets a new row id; an item's own id
/// survives that too.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Relayed<I> {
    /// The outbox table row's id (`id`, an identity column from 1).
    pub row_id: i64,
    /// The item, as the codec decoded it.
    pub item: I,
}

impl<I> Relayed<I> {
    /// The row id as a UUID (`00000000-0000-0000-` and the id's 8 bytes):
    /// an idempotency key for sinks keyed by UUID when the item has no id
    /// of its own.
    pub fn row_uuid(&self) -> Uuid {
        Uuid::from_u64_pair(0, self.row_id as u64)
    }
}

/// A relayed [`Record`] keeps the item's own id: the idempotency key of
/// the reference sinks survives a redrive as well as a restart.
impl<R: Record> Record for Relayed<R> {
    fn id(&self) -> Uuid {
        self.item.id()
    }

    fn payload(&self) -> &[u8] {
        self.item.payload()
    }
}
