//! The journal's part of building an outbox (D1-D6): the builder's
//! `journal` calls, opening the journal and staging what it recovers,
//! spawning its commit task, and [`Outbox::sync`].

use std::sync::Arc;

use super::Journal;
use crate::core::{Engine, Time};
use crate::driver::shared::Shared;
use crate::driver::{BuildError, OutboxBuilder};
use crate::sink::Sink;
use crate::Outbox;

/// A journal to open at build: where, and with which codec.
pub(crate) type Setup<K, I> = (
    crate::journal::JournalConfig,
    Box<dyn crate::journal::Codec<K, I>>,
);

/// What the journal's commit task runs.
pub(crate) type CommitTask = crate::journal::Committer<Box<dyn crate::journal::Storage>>;

/// An open journal and the committer its task runs.
pub(crate) type OpenedJournal<K, I> = (Arc<Journal<K, I>>, CommitTask);

impl<S: Sink> OutboxBuilder<S> {
    /// Journals every accepted item to disk, so that pending items survive
    /// a crash of the process and are staged again when an outbox is built
    /// on the same directory (feature `journal`; D1-D6). Items and tenants
    /// are encoded with [`Postcard`](crate::journal::Postcard) (serde); see
    /// [`journal_with_codec`](Self::journal_with_codec) for another
    /// encoding. Off by default.
    ///
    /// What survives: every item staged before a [`sync`](Outbox::sync)
    /// that answered `Ok` (D1); an item staged less than
    /// `sync_interval` before a crash may be lost uncounted. See the
    /// [`journal`](crate::journal) module.
    pub fn journal(self, config: crate::journal::JournalConfig) -> Self
    where
        S::Tenant: serde::Serialize + serde::de::DeserializeOwned,
        S::Item: serde::Serialize + serde::de::DeserializeOwned,
    {
        self.journal_with_codec(config, crate::journal::Postcard)
    }

    /// Like [`journal`](Self::journal), encoding with `codec`.
    pub fn journal_with_codec(
        mut self,
        config: crate::journal::JournalConfig,
        codec: impl crate::journal::Codec<S::Tenant, S::Item>,
    ) -> Self {
        self.journal = Some((config, Box::new(codec)));
        self
    }
}

impl<S: Sink> Outbox<S> {
    /// A durability barrier (feature `journal`; D1): answers `Ok` once
    /// every item staged before the call, and every done mark recorded
    /// before it, is on disk (written, then `fdatasync`). The call takes
    /// effect at once; the future only waits for the answer. Costs one
    /// group commit, shared with every other caller in the same round.
    ///
    /// # Errors
    /// [`SyncError::NoJournal`](crate::SyncError::NoJournal) without a
    /// journal; `Failed` when the commit failed; `Down` while the journal
    /// is failing or pending items staged during a fault are in memory
    /// only (S-J5); `Closed` once the journal stopped.
    pub fn sync(
        &self,
    ) -> impl std::future::Future<Output = Result<(), crate::SyncError>> + Send + 'static {
        let journal = self.shared().journal.clone();
        let synced = journal.as_ref().map(|j| j.sync());
        async move {
            match synced {
                Some(synced) => synced.await,
                None => Err(crate::SyncError::NoJournal),
            }
        }
    }
}

/// Opens the journal of `setup`, if any, and stages what it recovers into
/// `engine`, per tenant in staging order, before any new stage (D2, D4).
///
/// # Errors
/// [`BuildError::Journal`]: the directory is unusable, locked, or holds a
/// foreign file.
pub(crate) fn open<K: crate::TenantKey, I: Send + 'static>(
    setup: Option<Setup<K, I>>,
    name: &str,
    engine: &mut Engine<K, I>,
) -> Result<Option<OpenedJournal<K, I>>, BuildError> {
    let Some((config, codec)) = setup else {
        return Ok(None);
    };
    let dir = config.dir.display().to_string();
    let opened = Journal::open(config, codec, name).map_err(BuildError::Journal)?;
    let r = &opened.report;
    // S-R3: an item keeps the age it had on the wall clock, at most just
    // past `max_item_age` (one past it stays past it), on an engine clock
    // that starts that far in.
    let max_age = crate::driver::shared::head_start(engine.config());
    let mut items: Vec<_> = (opened.items.into_iter())
        .zip(opened.ages.iter().map(|age| (*age).min(max_age)))
        .collect();
    if crate::journal::canary::on(crate::journal::canary::REORDER) {
        items.reverse();
    }
    let durable = items
        .into_iter()
        .map(|((tenant, item), age)| crate::core::Durable {
            tenant,
            item,
            age,
            // The journal's marks count each tenant's items: no keys needed.
            key: None,
        });
    // Logged below, with the recovery's report.
    let now = Time::from_elapsed(max_age);
    let _ = engine.stage_durable(now, durable, r.unreadable);
    engine.recover_other_version(r.other_version);
    // S-J17: the suspects of a crash go alone; the poisoned are given up.
    for (tenant, n) in opened.alone {
        engine.write_alone(tenant, n);
    }
    // S-J16: what an earlier life attempted may be in the store.
    for (tenant, n) in opened.tried {
        engine.tried_before(tenant, n);
    }
    let poisoned = opened.poisoned.len();
    for (tenant, item) in opened.poisoned {
        engine.recover_poisoned(now, tenant, vec![item]);
    }
    if poisoned > 0 {
        tracing::error!(
            outbox = name,
            dir = %dir,
            poisoned,
            reason = crate::LostReason::Poisoned.as_str(),
            "journal recovery gave up items whose writes crashes cut max_crash_attempts times"
        );
    }
    log_recovery(r, name, &dir);
    Ok(Some((opened.journal, opened.committer)))
}

/// Logs what a recovery found: an error for items it counted lost, else
/// what it brought back.
fn log_recovery(r: &crate::journal::RecoveryReport, name: &str, dir: &str) {
    if r.other_version > 0 {
        tracing::error!(
            outbox = name,
            dir = %dir,
            other_version = r.other_version,
            reason = crate::LostReason::OtherVersion.as_str(),
            "journal recovery refused items of another codec version; they are counted lost"
        );
    }
    if r.unreadable > 0 || r.damaged_bytes > 0 || r.damaged_headers > 0 {
        tracing::error!(
            outbox = name,
            dir = %dir,
            recovered = r.recovered,
            unreadable = r.unreadable,
            damaged_bytes = r.damaged_bytes,
            damaged_headers = r.damaged_headers,
            reason = crate::LostReason::JournalUnreadable.as_str(),
            "journal recovery found damaged records; their items are counted lost"
        );
    } else if r.segments > 0 {
        tracing::info!(
            outbox = name,
            dir = %dir,
            recovered = r.recovered,
            done = r.done,
            torn_bytes = r.torn_bytes,
            segments = r.segments,
            "journal recovered"
        );
    }
}

/// Spawns the journal's commit task on the outbox's runtime, tracked with
/// the writer (S-J6: `closed` waits for it).
pub(crate) fn spawn<S: Sink>(shared: &Shared<S>, committer: Option<CommitTask>) {
    if let (Some(journal), Some(committer)) = (&shared.journal, committer) {
        drop(
            shared
                .tasks
                .spawn_on(Arc::clone(journal).run(committer), shared.runtime()),
        );
    }
}
