//! Catching a panic inside a future: an action that panics is a failed action (its key is
//! released, a runner retries or dead-letters its message), not a torn-down task that leaves
//! its reservation and its queue behind.

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project_lite::pin_project! {
    /// Polls `inner`, turning a panic during a poll into `Err(payload)`.
    pub(crate) struct CatchUnwind<F> {
        #[pin]
        inner: F,
    }
}

/// `inner`, with its panics caught (see [`CatchUnwind`]).
pub(crate) fn catch<F: Future>(inner: F) -> CatchUnwind<F> {
    CatchUnwind { inner }
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.project().inner;
        // Unwind safety: a future that panicked is never polled again (the caller gets the
        // payload and drops it), so no broken invariant of it can be observed.
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}

/// A panic's message, for logs and dead-letter reasons.
pub(crate) fn message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a panic with a non-string payload"
    }
}
