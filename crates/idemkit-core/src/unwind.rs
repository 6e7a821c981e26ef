//! Catching a panic inside a future: an action that panics is a failed action (its key is
//! released, a runner retries or dead-letters its message), not a torn-down task that leaves
//! its reservation and its queue behind. The coordinator catches an action's panics with it,
//! and the runners (`idemkit-runner`) a handler's.
//!
//! [`catch`] is a plain function returning the wrapper, not an `async fn`: an `async fn`
//! taking a future keeps its argument's slot beside the future it awaits, which doubled a
//! runner message's future (measured in docs/benchmarks.md).
//!
//! ```
//! use idemkit_core::unwind;
//!
//! # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
//! let caught = unwind::catch(async { panic!("the handler broke") }).await;
//! let payload = caught.expect_err("a panic, as a value");
//! assert_eq!(unwind::message(&*payload), "the handler broke");
//! assert_eq!(unwind::catch(async { 7 }).await.ok(), Some(7));
//! # });
//! # Ok::<(), std::io::Error>(())
//! ```

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project_lite::pin_project! {
    /// Polls `inner`, turning a panic during a poll into `Err(payload)` (made by [`catch`]).
    #[must_use = "futures do nothing unless polled"]
    pub struct CatchUnwind<F> {
        #[pin]
        inner: F,
    }
}

/// `inner`, with its panics caught (see [`CatchUnwind`]).
pub fn catch<F: Future>(inner: F) -> CatchUnwind<F> {
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

/// A panic's message, for logs and dead-letter reasons: the payload of `panic!` with a
/// message, or a fixed text for any other payload.
pub fn message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a panic with a non-string payload"
    }
}
