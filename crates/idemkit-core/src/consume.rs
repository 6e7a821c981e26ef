//! What a queue or stream runner does with one delivery: the mapping every runner shares.
//!
//! A runner (Kafka, NATS JetStream, a job framework) receives a message, asks a
//! [`Processor`] to run the user's handler under the coordinator, and gets back a
//! [`Settlement`]: acknowledge, deliver again after a delay, or dead-letter. The mapping is
//! the table below, read from [`Error::disposition`] and a [`RetryPolicy`]; every runner
//! applies it the same way, so no user writes it again.
//!
//! | the call ended with | settlement | counts against `max_deliveries` |
//! |---|---|---|
//! | the action's value, fresh or replayed | `Ack` | - |
//! | [`Error::ResultUnavailable`] (the effect happened, its result was not stored) | `Ack` | - |
//! | [`Error::InFlight`] (reject mode, or a wait past `wait_timeout`: another worker holds the key) | `Retry` after the hint (a runner waits for the owner's key meanwhile) | no |
//! | [`Error::Store`] with the store unavailable (fail-closed) | `Retry` after the backoff | no |
//! | [`Error::Action`] (the handler failed, its key released) | `Retry` after the backoff, then `DeadLetter` | yes |
//! | the key function failed ([`KeyError`]) | `DeadLetter` | - |
//! | [`Error::KeyReused`], [`Error::ActionStored`], [`Error::ReplayedAction`], [`Error::Decode`], [`Error::Config`], any other store error | `DeadLetter` | - |
//!
//! A store outage and a concurrent duplicate are not the message's fault, so they never
//! dead-letter it: the runner keeps retrying with the backoff (capped at
//! [`RetryPolicy::backoff`]'s maximum). Only the handler's own failures use up the budget.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use idemkit_core::consume::{Processor, RetryPolicy, Settlement};
//! use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
//! let processor = Processor::new(
//!     Coordinator::new(MemoryStore::new()),
//!     Operation::new("mail.invoice")?,
//!     // The effect's identity, from the message: the order's invoice, not the delivery.
//!     |order: &String| Key::compose([order.as_str(), "invoice"]),
//!     |order: String, _attempt| async move { Ok::<_, std::io::Error>(format!("em_{order}")) },
//! )
//! .retry(RetryPolicy::new().max_deliveries(3));
//!
//! let first = processor.process(&"order-9".to_string(), 1).await;
//! let again = processor.process(&"order-9".to_string(), 1).await; // the producer's duplicate
//! assert_eq!(first.settlement, Settlement::Ack);
//! assert!(again.receipt.unwrap().is_replay());
//!
//! let blank = processor.process(&String::new(), 1).await; // no order id: no key
//! assert!(matches!(blank.settlement, Settlement::DeadLetter { .. }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{
    Attempt, Coordinator, Disposition, Error, ErrorKind, InFlight, Key, KeyError, Operation,
    Receipt, Store,
};

/// What a runner does with one delivery.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::consume::Settlement;
///
/// let s = Settlement::Retry { after: Duration::from_millis(200) };
/// assert!(!s.is_final());
/// assert!(Settlement::Ack.is_final());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settlement {
    /// Acknowledge (commit the offset, `ack`): the effect happened, now or earlier.
    Ack,
    /// Deliver again after `after` (nak with a delay, retry in place, requeue).
    Retry {
        /// How long to wait first.
        after: Duration,
    },
    /// Retrying cannot help, or the handler's retries are used up: park the message (a
    /// dead-letter topic, `term`, a user hook) and move on.
    DeadLetter {
        /// Why, in one line: goes into the dead-letter record.
        reason: String,
    },
}

impl Settlement {
    /// Whether the delivery is done with: acknowledged or dead-lettered.
    ///
    /// # Example
    ///
    /// See [`Settlement`].
    pub fn is_final(&self) -> bool {
        !matches!(self, Settlement::Retry { .. })
    }
}

