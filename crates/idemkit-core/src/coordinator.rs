//! The coordinator: reserve, run while renewing, complete, replay.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::mem;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tracing::Instrument as _;

use crate::clock::now;
use crate::codec::{Codec, JsonCodec};
use crate::error::{Error, Phase};
use crate::policy::{InFlight, OnStoreError, Policy};
use crate::record::{FencingToken, OutcomeKind, OwnerToken};
use crate::store::{Begin, BeginRequest, BoxError, Completed, Completion, Lease, Store};
use crate::{Fingerprint, Key, Operation, Scope, StorageKey};

/// Runs actions at most once per key, replaying the stored result to every later caller.
///
/// Cheap to clone (an `Arc`); share one per store.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::{Coordinator, Key, MemoryStore, Operation, Source};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let coordinator = Coordinator::new(MemoryStore::new());
/// let op = Operation::new("mail.invoice")?;
/// let key = Key::compose(["order-9", "invoice"])?;
/// let send = |_| async { Ok::<_, std::io::Error>("em_1".to_string()) };
/// let first = coordinator.call(&op, &key).ttl(Duration::from_secs(3600)).run(send).await?;
/// let again = coordinator.call(&op, &key).ttl(Duration::from_secs(3600)).run(send).await?;
/// assert_eq!(first.source, Source::Fresh);
/// assert_eq!(again.source, Source::Replayed);
/// assert_eq!(again.value, "em_1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Coordinator<S> {
    inner: Arc<Shared<S>>,
}

struct Shared<S> {
    store: S,
    policy: Policy,
    /// Per-operation overrides, fixed at build time so a call's lookup takes no lock.
    overrides: HashMap<Operation, Policy>,
}

impl<S> Clone for Coordinator<S> {
    fn clone(&self) -> Self {
        Coordinator {
            inner: self.inner.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Coordinator<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coordinator")
            .field("store", &self.inner.store)
            .field("policy", &self.inner.policy)
            .field("overrides", &self.inner.overrides)
            .finish()
    }
}

/// Builds a [`Coordinator`] with a policy and per-operation overrides.
///
/// # Example
///
/// ```
/// use idemkit_core::{Coordinator, InFlight, MemoryStore, Operation, Policy};
///
/// let charge = Operation::new("payment.charge")?;
/// let coordinator = Coordinator::builder(MemoryStore::new())
///     .policy(Policy::default().in_flight(InFlight::Wait))
///     .operation_policy(charge.clone(), Policy::default().in_flight(InFlight::Reject))
///     .build();
/// assert_eq!(coordinator.policy_for(&charge).in_flight, InFlight::Reject);
/// # Ok::<(), idemkit_core::KeyError>(())
/// ```
#[derive(Debug)]
pub struct Builder<S> {
    store: S,
    policy: Policy,
    overrides: HashMap<Operation, Policy>,
}

impl<S: Store> Builder<S> {
    /// Sets the default policy.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, MemoryStore, Policy, OnStoreError};
    /// let c = Coordinator::builder(MemoryStore::new())
    ///     .policy(Policy::default().on_store_error(OnStoreError::FailOpen)).build();
    /// assert_eq!(c.policy().on_store_error, OnStoreError::FailOpen);
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets the policy of one operation.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, InFlight, MemoryStore, Operation, Policy};
    /// let op = Operation::new("a")?;
    /// let c = Coordinator::builder(MemoryStore::new())
    ///     .operation_policy(op.clone(), Policy::default().in_flight(InFlight::Run)).build();
    /// assert_eq!(c.policy_for(&op).in_flight, InFlight::Run);
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn operation_policy(mut self, operation: Operation, policy: Policy) -> Self {
        self.overrides.insert(operation, policy);
        self
    }

    /// Builds the coordinator.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, MemoryStore};
    /// let _c = Coordinator::builder(MemoryStore::new()).build();
    /// ```
    pub fn build(self) -> Coordinator<S> {
        Coordinator {
            inner: Arc::new(Shared {
                store: self.store,
                policy: self.policy,
                overrides: self.overrides,
            }),
        }
    }
}

