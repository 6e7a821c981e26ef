//! One call being set up: its options, then [`run`](Call::run).

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use super::Coordinator;
use super::attempt::Attempt;
use super::batch::Prepared;
use super::options::{
    Batch, Completer, FromBatch, NoBatch, OnActionError, ReleaseErrors, StoreCompletes, StoreErrors,
};
use super::receipt::Receipt;
use crate::codec::{Codec, JsonCodec};
use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::ident::{Key, Operation, Scope};
use crate::policy::{InFlight, Policy};
use crate::store::Store;

/// One call being set up: options, then [`run`](Call::run), the one way to run it.
///
/// The options that change what `run` needs change the call's type: [`codec`](Call::codec)
/// (`C`), [`store_errors`](Call::store_errors) (`P`), [`completer`](Call::completer) (`K`)
/// and [`prepared`](Call::prepared) (`B`); see [`options`](super::options). The others keep
/// it.
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
pub struct Call<'a, S: Store, C = JsonCodec, P = ReleaseErrors, K = StoreCompletes, B = NoBatch> {
    pub(super) coordinator: Cow<'a, Coordinator<S>>,
    pub(super) operation: Cow<'a, Operation>,
    pub(super) key: Cow<'a, Key>,
    pub(super) scope: Option<Cow<'a, Scope>>,
    pub(super) fingerprint: Option<Fingerprint>,
    /// Set by [`Call::ttl`]; otherwise the policy's.
    pub(super) ttl: Option<Duration>,
    pub(super) policy: Policy,
    pub(super) codec: C,
    pub(super) errors: P,
    /// `None`: the store completes.
    pub(super) completer: Option<K>,
    /// A claim from a batch ([`FromBatch`]), or nothing ([`NoBatch`]).
    pub(super) batch: B,
}

impl<S: Store, C: fmt::Debug, P, K, B: fmt::Debug> fmt::Debug for Call<'_, S, C, P, K, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("operation", &self.operation)
            .field("key", &self.key)
            .field("scope", &self.scope)
            .field("fingerprint", &self.fingerprint)
            .field("ttl", &self.ttl)
            .field("policy", &self.policy)
            .field("codec", &self.codec)
            .field("completer", &self.completer.is_some())
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl<'a, S: Store> Call<'a, S> {
    pub(super) fn new(
        coordinator: Cow<'a, Coordinator<S>>,
        operation: Cow<'a, Operation>,
        key: Cow<'a, Key>,
    ) -> Self {
        let policy = *coordinator.policy_for(&operation);
        Call {
            coordinator,
            operation,
            key,
            scope: None,
            fingerprint: None,
            ttl: None,
            policy,
            codec: JsonCodec,
            errors: ReleaseErrors,
            completer: None,
            batch: NoBatch,
        }
    }
}

impl<'a, S: Store, C, P, K, B> Call<'a, S, C, P, K, B> {
    /// The store this call runs on (for store crates that extend a call, such as the
    /// transactional call of idemkit-postgres).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
    /// # let c = Coordinator::new(MemoryStore::new());
    /// # let (op, key) = (Operation::new("op")?, Key::new("k")?);
    /// let call = c.call(&op, &key);
    /// let store: &MemoryStore = call.store();
    /// # let _ = store;
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn store(&self) -> &S {
        self.coordinator.store()
    }

    /// How long the completed record is kept, exactly (default: the policy's `ttl`). Pick
    /// it to outlive the latest redelivery: a day, a week for manual re-runs. Clamped to
    /// [`Policy::MAX_DURATION`] and to what the store can keep ([`Store::max_ttl`]); zero is
    /// refused with [`Error::Config`] when the call runs.
    ///
    /// # Example
    ///
    /// See [`Call`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Scopes the key to a tenant or principal; `None` leaves it unscoped.
    ///
    /// # Example
    ///
    /// See [`Call`].
    pub fn scope(mut self, scope: impl Into<Option<&'a Scope>>) -> Self {
        self.scope = scope.into().map(Cow::Borrowed);
        self
    }

    /// Like [`scope`](Call::scope), taking the scope by value (for
    /// [`call_owned`](Coordinator::call_owned)).
    ///
    /// # Example
    ///
    /// See [`Coordinator::call_owned`].
    pub fn scope_owned(mut self, scope: impl Into<Option<Scope>>) -> Self {
        self.scope = scope.into().map(Cow::Owned);
        self
    }

    /// The request's fingerprint; a later call with the same key and another fingerprint
    /// gets [`Error::KeyReused`]. `None` sets none.
    ///
    /// # Example
    ///
    /// See [`Call`].
    pub fn fingerprint(mut self, fingerprint: impl Into<Option<Fingerprint>>) -> Self {
        self.fingerprint = fingerprint.into();
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

    /// Overrides the whole policy for this call. A TTL set with [`ttl`](Call::ttl) stays,
    /// whichever is called first; otherwise the new policy's `ttl` applies.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation, Policy};
    /// # let c = Coordinator::new(MemoryStore::new());
    /// # let (op, key) = (Operation::new("op")?, Key::new("k")?);
    /// let call = c.call(&op, &key)
    ///     .ttl(Duration::from_secs(60))
    ///     .policy(Policy::default().max_result_bytes(64)); // the 60 s TTL stays
    /// # drop(call);
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Uses another codec for the result (and stored errors).
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::{BytesCodec, Coordinator, Key, MemoryStore, Operation};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let c = Coordinator::new(MemoryStore::new());
    /// let (op, key) = (Operation::new("op")?, Key::new("k")?);
    /// let out = c.call(&op, &key).codec(BytesCodec)
    ///     .run(|_| async { Ok::<_, std::io::Error>(vec![1u8, 2]) }).await?;
    /// assert_eq!(out.value, [1, 2]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn codec<C2>(self, codec: C2) -> Call<'a, S, C2, P, K, B> {
        self.map(|_, errors, completer, batch| (codec, errors, completer, batch))
    }