/// How often a failing handler is retried, and how long to wait between tries.
///
/// The wait after the `n`-th failure is `initial * 2^(n-1)`, capped at `max`; no jitter
/// (the broker's own redelivery spreads workers out). The defaults: 5 deliveries, 100 ms
/// doubling to 30 s.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::consume::RetryPolicy;
///
/// let p = RetryPolicy::new().backoff(Duration::from_millis(100), Duration::from_secs(1));
/// assert_eq!(p.delay(1), Duration::from_millis(100));
/// assert_eq!(p.delay(3), Duration::from_millis(400));
/// assert_eq!(p.delay(10), Duration::from_secs(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    max_deliveries: u32,
    initial: Duration,
    max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_deliveries: 5,
            initial: Duration::from_millis(100),
            max: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The defaults: 5 deliveries, 100 ms doubling to 30 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many deliveries a failing handler gets before its message is dead-lettered
    /// (at least 1: 1 means no retry).
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n.max(1);
        self
    }

    /// The first wait and the cap.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial = initial;
        self.max = max.max(initial);
        self
    }

    /// The configured number of deliveries.
    pub fn deliveries(&self) -> u32 {
        self.max_deliveries
    }

    /// The wait after the `failures`-th failure (1-based).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << doublings)
            .map_or(self.max, |d| d.min(self.max))
    }

    /// The settlement of one delivery, from the call's result: the table in the
    /// [module docs](self). `delivery` is this delivery's number, 1 for the first.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use idemkit_core::consume::{RetryPolicy, Settlement};
    /// use idemkit_core::Error;
    ///
    /// let p = RetryPolicy::new().max_deliveries(2);
    /// let failed: Result<(), _> = Err(Error::Action("smtp down"));
    /// assert_eq!(p.settle(&failed, 1), Settlement::Retry { after: Duration::from_millis(100) });
    /// assert!(matches!(p.settle(&failed, 2), Settlement::DeadLetter { reason } if reason.contains("smtp down")));
    /// ```
    pub fn settle<T, E: fmt::Display>(
        &self,
        result: &Result<T, Error<E>>,
        delivery: u32,
    ) -> Settlement {
        let Err(error) = result else {
            return Settlement::Ack;
        };
        match (error, error.disposition()) {
            (_, Disposition::Ack) => Settlement::Ack,
            (Error::InFlight { retry_after, .. }, _) => Settlement::Retry {
                after: *retry_after,
            },
            (Error::Action(e), _) if delivery >= self.max_deliveries => Settlement::DeadLetter {
                reason: format!(
                    "the handler failed on delivery {delivery} of {}: {e}",
                    self.max_deliveries
                ),
            },
            (Error::Action(_), _) => Settlement::Retry {
                after: self.delay(delivery),
            },
            // A store outage is not the message's fault: back off, never dead-letter.
            (_, Disposition::Retry { after }) => Settlement::Retry {
                after: after.unwrap_or_else(|| self.delay(delivery)),
            },
            (e, _) => Settlement::DeadLetter {
                reason: dead_letter_reason(e),
            },
        }
    }

    /// The settlement of a message whose key function failed: dead-letter, never run
    /// unprotected.
    pub fn settle_key_error(&self, error: &KeyError) -> Settlement {
        Settlement::DeadLetter {
            reason: format!("the message names no valid effect key: {error}"),
        }
    }
}

fn dead_letter_reason<E: fmt::Display>(e: &Error<E>) -> String {
    match e {
        Error::ActionStored(inner) | Error::ReplayedAction(inner) => format!("{e}: {inner}"),
        _ => e.to_string(),
    }
}

/// One delivery, processed: its settlement, and the call's receipt when the handler's value
/// is known (fresh, replayed or unprotected).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Processed<T> {
    /// What the runner does with the delivery.
    pub settlement: Settlement,
    /// The call's value and source, if it returned one.
    pub receipt: Option<Receipt<T>>,
    /// The kind of the call's error, if it failed (`None` for a key function's failure, and
    /// for success).
    pub error: Option<ErrorKind>,
}