impl<S: Store> Coordinator<S> {
    /// A coordinator with the default [`Policy`].
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, MemoryStore, Policy};
    /// let c = Coordinator::new(MemoryStore::new());
    /// assert_eq!(*c.policy(), Policy::default());
    /// ```
    pub fn new(store: S) -> Self {
        Self::builder(store).build()
    }

    /// A builder, to set policies.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, MemoryStore};
    /// let _c = Coordinator::builder(MemoryStore::new()).build();
    /// ```
    pub fn builder(store: S) -> Builder<S> {
        Builder {
            store,
            policy: Policy::default(),
            overrides: HashMap::new(),
        }
    }

    /// The store.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, MemoryStore};
    /// let c = Coordinator::new(MemoryStore::new());
    /// assert!(c.store().is_empty());
    /// ```
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The default policy.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, InFlight, MemoryStore};
    /// assert_eq!(Coordinator::new(MemoryStore::new()).policy().in_flight, InFlight::Wait);
    /// ```
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// The policy an operation runs under.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, MemoryStore, Operation};
    /// let c = Coordinator::new(MemoryStore::new());
    /// assert_eq!(c.policy_for(&Operation::new("x")?), c.policy());
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn policy_for(&self, operation: &Operation) -> &Policy {
        self.inner
            .overrides
            .get(operation)
            .unwrap_or(&self.inner.policy)
    }

    /// Starts a call: `operation` + `key`, then options, then [`Call::run`].
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let c = Coordinator::new(MemoryStore::new());
    /// let (op, key) = (Operation::new("mail.invoice")?, Key::new("order-9.invoice")?);
    /// let out = c.call(&op, &key).ttl(Duration::from_millis(1500))
    ///     .run(|attempt| async move { Ok::<_, std::io::Error>(attempt.fencing_token().is_some()) })
    ///     .await?;
    /// assert!(out.value);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call<'a>(&'a self, operation: &'a Operation, key: &'a Key) -> Call<'a, S, JsonCodec> {
        let policy = *self.policy_for(operation);
        Call {
            coordinator: self,
            operation,
            key,
            scope: None,
            fingerprint: None,
            ttl: policy.ttl,
            policy,
            codec: JsonCodec,
        }
    }
}

/// Where a call's value came from.
///
/// # Example
///
/// ```
/// use idemkit_core::Source;
///
/// assert_ne!(Source::Fresh, Source::Replayed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// This call reserved the key and ran the action.
    Fresh,
    /// An earlier call's stored result, replayed; the action did not run.
    Replayed,
    /// The action ran without protection (fail-open on a store outage, or
    /// [`InFlight::Run`]); nothing was stored.
    Unprotected,
}

/// A call's value and where it came from.
///
/// # Example
///
/// ```
/// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation, Source};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// # let c = Coordinator::new(MemoryStore::new());
/// # let (op, key) = (Operation::new("op")?, Key::new("k")?);
/// let out = c.call(&op, &key).run(|_| async { Ok::<_, std::io::Error>(5) }).await?;
/// assert!(!out.is_replay());
/// assert_eq!(out.into_value(), 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Outcome<T> {
    /// The value.
    pub value: T,
    /// Fresh, replayed or unprotected.
    pub source: Source,
    /// The fencing token of the reservation that produced the value (none if unprotected).
    pub fencing: Option<FencingToken>,
}

impl<T> Outcome<T> {
    /// Whether the value was replayed from the store.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// # let c = Coordinator::new(MemoryStore::new());
    /// # let (op, key) = (Operation::new("op")?, Key::new("k")?);
    /// # let out = c.call(&op, &key).run(|_| async { Ok::<_, std::io::Error>(5) }).await?;
    /// assert!(!out.is_replay());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_replay(&self) -> bool {
        self.source == Source::Replayed
    }

    /// The value.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// # let c = Coordinator::new(MemoryStore::new());
    /// # let (op, key) = (Operation::new("op")?, Key::new("k")?);
    /// let v = c.call(&op, &key).run(|_| async { Ok::<_, std::io::Error>(5) }).await?.into_value();
    /// assert_eq!(v, 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_value(self) -> T {
        self.value
    }
}

