//! The driver's one journal adapter (D1-D6): everything the staging
//! pipeline, the writer and the build do with a journal goes through the
//! names this module exports, so that no other driver file needs a
//! `cfg(feature = "journal")`.
//!
//! - `adapter` (feature `journal`): the journal itself: opening it and
//!   staging what it recovers (`build`), encoding and appending on the
//!   request path (`stage`), the group-commit task (`commit`), done marks,
//!   the sync barrier and the metrics;
//! - `stub` (without the feature): the same names, uninhabited; an outbox
//!   of that build never holds a journal.

#[cfg(feature = "journal")]
mod adapter;
#[cfg(feature = "journal")]
pub use adapter::*;

#[cfg(not(feature = "journal"))]
mod stub;
#[cfg(not(feature = "journal"))]
pub(crate) use stub::*;

/// What a write waits for before its attempt starts: its attempt marks on
/// disk (S-J17).
pub(crate) type Gate = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;