/// A user's message handler under a coordinator: the effect identity from the message, the
/// handler as the action, the settlement from the [table](self).
///
/// `K: Fn(&M) -> Result<Key, KeyError>` names the effect a message asks for (keys name the
/// effect, not the delivery: `order-9.invoice`, not the offset or message id). A key
/// function that fails dead-letters the message; it never runs the handler unprotected.
/// `H: Fn(M, Attempt) -> Future<Output = Result<T, E>>` is the handler; its value is stored
/// with the JSON codec and replayed to every redelivery.
///
/// Runners share one `Processor` between their tasks (it is `Sync` when its parts are).
///
/// # Example
///
/// See the [module docs](self).
pub struct Processor<S, K, H> {
    coordinator: Coordinator<S>,
    operation: Operation,
    key: K,
    handler: H,
    retry: RetryPolicy,
    in_flight: Option<InFlight>,
    ttl: Option<Duration>,
    protected: bool,
}

impl<S: fmt::Debug, K, H> fmt::Debug for Processor<S, K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Processor")
            .field("coordinator", &self.coordinator)
            .field("operation", &self.operation)
            .field("retry", &self.retry)
            .field("in_flight", &self.in_flight)
            .field("ttl", &self.ttl)
            .field("protected", &self.protected)
            .finish_non_exhaustive()
    }
}

impl<S: Store, K, H> Processor<S, K, H> {
    /// A processor for `operation`, with the coordinator's policy for it.
    pub fn new(coordinator: Coordinator<S>, operation: Operation, key: K, handler: H) -> Self {
        Processor {
            coordinator,
            operation,
            key,
            handler,
            retry: RetryPolicy::default(),
            in_flight: None,
            ttl: None,
            protected: true,
        }
    }

    /// The retry budget and backoff of a failing handler.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// What a concurrent duplicate does, instead of the policy's: `Wait` (both deliveries
    /// settle `Ack`, one effect) or `Reject` (the duplicate settles `Retry` after the hint).
    pub fn in_flight(mut self, in_flight: InFlight) -> Self {
        self.in_flight = Some(in_flight);
        self
    }

    /// How long a result is kept, instead of the policy's TTL: longer than the latest
    /// redelivery (the broker's retention, the consumer's longest outage).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Switches idempotency off (`false`): the handler runs on every delivery, with
    /// [`Attempt::unprotected`], and its key function is not called. For comparisons and
    /// benchmarks: it is what a runner without idemkit does.
    pub fn protected(mut self, protected: bool) -> Self {
        self.protected = protected;
        self
    }

    /// The retry policy.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    /// The operation.
    pub fn operation(&self) -> &Operation {
        &self.operation
    }

    /// The coordinator.
    pub fn coordinator(&self) -> &Coordinator<S> {
        &self.coordinator
    }

    /// The effect key `message` names, or why it names none.
    pub fn key_of<M>(&self, message: &M) -> Result<Key, KeyError>
    where
        K: Fn(&M) -> Result<Key, KeyError>,
    {
        (self.key)(message)
    }

    /// Runs one delivery of `message` (its `delivery`-th, 1-based) and settles it.
    ///
    /// The handler gets a clone of the message only if it runs.
    pub async fn process<M>(&self, message: &M, delivery: u32) -> Processed<H::Output>
    where
        M: Clone,
        K: Fn(&M) -> Result<Key, KeyError>,
        H: Handle<M>,
    {
        self.process_prepared(message, None, delivery).await
    }

