//! The coordinator: reserve, run while renewing, complete, replay.
//!
//! - [`mod@self`]: [`Coordinator`] and its builder, the policy lookup;
//! - `call`: one call's options ([`Call`]) and its one `run`;
//! - [`options`]: the type-state of the options that change a call's type (how the
//!   action's errors are treated, who stores the result: [`Completer`]);
//! - `receipt` and `attempt`: what a call returns ([`Receipt`], [`Source`]) and what the
//!   action is told ([`Attempt`]);
//! - `batch`: claims made for a batch of keys at once ([`Prepared`]);
//! - `drive`: the state machine, opening with its diagram (ARCHITECTURE.md, "The state
//!   machine and its interleavings", has the rows it names);
//! - `outcome`: what an action's result becomes (a completion, a release) and what a
//!   replay answers;
//! - `complete`: completion by a [`Completer`] (the caller's transaction) instead of the store;
//! - `lease`: the lease keeper (renewals, the lease-lost signal, the maximum hold) and the
//!   guard that finishes a dropped call.
//!
//! The imports run one way: `call` → `options`, `receipt`, `attempt`, `batch`; `drive`,
//! `complete` and `outcome` → `call`; everything → `lease`. `call`'s `run` enters `drive`
//! through a method, never an import.

mod attempt;
mod batch;
mod call;
mod complete;
mod drive;
mod lease;
pub mod options;
mod outcome;
mod receipt;
mod state;

pub use attempt::Attempt;
pub use batch::Prepared;
pub use call::Call;
pub use options::Completer;
pub use receipt::{Receipt, Source};

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::clock::after;
use crate::codec::JsonCodec;
use crate::downstream::{DownstreamKey, DownstreamSecret};
use crate::ident::{Key, Operation, Scope, StorageKey};
use crate::policy::Policy;
use crate::record::{Holder, RecordState, SharedHolder};
use crate::store::{Store, StoreError};

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
    /// Keys [`Attempt::downstream_key`] when set.
    downstream_secret: Option<DownstreamSecret>,
    /// Per-operation overrides, fixed at build time so a call's lookup takes no lock.
    overrides: HashMap<Operation, Policy>,
    /// This process, recorded in every reservation it makes (`Record::holder`).
    holder: Option<SharedHolder>,
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
pub struct CoordinatorBuilder<S> {
    store: S,
    policy: Policy,
    overrides: HashMap<Operation, Policy>,
    downstream_secret: Option<DownstreamSecret>,
    holder: Option<SharedHolder>,
}

impl<S: Store> CoordinatorBuilder<S> {
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

    /// Keys every [downstream key](crate::downstream) with `secret` (HMAC-SHA-256), so a
    /// receiver learns nothing of the effect's key. Every coordinator whose attempts must
    /// pass the same keys (all workers of one consumer) needs the same secret.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, DownstreamSecret, Key, MemoryStore, Operation};
    /// let secret = DownstreamSecret::new(b"a secret of 16 bytes or more".to_vec())?;
    /// let c = Coordinator::builder(MemoryStore::new()).downstream_secret(secret).build();
    /// let k = c.downstream_key(&Operation::new("op")?, None, &Key::new("k")?);
    /// assert!(k.as_str().starts_with("idk1s_"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn downstream_secret(mut self, secret: DownstreamSecret) -> Self {
        self.downstream_secret = Some(secret);
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
                downstream_secret: self.downstream_secret,
                overrides: self.overrides,
                holder: self.holder,
            }),
        }
    }

    /// Names this process in the reservations it makes: each records its holder (host,
    /// process id, this name; by default the executable's file name) and its lease, so that
    /// `idemkit list`, `inspect` and the status page show whose a reservation is and flag
    /// one its holder stopped renewing (`Record::is_stale`).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, MemoryStore};
    /// let c = Coordinator::builder(MemoryStore::new()).holder_name("billing-worker").build();
    /// assert_eq!(c.holder().map(|h| h.name.as_str()), Some("billing-worker"));
    /// ```
    pub fn holder_name(mut self, name: &str) -> Self {
        self.holder = Some(Arc::new(Holder::this_process().named(name)));
        self
    }

    /// Records no holder: reservations are written in record format version 1, which
    /// idemkit before 0.2 reads. For a rolling upgrade: until every process that reads the
    /// store runs 0.2, its writers use this (an older reader refuses a version-2 record as
    /// corrupt).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, MemoryStore};
    /// let c = Coordinator::builder(MemoryStore::new()).without_holder().build();
    /// assert!(c.holder().is_none());
    /// ```
    pub fn without_holder(mut self) -> Self {
        self.holder = None;
        self
    }
}

