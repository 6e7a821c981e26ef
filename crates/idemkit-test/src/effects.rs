//! A counted side effect, and the outage check every store's coordinator tests share.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, ErrorKind, Key, OnStoreError, Operation, Policy, Source, Store};

/// An action that counts its runs and returns a receipt numbered by run: `em_1`, `em_2`...
/// The tests' stand-in for the seed's invoice email.
///
/// # Example
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use std::time::Duration;
/// let mailer = idemkit_test::Mailer::default();
/// assert_eq!(mailer.send(Duration::ZERO).await.unwrap(), "em_1");
/// assert_eq!(mailer.sent(), 1);
/// # });
/// ```
#[derive(Debug, Clone, Default)]
pub struct Mailer {
    sent: Arc<AtomicUsize>,
}

impl Mailer {
    /// How many times [`Mailer::send`] has run.
    pub fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }

    /// Counts a run, waits `delay` (the effect's duration), returns the run's receipt.
    ///
    /// # Errors
    ///
    /// Never: the error type is there to fit `Coordinator` actions.
    pub async fn send(&self, delay: Duration) -> Result<String, Infallible> {
        let n = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok(format!("em_{n}"))
    }
}

/// With `store` unable to answer (a stopped server, a [`Probe`](crate::Probe) failing
/// `begin`): a coordinator that fails closed returns `StoreUnavailable` and runs nothing,
/// and one that fails open runs the action once, unprotected. Returns the mailer, which has
/// sent exactly once. Panics otherwise.
pub async fn assert_fails_closed_then_open<S: Store + Clone>(store: S) -> Mailer {
    let (op, key) = (
        Operation::new("mail.invoice").expect("valid"),
        Key::new("k").expect("valid"),
    );
    let mailer = Mailer::default();

    let closed = Coordinator::new(store.clone());
    let r = closed
        .call(&op, &key)
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert_eq!(
        r.expect_err("fail-closed must refuse").kind(),
        ErrorKind::StoreUnavailable
    );
    assert_eq!(mailer.sent(), 0, "fail-closed ran the action");

    let open = Coordinator::builder(store)
        .policy(Policy::default().on_store_error(OnStoreError::FailOpen))
        .build();
    let r = open
        .call(&op, &key)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .expect("fail-open runs the action");
    assert_eq!(r.source, Source::Unprotected);
    assert_eq!(mailer.sent(), 1);
    mailer
}