    /// Runs the first delivery of each message of a batch, in order, their keys reserved
    /// together first ([`Coordinator::prepare`]: one store round trip for the batch where
    /// the store can, instead of one per message). Stops after the first message that is
    /// not settled for good (`Retry`): the result holds the settled prefix and that message,
    /// which the runner retries (with [`process`](Processor::process)) before it goes on with
    /// the rest; the rest's reservations are released.
    ///
    /// The reservations of a batch are held from the start: a message that waits behind
    /// slow handlers of its batch keeps its key reserved meanwhile (confirmed before it runs,
    /// if it waited longer than a renewal interval). If the process dies mid-batch, the keys
    /// not yet started stay reserved until their lease ends: their redelivery elsewhere waits
    /// up to one lease.
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::consume::{Processor, Settlement};
    /// use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let p = Processor::new(
    ///     Coordinator::new(MemoryStore::new()),
    ///     Operation::new("mail.invoice")?,
    ///     |order: &String| Key::compose([order.as_str(), "invoice"]),
    ///     |order: String, _| async move { Ok::<_, std::io::Error>(format!("em_{order}")) },
    /// );
    /// let batch = ["order-1".to_string(), "order-2".into(), "order-1".into()];
    /// let out = p.process_batch(&batch).await;
    /// assert_eq!(out.len(), 3);
    /// assert!(out.iter().all(|o| o.settlement == Settlement::Ack));
    /// assert!(out[2].receipt.as_ref().unwrap().is_replay());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn process_batch<M>(&self, messages: &[M]) -> Vec<Processed<H::Output>>
    where
        M: Clone,
        K: Fn(&M) -> Result<Key, KeyError>,
        H: Handle<M>,
    {
        self.process_batch_while(messages, || true).await
    }

    /// [`process_batch`](Processor::process_batch), asking `go_on` before each message: once
    /// it says no (the runner lost the partition, or is shutting down), the batch stops and
    /// the reservations of the messages not started are released, so their next owner does
    /// not wait for a lease.
    pub async fn process_batch_while<M>(
        &self,
        messages: &[M],
        go_on: impl Fn() -> bool,
    ) -> Vec<Processed<H::Output>>
    where
        M: Clone,
        K: Fn(&M) -> Result<Key, KeyError>,
        H: Handle<M>,
    {
        let mut claims = self.prepare(messages).await.into_iter();
        let mut out = Vec::with_capacity(messages.len());
        for m in messages {
            if !go_on() {
                break; // the unused claims are released as they drop
            }
            let processed = self.process_prepared(m, claims.next().flatten(), 1).await;
            let stop = !processed.settlement.is_final();
            out.push(processed);
            if stop {
                break;
            }
        }
        out
    }

    /// Reserves the keys of a batch of messages in one store round trip
    /// ([`Coordinator::prepare`]), for [`process_prepared`](Processor::process_prepared):
    /// one claim per message, in order (`None` for a message whose key function fails, and
    /// for every message when the processor is unprotected). A runner that settles each
    /// message as soon as it is handled (and stores its offset then) uses these two instead
    /// of [`process_batch`](Processor::process_batch). A claim dropped unused is released.
    pub async fn prepare<M>(&self, messages: &[M]) -> Vec<Option<crate::Prepared<S>>>
    where
        K: Fn(&M) -> Result<Key, KeyError>,
    {
        if !self.protected {
            return messages.iter().map(|_| None).collect();
        }
        let keys: Vec<Result<Key, KeyError>> = messages.iter().map(|m| (self.key)(m)).collect();
        let valid: Vec<Key> = keys
            .iter()
            .filter_map(|k| k.as_ref().ok().cloned())
            .collect();
        let mut prepared = self
            .coordinator
            .prepare(&self.operation, &valid)
            .await
            .into_iter();
        keys.iter()
            .map(|k| k.as_ref().ok().and_then(|_| prepared.next()))
            .collect()
    }

    /// [`process`](Processor::process), with the claim [`prepare`](Processor::prepare) made
    /// for this message (a claim confirmed late is renewed before the handler runs).
    pub async fn process_prepared<M>(
        &self,
        message: &M,
        prepared: Option<crate::Prepared<S>>,
        delivery: u32,
    ) -> Processed<H::Output>
    where
        M: Clone,
        K: Fn(&M) -> Result<Key, KeyError>,
        H: Handle<M>,
    {
        if !self.protected {
            return self.unprotected(message, delivery).await;
        }
        match (self.key)(message) {
            Ok(key) => self.run(message, &key, prepared, delivery).await,
            Err(e) => self.key_failed(&e),
        }
    }

