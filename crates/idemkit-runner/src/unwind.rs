//! A handler's panic caught as a value: a failed handler (its key is released, the runner
//! retries or dead-letters its message), not a torn-down task that leaves its reservation
//! and its queue behind.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt as _;

/// `inner`'s output, or the payload of a panic during one of its polls.
pub(crate) async fn catch<F: Future>(inner: F) -> Result<F::Output, Box<dyn Any + Send>> {
    // The future is dropped right after a panic and nothing it borrowed is looked at again.
    AssertUnwindSafe(inner).catch_unwind().await
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