/// This process as a holder, read once.
fn this_process() -> SharedHolder {
    static THIS: std::sync::OnceLock<SharedHolder> = std::sync::OnceLock::new();
    THIS.get_or_init(|| Arc::new(Holder::this_process()))
        .clone()
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
    pub fn builder(store: S) -> CoordinatorBuilder<S> {
        CoordinatorBuilder {
            store,
            policy: Policy::default(),
            overrides: HashMap::new(),
            downstream_secret: None,
            holder: Some(this_process()),
        }
    }

    /// The process this coordinator records in its reservations (see
    /// [`CoordinatorBuilder::holder_name`]).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, MemoryStore};
    /// let c = Coordinator::new(MemoryStore::new());
    /// assert_eq!(c.holder().map(|h| h.pid), Some(std::process::id()));
    /// ```
    pub fn holder(&self) -> Option<&SharedHolder> {
        self.inner.holder.as_ref()
    }

    /// The [downstream key](crate::downstream) of an effect, as its attempts get it from
    /// [`Attempt::downstream_key`]: keyed with this coordinator's secret, if it has one.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, DownstreamKey, Key, MemoryStore, Operation};
    /// let c = Coordinator::new(MemoryStore::new());
    /// let (op, key) = (Operation::new("op")?, Key::new("k")?);
    /// assert_eq!(c.downstream_key(&op, None, &key), DownstreamKey::of(&op, None, &key));
    /// # Ok::<(), idemkit_core::KeyError>(())
    /// ```
    pub fn downstream_key(
        &self,
        operation: &Operation,
        scope: Option<&Scope>,
        key: &Key,
    ) -> DownstreamKey {
        DownstreamKey::of_storage_key(
            &StorageKey::new(operation, scope, key),
            self.inner.downstream_secret.as_ref(),
        )
    }

    pub(crate) fn downstream_secret(&self) -> Option<&DownstreamSecret> {
        self.inner.downstream_secret.as_ref()
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

    /// Starts a call: `operation` + `key`, then options, then [`Call::run`]. The call
    /// borrows its arguments; [`call_owned`](Coordinator::call_owned) takes them by value
    /// for a `'static` future.
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
        Call::new(
            Cow::Borrowed(self),
            Cow::Borrowed(operation),
            Cow::Borrowed(key),
        )
    }

    /// Starts a call that owns its coordinator handle, operation and key, so that
    /// [`Call::run`]'s future is `'static` whenever the action is: a tower service, an axum
    /// handler or a consumer task can return or spawn it. Costs a reference-count increment
    /// for the coordinator and the operation.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation, Scope};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let c = Coordinator::new(MemoryStore::new());
    /// let op = Operation::new("mail.invoice")?;
    /// let task = tokio::spawn(
    ///     c.call_owned(op.clone(), Key::new("order-9.invoice")?)
    ///         .scope_owned(Scope::new("tenant-1")?)
    ///         .run(|_| async { Ok::<_, std::io::Error>("em_1".to_string()) }),
    /// );
    /// assert_eq!(task.await??.value, "em_1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_owned(&self, operation: Operation, key: Key) -> Call<'static, S, JsonCodec> {
        Call::new(
            Cow::Owned(self.clone()),
            Cow::Owned(operation),
            Cow::Owned(key),
        )
    }

    /// Waits while a live owner holds `key`'s reservation, at most `timeout`: returns as
    /// soon as the key is completed, released (by its owner or an operator), purged or its
    /// lease ends, woken by the store's push where it has one. For a caller that was told
    /// [`Error::InFlight`](crate::Error::InFlight) and would otherwise sleep for the hint
    /// (the owner's whole lease): a runner's retry goes on the moment the key is free.
    /// Returns at once if nobody holds the key. A store call is bounded by the policy's
    /// `store_timeout`; reading the key costs one `get`, waiting one `wait` per lease the
    /// owner renews.
    ///
    /// # Errors
    ///
    /// The store's error, if it fails (the caller then falls back to sleeping).
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let c = Coordinator::new(MemoryStore::new());
    /// let (op, key) = (Operation::new("op")?, Key::new("k")?);
    /// // Nobody holds the key: returns at once.
    /// c.wait_while_reserved(&op, None, &key, Duration::from_secs(60)).await?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn wait_while_reserved(
        &self,
        operation: &Operation,
        scope: Option<&Scope>,
        key: &Key,
        timeout: std::time::Duration,
    ) -> Result<(), StoreError> {
        let store = self.store();
        let bound = self.policy_for(operation).store_timeout;
        let key = StorageKey::new(operation, scope, key);
        let deadline = after(crate::clock::now(), timeout);
        loop {
            let record = lease::bounded(bound, store.call_timeout(), store.get(&key)).await?;
            let Some(record) = record else {
                return Ok(());
            };
            if !matches!(record.state, RecordState::Reserved) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(crate::clock::now());
            if left.is_zero() {
                return Ok(());
            }
            let own = store.call_timeout().map(|t| t.saturating_add(left));
            lease::bounded(
                left.saturating_add(bound),
                own,
                store.wait(&key, record.fencing, left),
            )
            .await?;
        }
    }
}