    /// Retries a delivery in place until it settles for good (`Ack` or `DeadLetter`), the
    /// way every runner does: the handler's own failures are counted in `failures` (give
    /// the count of this delivery's failures so far: 0 after a first `process`, whose
    /// failure this counts) against [`RetryPolicy::max_deliveries`], with its backoff; a
    /// store outage backs off without counting; a duplicate in flight waits for the owner's
    /// key to be completed, released or to expire (pushed by the store, see
    /// [`Coordinator::wait_while_reserved`]), at most the hint, so an operator's release
    /// of a dead owner lets the message go on at once. `go_on` is asked before each try;
    /// `None` once it says no (a revoked partition, a shutdown): the delivery is left to
    /// the broker.
    pub async fn settle_in_place<M>(
        &self,
        message: &M,
        mut processed: Processed<H::Output>,
        failures: &mut u32,
        go_on: impl Fn() -> bool,
    ) -> Option<Processed<H::Output>>
    where
        M: Clone,
        K: Fn(&M) -> Result<Key, KeyError>,
        H: Handle<M>,
    {
        loop {
            let Settlement::Retry { after } = processed.settlement else {
                return Some(processed);
            };
            if processed.error == Some(ErrorKind::Action) {
                *failures += 1;
            }
            if !go_on() {
                return None;
            }
            match (processed.error, (self.key)(message)) {
                (Some(ErrorKind::InFlight), Ok(key)) => {
                    if let Err(e) = self
                        .coordinator
                        .wait_while_reserved(&self.operation, None, &key, after)
                        .await
                    {
                        tracing::debug!(operation = %self.operation, error = %e,
                            "waiting for the key's owner failed; backing off");
                        tokio::time::sleep(after).await;
                    }
                }
                _ => tokio::time::sleep(after).await,
            }
            if !go_on() {
                return None;
            }
            processed = self.process(message, *failures + 1).await;
        }
    }

    fn key_failed<T>(&self, e: &KeyError) -> Processed<T> {
        Processed {
            settlement: self.retry.settle_key_error(e),
            receipt: None,
            error: None,
        }
    }

    async fn run<M>(
        &self,
        message: &M,
        key: &Key,
        prepared: Option<crate::Prepared<S>>,
        delivery: u32,
    ) -> Processed<H::Output>
    where
        M: Clone,
        H: Handle<M>,
    {
        let mut call = self.coordinator.call(&self.operation, key);
        if let Some(in_flight) = self.in_flight {
            call = call.in_flight(in_flight);
        }
        if let Some(ttl) = self.ttl {
            call = call.ttl(ttl);
        }
        let action = |attempt| self.handler.handle(message.clone(), attempt);
        // A panicking handler is a failing handler (retried, then dead-lettered), never a
        // dead runner task; the coordinator has released its key.
        let result = match prepared {
            Some(p) => crate::unwind::catch(call.prepared(p).run(action)).await,
            None => crate::unwind::catch(call.run(action)).await,
        };
        match result {
            Ok(result) => self.settled(result, delivery),
            Err(panic) => self.panicked(&*panic, delivery),
        }
    }

    /// The settlement of a handler that panicked: a handler failure.
    fn panicked<T>(&self, panic: &(dyn std::any::Any + Send), delivery: u32) -> Processed<T> {
        let message = crate::unwind::message(panic);
        tracing::warn!(operation = %self.operation, panic = message, "the handler panicked");
        let failed: Result<Receipt<T>, Error<String>> =
            Err(Error::Action(format!("the handler panicked: {message}")));
        self.settled(failed, delivery)
    }

