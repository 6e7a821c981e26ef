//! What the action is told about its run: its fencing token, its lease, its downstream key.

use std::sync::Arc;
use std::time::Duration;

use super::lease::LeaseState;
use crate::downstream::{DownstreamKey, DownstreamSecret};
use crate::error::LeaseLost;
use crate::ident::StorageKey;
#[cfg(doc)]
use crate::policy::Policy;
use crate::record::FencingToken;

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