/// What the action is told about its run.
///
/// # Example
///
/// ```
/// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// # let c = Coordinator::new(MemoryStore::new());
/// # let (op, key) = (Operation::new("op")?, Key::new("k")?);
/// let out = c.call(&op, &key).run(|attempt| async move {
///     // Pass the token to a downstream system that rejects smaller tokens than it has seen.
///     Ok::<_, std::io::Error>(attempt.fencing_token().map(|t| t.get()))
/// }).await?;
/// assert!(out.value.is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    fencing: Option<FencingToken>,
}

impl Attempt {
    /// The reservation's fencing token; `None` when running unprotected.
    ///
    /// # Example
    ///
    /// See [`Attempt`].
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.fencing
    }

    /// Whether the run holds a reservation.
    ///
    /// # Example
    ///
    /// See [`Attempt`].
    pub fn is_protected(&self) -> bool {
        self.fencing.is_some()
    }
}

/// One call being set up: options, then [`run`](Call::run) or
/// [`run_storing_errors`](Call::run_storing_errors).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::{Coordinator, Fingerprint, InFlight, Key, MemoryStore, Operation, Scope};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let c = Coordinator::new(MemoryStore::new());
/// let (op, key, tenant) = (Operation::new("charge")?, Key::new("k1")?, Scope::new("t-1")?);
/// let out = c.call(&op, &key)
///     .scope(&tenant)
///     .fingerprint(Fingerprint::of(b"amount=100"))
///     .ttl(Duration::from_secs(86400))
///     .in_flight(InFlight::Reject)
///     .run(|_| async { Ok::<_, std::io::Error>("ch_1".to_string()) })
///     .await?;
/// assert_eq!(out.value, "ch_1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a call does nothing until `run` is awaited"]
pub struct Call<'a, S, C> {
    coordinator: &'a Coordinator<S>,
    operation: &'a Operation,
    key: &'a Key,
    scope: Option<&'a Scope>,
    fingerprint: Option<Fingerprint>,
    ttl: Duration,
    policy: Policy,
    codec: C,
}

impl<S, C: fmt::Debug> fmt::Debug for Call<'_, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("operation", self.operation)
            .field("key", self.key)
            .field("scope", &self.scope)
            .field("fingerprint", &self.fingerprint)
            .field("ttl", &self.ttl)
            .field("policy", &self.policy)
            .field("codec", &self.codec)
            .finish()
    }
}

impl<'a, S: Store, C> Call<'a, S, C> {
    /// How long the completed record is kept, exactly (default: the policy's `ttl`). Pick
    /// it to outlive the latest redelivery: a day, a week for manual re-runs.
    ///
    /// # Example
    ///
    /// See [`Call`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Scopes the key to a tenant or principal.
    ///
    /// # Example
    ///
    /// See [`Call`].
    pub fn scope(mut self, scope: &'a Scope) -> Self {
        self.scope = Some(scope);
        self
    }

    /// The request's fingerprint; a later call with the same key and another fingerprint
    /// gets [`Error::KeyReused`].
    ///
    /// # Example
    ///
    /// See [`Call`].
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// Overrides the in-flight policy for this call.
    ///
    /// # Example
    ///
    /// See [`Call`].
    pub fn in_flight(mut self, in_flight: InFlight) -> Self {
        self.policy.in_flight = in_flight;
        self
    }

