//! The handler a [`Processor`](crate::Processor) runs as the action.

use std::fmt;
use std::future::Future;

use idemkit_core::Attempt;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A message handler: what a [`Processor`](crate::Processor) runs as the action. Implemented for every
/// `Fn(M, Attempt) -> impl Future<Output = Result<T, E>>` whose value can be stored (JSON)
/// and whose error can be shown (it goes into dead-letter records).
///
/// # Example
///
/// ```
/// use idemkit_core::Attempt;
/// use idemkit_runner::Handle;
///
/// fn assert_handler<H: Handle<String>>(_: &H) {}
/// assert_handler(&|order: String, _: Attempt| async move { Ok::<_, std::io::Error>(order.len()) });
/// ```
pub trait Handle<M>: Send + Sync {
    /// The handler's value, stored and replayed.
    type Output: Serialize + DeserializeOwned + Send;
    /// The handler's error.
    type Error: fmt::Display + Send;
    /// Handles one message.
    fn handle(
        &self,
        message: M,
        attempt: Attempt,
    ) -> impl Future<Output = Result<Self::Output, Self::Error>> + Send;
}

impl<M, F, Fut, T, E> Handle<M> for F
where
    F: Fn(M, Attempt) -> Fut + Send + Sync,
    Fut: Future<Output = Result<T, E>> + Send,
    T: Serialize + DeserializeOwned + Send,
    E: fmt::Display + Send,
{
    type Output = T;
    type Error = E;
    fn handle(&self, message: M, attempt: Attempt) -> impl Future<Output = Result<T, E>> + Send {
        self(message, attempt)
    }
}
