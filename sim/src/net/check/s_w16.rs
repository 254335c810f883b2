//! S-W16: after every handle is dropped without a shutdown, the writer
//! drains what it holds, accounts for what it gives up, and exits.

use std::time::Duration;

use outbox::core::Counters;

use super::Broken;
use crate::net::book::ms;

/// After the writer exited, nothing is pending.
pub fn nothing_pending_after_drop(c: &Counters) -> Result<(), Broken> {
    if c.pending != 0 {
        return Err((
            "S-W16",
            format!("{} items pending after the writer exited", c.pending),
        ));
    }
    Ok(())
}

/// After the writer exited, the pending gauge is zero (S-W14: everything
/// is written, lost or dropped).
pub fn nothing_pending_after_exit(c: &Counters) -> Option<Broken> {
    (c.pending != 0).then(|| {
        (
            "S-W16",
            format!(
                "the pending gauge is {} after the writer exited (S-W14: everything is \
                 written, lost or dropped)",
                c.pending
            ),
        )
    })
}

/// A drop deadline that covered the I6 bound (`bound`) for the items
/// pending at the drop leaves nothing lost under `deadline` (`lost`).
pub fn drained_what_it_held(
    deadline: Duration,
    bound: Duration,
    before: &Counters,
    lost: u64,
) -> Option<Broken> {
    (lost > 0).then(|| {
        (
            "S-W16",
            format!(
                "the drop deadline ({} ms) covered the I6 bound ({} ms) for the {} items \
                 pending at the drop, yet {lost} were lost under `deadline`: the writer did \
                 not drain what it held",
                ms(deadline),
                ms(bound),
                before.pending
            ),
        )
    })
}