    /// Overrides the whole policy for this call (its `ttl` too).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation, Policy};
    /// # let c = Coordinator::new(MemoryStore::new());
    /// # let (op, key) = (Operation::new("op")?, Key::new("k")?);
    /// let call = c.call(&op, &key).policy(Policy::default().max_result_bytes(64));
    /// # drop(call);
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self.ttl = policy.ttl;
        self
    }

    /// Uses another codec for the result (and stored errors).
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::{BoxError, Codec, Coordinator, Key, MemoryStore, Operation};
    ///
    /// struct Raw;
    /// impl Codec<Vec<u8>> for Raw {
    ///     fn encode(&self, v: &Vec<u8>) -> Result<Vec<u8>, BoxError> { Ok(v.clone()) }
    ///     fn decode(&self, b: &[u8]) -> Result<Vec<u8>, BoxError> { Ok(b.to_vec()) }
    /// }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let c = Coordinator::new(MemoryStore::new());
    /// let (op, key) = (Operation::new("op")?, Key::new("k")?);
    /// let out = c.call(&op, &key).codec(Raw)
    ///     .run(|_| async { Ok::<_, std::io::Error>(vec![1u8, 2]) }).await?;
    /// assert_eq!(out.value, [1, 2]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn codec<C2>(self, codec: C2) -> Call<'a, S, C2> {
        Call {
            coordinator: self.coordinator,
            operation: self.operation,
            key: self.key,
            scope: self.scope,
            fingerprint: self.fingerprint,
            ttl: self.ttl,
            policy: self.policy,
            codec,
        }
    }

    /// Runs the action at most once for this key and returns its value, or replays the stored
    /// value. An action error releases the key, so the next call runs the action again.
    ///
    /// # Errors
    ///
    /// See [`Error`]: every variant but `Action` means the action did not run in this call.
    ///
    /// # Cancellation
    ///
    /// If the returned future is dropped while the action runs, the action is dropped with it
    /// and the reservation is released from a background task (the effect may or may not have
    /// happened, as after a crash; releasing lets the next delivery retry at once instead of
    /// after the lease). If it is dropped after the action returned `Ok` but before the result
    /// was stored, the result is still stored from a background task, so the action is not
    /// run again. Without a tokio runtime to spawn on, the reservation simply expires with its
    /// lease.
    ///
    /// # Example
    ///
    /// See [`Call`].
    pub async fn run<T, E, F, Fut>(self, action: F) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.execute_ref(action, ReleaseOnError).await
    }

    /// Like [`run`](Call::run), but an error for which `is_permanent` returns true is stored
    /// (with this call's codec) and replayed to later callers as [`Error::ReplayedAction`],
    /// instead of releasing the key. Use it for failures that retrying cannot fix (a card
    /// declined, an address rejected).
    ///
    /// # Errors
    ///
    /// See [`Error`].
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, Error, Key, MemoryStore, Operation};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let c = Coordinator::new(MemoryStore::new());
    /// let (op, key) = (Operation::new("charge")?, Key::new("k")?);
    /// let declined = |_| async { Err::<String, _>("card declined".to_string()) };
    /// let first = c.call(&op, &key).run_storing_errors(|_| true, declined).await;
    /// assert!(matches!(first, Err(Error::Action(_))));
    /// let again = c.call(&op, &key).run_storing_errors(|_| true, declined).await;
    /// assert!(matches!(again, Err(Error::ReplayedAction(e)) if e == "card declined"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn run_storing_errors<T, E, P, F, Fut>(
        self,
        is_permanent: P,
        action: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T> + Codec<E>,
        P: Fn(&E) -> bool,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let errors = StorePermanent {
            codec: &self.codec,
            is_permanent,
        };
        self.execute_ref(action, errors).await
    }

    async fn execute_ref<T, E, F, Fut, P>(
        &self,
        action: F,
        errors: P,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        P: ErrorPolicy<E>,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let span = tracing::debug_span!(
            "idemkit.call",
            operation = %self.operation,
            key = %self.key,
            source = tracing::field::Empty,
        );
        self.execute_in_span(action, errors).instrument(span).await
    }

    async fn execute_in_span<T, E, F, Fut, P>(
        &self,
        action: F,
        errors: P,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        P: ErrorPolicy<E>,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let store = &self.coordinator.inner.store;
        let op = self.operation;
        let policy = &self.policy;
        let key = StorageKey::new(op, self.scope, self.key);
        let owner = OwnerToken::random();
        let req = BeginRequest::new(&key, owner, policy.lease).with_fingerprint(self.fingerprint);
        let mut wait_deadline = None;

        loop {
            let started = now();
            let begin = store.begin(&req).await;
            op.metrics().timing(Phase::Begin, started);
            match begin {
                Ok(Begin::Reserved { lease, took_over }) => {
                    op.metrics().misses.increment(1);
                    if took_over {
                        op.metrics().takeovers.increment(1);
                        tracing::info!(fencing = %lease.fencing, "took over an expired lease");
                    }
                    return self.run_owned(&key, lease, action, &errors).await;
                }
                Ok(Begin::Completed(completed)) => {
                    op.metrics().hits.increment(1);
                    tracing::debug!(fencing = %completed.fencing, "replaying stored outcome");
                    return self.replay(completed, &errors);
                }
                Ok(Begin::Mismatch) => {
                    op.metrics().key_reuse.increment(1);
                    tracing::debug!("key reused with a different fingerprint");
                    return Err(Error::KeyReused);
                }
                Ok(Begin::InFlight {
                    retry_after,
                    fencing,
                }) => match policy.in_flight {
                    InFlight::Reject => {
                        op.metrics().rejections.increment(1);
                        return Err(Error::InFlight { retry_after });
                    }
                    InFlight::Run => {
                        op.metrics().unprotected_in_flight.increment(1);
                        tracing::warn!("running unprotected beside a live owner (in_flight=run)");
                        return run_unprotected(action).await;
                    }
                    InFlight::Wait => {
                        let started = now();
                        let deadline = *wait_deadline.get_or_insert(started + policy.wait_timeout);
                        if started >= deadline {
                            op.metrics().rejections.increment(1);
                            return Err(Error::InFlight { retry_after });
                        }
                        op.metrics().waits.increment(1);
                        // Wake on the owner's completion or release (pushed), at the end of
                        // its current lease at the latest (then `begin` reads the renewed
                        // lease, or takes an expired one over), or at our own deadline.
                        let timeout = retry_after.min(deadline - started);
                        let waited = store.wait(&key, fencing, timeout).await;
                        op.metrics().timing(Phase::Wait, started);
                        if let Err(source) = waited {
                            op.metrics().store_error(Phase::Wait);
                            return Err(Error::Store {
                                phase: Phase::Wait,
                                source,
                            });
                        }
                    }
                },
                Err(source) => {
                    op.metrics().store_error(Phase::Begin);
                    if source.is_unavailable() && policy.on_store_error == OnStoreError::FailOpen {
                        op.metrics().unprotected_store_unavailable.increment(1);
                        tracing::warn!(error = %source, "store unavailable: running unprotected (fail-open)");
                        return run_unprotected(action).await;
                    }
                    return Err(Error::Store {
                        phase: Phase::Begin,
                        source,
                    });
                }
            }
        }
    }

    /// Runs the action as the key's owner, renewing the lease, then completes or releases.
    async fn run_owned<T, E, F, Fut, P>(
        &self,
        key: &StorageKey,
        lease: Lease,
        action: F,
        errors: &P,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        P: ErrorPolicy<E>,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let store = &self.coordinator.inner.store;
        let op = self.operation;
        let mut guard = Guard {
            store,
            key,
            lease,
            pending: Pending::Release,
        };
        let started = now();
        let result = renewing(
            store,
            key,
            &lease,
            &self.policy,
            op,
            action(Attempt {
                fencing: Some(lease.fencing),
            }),
        )
        .await;
        op.metrics().timing(Phase::Action, started);

        let (completion, answer) = match result {
            Ok(value) => {
                let completion = self.encode_value(&value);
                (
                    completion,
                    Ok(Outcome {
                        value,
                        source: Source::Fresh,
                        fencing: Some(lease.fencing),
                    }),
                )
            }
            Err(e) => match errors.encode(&e) {
                Some(Ok(bytes)) => (
                    Completion::new(OutcomeKind::PermanentError, bytes, self.ttl),
                    Err(Error::Action(e)),
                ),
                Some(Err(encode_error)) => {
                    tracing::warn!(error = %encode_error, "permanent error could not be encoded; releasing the key");
                    guard.pending = Pending::Done;
                    self.release(key, &lease).await;
                    return Err(Error::Action(e));
                }
                None => {
                    guard.pending = Pending::Done;
                    self.release(key, &lease).await;
                    return Err(Error::Action(e));
                }
            },
        };

        // From here on the outcome must be stored even if this future is dropped: the guard
        // stores it from a background task then.
        guard.pending = Pending::Complete(completion.clone());
        let started = now();
        let completed = store.complete(key, &lease, &completion).await;
        guard.pending = Pending::Done;
        op.metrics().timing(Phase::Complete, started);
        match completed {
            Ok(()) => {}
            Err(e) if e.is_lease_lost() => {
                // Our lease expired and possibly another owner took the key over; its record
                // wins. The caller still gets this run's value: the action did run.
                op.metrics().lease_lost.increment(1);
                tracing::warn!("lease lost before completion; the result was not stored");
            }
            Err(e) => {
                op.metrics().store_error(Phase::Complete);
                op.metrics().completion_failed.increment(1);
                tracing::warn!(error = %e, "the action ran but its result could not be stored; \
                    a retry after the lease expires will run it again");
            }
        }
        answer
    }

    /// Encodes a successful value, or explains why it cannot be kept. Never fails: once the
    /// action succeeded the key must end completed, whatever happens to its bytes.
    fn encode_value<T>(&self, value: &T) -> Completion
    where
        C: Codec<T>,
    {
        let unavailable = |reason: String| {
            self.operation.metrics().results_unavailable.increment(1);
            tracing::warn!(%reason, "result not stored; replays will get ResultUnavailable");
            Completion::new(OutcomeKind::Unavailable, reason, self.ttl)
        };
        match self.codec.encode(value) {
            Ok(bytes) if bytes.len() <= self.policy.max_result_bytes => {
                Completion::new(OutcomeKind::Value, Bytes::from(bytes), self.ttl)
            }
            Ok(bytes) => unavailable(format!(
                "result of {} bytes exceeds the limit of {} bytes",
                bytes.len(),
                self.policy.max_result_bytes
            )),
            Err(e) => unavailable(format!("result could not be encoded: {e}")),
        }
    }

    fn replay<T, E, P>(&self, completed: Completed, errors: &P) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        P: ErrorPolicy<E>,
    {
        let bytes = completed.outcome.bytes();
        match completed.outcome.kind() {
            OutcomeKind::Value => match self.codec.decode(bytes) {
                Ok(value) => Ok(Outcome {
                    value,
                    source: Source::Replayed,
                    fencing: Some(completed.fencing),
                }),
                Err(e) => Err(Error::Decode(e)),
            },
            OutcomeKind::PermanentError => match errors.decode(bytes) {
                Some(Ok(e)) => Err(Error::ReplayedAction(e)),
                Some(Err(e)) => Err(Error::Decode(e)),
                None => Err(Error::Decode(
                    "a permanent error is stored under this key; use run_storing_errors to replay it"
                        .into(),
                )),
            },
            OutcomeKind::Unavailable => Err(Error::ResultUnavailable {
                reason: String::from_utf8_lossy(bytes).into_owned(),
            }),
        }
    }

    async fn release(&self, key: &StorageKey, lease: &Lease) {
        let started = now();
        let released = self.coordinator.inner.store.release(key, lease).await;
        self.operation.metrics().timing(Phase::Release, started);
        match released {
            Ok(()) => {}
            Err(e) if e.is_lease_lost() => {
                tracing::debug!("release found the lease already gone");
            }
            Err(e) => {
                self.operation.metrics().store_error(Phase::Release);
                tracing::warn!(error = %e, "release failed; the key unlocks when its lease expires");
            }
        }
    }
}

