//! Panic containment for user code (S-W5, S-W13, S-J8): a panic while
//! creating a write future, polling it, dropping it or rendering its
//! error, or in a codec, becomes a value, never an unwinding writer or a
//! failed recovery.

use std::any::Any;
use std::future::Future;
use std::mem;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

/// The sink panicked; the payload is already disposed of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Panicked;

/// Runs `f`, turning a panic into [`Panicked`].
pub(crate) fn call<T>(f: impl FnOnce() -> T) -> Result<T, Panicked> {
    catch_unwind(AssertUnwindSafe(f)).map_err(dispose)
}

/// Drops `value`, swallowing a panic in its destructor.
pub(crate) fn drop_quietly<T>(value: T) {
    let _ = call(move || drop(value));
}

/// Drops every value of `values` on its own, swallowing a panic in each
/// destructor (S-W13). Dropping a collection whole would not do: a second
/// panicking destructor during the first one's unwinding aborts the
/// process, losing every pending item uncounted.
pub(crate) fn drop_each<T>(values: impl IntoIterator<Item = T>) {
    for value in values {
        drop_quietly(value);
    }
}

/// Drops runs of items (one write's items each), item by item.
pub(crate) fn drop_runs<I>(runs: Vec<Vec<I>>) {
    for run in runs {
        drop_each(run);
    }
}

/// Drops a dead letter's items one by one, then its tenant.
pub(crate) fn drop_letter<K, I>(letter: crate::core::DeadLetter<K, I>) {
    drop_each(letter.items);
    drop_quietly(letter.tenant);
}

/// Drops a shutdown report's unwritten items one by one, then its tenants.
pub(crate) fn drop_report<K, I>(report: crate::core::ShutdownReport<K, I>) {
    for run in report.unwritten {
        let (tenant, items) = run.into_parts();
        drop_each(items);
        drop_quietly(tenant);
    }
}

/// Drops a panic payload; a payload whose own destructor panics is leaked
/// rather than allowed to unwind through the writer.
fn dispose(payload: Box<dyn Any + Send>) -> Panicked {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        mem::forget(again);
    }
    Panicked
}

/// A future whose polls and whose drop cannot unwind: a panic in the inner
/// future's `poll` ends it with `Err(Panicked)`.
///
/// Polled again after it completed, it answers `Err(Panicked)` instead of
/// polling a finished future.
pub(crate) struct Contained<F> {
    inner: Option<Pin<Box<F>>>,
}

impl<F: Future> Contained<F> {
    pub(crate) fn new(future: F) -> Self {
        Contained {
            inner: Some(Box::pin(future)),
        }
    }
}

impl<F: Future> Future for Contained<F> {
    type Output = Result<F::Output, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(Err(Panicked));
        };
        let result = match call(|| inner.as_mut().poll(cx)) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(output)) => Ok(output),
            Err(panicked) => Err(panicked),
        };
        drop_quietly(self.inner.take());
        Poll::Ready(result)
    }
}

impl<F> Drop for Contained<F> {
    fn drop(&mut self) {
        drop_quietly(self.inner.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    struct PanicOnDrop;
    impl Drop for PanicOnDrop {
        fn drop(&mut self) {
            panic!("drop");
        }
    }

    #[tokio::test]
    async fn a_panic_in_poll_becomes_a_value() {
        // S-W5: a panic while polling the write future.
        let out = Contained::new(poll_fn(|_| -> Poll<u8> { panic!("poll") })).await;
        assert_eq!(out, Err(Panicked));
        assert_eq!(Contained::new(async { 7 }).await, Ok(7));
    }

    #[tokio::test]
    async fn a_panic_in_drop_is_swallowed() {
        let guard = PanicOnDrop;
        let fut = async move {
            let _g = guard;
            std::future::pending::<()>().await
        };
        let mut c = Box::pin(Contained::new(fut));
        assert!(futures_poll_once(c.as_mut()).is_pending());
        drop(c); // must not unwind
        assert_eq!(call(|| 1), Ok(1));
        assert_eq!(
            call(|| -> u8 { std::panic::panic_any(PanicOnDrop) }),
            Err(Panicked)
        );
    }

    fn futures_poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
        let waker = std::task::Waker::noop();
        f.poll(&mut Context::from_waker(waker))
    }
}
