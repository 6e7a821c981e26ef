//! A user's handler under a coordinator: one delivery in, its [`Processed`] settlement out.

use std::fmt;
use std::time::Duration;

use idemkit_core::{
    Attempt, Coordinator, Error, ErrorKind, InFlight, Key, KeyError, Operation, Prepared, Receipt,
    Source, Store,
};

use crate::handle::Handle;
use crate::key::KeyOf;
use crate::settlement::{RetryPolicy, Settlement};
use idemkit_core::unwind;

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
/// handler as the action, the settlement from the [table](crate).
///
/// `K` names the effect a message asks for ([`KeyOf`]): a key function `Fn(&M) ->
/// Result<Key, KeyError>` (keys name the effect, not the delivery: `order-9.invoice`, not the
/// offset), or, with no key function given (`()`), the message's dedupe id ([`DedupeId`]: the
/// id its producer's effect published it under, which is the same on every republish). A
/// key that fails dead-letters the message; it never runs the handler unprotected.
///
/// [`DedupeId`]: crate::DedupeId
/// `H: Fn(M, Attempt) -> Future<Output = Result<T, E>>` is the handler; its value is stored
/// with the JSON codec and replayed to every redelivery.
///
/// Runners share one `Processor` between their tasks (it is `Sync` when its parts are).
///
/// # Example
///
/// See the [crate docs](crate).
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

/// Builds a [`Processor`] a part at a time: what it runs under (the coordinator and the
/// operation), then the message's key, then the handler; the options follow on the
/// processor. From [`Processor::builder`].
///
/// ```
/// use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
/// use idemkit_runner::{Processor, RetryPolicy};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let processor = Processor::builder(Coordinator::new(MemoryStore::new()), Operation::new("mail.invoice")?)
///     .key(|order: &String| Key::compose([order.as_str(), "invoice"]))
///     .handler(|order: String, _attempt: idemkit_core::Attempt| async move {
///         Ok::<_, std::io::Error>(format!("em_{order}"))
///     })
///     .retry(RetryPolicy::new().max_deliveries(3));
/// assert_eq!(processor.operation().as_str(), "mail.invoice");
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until its handler is given"]
pub struct ProcessorBuilder<S, K = ()> {
    coordinator: Coordinator<S>,
    operation: Operation,
    key: K,
}

impl<S: Store> Processor<S, (), ()> {
    /// Starts a processor for `operation` under `coordinator` (with the coordinator's
    /// policy for it); the key function and the handler come next.
    pub fn builder(coordinator: Coordinator<S>, operation: Operation) -> ProcessorBuilder<S> {
        ProcessorBuilder {
            coordinator,
            operation,
            key: (),
        }
    }
}

impl<S: Store> ProcessorBuilder<S> {
    /// The effect's key, from the message (the order's invoice, not the delivery). Without
    /// it, [`handler`](Self::handler) keys each message on its dedupe id
    /// ([`DedupeId`](crate::DedupeId)), as a consumer of idemkit producers wants.
    pub fn key<K>(self, key: K) -> ProcessorBuilder<S, K> {
        ProcessorBuilder {
            coordinator: self.coordinator,
            operation: self.operation,
            key,
        }
    }
}

impl<S: Store, K> ProcessorBuilder<S, K> {
    /// The handler, the action each message runs under its key: the processor, whose
    /// options ([`retry`](Processor::retry), [`in_flight`](Processor::in_flight),
    /// [`ttl`](Processor::ttl), [`protected`](Processor::protected)) follow.
    pub fn handler<H>(self, handler: H) -> Processor<S, K, H> {
        Processor::new(self.coordinator, self.operation, self.key, handler)
    }
}

impl<S: Store, K, H> Processor<S, K, H> {
    /// A processor for `operation`, with the coordinator's policy for it: the same as
    /// [`Processor::builder`]`(coordinator, operation).key(key).handler(handler)`.
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
        K: KeyOf<M>,
    {
        self.key.key_of(message)
    }

