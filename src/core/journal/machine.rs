//! The journal machine (S-J1..S-J6): one sans-IO state machine for every
//! decision the journal makes at run time, built like the
//! [`Engine`](crate::core::Engine). See the [module](super) docs for its
//! inputs, outputs and drain order.

use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;
use std::io;
use std::time::Duration;

use super::batch::{Batch, Executed, Record, Sizes};
use super::commits::Commits;
use super::disk::Disk;
use super::faults::{Faults, Next};
use super::ledger::{Costs, Ledger};
use crate::core::Time;

/// Why a [`sync`](crate::Outbox::sync) could not promise durability.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SyncError {
    /// The outbox has no journal: nothing survives a crash.
    NoJournal,
    /// The journal is failing (S-J5): items staged since the fault are
    /// held in memory only, and this many of them are still pending.
    Down {
        /// Pending items on no disk.
        undurable: u64,
    },
    /// The commit this sync waited for failed (the journal is now down).
    Failed(io::ErrorKind),
    /// The journal stopped (its runtime shut down) before answering.
    Closed,
}

impl fmt::Display for SyncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncError::NoJournal => f.write_str("outbox sync: no journal is configured"),
            SyncError::Down { undurable } => write!(
                f,
                "outbox sync: the journal is failing; {undurable} pending items are in memory only"
            ),
            SyncError::Failed(kind) => write!(f, "outbox sync: the journal commit failed: {kind}"),
            SyncError::Closed => f.write_str("outbox sync: the journal stopped"),
        }
    }
}

impl std::error::Error for SyncError {}

/// The machine's timings and sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// A commit starts this long after something was buffered (S-J1).
    pub sync_interval: Duration,
    /// A commit starts at once when this many bytes are buffered.
    pub sync_bytes: usize,
    /// After a failed commit, the next try is this much later (S-J5).
    pub retry_interval: Duration,
    /// The format's record sizes.
    pub sizes: Sizes,
}

/// What the driver must log or count ([`Machine::poll_event`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A commit failed (count it); `opened`: the first failure of an
    /// incident (log it once, with its error), `undurable` items being in
    /// memory only then.
    Failed {
        /// The failure opened an incident.
        opened: bool,
        /// Pending items on no disk.
        undurable: u64,
    },
    /// This many items went to memory only: a failed commit's (S-J5).
    Unjournaled(u64),
    /// A commit worked after an incident: the journal is up again.
    Resumed,
    /// Deletions started to fail: this many segments wait (their files
    /// stay on disk; the journal goes on).
    DeletionsWaiting(usize),
    /// Every waiting deletion is done.
    DeletionsDone,
    /// A closing journal gave up on a disk that kept failing (S-J5): the
    /// marks it could not write stage their items again at the next start.
    GaveUp,
}

/// What a suspect's lone attempt does next
/// ([`Machine::handle_lone_attempt`], S-J17).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoneStep {
    /// Start it: its attempt marks are on disk (or it has none to take,
    /// or the journal is closing or closed: the writer is done, and the
    /// last round waits for no marks of an abandoned write).
    Start,
    /// Its marks are taken: pass a waiter to
    /// [`handle_sync`](Machine::handle_sync), ask again once answered.
    Commit,
    /// The journal is down: ask again once it works
    /// ([`Event::Resumed`]).
    Down,
}

/// The round a batch handed out belongs to.
#[derive(Clone, Copy, Debug)]
struct Round {
    id: u64,
    /// The journal was closing when the round started.
    closing: bool,
    /// The round carries the closing roll (D6).
    rolling: bool,
    /// The round is a resume: it carries no attempt marks and no done
    /// marks taken while down.
    resume: bool,
}

