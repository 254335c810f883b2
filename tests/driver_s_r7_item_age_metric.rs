//! S-R7 through the tokio driver, on tokio's paused clock: with a
//! `max_item_age`, `outbox_item_age_seconds{outcome}` takes one sample per
//! item as it is written or given up, its age from its stage; without one,
//! the series exist and take none.

mod support;

use std::time::Duration;

use outbox::{Config, Outbox, Staged};
use support::*;

#[test]
fn written_and_rejected_items_are_sampled_with_their_age() {
    let (counters, snap) = with_metrics(|| async {
        let sink = TestSink::new("r7-ages");
        sink.set(t(1), Act::Slow(Duration::from_secs(5)));
        sink.set(t(2), Act::Terminal);
        let config = Config::builder()
            .max_item_age(Duration::from_secs(60))
            .linger(Duration::ZERO)
            .build()
            .unwrap();
        let o = Outbox::new(sink.clone(), config).unwrap();
        assert_eq!(o.stage(t(1), 1), Staged::Accepted);
        assert_eq!(o.stage(t(1), 2), Staged::Accepted);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(o.stage(t(2), 3), Staged::Accepted);
        assert!(!o.settle(Duration::from_secs(30)).await.deadline_passed);
        o.counters()
    });
    assert_eq!((counters.written, counters.lost_total()), (2, 1));
    let m = snapshot(&snap);
    let written = item_ages(&m, "r7-ages", "written");
    assert_eq!(written.len(), 2, "{written:?}");
    // Staged at 0, written when the 5 s write ended.
    assert!(
        written.iter().all(|a| (5.0..5.1).contains(a)),
        "{written:?}"
    );
    let terminal = item_ages(&m, "r7-ages", "terminal");
    assert_eq!(terminal.len(), 1, "{terminal:?}");
    assert!(terminal[0] < 0.1, "rejected at once: {terminal:?}");
    assert!(item_ages(&m, "r7-ages", "expired").is_empty());
}

#[test]
fn without_a_max_item_age_no_age_is_sampled() {
    let (counters, snap) = with_metrics(|| async {
        let sink = TestSink::new("r7-none");
        let o = Outbox::new(sink.clone(), Config::default()).unwrap();
        assert_eq!(o.stage(t(1), 1), Staged::Accepted);
        assert!(!o.settle(Duration::from_secs(30)).await.deadline_passed);
        o.counters()
    });
    assert_eq!(counters.written, 1);
    let m = snapshot(&snap);
    assert!(item_ages(&m, "r7-none", "written").is_empty());
}
