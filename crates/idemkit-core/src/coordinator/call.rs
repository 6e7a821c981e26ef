//! One call: its options, what it returns and what its action is told.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::Coordinator;
use super::complete::{ByStore, Completer};
use super::errors::{ReleaseOnError, StorePermanent};
use super::lease::LeaseState;
use crate::codec::Codec;
use crate::downstream::{DownstreamKey, DownstreamSecret};
use crate::error::{Error, LeaseLost};
use crate::policy::{InFlight, Policy};
use crate::record::FencingToken;
use crate::store::Store;
use crate::{Fingerprint, Key, Operation, Scope, StorageKey};

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

/// A call's value and where it came from: the receipt of one call.
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
pub struct Receipt<T> {
    /// The value.
    pub value: T,
    /// Fresh, replayed or unprotected.
    pub source: Source,
    /// The fencing token of the reservation that produced the value (none if unprotected).
    pub fencing: Option<FencingToken>,
    /// Whether the store holds this outcome, so that later calls with the key replay it
    /// instead of running the action: always for a replay, never for an unprotected run,
    /// and for a fresh run only if its completion was stored (`false`: the store stayed
    /// unreachable until the lease ended, or the lease was lost; the next delivery after
    /// the lease runs the action again, ARCHITECTURE.md rows 7 and 21).
    pub stored: bool,
}

impl<T> Receipt<T> {
    /// Builds one: for tests of code that consumes outcomes, and for stand-ins of the
    /// coordinator.
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::{Receipt, Source};
    /// let o = Receipt::new("em_1", Source::Replayed, None);
    /// assert!(o.is_replay());
    /// ```
    pub fn new(value: T, source: Source, fencing: Option<FencingToken>) -> Self {
        Receipt {
            value,
            source,
            fencing,
            stored: source != Source::Unprotected,
        }
    }

    /// Sets [`stored`](Receipt::stored) (by default, true unless unprotected).
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::{Receipt, Source};
    /// let o = Receipt::new("em_1", Source::Fresh, None).with_stored(false);
    /// assert!(!o.stored);
    /// ```
    pub fn with_stored(mut self, stored: bool) -> Self {
        self.stored = stored;
        self
    }

    /// Whether the value was replayed from the store.
    ///
    /// # Example
    ///
    /// See [`Receipt`].
    pub fn is_replay(&self) -> bool {
        self.source == Source::Replayed
    }

    /// The value.
    ///
    /// # Example
    ///
    /// See [`Receipt`].
    pub fn into_value(self) -> T {
        self.value
    }
}

/// What the action is told about its run: its fencing token, and whether it still holds
/// its lease.
///
/// The lease can be lost while the action runs: the store stopped answering for longer than
/// the lease, the process stalled, or the action ran past [`Policy::max_hold`]. From then on
/// another caller may take the key over and run the effect too. An action with an
/// irreversible step should check [`is_lease_lost`](Attempt::is_lease_lost) just before it
/// (or race the step against [`lease_lost`](Attempt::lease_lost)), and pass the
/// [fencing token](Attempt::fencing_token) downstream, so that a receiver that keeps the
/// highest token it has seen refuses a stale writer.
///
/// # Example
///
/// ```
/// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// # let c = Coordinator::new(MemoryStore::new());
/// # let (op, key) = (Operation::new("op")?, Key::new("k")?);
/// let out = c.call(&op, &key).run(|attempt| async move {
///     if attempt.is_lease_lost() {
///         return Err(std::io::Error::other("lease lost: another worker may run this"));
///     }
///     // The irreversible step, with the token for a receiver that orders writers.
///     Ok(attempt.fencing_token().map(|t| t.get()))
/// }).await?;
/// assert!(out.value.is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Attempt {
    pub(super) fencing: Option<FencingToken>,
    pub(super) lease: Option<Arc<LeaseState>>,
    pub(super) downstream: Option<Downstream>,
}

/// What an attempt's downstream key is derived from: the effect, and the coordinator's
/// secret. Derived when asked for (a SHA-256), not on every call.
#[derive(Debug, Clone)]
pub(super) struct Downstream {
    pub(super) key: StorageKey,
    pub(super) secret: Option<DownstreamSecret>,
}

