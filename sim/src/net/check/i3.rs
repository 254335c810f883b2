//! I3: S-W14 holds after every step (every item staged is pending, written,
//! lost or dropped), and the metrics equal the counters (the comparison is
//! [`SimRecorder::mismatch`](crate::net::metrics::SimRecorder::mismatch)).

use outbox::core::{Counters, DropReason, LostReason};

use super::Broken;

/// The counters balance: staged = pending + written + lost + dropped.
pub fn counters_balance(c: &Counters) -> Option<Broken> {
    (!c.balanced()).then(|| ("I3", format!("the counters do not balance: {c:?}")))
}

/// The counters count every item the application staged.
pub fn every_stage_counted(c: &Counters, staged: usize) -> Option<Broken> {
    (c.staged != staged as u64).then(|| {
        (
            "I3",
            format!("{staged} items staged, the counters say {}", c.staged),
        )
    })
}

/// After the writer exited (S-W16), the counters read from the metrics
/// balance.
pub fn counters_balance_after_exit(c: &Counters) -> Option<Broken> {
    (!c.balanced()).then(|| {
        (
            "I3",
            format!("after the writer exited the counters do not balance: {c:?}"),
        )
    })
}

/// No counter went down between `before` and `after` (S-W14): the first
/// that did.
pub fn counters_never_decrease(before: &Counters, after: &Counters) -> Option<Broken> {
    let shrank =
        |what: &str, was: u64, is: u64| (is < was).then(|| format!("{what} {was} -> {is}"));
    let mut shrunk = vec![shrank("staged", before.staged, after.staged)];
    shrunk.push(shrank("written", before.written, after.written));
    shrunk.push(shrank("writes", before.writes, after.writes));
    shrunk.push(shrank(
        "failed attempts",
        before.failed_attempts,
        after.failed_attempts,
    ));
    for r in LostReason::ALL {
        shrunk.push(shrank(r.as_str(), before.lost_for(r), after.lost_for(r)));
    }
    for r in DropReason::ALL {
        shrunk.push(shrank(
            r.as_str(),
            before.dropped_for(r),
            after.dropped_for(r),
        ));
    }
    let m = shrunk.into_iter().flatten().next()?;
    Some((
        "I3",
        format!("a counter went down after the drop (S-W14): {m}"),
    ))
}