/// Polls the action and, beside it, renews the lease every third of it. The renewal runs
/// concurrently, so a slow store never stalls the action; the action is never cancelled by
/// a failed renewal (aborting mid-effect is worse than finishing: the stale run's writes are
/// refused by the owner check, and downstream systems can refuse it by fencing token).
async fn renewing<S: Store, T, E>(
    store: &S,
    key: &StorageKey,
    lease: &Lease,
    policy: &Policy,
    op: &Operation,
    action: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let every = policy.renew_every();
    let renewals = async {
        let mut sleep = pin!(tokio::time::sleep(every));
        loop {
            sleep.as_mut().await;
            let started = now();
            match store.renew(key, lease, policy.lease).await {
                Ok(()) => op.metrics().timing(Phase::Renew, started),
                Err(e) if e.is_lease_lost() => {
                    op.metrics().lease_lost.increment(1);
                    tracing::warn!(
                        "lease lost while the action runs; its result will not be stored"
                    );
                    return;
                }
                Err(e) => {
                    op.metrics().store_error(Phase::Renew);
                    tracing::warn!(error = %e, "lease renewal failed; retrying");
                }
            }
            sleep.as_mut().reset(now() + every);
        }
    };
    let mut action = pin!(action);
    let mut renewals = pin!(renewals);
    let mut renewing = true;
    loop {
        tokio::select! {
            biased;
            result = &mut action => return result,
            () = &mut renewals, if renewing => renewing = false,
        }
    }
}

