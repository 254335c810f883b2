//! The journal's commit task (S-J1, S-J5): asks the core's journal
//! machine for the next batch, carries it out on the blocking pool (never
//! under the outbox's lock), hands back what happened, and answers, logs
//! and counts what the machine says. It decides nothing.

use std::io;
use std::sync::Arc;

use tokio::time::Instant;

use super::{Inner, Journal};
use crate::contain;
use crate::core::journal::{Batch, Event, Executed};
use crate::core::Time;
use crate::journal::format::Schema;
use crate::journal::{Committer, Storage};

/// The committer, its batch and what it did, back from the blocking pool
/// (`None`: the blocking task was lost, and the batch with it).
type Back = (Option<Batch>, Executed);

impl<K, I> Journal<K, I>
where
    K: Ord + std::hash::Hash + Clone + Send + 'static,
    I: Send + 'static,
{
    /// The commit task: rounds until the machine closes (S-J1, S-J5).
    pub(crate) async fn run(self: Arc<Self>, mut committer: Committer<Box<dyn Storage>>) {
        // The machine's clock (S-C1: the core takes time as input).
        let clock = Clock(Instant::now());
        loop {
            let (batch, timeout) = {
                let mut g = self.lock();
                let batch = g.state.poll_batch(clock.now());
                self.drain(&mut g, None);
                if batch.is_none() && g.state.is_closed() {
                    break;
                }
                (batch, g.state.poll_timeout())
            };
            match batch {
                Some(batch) => {
                    let (batch, done) = self.carry_out(&mut committer, batch).await;
                    let error = done.error.as_ref().map(ToString::to_string);
                    let mut g = self.lock();
                    g.state.handle_executed(clock.now(), batch, done);
                    self.drain(&mut g, error.as_deref());
                    drop(g);
                    // Done marks on disk and segments deleted give room
                    // back: a `stage_wait` on a full journal tries again.
                    self.staging.room.notify_waiters();
                }
                None => self.wait(clock, timeout).await,
            }
        }
        drop(committer);
        // A suspect's lone attempt waiting for the journal goes (S-J17).
        self.resumed.notify_waiters();
        tracing::debug!(outbox = %self.name, "journal closed");
    }

    /// Waits for a reason to poll the machine again: a kick now, a wake
    /// (something buffered), or its timeout.
    async fn wait(&self, clock: Clock, timeout: Option<Time>) {
        let sleep = async {
            match timeout {
                Some(at) => tokio::time::sleep_until(clock.instant(at)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = self.staging.now.notified() => {}
            () = self.staging.soon.notified() => self.lock().state.handle_wake(clock.now()),
            () = sleep => {}
        }
    }

    /// Carries `batch` out: nothing for an empty one, on the task itself
    /// with `inline_io`, else on the blocking pool.
    async fn carry_out(&self, committer: &mut Committer<Box<dyn Storage>>, batch: Batch) -> Back {
        if batch.is_empty() {
            let done = Executed::all(&batch);
            return (Some(batch), done);
        }
        let started = Instant::now();
        let back = if self.inline_io {
            let mut batch = batch;
            let done = commit_contained(committer, &mut batch);
            (Some(batch), done)
        } else {
            let mut c =
                std::mem::replace(committer, Committer::new(Box::new(Gone), Schema::default()));
            let mut batch = batch;
            let joined = tokio::task::spawn_blocking(move || {
                let done = commit_contained(&mut c, &mut batch);
                (c, batch, done)
            })
            .await;
            match joined {
                Ok((c, batch, done)) => {
                    *committer = c;
                    (Some(batch), done)
                }
                Err(_) => (None, failure("the journal commit task was lost")),
            }
        };
        if back.0.is_some() {
            self.metrics
                .sync_latency
                .record(started.elapsed().as_secs_f64());
        }
        back
    }

    /// Answers the sync callers and logs and counts the machine's events
    /// (`error`: the last batch's failure, for the incident's log line).
    fn drain(&self, g: &mut Inner<K, super::Waiter>, error: Option<&str>) {
        g.answer();
        while let Some(event) = g.state.poll_event() {
            self.on_event(g, event, error);
        }
        self.export(g);
    }

    fn on_event(&self, g: &mut Inner<K, super::Waiter>, event: Event, error: Option<&str>) {
        let (outbox, dir) = (&self.name, &self.dir);
        match event {
            Event::Failed { opened, undurable } => {
                self.metrics.faults.increment(1);
                if opened {
                    // Once per incident (S-A6 in spirit): the first failure.
                    tracing::error!(
                        outbox = %outbox,
                        dir = %dir,
                        error = error.unwrap_or("unknown"),
                        undurable,
                        "journal commit failed; items are held in memory only until it works \
                         again (counted in outbox_items_unjournaled_total)"
                    );
                }
            }
            Event::Unjournaled(n) => {
                g.unjournaled_in_incident += n;
                self.staging.unjournaled.increment(n);
            }
            Event::Resumed => {
                tracing::warn!(
                    outbox = %outbox,
                    dir = %dir,
                    unjournaled = g.unjournaled_in_incident,
                    "journal works again; items staged during the fault stay in memory only"
                );
                g.unjournaled_in_incident = 0;
                // A suspect's lone attempt may take its marks now (S-J17).
                self.resumed.notify_waiters();
            }
            Event::DeletionsWaiting(undeleted) => tracing::warn!(
                outbox = %outbox,
                dir = %dir,
                undeleted,
                "journal segments cannot be deleted; their files stay on disk (the journal goes on) and their deletion is tried again after every commit"
            ),
            Event::DeletionsDone => {
                tracing::info!(outbox = %outbox, dir = %dir, "journal segments are deleted again");
            }
            Event::GaveUp => tracing::error!(
                outbox = %outbox,
                dir = %dir,
                "journal closed with its disk still failing; items it could not mark done are staged again at the next start"
            ),
        }
    }
}

/// A report of a batch that failed before its first op.
fn failure(why: &str) -> Executed {
    Executed {
        error: Some(io::Error::other(why.to_owned())),
        ..Executed::default()
    }
}

/// Carries `batch` out on `committer`; a storage that panics fails the
/// batch where it stood.
fn commit_contained(committer: &mut Committer<Box<dyn Storage>>, batch: &mut Batch) -> Executed {
    contain::call(|| committer.commit(batch))
        .unwrap_or_else(|_| failure("the journal storage panicked"))
}

/// The commit task's clock: [`Time`] for the core's journal machine, from
/// the instant the task started.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn now(self) -> Time {
        Time::from_elapsed(Instant::now().saturating_duration_since(self.0))
    }

    /// The instant of `at` (a "never" far away, not an overflow).
    fn instant(self, at: Time) -> Instant {
        crate::driver::deadline(self.0, at.elapsed())
    }
}

/// The committer's storage while it is away on a blocking thread.
struct Gone;

impl Storage for Gone {
    fn lock(&mut self) -> io::Result<()> {
        Err(io::Error::other("storage away"))
    }
    fn list(&mut self) -> io::Result<Vec<String>> {
        Err(io::Error::other("storage away"))
    }
    fn read(&mut self, _: &str) -> io::Result<Vec<u8>> {
        Err(io::Error::other("storage away"))
    }
    fn create(&mut self, _: &str) -> io::Result<()> {
        Err(io::Error::other("storage away"))
    }
    fn append(&mut self, _: &str, _: &[u8]) -> io::Result<()> {
        Err(io::Error::other("storage away"))
    }
    fn sync(&mut self, _: &str) -> io::Result<()> {
        Err(io::Error::other("storage away"))
    }
    fn truncate(&mut self, _: &str, _: u64) -> io::Result<()> {
        Err(io::Error::other("storage away"))
    }
    fn delete(&mut self, _: &str) -> io::Result<()> {
        Err(io::Error::other("storage away"))
    }
}
