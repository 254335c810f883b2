//! The journal's commit task (S-J1, S-J5): group commits on the blocking
//! pool, never under the outbox's lock, following the core's fault policy
//! ([`Faults`](crate::core::journal::Faults)).

use std::io;
use std::sync::Arc;

use tokio::time::Instant;

use super::{Journal, SyncError};
use crate::core::journal::Next;
use crate::core::Time;
use crate::driver::contain;
use crate::journal::{Committer, Storage};

impl<K, I> Journal<K, I>
where
    K: Ord + std::hash::Hash + Clone + Send + 'static,
    I: Send + 'static,
{
    /// The commit task: group commits until closed (S-J1, S-J5).
    pub(crate) async fn run(self: Arc<Self>, mut committer: Committer<Box<dyn Storage>>) {
        // The fault policy's clock (S-C1: the core takes time as input).
        let clock = Clock(Instant::now());
        loop {
            let exit = self.round(&mut committer, clock).await;
            if exit {
                break;
            }
            // Closing: nobody kicks the task any more, and each round either
            // finishes or makes progress (a resume that worked is followed
            // by the closing roll, D6); after a failed one, the next waits
            // for the retry time (S-J5), or a disk that stays full would
            // spin the task (crash seed 5843), and gives up after a few.
            let next = {
                let mut g = self.lock();
                let closing = g.closing;
                g.faults.next(closing)
            };
            match next {
                Next::Wait => self.wait(clock).await,
                Next::Again => {}
                Next::RetryAt(at) => tokio::time::sleep_until(clock.instant(at)).await,
                Next::GiveUp => {
                    tracing::error!(
                        outbox = %self.name,
                        dir = %self.dir,
                        "journal closed with its disk still failing; items it could not mark done are staged again at the next start"
                    );
                    break;
                }
            }
        }
        let mut g = self.lock();
        g.gone = true;
        for (_, tx) in g.waiters.drain(..) {
            let _ = tx.send(Err(SyncError::Closed));
        }
        drop(g);
        drop(committer);
        tracing::debug!(outbox = %self.name, "journal closed");
    }

    /// Waits for a reason to commit: a kick now, or something buffered
    /// for `sync_interval`; while down, the retry time.
    async fn wait(&self, clock: Clock) {
        let retry_at = self.lock().faults.retry_at();
        if let Some(at) = retry_at {
            tokio::select! {
                biased;
                () = self.now.notified() => {}
                () = tokio::time::sleep_until(clock.instant(at)) => {}
            }
            return;
        }
        tokio::select! {
            biased;
            () = self.now.notified() => {}
            () = self.soon.notified() => {
                tokio::select! {
                    biased;
                    () = self.now.notified() => {}
                    () = tokio::time::sleep(self.sync_interval) => {}
                }
            }
        }
    }

    /// One group commit. Returns whether the task is done.
    async fn round(&self, committer: &mut Committer<Box<dyn Storage>>, clock: Clock) -> bool {
        let (mut batch, round, closing, rolling) = {
            let mut g = self.lock();
            if g.state.is_down() {
                if !g.faults.may_try(clock.now(), g.closing) {
                    let undurable = g.state.ledger().undurable();
                    for (_, tx) in g.waiters.drain(..) {
                        let _ = tx.send(Err(SyncError::Down { undurable }));
                    }
                    return false;
                }
                g.started += 1;
                (g.state.resume(), g.started, g.closing, false)
            } else {
                // Closing with nothing pending: a fresh segment, so every
                // old one goes (D6); once.
                let roll = g.closing && !g.rolled;
                g.started += 1;
                (g.state.take_batch_then(roll), g.started, g.closing, roll)
            }
        };
        let started = Instant::now();
        let (back, result) = if batch.is_empty() {
            (None, Ok(()))
        } else if self.inline_io {
            let r = contain::call(|| committer.commit(&mut batch))
                .unwrap_or_else(|_| Err(io::Error::other("the journal storage panicked")));
            (Some(batch), r)
        } else {
            let mut c = std::mem::replace(committer, Committer::new(Box::new(Gone)));
            let joined = tokio::task::spawn_blocking(move || {
                let r = contain::call(|| c.commit(&mut batch))
                    .unwrap_or_else(|_| Err(io::Error::other("the journal storage panicked")));
                (c, batch, r)
            })
            .await;
            match joined {
                Ok((c, batch, r)) => {
                    *committer = c;
                    (Some(batch), r)
                }
                Err(_) => (
                    None,
                    Err(io::Error::other("the journal commit task was lost")),
                ),
            }
        };
        if back.is_some() {
            self.metrics
                .sync_latency
                .record(started.elapsed().as_secs_f64());
        }
        let undeleted = committer.undeleted();
        let mut g = self.lock();
        if undeleted > 0 && g.undeleted == 0 {
            tracing::warn!(
                outbox = %self.name,
                dir = %self.dir,
                undeleted,
                "journal segments cannot be deleted; their files stay on disk (the journal goes on) and their deletion is tried again after every commit"
            );
        } else if undeleted == 0 && g.undeleted > 0 {
            tracing::info!(outbox = %self.name, dir = %self.dir, "journal segments are deleted again");
        }
        g.undeleted = undeleted;
        let ok = result.is_ok();
        // The failed commit's items are on no disk now: unjournaled, like
        // the items staged while the journal is down (S-J5).
        let undurable = if let Some(batch) = back {
            let n = g.state.committed(batch.upto, ok);
            // Its buffer is the next one staging fills (S-J1: two buffers
            // take turns); a burst's larger one is let go.
            g.state.recycle(batch, self.sync_bytes.saturating_mul(4));
            n
        } else if !ok {
            g.state.committed(0, false)
        } else {
            0
        };
        if undurable > 0 {
            g.unjournaled_in_incident += undurable;
            self.metrics.unjournaled.increment(undurable);
        }
        g.finished = round;
        // The closing roll counts once it is on disk: after a failed one,
        // the resume and then another roll follow.
        g.rolled |= rolling && ok;
        match &result {
            Ok(()) => {
                if g.faults.worked() {
                    tracing::warn!(
                        outbox = %self.name,
                        dir = %self.dir,
                        unjournaled = g.unjournaled_in_incident,
                        "journal works again; items staged during the fault stay in memory only"
                    );
                }
                g.unjournaled_in_incident = 0;
                let undurable = g.state.ledger().undurable();
                while g.waiters.front().is_some_and(|(r, _)| *r <= round) {
                    let (_, tx) = g.waiters.pop_front().expect("checked");
                    let answer = if undurable == 0 {
                        Ok(())
                    } else {
                        Err(SyncError::Down { undurable })
                    };
                    let _ = tx.send(answer);
                }
            }
            Err(e) => {
                self.metrics.faults.increment(1);
                if g.faults.failed(clock.now()) {
                    // Once per incident (S-A6 in spirit): the first failure.
                    tracing::error!(
                        outbox = %self.name,
                        dir = %self.dir,
                        error = %e,
                        undurable = g.state.ledger().undurable(),
                        "journal commit failed; items are held in memory only until it works \
                         again (counted in outbox_items_unjournaled_total)"
                    );
                }
                let kind = e.kind();
                for (_, tx) in g.waiters.drain(..) {
                    let _ = tx.send(Err(SyncError::Failed(kind)));
                }
            }
        }
        self.export(&g);
        // Done when closing, nothing is left to write and nobody waits.
        // A failed commit's marks and deletions are left to write: a
        // closing journal retries them (S-J5) before it gives up.
        let idle = g.state.buffered() == 0 && !g.state.ledger().has_marks() && !g.state.has_redo();
        closing
            && g.closing
            && idle
            && g.waiters.is_empty()
            && ((ok && g.rolled) || g.state.is_down())
    }
}

/// The commit task's clock: [`Time`] for the core's fault policy, from
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