async fn run_unprotected<T, E, F, Fut>(action: F) -> Result<Outcome<T>, Error<E>>
where
    F: FnOnce(Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    match action(Attempt { fencing: None }).await {
        Ok(value) => Ok(Outcome {
            value,
            source: Source::Unprotected,
            fencing: None,
        }),
        Err(e) => Err(Error::Action(e)),
    }
}

// ===== cancellation =====

/// What still has to happen to a reservation if the call's future is dropped now.
enum Pending {
    /// The action has not succeeded: release the key.
    Release,
    /// The action succeeded: store its outcome, so it is not run again.
    Complete(Completion),
    /// Nothing: the call finished the reservation itself.
    Done,
}

/// Finishes a reservation from a background task when the call's future is dropped.
struct Guard<'a, S: Store> {
    store: &'a S,
    key: &'a StorageKey,
    lease: Lease,
    pending: Pending,
}

impl<S: Store> Drop for Guard<'_, S> {
    fn drop(&mut self) {
        let pending = mem::replace(&mut self.pending, Pending::Done);
        if matches!(pending, Pending::Done) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the lease expires on its own
        };
        let (store, key, lease) = (self.store.clone(), self.key.clone(), self.lease);
        handle.spawn(async move {
            let result = match pending {
                Pending::Release => store.release(&key, &lease).await,
                Pending::Complete(c) => store.complete(&key, &lease, &c).await,
                Pending::Done => Ok(()),
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, key = %key, "finishing a dropped call failed");
            }
        });
    }
}