/// The journal's decisions (S-J1..S-J6), generic over the tenant key `K`
/// and the token `W` the driver hands in with each sync and gets back with
/// its answer.
///
/// # Inputs
/// - The request path, under the outbox's lock and without a clock (a
///   stage reads no time, S-W1): [`fits`](Self::fits), then
///   [`append`](Self::append); [`buffered`](Self::buffered).
/// - [`handle_done`](Self::handle_done): a tenant's oldest items are
///   done (written, lost or dropped): their done marks wait for the next
///   commit (S-J3).
/// - [`handle_attempt`](Self::handle_attempt) and
///   [`handle_ended`](Self::handle_ended): an attempt starts, or comes
///   back failed to be retried (S-J17); a suspect's lone attempt, or
///   any while [`lone_end_waits`](Self::lone_end_waits), through
///   [`handle_lone_attempt`](Self::handle_lone_attempt) instead, then
///   [`handle_lone_started`](Self::handle_lone_started) for the lone one.
/// - [`handle_sync`](Self::handle_sync): a durability barrier (D1).
/// - [`handle_close`](Self::handle_close): the writer is done.
/// - [`handle_wake`](Self::handle_wake)`(now)`: something was buffered
///   (the driver's wake-up after a stage or a mark); a commit is due
///   `sync_interval` later.
/// - [`handle_executed`](Self::handle_executed)`(now, ..)`: what the
///   driver did with the last batch.
///
/// # Outputs, in this drain order
/// [`poll_batch`](Self::poll_batch)`(now)` (a commit to run now, or
/// `None`), then [`poll_answer`](Self::poll_answer) and
/// [`poll_event`](Self::poll_event) until `None`, then
/// [`poll_timeout`](Self::poll_timeout): when to poll again without an
/// input (a spurious poll is harmless). [`is_closed`](Self::is_closed):
/// the task may exit. One batch is out at a time.
#[derive(Debug)]
pub struct Machine<K, W> {
    commits: Commits<K>,
    disk: Disk,
    settings: Settings,
    faults: Faults,
    /// Rounds started; a sync waits for a round that starts after it.
    started: u64,
    /// The last round that worked and was no resume, and the last that
    /// failed.
    last_committed: u64,
    last_failed: u64,
    /// The tenant whose suspect's lone attempt is in flight (S-J17).
    lone: Option<K>,
    /// The round whose commit carries the end (done or attempt-end mark)
    /// of the last lone attempt, until one at or after it works.
    lone_end: Option<u64>,
    executing: Option<Round>,
    /// Sync callers: the round they wait for, in order.
    waiters: VecDeque<(u64, W)>,
    answers: VecDeque<(W, Result<(), SyncError>)>,
    events: VecDeque<Event>,
    /// Something was buffered: a commit is due then.
    due_at: Option<Time>,
    /// The writer is done: a last round, then the task exits.
    closing: bool,
    /// What a closing journal does after its last round.
    next: Next,
    /// The closing round started a fresh segment already (D6).
    rolled: bool,
    closed: bool,
}

impl<K: Ord + Hash + Clone, W> Machine<K, W> {
    /// The machine around `ledger` (a recovery's), whose current segment
    /// the first commit creates at once.
    pub fn new(ledger: Ledger<K>, settings: Settings) -> Self {
        let costs = Costs::new(&settings.sizes, ledger.limits().segment_bytes);
        let ledger = ledger.with_costs(costs);
        Machine {
            commits: Commits::new(ledger, settings.sizes),
            disk: Disk::default(),
            faults: Faults::new(settings.retry_interval),
            settings,
            started: 0,
            last_committed: 0,
            last_failed: 0,
            lone: None,
            lone_end: None,
            executing: None,
            waiters: VecDeque::new(),
            answers: VecDeque::new(),
            events: VecDeque::new(),
            due_at: Some(Time::ZERO),
            closing: false,
            next: Next::Wait,
            rolled: false,
            closed: false,
        }
    }

    /// The bookkeeping (sizes, segments, undurable items).
    pub fn ledger(&self) -> &Ledger<K> {
        &self.commits.ledger
    }