impl Attempt {
    /// An attempt with no reservation: for running the same action without idemkit (a
    /// plain path, a test).
    ///
    /// # Example
    ///
    /// ```
    /// let a = idemkit_core::Attempt::unprotected();
    /// assert!(!a.is_protected());
    /// assert!(!a.is_lease_lost());
    /// ```
    pub fn unprotected() -> Self {
        Attempt {
            fencing: None,
            lease: None,
            downstream: None,
        }
    }

    /// The reservation's fencing token; `None` when running unprotected.
    ///
    /// # Example
    ///
    /// See [`Attempt`].
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.fencing
    }

    /// The effect's [downstream key](crate::downstream): the same on every attempt of this
    /// effect (operation, scope, key), on every machine and store, keyed with the
    /// coordinator's [secret](crate::CoordinatorBuilder::downstream_secret) if it has one.
    /// Pass it as the idempotency key of a receiver that deduplicates (`Idempotency-Key`),
    /// and the [fencing token](Attempt::fencing_token) to a receiver that orders writers.
    /// `None` only for an attempt made by [`Attempt::unprotected`]; a run the coordinator
    /// lets go unprotected (fail-open) still has it.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, DownstreamKey, Key, MemoryStore, Operation};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let c = Coordinator::new(MemoryStore::new());
    /// let (op, key) = (Operation::new("mail.invoice")?, Key::new("order-9.invoice")?);
    /// let sent = c.call(&op, &key).run(|attempt| async move {
    ///     let idempotency_key = attempt.downstream_key().expect("a coordinator's attempt");
    ///     // provider.send(invoice).header("Idempotency-Key", idempotency_key.as_str())
    ///     Ok::<_, std::io::Error>(idempotency_key.into_string())
    /// }).await?;
    /// assert_eq!(sent.value, DownstreamKey::of(&op, None, &key).as_str());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn downstream_key(&self) -> Option<DownstreamKey> {
        self.downstream
            .as_ref()
            .map(|d| DownstreamKey::of_storage_key(&d.key, d.secret.as_ref()))
    }

    /// Whether the run holds a reservation.
    ///
    /// # Example
    ///
    /// See [`Attempt::unprotected`].
    pub fn is_protected(&self) -> bool {
        self.fencing.is_some()
    }

    /// Whether the lease is lost, or can no longer be confirmed (no renewal succeeded within
    /// the lease, or the maximum hold has passed). Cheap: an atomic load, an uncontended lock
    /// and a clock read.
    /// Always `false` for an unprotected run.
    ///
    /// # Example
    ///
    /// See [`Attempt`].
    pub fn is_lease_lost(&self) -> bool {
        self.lease.as_ref().is_some_and(|l| l.is_lost())
    }

    /// The instant until which the store has confirmed the lease (the send time of the last
    /// confirmed `begin` or renewal, plus the lease; the moment of loss once it is lost), on
    /// tokio's clock. `None` for an unprotected run. Renewals move it on while the action
    /// runs.
    ///
    /// # Example
    ///
    /// See [`check_lease`](Attempt::check_lease).
    pub fn lease_deadline(&self) -> Option<tokio::time::Instant> {
        self.lease.as_ref().map(|l| l.confirmed_until())
    }

    /// What is left of the lease as far as the coordinator knows (see
    /// [`lease_deadline`](Attempt::lease_deadline)): zero once it is lost, `None` for an
    /// unprotected run.
    ///
    /// # Example
    ///
    /// See [`check_lease`](Attempt::check_lease).
    pub fn lease_left(&self) -> Option<Duration> {
        self.lease.as_ref().map(|l| l.left())
    }

    /// `Ok` if the lease is held for at least `margin` more: call it just before an
    /// irreversible step, with a margin above the step's own duration, and return its
    /// [`LeaseLost`] with `?` to skip the step when another caller may take the key over
    /// before the step lands. Always `Ok` for an unprotected run.
    ///
    /// # Errors
    ///
    /// [`LeaseLost`] when the lease is lost, or ends within `margin`.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// # let c = Coordinator::new(MemoryStore::new());
    /// # let (op, key) = (Operation::new("op")?, Key::new("k")?);
    /// let out = c.call(&op, &key).run(|attempt| async move {
    ///     assert!(attempt.lease_left().unwrap() > Duration::from_secs(10));
    ///     attempt.check_lease(Duration::from_secs(2))?; // the send takes up to 2 s
    ///     // provider.send(invoice).await?
    ///     Ok::<_, std::io::Error>("em_1".to_string())
    /// }).await?;
    /// assert_eq!(out.value, "em_1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_lease(&self, margin: Duration) -> Result<(), LeaseLost> {
        let Some(lease) = &self.lease else {
            return Ok(());
        };
        let left = lease.left();
        if left.is_zero() || left < margin {
            return Err(LeaseLost::new(left));
        }
        Ok(())
    }

    /// Resolves when the lease is lost or can no longer be confirmed (see
    /// [`is_lease_lost`](Attempt::is_lease_lost)); never, for an unprotected run.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// # let c = Coordinator::new(MemoryStore::new());
    /// # let (op, key) = (Operation::new("op")?, Key::new("k")?);
    /// let out = c.call(&op, &key).run(|attempt| async move {
    ///     tokio::select! {
    ///         () = attempt.lease_lost() => Err(std::io::Error::other("lease lost")),
    ///         () = tokio::time::sleep(Duration::from_millis(10)) => Ok("sent".to_string()),
    ///     }
    /// }).await?;
    /// assert_eq!(out.value, "sent");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn lease_lost(&self) {
        match &self.lease {
            Some(lease) => lease.lost().await,
            None => std::future::pending().await,
        }
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
pub struct Call<'a, S: Store, C> {
    pub(super) coordinator: Cow<'a, Coordinator<S>>,
    pub(super) operation: Cow<'a, Operation>,
    pub(super) key: Cow<'a, Key>,
    pub(super) scope: Option<Cow<'a, Scope>>,
    pub(super) fingerprint: Option<Fingerprint>,
    /// Set by [`Call::ttl`]; otherwise the policy's.
    pub(super) ttl: Option<Duration>,
    pub(super) policy: Policy,
    pub(super) codec: C,
}

