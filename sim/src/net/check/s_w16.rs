//! S-W16: after every handle is dropped without a shutdown, the writer
//! drains what it holds, accounts for what it gives up, and exits.

use outbox::core::Counters;

use super::Broken;

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
