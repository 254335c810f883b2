//! The run-time dead-letter hand-off (S-R4): where the writer puts the
//! items the engine gave up while running, instead of dropping them unseen.
//!
//! Bounded either way: a channel of a fixed capacity, or a callback the
//! writer calls in line (no queue). What cannot be handed out (the channel
//! is full or closed, the callback panicked) is dropped and counted in
//! [`Health::dead_letters_dropped`](crate::Health::dead_letters_dropped);
//! its items stay counted lost or dropped as the engine counted them.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

use super::contain;
use crate::core::DeadLetter;

/// Where run-time dead letters go: give it to
/// [`OutboxBuilder::dead_letters`](crate::OutboxBuilder::dead_letters).
pub struct DeadLetters<K, I> {
    kind: Kind<K, I>,
}

/// A callback the writer calls with each dead letter.
type Callback<K, I> = Box<dyn Fn(DeadLetter<K, I>) + Send + Sync>;

enum Kind<K, I> {
    Callback(Callback<K, I>),
    Channel(mpsc::Sender<DeadLetter<K, I>>),
}

impl<K, I> fmt::Debug for DeadLetters<K, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            Kind::Callback(_) => "DeadLetters::Callback",
            Kind::Channel(_) => "DeadLetters::Channel",
        })
    }
}

impl<K: Send + 'static, I: Send + 'static> DeadLetters<K, I> {
    /// The writer task calls `f` with each dead letter, in the order the
    /// engine gave them up. It runs on the writer, outside its lock: keep
    /// it short (hand the letter to a queue of your own for anything
    /// slow), as every write waits while it runs. A panic in it is
    /// contained: logged, counted in `dead_letters_dropped`, the writer
    /// carries on.
    pub fn callback(f: impl Fn(DeadLetter<K, I>) + Send + Sync + 'static) -> Self {
        DeadLetters {
            kind: Kind::Callback(Box::new(f)),
        }
    }

    /// A bounded channel of `capacity` dead letters (0 is taken as 1, and
    /// more than tokio's channel can hold, `Semaphore::MAX_PERMITS`, as that
    /// many): the writer never waits for it; a letter that finds it full or
    /// closed is dropped and counted in `dead_letters_dropped`.
    pub fn channel(capacity: usize) -> (Self, mpsc::Receiver<DeadLetter<K, I>>) {
        let capacity = capacity.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        let (tx, rx) = mpsc::channel(capacity);
        (
            DeadLetters {
                kind: Kind::Channel(tx),
            },
            rx,
        )
    }

    /// Hands one letter out; counts it in `dropped` if it could not be.
    /// Returns whether a callback panicked (for the log).
    pub(crate) fn hand(&self, letter: DeadLetter<K, I>, dropped: &AtomicU64) -> bool {
        match &self.kind {
            Kind::Callback(f) => {
                if contain::call(|| f(letter)).is_err() {
                    dropped.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                false
            }
            Kind::Channel(tx) => {
                if let Err(e) = tx.try_send(letter) {
                    dropped.fetch_add(1, Ordering::Relaxed);
                    contain::drop_letter(e.into_inner());
                }
                false
            }
        }
    }
}