    /// Whether commits are failing (S-J5).
    pub fn is_down(&self) -> bool {
        self.commits.is_down()
    }

    /// Whether the machine is done: no round will run again.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Bytes in the segment files, as far as the journal wrote them: the
    /// existing segments' and those whose deletion waits (S-J10).
    pub fn disk_bytes(&self) -> u64 {
        self.commits.disk_bytes()
    }

    /// Bytes waiting for the next commit.
    pub fn buffered(&self) -> usize {
        self.commits.buffered()
    }

    /// Whether an item record of `len` bytes may be appended under
    /// `max_bytes` (S-J4).
    pub fn fits(&self, len: usize) -> bool {
        self.commits.fits(len)
    }

    /// Takes an accepted item: journaled in the buffer, or, while the
    /// journal is down, only placed in its tenant's order (S-J5). Returns
    /// whether it was journaled.
    pub fn append(&mut self, tenant: K, item: impl Record) -> bool {
        self.commits.append(tenant, item)
    }

    /// The oldest `n` pending items of `tenant` are done.
    pub fn handle_done(&mut self, tenant: &K, n: u64) {
        self.commits.ledger.mark_done(tenant, n);
        self.lone_back(tenant);
    }

    /// An attempt of `tenant`'s oldest `n` pending items is about to start
    /// (S-J17). Returns whether it must wait for the next commit: an
    /// attempt of a journaled item needs its attempt mark on disk first,
    /// so a crash during it is counted at the next recovery. Then pass a
    /// waiter to [`handle_sync`](Self::handle_sync) and start the attempt
    /// once it is answered (whatever the answer). A journal that is down
    /// never waits.
    pub fn handle_attempt(&mut self, tenant: &K, n: u64) -> bool {
        self.commits.attempt(tenant, n)
    }

    /// An attempt of the writes `writes` (`(tenant, n)`: its oldest `n`
    /// pending items) is about to start that must not start without its
    /// attempt marks on disk (S-J17): a suspect's lone attempt, or any
    /// while [`lone_end_waits`](Self::lone_end_waits). Unlike another it
    /// never starts on a journal that is down: the commit of its marks
    /// carries every done and end mark taken before them, an earlier
    /// suspect's too, so a crash during it is counted against its own
    /// items alone. `marked` is the attempt's own state, `None` at first:
    /// the round that carries its marks. Ask again after each answer of
    /// the sync [`LoneStep::Commit`] asks for, and after each
    /// [`Event::Resumed`] while [`LoneStep::Down`].
    pub fn handle_lone_attempt(
        &mut self,
        writes: &[(K, u64)],
        marked: &mut Option<u64>,
    ) -> LoneStep {
        if self.closed || self.closing {
            return LoneStep::Start;
        }
        if self.is_down() {
            // A failed commit lost its marks, if they were taken.
            *marked = None;
            return LoneStep::Down;
        }
        // Its round worked, and none failed since it started; unless its
        // mark waited for room and rides a later one.
        if marked.is_some_and(|round| self.last_committed >= round && self.last_failed < round) {
            if !self.commits.ledger.attempts_waiting() {
                return LoneStep::Start;
            }
            *marked = Some(self.started + 1);
            return LoneStep::Commit;
        }
        let mut wait = false;
        for (tenant, n) in writes {
            self.commits.ledger.reopen(tenant);
            wait |= self.commits.attempt(tenant, *n);
        }
        if !wait {
            return LoneStep::Start;
        }
        *marked = Some(self.started + 1);
        LoneStep::Commit
    }

    /// The attempt of `tenant`'s oldest `n` pending items came back failed
    /// and waits for its retry (S-J17): its attempt-end marks ride the
    /// next commit (nothing waits for them), so a crash while it waits
    /// does not count against its items. Then wake the machine like after
    /// a done mark.
    pub fn handle_ended(&mut self, tenant: &K, n: u64) {
        self.commits.ended(tenant, n);
        self.lone_back(tenant);
    }

