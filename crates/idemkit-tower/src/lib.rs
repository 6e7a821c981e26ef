//! A tower layer that runs any job handler's effect once per key.
//!
//! [`IdempotencyLayer`] wraps a `Service<Job>` (an apalis worker's handler, or any tower
//! service that performs a job). For every job it asks a user function for the job's
//! **effect key** (`order-9.invoice`, not the job id: a job pushed twice, or redelivered
//! after a worker died, names the same effect), reserves it in the coordinator's store, and
//! calls the inner service only if no caller holds or has completed the key. The inner
//! service's response is stored (JSON) and replayed to every later job with the key; a
//! concurrent duplicate waits for it (the default) and fails with `InFlight`, to be retried
//! by the framework, if the wait outlasts the policy's `wait_timeout` or in reject mode.
//!
//! # Errors
//!
//! The service's error type is [`BoxError`] (what tower middleware and apalis expect):
//!
//! - the inner service's own error, unchanged, when the inner service failed (its key was
//!   released, so the framework's retry runs it again);
//! - otherwise an [`idemkit_core::Error`]`<`[`ActionError`]`>`, boxed: an invalid key, a key
//!   in flight, the store down. [`disposition`] reads the settlement from either, with the
//!   table of `idemkit_runner` (the one every runner reads): a framework's retry policy retries a `Retry` and
//!   gives up on a `DeadLetter` (an invalid key is never run unprotected).
//!
//! # Example
//!
//! ```
//! use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
//! use idemkit_tower::IdempotencyLayer;
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[derive(Clone)] struct Invoice { order: String }
//! # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
//! let mut jobs = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(
//!         Coordinator::new(MemoryStore::new()),
//!         Operation::new("mail.invoice")?,
//!         |job: &Invoice| Key::compose([job.order.as_str(), "invoice"]),
//!     ))
//!     .service(service_fn(|job: Invoice| async move {
//!         // send the mail
//!         Ok::<_, std::io::Error>(format!("em_{}", job.order))
//!     }));
//! let job = Invoice { order: "order-9".into() };
//! let first = jobs.ready().await?.call(job.clone()).await?;
//! let again = jobs.ready().await?.call(job).await?; // delivered twice: replayed
//! assert_eq!(first, again);
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use idemkit_core::{Coordinator, Disposition, Error, InFlight, Key, KeyError, Operation, Store};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tower_layer::Layer;
use tower_service::Service;

/// The boxed error the layered service returns (tower's and apalis' error type).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The inner service's error inside an [`idemkit_core::Error`]: only in the variants that
/// carry one, which this layer does not produce (a failing inner service's error is
/// returned as is). It is here so that the boxed error has one concrete type to downcast to.
#[derive(Debug)]
pub struct ActionError(pub BoxError);

impl fmt::Display for ActionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ActionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// The settlement an error of the layered service asks for: idemkit's own errors by their
/// [`Error::disposition`], the inner service's errors `Retry` (a retry runs it again).
///
/// # Example
///
/// ```
/// use idemkit_core::{Disposition, Error};
/// use idemkit_tower::{ActionError, BoxError, disposition};
///
/// let reused: BoxError = Box::new(Error::<ActionError>::KeyReused);
/// assert_eq!(disposition(&reused), Disposition::DeadLetter);
/// let own: BoxError = "smtp down".into();
/// assert_eq!(disposition(&own), Disposition::Retry { after: None });
/// ```
pub fn disposition(error: &BoxError) -> Disposition {
    match error.downcast_ref::<Error<ActionError>>() {
        Some(e) => e.disposition(),
        None => Disposition::Retry { after: None },
    }
}

/// Makes the wrapped job service idempotent per effect key. See the [crate docs](crate).
///
/// Cloning is cheap (the coordinator, operation and key function are shared); the options
/// may be set on any copy, before or after it is cloned.
pub struct IdempotencyLayer<S, K> {
    shared: Arc<Shared<S, K>>,
    options: Options,
}

struct Shared<S, K> {
    coordinator: Coordinator<S>,
    operation: Operation,
    key: K,
}

/// The per-layer options, copied into every service the layer makes.
#[derive(Debug, Clone, Copy, Default)]
struct Options {
    in_flight: Option<InFlight>,
    ttl: Option<Duration>,
}