    /// Stores the action's errors for which `is_permanent` returns true (with this call's
    /// codec, within the policy's `max_result_bytes`) and replays them to later callers as
    /// [`Error::ReplayedAction`], instead of releasing the key. Use it for failures that
    /// retrying cannot fix (a card declined, an address rejected). Without it every error
    /// releases the key, and a stored error found by a later call is
    /// [`Error::Decode`]: only a call that stores errors can read one back.
    ///
    /// `run` then answers this call's own stored failure with [`Error::ActionStored`]; one
    /// that could not be stored (too large, unencodable, the store down) with
    /// [`Error::Action`], its key released.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, Error, Key, MemoryStore, Operation};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let c = Coordinator::new(MemoryStore::new());
    /// let (op, key) = (Operation::new("charge")?, Key::new("k")?);
    /// let declined = |_| async { Err::<String, _>("card declined".to_string()) };
    /// let first = c.call(&op, &key).store_errors(|_| true).run(declined).await;
    /// assert!(matches!(first, Err(Error::ActionStored(_))));
    /// let again = c.call(&op, &key).store_errors(|_| true).run(declined).await;
    /// assert!(matches!(again, Err(Error::ReplayedAction(e)) if e == "card declined"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn store_errors<E, Q>(self, is_permanent: Q) -> Call<'a, S, C, StoreErrors<Q, E>, K, B>
    where
        Q: Fn(&E) -> bool,
    {
        let errors = StoreErrors {
            is_permanent,
            error: PhantomData,
        };
        self.map(|codec, _, completer, batch| (codec, errors, completer, batch))
    }

    /// Stores the result with `completer` (inside the caller's transaction) instead of the
    /// store, once, after the lease renewals stopped; see [`Completer`] for what a failure
    /// means. Replays, waits and rejections are as without it. Store crates wrap this in
    /// their transactional call (idemkit-postgres's `in_transaction`); applications rarely
    /// set it directly.
    ///
    /// `run` then also fails with [`Error::Store`] (phase `Complete`) when the completer
    /// failed: the action ran, and its transaction must roll back.
    ///
    /// # Example
    ///
    /// See [`Completer`].
    pub fn completer<K2: Completer>(self, completer: K2) -> Call<'a, S, C, P, K2, B> {
        self.map(|codec, errors, _, batch| (codec, errors, Some(completer), batch))
    }

    /// Uses a claim from a batch ([`Coordinator::prepare`]) instead of this call's first
    /// `begin`, saving its round trip. A claim for another key, or one made stale by a long
    /// wait in its batch, is not trusted: the call sends its own `begin` (with the claim's
    /// owner token, so a reservation the batch made is confirmed, not waited on). Ignored
    /// when the call has a fingerprint or a scope (a batch reserves without either): the
    /// claim is released and the call begins as usual.
    ///
    /// # Example
    ///
    /// See [`Coordinator::prepare`].
    pub fn prepared(self, prepared: Prepared<S>) -> Call<'a, S, C, P, K, FromBatch<S>> {
        let batch = FromBatch(Some(prepared));
        self.map(|codec, errors, completer, _| (codec, errors, completer, batch))
    }

    /// The call with the options that set its type replaced (the others kept).
    #[inline]
    fn map<C2, P2, K2, B2>(
        self,
        f: impl FnOnce(C, P, Option<K>, B) -> (C2, P2, Option<K2>, B2),
    ) -> Call<'a, S, C2, P2, K2, B2> {
        let (codec, errors, completer, batch) =
            f(self.codec, self.errors, self.completer, self.batch);
        Call {
            coordinator: self.coordinator,
            operation: self.operation,
            key: self.key,
            scope: self.scope,
            fingerprint: self.fingerprint,
            ttl: self.ttl,
            policy: self.policy,
            codec,
            errors,
            completer,
            batch,
        }
    }

    /// Runs the action at most once for this key and returns its value, or replays the stored
    /// value. An action error releases the key, so the next call runs the action again
    /// (unless the call [stores errors](Call::store_errors)).
    ///
    /// # Errors
    ///
    /// See [`Error`]: every variant but `Action` and `ActionStored` means the action did not
    /// run in this call.
    ///
    /// # Cancellation
    ///
    /// If the returned future is dropped while the action runs, the action is dropped with it
    /// and, by default, the reservation is left to end with its lease (it is no longer
    /// renewed): the effect may or may not have happened, or may still be landing downstream,
    /// so, as after a crash, the next delivery runs after the lease, never beside it.
    /// With [`OnCancel::Release`](crate::OnCancel::Release) ([`Policy::on_cancel`]) it is
    /// released at once from a background task instead. If the future is dropped after the action
    /// returned `Ok` but before the result was stored, the result is still stored from a
    /// background task, so the action is not run again. Without a tokio runtime to spawn on,
    /// the reservation simply expires with its lease. An action that panics releases the key
    /// (as a failed action does), and the panic goes on to the caller.
    ///
    /// # Example
    ///
    /// See [`Call`].
    pub fn run<T, E, F, Fut>(self, action: F) -> impl Future<Output = Result<Receipt<T>, Error<E>>>
    where
        C: Codec<T>,
        P: OnActionError<C, E>,
        K: Completer,
        B: Batch<S>,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.execute(action)
    }
}
