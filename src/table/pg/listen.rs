//! The listener: a connection of its own (never pooled, never through
//! pgbouncer in transaction mode), whose notifications wake the relay
//! (S-T15).

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, NoTls};

use super::error;
use crate::core::relay::{StoreError, StoreErrorKind};
use crate::table::names::TableNames;
use crate::table::store::Listener;

/// A listener on an outbox's channel: see [`Listener`]. Notifications
/// coalesce: several before a [`next`](Listener::next) wake it once.
pub struct PgListener {
    wakes: mpsc::Receiver<()>,
    _client: tokio_postgres::Client,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for PgListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgListener").finish_non_exhaustive()
    }
}

impl PgListener {
    pub(super) async fn connect(
        config: &tokio_postgres::Config,
        names: &TableNames,
    ) -> Result<Self, StoreError> {
        let (client, mut conn) = config.connect(NoTls).await.map_err(error)?;
        let (tx, wakes) = mpsc::channel(1);
        let task = tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(_))) => {
                        // Full: a wake-up is already pending.
                        let _ = tx.try_send(());
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                }
            }
        });
        let listen = client
            .batch_execute(&format!("LISTEN {}", names.channel()))
            .await;
        if let Err(e) = listen {
            task.abort();
            return Err(error(e));
        }
        Ok(PgListener {
            wakes,
            _client: client,
            task,
        })
    }
}

impl Listener for PgListener {
    async fn next(&mut self) -> Result<(), StoreError> {
        match self.wakes.recv().await {
            Some(()) => Ok(()),
            None => Err(StoreError::new(
                StoreErrorKind::Unknown,
                None,
                "the listener's connection closed",
            )),
        }
    }
}

impl Drop for PgListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}
