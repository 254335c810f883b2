//! The journal adapter of a build without the `journal` feature: the same
//! names as [`adapter`](super), each uninhabited, so that the staging
//! pipeline, the writer and the build carry no `cfg`. An outbox of this
//! build never holds a [`Journal`] (its field is always `None`), so no
//! method here can be called: each body is an empty `match` on a value
//! that cannot exist.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::core::{Engine, Event, Write};
use crate::driver::shared::Shared;
use crate::driver::BuildError;
use crate::sink::Sink;

/// No journal: a value of this type cannot be made.
pub(crate) struct Journal<K, I> {
    never: Infallible,
    /// No stage's side of a journal either.
    pub(crate) staging: Staging<K, I>,
}

/// No stage's side of a journal.
pub(crate) struct Staging<K, I>(Infallible, PhantomData<fn() -> (K, I)>);

/// No run of records.
pub(crate) struct Run(Infallible);
/// No journal to open.
pub(crate) type Setup<K, I> = Journal<K, I>;
/// No commit task.
pub(crate) type CommitTask = Infallible;
/// No journal opened.
pub(crate) type OpenedJournal<K, I> = (Arc<Journal<K, I>>, CommitTask);

/// No journal's lock.
pub(crate) struct Appender<'a, K, I>(Infallible, PhantomData<&'a Journal<K, I>>);

impl<K, I> crate::core::Append<K> for Appender<'_, K, I> {
    fn append_if<R>(&mut self, _: usize, _: impl FnOnce(bool) -> (Option<K>, R)) -> R {
        match self.0 {}
    }
}

impl<K, I> Staging<K, I> {
    pub(crate) fn encode_into(&self, _: &mut Option<Run>, _: &K, _: &I) -> Option<usize> {
        match self.0 {}
    }

    pub(crate) fn room_freed(&self) -> tokio::sync::futures::Notified<'_> {
        match self.0 {}
    }

    /// Nothing to hand back: a run of this build is never made.
    pub(crate) fn recycle_run(run: Option<Run>) {
        if let Some(run) = run {
            match run.0 {}
        }
    }

    pub(crate) fn appending<R>(
        &self,
        _: Option<&Run>,
        _: impl FnOnce(&mut Appender<'_, K, I>) -> R,
    ) -> R {
        match self.0 {}
    }
}

impl<K, I> Journal<K, I> {
    pub(crate) fn mark_done<'a>(&self, _: impl IntoIterator<Item = &'a Event<K, I>>)
    where
        K: 'a,
        I: 'a,
    {
        match self.never {}
    }

    pub(crate) fn on_spawn(&self, _: &[Write<K, I>], _: bool) -> Option<super::Gate> {
        match self.never {}
    }

    pub(crate) fn close(&self) {
        match self.never {}
    }

    pub(crate) fn after_sync(
        &self,
        _: &tokio::runtime::Handle,
        _: Option<tokio::time::Instant>,
        _: String,
        _: impl FnOnce() + Send + 'static,
    ) {
        match self.never {}
    }
}

/// Nothing to open: `setup` is always `None` in this build.
pub(crate) fn open<K, I>(
    setup: Option<Setup<K, I>>,
    _: &str,
    _: &mut Engine<K, I>,
) -> Result<Option<OpenedJournal<K, I>>, BuildError> {
    match setup {
        None => Ok(None),
        Some(journal) => match journal.never {},
    }
}

/// Nothing to spawn: `committer` is always `None` in this build.
pub(crate) fn spawn<S: Sink>(_: &Shared<S>, committer: Option<CommitTask>) {
    if let Some(never) = committer {
        match never {}
    }
}
