//! A tower layer that runs any job handler's effect once per key.
//!
//! [`IdempotencyLayer`] wraps a `Service<Job>` (an apalis worker's handler, or any tower
//! service that performs a job). For every job it asks a user function for the job's
//! **effect key** (`order-9.invoice`, not the job id: a job pushed twice, or redelivered
//! after a worker died, names the same effect), reserves it in the coordinator's store, and
//! calls the inner service only if no caller holds or has completed the key. The inner
//! service's response is stored (JSON) and replayed to every later job with the key; a
//! concurrent duplicate waits for it (or, in reject mode, fails with `InFlight` to be retried
//! by the framework).
//!
//! # Errors
//!
//! The service's error type is [`BoxError`] (what tower middleware and apalis expect):
//!
//! - the inner service's own error, unchanged, when the inner service failed (its key was
//!   released, so the framework's retry runs it again);
//! - otherwise an [`idemkit_core::Error`]`<`[`ActionError`]`>`, boxed: an invalid key, a key
//!   in flight, the store down. [`disposition`] reads the settlement from either, with the
//!   table of [`idemkit_core::consume`]: a framework's retry policy retries a `Retry` and
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
/// [`Error::disposition`], the inner service's errors `Retry` (its key was released).
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
pub struct IdempotencyLayer<S, K> {
    inner: Arc<Config<S, K>>,
}

struct Config<S, K> {
    coordinator: Coordinator<S>,
    operation: Operation,
    key: K,
    in_flight: Option<InFlight>,
    ttl: Option<Duration>,
}

impl<S, K> Clone for IdempotencyLayer<S, K> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            inner: self.inner.clone(),
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for IdempotencyLayer<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("coordinator", &self.inner.coordinator)
            .field("operation", &self.inner.operation)
            .field("in_flight", &self.inner.in_flight)
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

impl<S: Store, K> IdempotencyLayer<S, K> {
    /// A layer for `operation`; `key` names the effect a job asks for.
    pub fn new(coordinator: Coordinator<S>, operation: Operation, key: K) -> Self {
        IdempotencyLayer {
            inner: Arc::new(Config {
                coordinator,
                operation,
                key,
                in_flight: None,
                ttl: None,
            }),
        }
    }

    fn config_mut(&mut self) -> &mut Config<S, K> {
        Arc::get_mut(&mut self.inner).expect("configured before it is cloned")
    }

    /// What a concurrent duplicate does instead of the policy's: wait for the first
    /// result (the default policy) or fail with `InFlight` for the framework to retry.
    ///
    /// # Panics
    ///
    /// If the layer was cloned already: configure it first.
    pub fn in_flight(mut self, in_flight: InFlight) -> Self {
        self.config_mut().in_flight = Some(in_flight);
        self
    }

    /// How long a result is kept instead of the policy's TTL: longer than the latest
    /// redelivery of a job.
    ///
    /// # Panics
    ///
    /// If the layer was cloned already: configure it first.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config_mut().ttl = Some(ttl);
        self
    }
}

impl<S, K, Svc> Layer<Svc> for IdempotencyLayer<S, K> {
    type Service = Idempotent<Svc, S, K>;

    fn layer(&self, inner: Svc) -> Self::Service {
        Idempotent {
            inner,
            config: self.inner.clone(),
        }
    }
}

/// The service [`IdempotencyLayer`] makes.
pub struct Idempotent<Svc, S, K> {
    inner: Svc,
    config: Arc<Config<S, K>>,
}

impl<Svc: Clone, S, K> Clone for Idempotent<Svc, S, K> {
    fn clone(&self) -> Self {
        Idempotent {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<Svc: fmt::Debug, S: fmt::Debug, K> fmt::Debug for Idempotent<Svc, S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotent")
            .field("inner", &self.inner)
            .field("operation", &self.config.operation)
            .finish_non_exhaustive()
    }
}

impl<Svc, S, K, Job> Service<Job> for Idempotent<Svc, S, K>
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
    type Future = Pin<Box<dyn Future<Output = Result<Svc::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, job: Job) -> Self::Future {
        // The ready service serves this call; a fresh clone waits for the next (tower's
        // rule for services that move into their future).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        Box::pin(async move {
            let key = match (config.key)(&job) {
                Ok(key) => key,
                // Never run unprotected: the job names no effect.
                Err(e) => return Err(boxed(Error::InvalidKey(e))),
            };
            let mut call = config.coordinator.call(&config.operation, &key);
            if let Some(in_flight) = config.in_flight {
                call = call.in_flight(in_flight);
            }
            if let Some(ttl) = config.ttl {
                call = call.ttl(ttl);
            }
            match call.run(|_attempt| inner.call(job)).await {
                Ok(receipt) => Ok(receipt.into_value()),
                Err(Error::Action(e)) => Err(e.into()),
                Err(e) => Err(boxed(e.map_action(|e| ActionError(e.into())))),
            }
        })
    }
}

fn boxed(e: Error<ActionError>) -> BoxError {
    Box::new(e)
}