    async fn unprotected<M>(&self, message: &M, delivery: u32) -> Processed<H::Output>
    where
        M: Clone,
        H: Handle<M>,
    {
        let handled =
            crate::unwind::catch(self.handler.handle(message.clone(), Attempt::unprotected()))
                .await;
        match handled {
            Ok(result) => {
                let result = result
                    .map(|v| Receipt::new(v, crate::Source::Unprotected, None))
                    .map_err(Error::Action);
                self.settled(result, delivery)
            }
            Err(panic) => self.panicked(&*panic, delivery),
        }
    }

    fn settled<T, E: fmt::Display>(
        &self,
        result: Result<Receipt<T>, Error<E>>,
        delivery: u32,
    ) -> Processed<T> {
        let settlement = self.retry.settle(&result, delivery);
        match result {
            Ok(receipt) => Processed {
                settlement,
                receipt: Some(receipt),
                error: None,
            },
            Err(e) => Processed {
                settlement,
                receipt: None,
                error: Some(e.kind()),
            },
        }
    }
}

/// A message handler: what a [`Processor`] runs as the action. Implemented for every
/// `Fn(M, Attempt) -> impl Future<Output = Result<T, E>>` whose value can be stored (JSON)
/// and whose error can be shown (it goes into dead-letter records).
///
/// # Example
///
/// ```
/// use idemkit_core::Attempt;
/// use idemkit_core::consume::Handle;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn op() -> Operation {
        Operation::new("consume.test").unwrap()
    }

    #[test]
    fn the_table() {
        let p = RetryPolicy::new().max_deliveries(3);
        let s = |r: Result<(), Error<&str>>, d| p.settle(&r, d);
        assert_eq!(s(Ok(()), 1), Settlement::Ack);
        assert_eq!(
            s(
                Err(Error::ResultUnavailable {
                    reason: "big".into()
                }),
                9
            ),
            Settlement::Ack
        );
        let hint = Duration::from_millis(700);
        assert_eq!(
            s(Err(Error::in_flight(hint)), 99),
            Settlement::Retry { after: hint }
        );
        assert_eq!(
            s(Err(Error::Action("x")), 2),
            Settlement::Retry {
                after: Duration::from_millis(200)
            }
        );
        assert!(matches!(
            s(Err(Error::Action("x")), 3),
            Settlement::DeadLetter { .. }
        ));
        let down = Error::Store {
            phase: crate::Phase::Begin,
            source: crate::StoreError::unavailable("refused"),
        };
        assert!(matches!(s(Err(down), 99), Settlement::Retry { .. }));
        for e in [
            Error::KeyReused,
            Error::ActionStored("declined"),
            Error::ReplayedAction("declined"),
            Error::Config { reason: "bad" },
        ] {
            assert!(matches!(s(Err(e), 1), Settlement::DeadLetter { .. }));
        }
    }

    #[tokio::test]
    async fn unprotected_runs_every_time_and_protected_once() {
        let runs = Arc::new(AtomicU32::new(0));
        let make = |protected| {
            let runs = runs.clone();
            Processor::new(
                Coordinator::new(MemoryStore::new()),
                op(),
                |m: &u32| Key::new(m.to_string()),
                move |m: u32, _| {
                    let runs = runs.clone();
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, String>(m)
                    }
                },
            )
            .protected(protected)
        };
        let on = make(true);
        for _ in 0..3 {
            assert_eq!(on.process(&7, 1).await.settlement, Settlement::Ack);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let off = make(false);
        for _ in 0..3 {
            assert_eq!(off.process(&7, 1).await.settlement, Settlement::Ack);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_failing_key_function_never_runs_the_handler() {
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        let p = Processor::new(
            Coordinator::new(MemoryStore::new()),
            op(),
            |_: &u32| Key::new(""),
            move |_: u32, _| {
                r.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, String>(()) }
            },
        );
        let out = p.process(&1, 1).await;
        assert!(
            matches!(out.settlement, Settlement::DeadLetter { ref reason } if reason.contains("key"))
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}