impl<S: Store, C: fmt::Debug> fmt::Debug for Call<'_, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("operation", &self.operation)
            .field("key", &self.key)
            .field("scope", &self.scope)
            .field("fingerprint", &self.fingerprint)
            .field("ttl", &self.ttl)
            .field("policy", &self.policy)
            .field("codec", &self.codec)
            .finish()
    }
}

impl<'a, S: Store> Call<'a, S, crate::JsonCodec> {
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
            codec: crate::JsonCodec,
        }
    }
}

impl<'a, S: Store, C> Call<'a, S, C> {
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

    /// Uses a claim from a batch ([`Coordinator::prepare`]) instead of this call's first
    /// `begin`, saving its round trip; set the call's other options first. A claim for
    /// another key, or one made stale by a long wait in its batch, is not trusted: the call
    /// sends its own `begin` (with the claim's owner token, so a reservation the batch made
    /// is confirmed, not waited on). Ignored when the call has a fingerprint or a scope (a
    /// batch reserves without either): the claim is released and the call begins as usual.
    ///
    /// # Example
    ///
    /// See [`Coordinator::prepare`].
    pub fn prepared(self, prepared: super::batch::Prepared<S>) -> PreparedCall<'a, S, C> {
        PreparedCall {
            call: self,
            prepared: Box::new(prepared),
        }
    }

    /// Runs the action at most once for this key and returns its value, or replays the stored
    /// value. An action error releases the key, so the next call runs the action again.
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
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.execute(action, ReleaseOnError, None::<ByStore>, None)
    }

    /// Like [`run`](Call::run), but an error for which `is_permanent` returns true is stored
    /// (with this call's codec, within the policy's `max_result_bytes`) and replayed to later
    /// callers as [`Error::ReplayedAction`], instead of releasing the key. Use it for failures
    /// that retrying cannot fix (a card declined, an address rejected).
    ///
    /// # Errors
    ///
    /// See [`Error`]: this call's own stored failure is [`Error::ActionStored`]; one that
    /// could not be stored (too large, unencodable, the store down) is [`Error::Action`] and
    /// its key released.
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
    /// assert!(matches!(first, Err(Error::ActionStored(_))));
    /// let again = c.call(&op, &key).run_storing_errors(|_| true, declined).await;
    /// assert!(matches!(again, Err(Error::ReplayedAction(e)) if e == "card declined"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_storing_errors<T, E, P, F, Fut>(
        self,
        is_permanent: P,
        action: F,
    ) -> impl Future<Output = Result<Receipt<T>, Error<E>>>
    where
        C: Codec<T> + Codec<E>,
        P: Fn(&E) -> bool,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let errors = StorePermanent { is_permanent };
        self.execute(action, errors, None::<ByStore>, None)
    }

    /// Like [`run`](Call::run), but the result is stored by `completer` (inside the caller's
    /// transaction) instead of by the store, once, after the lease renewals stopped; see
    /// [`Completer`] for what a failure means. Replays, waits and rejections are as for
    /// `run`. Store crates wrap this in their transactional call (idemkit-postgres's
    /// `TxCall`); applications rarely call it directly.
    ///
    /// # Errors
    ///
    /// As [`run`](Call::run), and [`Error::Store`] with phase `Complete` when the completer
    /// failed: the action ran, and its transaction must roll back.
    ///
    /// # Example
    ///
    /// See [`Completer`].
    pub fn run_completing<T, E, K, F, Fut>(
        self,
        completer: K,
        action: F,
    ) -> impl Future<Output = Result<Receipt<T>, Error<E>>>
    where
        C: Codec<T>,
        K: Completer,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.execute(action, ReleaseOnError, Some(completer), None)
    }

    /// [`run_storing_errors`](Call::run_storing_errors) with a [`Completer`]: a permanent
    /// error is stored by the completer too.
    ///
    /// # Errors
    ///
    /// As [`run_storing_errors`](Call::run_storing_errors) and
    /// [`run_completing`](Call::run_completing).
    ///
    /// # Example
    ///
    /// See [`Completer`].
    pub fn run_storing_errors_completing<T, E, K, P, F, Fut>(
        self,
        completer: K,
        is_permanent: P,
        action: F,
    ) -> impl Future<Output = Result<Receipt<T>, Error<E>>>
    where
        C: Codec<T> + Codec<E>,
        K: Completer,
        P: Fn(&E) -> bool,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let errors = StorePermanent { is_permanent };
        self.execute(action, errors, Some(completer), None)
    }
}