    /// `tenant`'s attempt came back: if it was the lone one, its end
    /// rides the next round.
    fn lone_back(&mut self, tenant: &K) {
        if self.lone.as_ref() == Some(tenant) {
            self.lone = None;
            self.lone_end = Some(self.started + 1);
        }
    }

    /// A suspect's lone attempt of `tenant` starts (S-J17), after
    /// [`handle_lone_attempt`](Self::handle_lone_attempt) said so: until
    /// its end is on disk, every attempt waits for its marks on disk.
    pub fn handle_lone_started(&mut self, tenant: &K) {
        self.lone = Some(tenant.clone());
    }

    /// Whether the end of the last lone attempt is not on disk yet
    /// (S-J17): then an attempt starts only once its own marks are,
    /// through [`handle_lone_attempt`](Self::handle_lone_attempt), so
    /// that a crash during it is not counted against that suspect.
    pub fn lone_end_waits(&mut self) -> bool {
        // A failed round's marks are redone by the resume, those taken
        // while down by the next commit: a commit at or after it worked.
        if self
            .lone_end
            .is_some_and(|round| self.last_committed >= round)
        {
            self.lone_end = None;
        }
        self.lone_end.is_some()
    }

    /// After a recovery: the first commit records this life's start with
    /// the crashes counted of the recovered items (`counts`: `(item,
    /// crashes)` for those with one or more) and keeps the segments of
    /// `recovered` (every item restored, in sequence order) from counting
    /// their records of earlier lives again (S-J17). Call once, before
    /// the first batch.
    pub fn start_life(&mut self, counts: Vec<(u64, u32)>, recovered: Vec<u64>) {
        self.commits.start_life(counts, recovered);
    }

    /// Something was buffered or marked done at `now`: a commit is due
    /// `sync_interval` later, unless one is due sooner.
    pub fn handle_wake(&mut self, now: Time) {
        if self.due_at.is_none() {
            self.due_at = Some(now + self.settings.sync_interval);
        }
    }

    /// A durability barrier (D1): `waiter` is answered once every item
    /// staged and every done mark taken before the call is on disk, or
    /// why not; at once when the journal is down or closed.
    pub fn handle_sync(&mut self, waiter: W) {
        if self.closed {
            self.answers.push_back((waiter, Err(SyncError::Closed)));
        } else if self.is_down() {
            let undurable = self.commits.ledger.undurable();
            self.answers
                .push_back((waiter, Err(SyncError::Down { undurable })));
        } else {
            self.waiters.push_back((self.started + 1, waiter));
        }
    }

    /// The writer is done: commit what is left, then close.
    pub fn handle_close(&mut self) {
        self.closing = true;
    }

    /// The next answer to a sync.
    pub fn poll_answer(&mut self) -> Option<(W, Result<(), SyncError>)> {
        self.answers.pop_front()
    }

