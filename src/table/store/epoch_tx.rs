//! The sink transaction fenced by epochs (S-T23), the one stateful
//! handle of the store interface: its own idea, apart from the
//! statements of [`Store`](super::Store).

use std::future::Future;

use crate::core::relay::{Fenced, StoreError};

/// A sink transaction fenced by epochs (S-T23): the sink's own statements
/// run in it, then [`check_epochs`](EpochTx::check_epochs) as the last
/// statement before [`commit`](EpochTx::commit).
pub trait EpochTx: Send {
    /// Checks under a shared lock on each partition's epoch row, taken in
    /// partition order, that every `(partition, epoch)` is the one
    /// installed; the locks hold until the transaction ends, so no
    /// takeover's install commits in between.
    ///
    /// # Errors
    /// A store error; the transaction is then rolled back.
    fn check_epochs(
        &mut self,
        epochs: &[(u32, u64)],
    ) -> impl Future<Output = Result<Fenced<()>, StoreError>> + Send;

    /// Commits. An error of kind `Unknown` means the reply was lost: it
    /// may have committed.
    fn commit(self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Rolls back.
    fn rollback(self) -> impl Future<Output = Result<(), StoreError>> + Send;
}
