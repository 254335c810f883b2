//! A tenant key whose `Debug` panics, under a subscriber that renders the
//! `tenant` field: the panic ends the writer (src/tenant.rs documents
//! `Debug` beside `Hash`, `Eq`, `Ord` and `Clone` as must-not-panic), but
//! it never aborts the process, and every item stays counted (S-W14, S-A7).
//! Its own test binary: the failure it guards against was a SIGABRT, which
//! would take every test of a shared binary with it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox::{Config, LostReason, Outbox, Sink, Staged, WriteError, Written};

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key(u64);

impl fmt::Debug for Key {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        panic!("a tenant key's Debug panics");
    }
}

#[derive(Clone, Default)]
struct Counting {
    written: Arc<AtomicU64>,
}

impl Sink for Counting {
    type Tenant = Key;
    type Item = u32;
    fn name(&self) -> &str {
        "counting"
    }
    async fn write(&self, _: &Key, items: &[u32]) -> Result<Written, WriteError> {
        self.written.fetch_add(items.len() as u64, Ordering::SeqCst);
        Ok(Written::ALL)
    }
}

/// Renders every field with `Debug`, as a fmt subscriber would.
struct Render;
struct Visit;

impl tracing::field::Visit for Visit {
    fn record_debug(&mut self, _: &tracing::field::Field, value: &dyn fmt::Debug) {
        let _ = format!("{value:?}");
    }
}

impl tracing::Subscriber for Render {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        event.record(&mut Visit);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_tenant_key_whose_debug_panics_ends_the_writer_without_an_abort() {
    // The expected panics would otherwise print a backtrace each.
    std::panic::set_hook(Box::new(|_| {}));
    tracing::subscriber::with_default(Render, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let sink = Counting::default();
            let config = Config::builder().capacity(2).build().unwrap();
            let o = Outbox::new(sink.clone(), config).unwrap();
            // Two accepted, two dropped as `buffer_full`: that drop's log
            // line carries the tenant and, on the writer, panics.
            let staged: Vec<Staged> = (0..4).map(|i| o.stage(Key(1), i)).collect();
            assert_eq!(&staged[..2], &[Staged::Accepted, Staged::Accepted]);
            let flush = o.flush(Duration::from_secs(10)).await;
            // The writer ended: the flush is answered from what it gave
            // up, nothing left pending.
            assert_eq!(
                (flush.pending, flush.written + flush.lost),
                (0, 2),
                "{flush:?}"
            );
            // No later stage is taken in.
            assert_ne!(o.stage(Key(2), 100), Staged::Accepted);
            let c = o.counters();
            assert!(c.balanced(), "S-W14 broken: {c:?}");
            assert_eq!(c.pending, 0, "{c:?}");
            let written = sink.written.load(Ordering::SeqCst);
            assert_eq!(written + c.lost(LostReason::Abandoned), 2, "{c:?}");
        });
    });
    let _ = std::panic::take_hook();
}