    /// Runs one delivery of `message` (its `delivery`-th, 1-based) and settles it.
    ///
    /// The handler gets a clone of the message only if it runs.
    pub async fn process<M>(&self, message: &M, delivery: u32) -> Processed<H::Output>
    where
        M: Clone,
        K: KeyOf<M>,
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
    /// use idemkit_runner::{Processor, Settlement};
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
        K: KeyOf<M>,
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
        K: KeyOf<M>,
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
    pub async fn prepare<M>(&self, messages: &[M]) -> Vec<Option<Prepared<S>>>
    where
        K: KeyOf<M>,
    {
        if !self.protected {
            return messages.iter().map(|_| None).collect();
        }
        let keys: Vec<Result<Key, KeyError>> =
            messages.iter().map(|m| self.key.key_of(m)).collect();
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
        prepared: Option<Prepared<S>>,
        delivery: u32,
    ) -> Processed<H::Output>
    where
        M: Clone,
        K: KeyOf<M>,
        H: Handle<M>,
    {
        self.process_signalled(message, prepared, delivery, || {})
            .await
    }

    /// [`process_prepared`](Processor::process_prepared), calling `handled` the moment the
    /// handler returned a value, before that value is stored: the effect has happened, and
    /// what is left is the completion's round trip. A runner that keeps a partition's
    /// order starts the partition's next message then, so that completions overlap the next
    /// handler (idemkit-kafka). `handled` is not called when the handler fails or panics
    /// (its message is retried before any later one), nor when it does not run (a replay,
    /// an owner in flight, an error before the action).
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
    /// use idemkit_runner::Processor;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let processor = Processor::new(
    ///     Coordinator::new(MemoryStore::new()),
    ///     Operation::new("mail.invoice")?,
    ///     |order: &String| Key::compose([order.as_str(), "invoice"]),
    ///     |order: String, _attempt| async move { Ok::<_, std::io::Error>(format!("em_{order}")) },
    /// );
    /// let handled = AtomicBool::new(false);
    /// let message = "order-9".to_string();
    /// processor.process_signalled(&message, None, 1, || handled.store(true, Ordering::SeqCst)).await;
    /// assert!(handled.load(Ordering::SeqCst));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn process_signalled<M>(
        &self,
        message: &M,
        prepared: Option<Prepared<S>>,
        delivery: u32,
        handled: impl FnOnce() + Send,
    ) -> Processed<H::Output>
    where
        M: Clone,
        K: KeyOf<M>,
        H: Handle<M>,
    {
        if !self.protected {
            return self.unprotected(message, delivery, handled).await;
        }
        match self.key.key_of(message) {
            Ok(key) => self.run(message, &key, prepared, delivery, handled).await,
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
        K: KeyOf<M>,
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
            match (processed.error, self.key.key_of(message)) {
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
        prepared: Option<Prepared<S>>,
        delivery: u32,
        handled: impl FnOnce() + Send,
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
        let action = |attempt| {
            let handling = self.handler.handle(message.clone(), attempt);
            async move {
                let result = handling.await;
                if result.is_ok() {
                    handled();
                }
                result
            }
        };
        // A panicking handler is a failing handler (retried, then dead-lettered), never a
        // dead runner task; the coordinator has released its key.
        let result = match prepared {
            Some(p) => unwind::catch(call.prepared(p).run(action)).await,
            None => unwind::catch(call.run(action)).await,
        };
        match result {
            Ok(result) => self.settled(result, delivery),
            Err(panic) => self.panicked(&*panic, delivery),
        }
    }

    /// The settlement of a handler that panicked: a handler failure.
    fn panicked<T>(&self, panic: &(dyn std::any::Any + Send), delivery: u32) -> Processed<T> {
        let message = unwind::message(panic);
        tracing::warn!(operation = %self.operation, panic = message, "the handler panicked");
        let failed: Result<Receipt<T>, Error<String>> =
            Err(Error::Action(format!("the handler panicked: {message}")));
        self.settled(failed, delivery)
    }

    async fn unprotected<M>(
        &self,
        message: &M,
        delivery: u32,
        on_value: impl FnOnce(),
    ) -> Processed<H::Output>
    where
        M: Clone,
        H: Handle<M>,
    {
        let handled =
            unwind::catch(self.handler.handle(message.clone(), Attempt::unprotected())).await;
        match handled {
            Ok(result) => {
                if result.is_ok() {
                    on_value();
                }
                let result = result
                    .map(|v| Receipt::new(v, Source::Unprotected, None))
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

#[cfg(test)]
mod tests {
    use super::*;
    use idemkit_core::MemoryStore;
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
            phase: idemkit_core::Phase::Begin,
            source: idemkit_core::StoreError::unavailable("refused"),
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
