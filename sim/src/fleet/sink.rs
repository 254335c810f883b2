//! The fleet's sink: a datastore sharing the store host's database, each
//! write one sink transaction fenced by its epoch (S-T23): the epoch
//! check under the epoch row's shared lock, then the datastore's log of
//! every row of the write with its epoch, then the commit. The datastore
//! absorbs repeats (a row accepted again) by row id.
//!
//! At a write's start it checks S-FW5 (the lease it runs under is live on
//! the store's clock); at its commit, S-FW2 (the row is committed, never
//! rolled back) and S-FW4 (its epoch is still the installed one).

use std::time::Duration;

use outbox::codec::{Codec, Postcard};
use outbox::core::relay::Fenced;
use outbox::table::model::Model;
use outbox::table::{partition_of, EpochTx, Relayed, Store};
use outbox::{Sink, WriteEpoch, WriteError, Written};

use super::book::{self, Book, Fate, SharedBook};
use super::link::LinkStore;

/// One host's sink.
pub struct FleetSink {
    /// The host's index.
    pub host: usize,
    /// The host's instance name (its lease owner name).
    pub instance: String,
    /// The host's link to the store.
    pub link: LinkStore,
    /// The store's database, for the checks (read without the link).
    pub model: Model,
    /// The book.
    pub book: SharedBook,
    /// P.
    pub partitions: u32,
    /// The datastore absorbs a repeat only within this window of the
    /// row's first acceptance (`None`: of any age).
    pub repeat_window: Option<Duration>,
    /// The lease ttl (repeats older are counted).
    pub ttl: Duration,
}

impl FleetSink {
    /// S-FW5: the lease row of `epoch`'s partition, on the store's clock
    /// now, is live, this host's and of this epoch.
    fn check_start(&self, epoch: WriteEpoch) {
        let rows = super::now(self.model.store().leases()).unwrap_or_default();
        let row = rows.iter().find(|r| r.partition == epoch.partition);
        let live = row.is_some_and(|r| {
            r.owner.as_deref() == Some(self.instance.as_str())
                && r.epoch == epoch.epoch
                && r.expires_in > Duration::ZERO
        });
        if !live {
            let mut b = book::lock(&self.book);
            b.count("late_write_start");
            if super::ENFORCE_S_F5 {
                b.fail(
                    "S-FW5",
                    format!(
                        "host {} started a write of partition {} under epoch {} while the \
                         store's lease row is {row:?}",
                        self.instance, epoch.partition, epoch.epoch
                    ),
                );
            }
        }
    }

    /// Logs the write's rows as accepted (the commit's instant).
    /// `installed`: the epoch installed at the commit, `None` for an
    /// unfenced write (no epoch to check).
    fn accept(&self, epoch: WriteEpoch, installed: Option<Option<u64>>, items: &[Relayed<u64>]) {
        let mut b = book::lock(&self.book);
        b.accepted_writes += 1;
        let seq = b.next_seq();
        b.note(
            "accept",
            self.host as u64,
            u64::from(epoch.partition),
            epoch.epoch,
        );
        if let Some(installed) = installed.filter(|&i| i != Some(epoch.epoch)) {
            b.fail(
                "S-FW4",
                format!(
                    "a write of partition {} under epoch {} committed while epoch {installed:?} \
                     was installed",
                    epoch.partition, epoch.epoch
                ),
            );
        }
        for item in items {
            let fate = b.rows.get(&item.row_id).map(|r| r.fate);
            if fate != Some(Fate::Committed) {
                b.fail(
                    "S-FW2",
                    format!("row {} delivered while its stage is {fate:?}", item.row_id),
                );
            }
            let first = (seq, self.host, epoch.epoch);
            b.last_accept.insert(item.row_id, (seq, epoch.epoch));
            match b.delivered.entry(item.row_id) {
                std::collections::btree_map::Entry::Occupied(_) => self.repeat(&mut b, item.row_id),
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(first);
                    let now = b.now;
                    b.accepted_at.insert(item.row_id, now);
                }
            }
        }
    }

    /// A row accepted again: absorbed within the datastore's window, else
    /// stored again (S-FW1: delivered twice).
    fn repeat(&self, b: &mut Book, id: i64) {
        b.repeats += 1;
        b.count("repeat");
        let age = b
            .now
            .saturating_sub(b.accepted_at.get(&id).copied().unwrap_or(b.now));
        if age > self.ttl {
            b.count("repeat_older_than_ttl");
        }
        if let Some(window) = self.repeat_window.filter(|w| age > *w) {
            b.fail(
                "S-FW1",
                format!(
                    "row {id} accepted again {age:?} after its first acceptance, past the \
                     datastore's repeat window of {window:?}: delivered twice"
                ),
            );
        }
    }

    /// The epoch installed for `partition` now (the model answers at once).
    fn installed(&self, partition: u32) -> Option<u64> {
        let epochs = super::now(self.model.store().sink_epochs()).unwrap_or_default();
        epochs
            .iter()
            .find(|e| e.partition == partition)
            .map(|e| e.epoch)
    }
}