/// A [`Call`] with a claim from a batch ([`Call::prepared`]). Kept apart from `Call` so that
/// calls without one carry nothing for it.
#[must_use = "a call does nothing until `run` is awaited"]
pub struct PreparedCall<'a, S: Store, C> {
    call: Call<'a, S, C>,
    prepared: Box<super::batch::Prepared<S>>,
}

impl<S: Store, C: fmt::Debug> fmt::Debug for PreparedCall<'_, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedCall")
            .field("call", &self.call)
            .field("prepared", &self.prepared)
            .finish()
    }
}

impl<S: Store, C> PreparedCall<'_, S, C> {
    /// [`Call::run`], with the batch's claim.
    ///
    /// # Errors
    ///
    /// As [`Call::run`].
    pub fn run<T, E, F, Fut>(self, action: F) -> impl Future<Output = Result<Receipt<T>, Error<E>>>
    where
        C: Codec<T>,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.call
            .execute(action, ReleaseOnError, None::<ByStore>, Some(self.prepared))
    }

    /// [`Call::run_storing_errors`], with the batch's claim.
    ///
    /// # Errors
    ///
    /// As [`Call::run_storing_errors`].
    pub fn run_storing_errors<T, E, P, F, Fut>(
        self,
        is_permanent: P,
        action: F,
    ) -> impl Future<Output = Result<Receipt<T>, Error<E>>>
    where
        C: Codec<T> + Codec<E>,
        P: Fn(&E) -> bool,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let errors = StorePermanent { is_permanent };
        self.call
            .execute(action, errors, None::<ByStore>, Some(self.prepared))
    }
}