// ===== error policies =====

/// How a call treats the action's errors: release (the default), or store permanent ones.
trait ErrorPolicy<E> {
    /// `None`: release the key. `Some(Ok(bytes))`: store these bytes as a permanent error.
    fn encode(&self, error: &E) -> Option<Result<Vec<u8>, BoxError>>;
    /// Decodes a stored permanent error; `None` when this call cannot.
    fn decode(&self, bytes: &[u8]) -> Option<Result<E, BoxError>>;
}

struct ReleaseOnError;

impl<E> ErrorPolicy<E> for ReleaseOnError {
    fn encode(&self, _: &E) -> Option<Result<Vec<u8>, BoxError>> {
        None
    }
    fn decode(&self, _: &[u8]) -> Option<Result<E, BoxError>> {
        None
    }
}

struct StorePermanent<'c, C, P> {
    codec: &'c C,
    is_permanent: P,
}

impl<E, C: Codec<E>, P: Fn(&E) -> bool> ErrorPolicy<E> for StorePermanent<'_, C, P> {
    fn encode(&self, error: &E) -> Option<Result<Vec<u8>, BoxError>> {
        (self.is_permanent)(error).then(|| self.codec.encode(error))
    }
    fn decode(&self, bytes: &[u8]) -> Option<Result<E, BoxError>> {
        Some(self.codec.decode(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_interval_is_a_third_of_the_lease() {
        let p = Policy::default().lease(Duration::from_secs(9));
        assert_eq!(p.renew_every(), Duration::from_secs(3));
    }
}