impl FleetSink {
    /// A write with a poison item is refused terminally (the datastore
    /// finds it malformed, before anything is sent); its rows are noted
    /// as refused, the cause of their dead letters.
    fn refuse_poison(&self, items: &[Relayed<u64>]) -> Option<WriteError> {
        let mut b = book::lock(&self.book);
        let poison = items
            .iter()
            .find(|i| b.rows.get(&i.row_id).is_some_and(|r| r.poison))?;
        let id = poison.row_id;
        b.count("rejected");
        b.note("rejected", self.host as u64, id as u64, items.len() as u64);
        let seq = b.next_seq();
        b.rejected.extend(items.iter().map(|i| (i.row_id, seq)));
        Some(WriteError::terminal(format!(
            "fleet datastore: row {id} is malformed"
        )))
    }

    /// The canary `epoch_check_at_start`: the epoch is read at the
    /// transaction's start, not under the share lock held to its commit,
    /// so an install (a takeover) can commit between the check and the
    /// commit of a paused zombie.
    async fn write_checked_at_start(
        &self,
        epoch: WriteEpoch,
        items: &[Relayed<u64>],
    ) -> Result<Written, WriteError> {
        let epochs = self.link.sink_epochs().await.map_err(retryable)?;
        let current = epochs.iter().find(|e| e.partition == epoch.partition);
        if current.map(|e| e.epoch) != Some(epoch.epoch) {
            book::lock(&self.book).count("stale_write");
            return Err(WriteError::stale_epoch("superseded (read at the start)"));
        }
        let tx = self.link.begin_epoch_tx().await.map_err(retryable)?;
        tx.commit_then(|| self.accept(epoch, Some(self.installed(epoch.partition)), items))
            .await
            .map_err(retryable)?;
        Ok(Written::ALL)
    }
}

fn retryable(e: impl std::fmt::Display) -> WriteError {
    WriteError::retryable(format!("fleet datastore: {e}"))
}

impl Sink for FleetSink {
    type Tenant = u64;
    type Item = Relayed<u64>;

    fn name(&self) -> &str {
        "fleet"
    }

    /// A write without an epoch: the writer of an outbox under leases
    /// passes each write's epoch (S-E8); until it does, the datastore
    /// accepts the write unfenced and the world counts it
    /// (`write_without_epoch`), or fails S-FW4 with [`super::EPOCHS_REQUIRED`].
    async fn write(&self, tenant: &u64, items: &[Relayed<u64>]) -> Result<Written, WriteError> {
        let mut bytes = Vec::new();
        let _ = Codec::<u64, u64>::encode_tenant(&Postcard, tenant, &mut bytes);
        let partition = partition_of(&bytes, self.partitions);
        {
            let mut b = book::lock(&self.book);
            b.count("write_without_epoch");
            if super::EPOCHS_REQUIRED {
                b.fail(
                    "S-FW4",
                    format!(
                        "host {} was asked for a write without an epoch",
                        self.instance
                    ),
                );
                return Err(WriteError::retryable("a write without an epoch"));
            }
        }
        let tx = self.link.begin_epoch_tx().await.map_err(retryable)?;
        tx.commit_then(|| self.accept(WriteEpoch::new(partition, 0), None, items))
            .await
            .map_err(retryable)?;
        Ok(Written::ALL)
    }

    async fn write_with_epoch(
        &self,
        epoch: WriteEpoch,
        _tenant: &u64,
        items: &[Relayed<u64>],
    ) -> Result<Written, WriteError> {
        self.check_start(epoch);
        if let Some(refused) = self.refuse_poison(items) {
            return Err(refused);
        }
        if super::canary::on("epoch_check_at_start") {
            return self.write_checked_at_start(epoch, items).await;
        }
        let mut tx = self.link.begin_epoch_tx().await.map_err(retryable)?;
        if !super::canary::on("sink_no_epoch_check") {
            match tx.check_epochs(&[(epoch.partition, epoch.epoch)]).await {
                Ok(Fenced::Done(())) => {}
                Ok(Fenced::Stale) => {
                    book::lock(&self.book).count("stale_write");
                    let _ = tx.rollback().await;
                    return Err(WriteError::stale_epoch(format!(
                        "epoch {} of partition {} is superseded",
                        epoch.epoch, epoch.partition
                    )));
                }
                Err(e) => return Err(retryable(e)),
            }
        }
        tx.commit_then(|| self.accept(epoch, Some(self.installed(epoch.partition)), items))
            .await
            .map_err(retryable)?;
        Ok(Written::ALL)
    }
}