    /// The next event to log or count.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When to poll again without an input: the commit due after a wake,
    /// the next retry while down, a closing journal's next try.
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.executing.is_some() || self.closed {
            return None;
        }
        if self.closing {
            return match self.next {
                Next::RetryAt(at) => Some(at),
                Next::Wait | Next::Again => Some(Time::ZERO),
                Next::GiveUp => None,
            };
        }
        if self.is_down() {
            return self.faults.retry_at();
        }
        self.due_at
    }

    /// Whether a round is due at `now`.
    fn due(&self, now: Time) -> bool {
        if self.closing {
            return match self.next {
                Next::Wait | Next::Again => true,
                Next::RetryAt(at) => now >= at,
                Next::GiveUp => false,
            };
        }
        if !self.waiters.is_empty() {
            return true;
        }
        if self.is_down() {
            return self.faults.retry_at().is_some_and(|at| now >= at);
        }
        self.buffered() >= self.settings.sync_bytes || self.due_at.is_some_and(|at| now >= at)
    }

    /// The batch to carry out now, if a round is due: the buffered
    /// records, the done marks and deletions, or while down a resume
    /// (S-J5); `None` while a batch is out. An empty batch needs no IO:
    /// hand it back at once.
    pub fn poll_batch(&mut self, now: Time) -> Option<Batch> {
        if self.executing.is_some() || self.closed || !self.due(now) {
            return None;
        }
        self.due_at = None;
        let down = self.is_down();
        if down && !self.faults.may_try(now, self.closing) {
            self.answer_all(SyncError::Down {
                undurable: self.commits.ledger.undurable(),
            });
            return None;
        }
        self.started += 1;
        // Closing with nothing pending: a fresh segment, so every old one
        // goes (D6); once.
        let rolling = !down && self.closing && !self.rolled;
        let body = if down {
            self.commits.resume()
        } else {
            self.commits.take_batch(rolling)
        };
        self.executing = Some(Round {
            id: self.started,
            closing: self.closing,
            rolling,
            resume: down,
        });
        Some(self.disk.wrap(body))
    }

    /// What the driver did with the batch of the last
    /// [`poll_batch`](Self::poll_batch): `batch` handed back (`None` if
    /// the driver lost it, counted a failure), with `done`.
    pub fn handle_executed(&mut self, now: Time, batch: Option<Batch>, done: Executed) {
        let Some(round) = self.executing.take() else {
            return;
        };
        let waiting_before = self.disk.undeleted();
        let kind = done.error.as_ref().map(io::Error::kind);
        let ok = match &batch {
            Some(b) => {
                let outcome = self.disk.report(b, &done);
                self.commits.created(&outcome.created);
                self.commits.sealed(&outcome.sealed);
                self.commits.deleted(&outcome.deleted);
                outcome.ok
            }
            None => false,
        };
        // The failed commit's items are on no disk now: unjournaled, like
        // the items staged while the journal is down (S-J5).
        let upto = batch.as_ref().map_or(0, |b| b.upto);
        let undurable = self.commits.committed(upto, ok);
        if let Some(batch) = batch {
            // Its buffer is the next one staging fills (S-J1: two buffers
            // take turns); a burst's larger one is let go.
            let keep = self.settings.sync_bytes.saturating_mul(4);
            self.commits.recycle(batch, keep);
        }
        if undurable > 0 {
            self.events.push_back(Event::Unjournaled(undurable));
        }
        self.note_deletions(waiting_before);
        // The closing roll counts once it is on disk: after a failed one,
        // the resume and then another roll follow.
        self.rolled |= round.rolling && ok;
        if ok {
            self.worked(round);
        } else {
            self.last_failed = round.id;
            self.failed(now, kind.unwrap_or(io::ErrorKind::Other));
        }
        self.after_round(round, ok);
    }

    /// Logs the transitions of the waiting deletions.
    fn note_deletions(&mut self, before: usize) {
        let after = self.disk.undeleted();
        if after > 0 && before == 0 {
            self.events.push_back(Event::DeletionsWaiting(after));
        } else if after == 0 && before > 0 {
            self.events.push_back(Event::DeletionsDone);
        }
    }

    /// A round worked: the syncs it covered are answered.
    fn worked(&mut self, round: Round) {
        if !round.resume {
            self.last_committed = round.id;
        }
        let round = round.id;
        if self.faults.worked() {
            self.events.push_back(Event::Resumed);
        }
        let undurable = self.commits.ledger.undurable();
        while self.waiters.front().is_some_and(|(r, _)| *r <= round) {
            let (_, waiter) = self.waiters.pop_front().expect("checked");
            let answer = if undurable == 0 {
                Ok(())
            } else {
                Err(SyncError::Down { undurable })
            };
            self.answers.push_back((waiter, answer));
        }
    }

    /// A round failed at `now`: an incident opens or goes on; every sync
    /// waiting is answered.
    fn failed(&mut self, now: Time, kind: io::ErrorKind) {
        let opened = self.faults.failed(now);
        self.events.push_back(Event::Failed {
            opened,
            undurable: self.commits.ledger.undurable(),
        });
        self.answer_all(SyncError::Failed(kind));
    }

    fn answer_all(&mut self, error: SyncError) {
        for (_, waiter) in self.waiters.drain(..) {
            self.answers.push_back((waiter, Err(error.clone())));
        }
    }

    /// After a round: done when closing, nothing is left to write and
    /// nobody waits (a failed commit's marks and deletions are left to
    /// write: a closing journal retries them, S-J5, before it gives up);
    /// else what a closing journal does next.
    fn after_round(&mut self, round: Round, ok: bool) {
        let idle =
            self.buffered() == 0 && !self.commits.ledger.has_marks() && !self.commits.has_redo();
        let done = round.closing
            && self.closing
            && idle
            && self.waiters.is_empty()
            && ((ok && self.rolled) || self.is_down());
        if done {
            self.close_now();
            return;
        }
        // Closing: each round either finishes or makes progress (a resume
        // that worked is followed by the closing roll, D6); after a failed
        // one, the next waits for the retry time (S-J5), or a disk that
        // stays full would spin the task (crash seed 5843), and gives up
        // after a few.
        self.next = self.faults.next(self.closing);
        if self.next == Next::GiveUp {
            self.events.push_back(Event::GaveUp);
            self.close_now();
        }
    }

    fn close_now(&mut self) {
        self.closed = true;
        self.answer_all(SyncError::Closed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::journal::ledger::Limits;

    fn machine() -> Machine<u32, ()> {
        let limits = Limits {
            segment_bytes: 4_096,
            max_bytes: None,
        };
        let sizes = Sizes {
            header: 48,
            seal: 17,
            done: 9,
            mark: 8,
            marks_per_record: 8_192,
        };
        let settings = Settings {
            sync_interval: Duration::from_millis(5),
            sync_bytes: 1 << 20,
            retry_interval: Duration::from_millis(100),
            sizes,
        };
        Machine::new(Ledger::new(limits, 1, 1, sizes.header), settings)
    }

    #[test]
    fn no_timeout_while_a_batch_is_out_nor_once_closed() {
        // While a batch is out, its answer is the next input; once closed,
        // nothing is: a timeout then would only wake the task for nothing.
        let mut m = machine();
        let now = Time::ZERO;
        let batch = m
            .poll_batch(now)
            .expect("the first commit creates the segment");
        assert_eq!(m.poll_timeout(), None, "a batch is out");
        m.handle_close();
        assert_eq!(m.poll_timeout(), None, "closing, with a batch out");
        let done = Executed::all(&batch);
        m.handle_executed(now, Some(batch), done);
        while !m.is_closed() {
            assert_eq!(m.poll_timeout(), Some(Time::ZERO), "closing: at once");
            let batch = m.poll_batch(now).expect("a closing round");
            let done = Executed::all(&batch);
            m.handle_executed(now, Some(batch), done);
        }
        assert_eq!(m.poll_timeout(), None, "closed");
        assert!(m.poll_batch(now).is_none());
    }

    #[test]
    fn each_sync_error_reads_as_its_cause_with_its_numbers() {
        // What an operator reads in a log: the cause, and how many items
        // are at stake when some are.
        let cases = [
            (
                SyncError::NoJournal,
                "outbox sync: no journal is configured",
            ),
            (
                SyncError::Down { undurable: 7 },
                "outbox sync: the journal is failing; 7 pending items are in memory only",
            ),
            (
                SyncError::Failed(io::ErrorKind::PermissionDenied),
                "outbox sync: the journal commit failed: permission denied",
            ),
            (SyncError::Closed, "outbox sync: the journal stopped"),
        ];
        for (error, text) in cases {
            assert_eq!(error.to_string(), text, "{error:?}");
        }
    }
}