impl<S, K> Clone for IdempotencyLayer<S, K> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            shared: self.shared.clone(),
            options: self.options,
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for IdempotencyLayer<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("coordinator", &self.shared.coordinator)
            .field("operation", &self.shared.operation)
            .field("in_flight", &self.options.in_flight)
            .field("ttl", &self.options.ttl)
            .finish_non_exhaustive()
    }
}

impl<S: Store, K> IdempotencyLayer<S, K> {
    /// A layer for `operation`; `key` names the effect a job asks for.
    pub fn new(coordinator: Coordinator<S>, operation: Operation, key: K) -> Self {
        IdempotencyLayer {
            shared: Arc::new(Shared {
                coordinator,
                operation,
                key,
            }),
            options: Options::default(),
        }
    }

    /// What a concurrent duplicate does instead of the policy's: wait for the first
    /// result (the default policy) or fail with `InFlight` for the framework to retry.
    pub fn in_flight(mut self, in_flight: InFlight) -> Self {
        self.options.in_flight = Some(in_flight);
        self
    }

    /// How long a result is kept instead of the policy's TTL: longer than the latest
    /// redelivery of a job.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options.ttl = Some(ttl);
        self
    }
}

impl<S, K, Svc> Layer<Svc> for IdempotencyLayer<S, K> {
    type Service = Idempotency<Svc, S, K>;

    fn layer(&self, inner: Svc) -> Self::Service {
        Idempotency {
            inner,
            shared: self.shared.clone(),
            options: self.options,
        }
    }
}

/// The service [`IdempotencyLayer`] makes: `inner`, run at most once per effect key.
pub struct Idempotency<Svc, S, K> {
    inner: Svc,
    shared: Arc<Shared<S, K>>,
    options: Options,
}

impl<Svc, S, K> Idempotency<Svc, S, K> {
    /// The inner service.
    pub fn get_ref(&self) -> &Svc {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut Svc {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> Svc {
        self.inner
    }
}

impl<Svc: Clone, S, K> Clone for Idempotency<Svc, S, K> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            options: self.options,
        }
    }
}

impl<Svc: fmt::Debug, S: fmt::Debug, K> fmt::Debug for Idempotency<Svc, S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("operation", &self.shared.operation)
            .finish_non_exhaustive()
    }
}

/// The future [`Idempotency`] returns: the call under the coordinator (boxed: it holds the
/// inner service's future inside the coordinator's).
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<T> {
    inner: Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>,
}

impl<T> fmt::Debug for ResponseFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<T> Future for ResponseFuture<T> {
    type Output = Result<T, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<Svc, S, K, Job> Service<Job> for Idempotency<Svc, S, K>
where
    Svc: Service<Job> + Clone + Send + 'static,
    Svc::Future: Send,
    Svc::Response: Serialize + DeserializeOwned + Send + 'static,
    Svc::Error: Into<BoxError> + Send + 'static,
    S: Store + Send + Sync + 'static,
    K: Fn(&Job) -> Result<Key, KeyError> + Send + Sync + 'static,
    Job: Send + 'static,
{
    type Response = Svc::Response;
    type Error = BoxError;
    type Future = ResponseFuture<Svc::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, job: Job) -> Self::Future {
        // The ready service serves this call; a fresh clone waits for the next (tower's
        // rule for services that move into their future).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        let options = self.options;
        ResponseFuture {
            inner: Box::pin(async move {
                let key = match (shared.key)(&job) {
                    Ok(key) => key,
                    // Never run unprotected: the job names no effect.
                    Err(e) => return Err(boxed(Error::InvalidKey(e))),
                };
                let mut call = shared.coordinator.call(&shared.operation, &key);
                if let Some(in_flight) = options.in_flight {
                    call = call.in_flight(in_flight);
                }
                if let Some(ttl) = options.ttl {
                    call = call.ttl(ttl);
                }
                match call.run(|_attempt| inner.call(job)).await {
                    Ok(receipt) => Ok(receipt.into_value()),
                    Err(Error::Action(e)) => Err(e.into()),
                    Err(e) => Err(boxed(e.map_action(|e| ActionError(e.into())))),
                }
            }),
        }
    }
}

fn boxed(e: Error<ActionError>) -> BoxError {
    Box::new(e)
}
