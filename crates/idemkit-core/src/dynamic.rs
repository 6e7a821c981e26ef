//! [`DynStore`]: a store chosen at run time, behind one type.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::ident::StorageKey;
use crate::record::{FencingToken, Record};
use crate::store::{
    BeginRequest, Claim, CompleteRequest, Ownership, RawStore, Store, StoreError, StoreErrorKind,
};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe mirror of [`Store`] and [`RawStore`]: each method boxes its future.
trait Erased: Send + Sync + 'static {
    fn max_ttl(&self) -> Duration;
    fn call_timeout(&self) -> Option<Duration>;
    fn uses_reservation(&self) -> bool;
    fn begin<'a>(&'a self, req: &'a BeginRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>>;
    fn begin_many<'a>(
        &'a self,
        reqs: &'a [BeginRequest<'a>],
    ) -> BoxFuture<'a, Vec<Result<Claim, StoreError>>>;
    fn renew<'a>(
        &'a self,
        key: &'a StorageKey,
        lease: &'a Ownership,
        duration: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn complete<'a>(
        &'a self,
        key: &'a StorageKey,
        lease: &'a Ownership,
        completion: &'a CompleteRequest,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn release<'a>(
        &'a self,
        key: &'a StorageKey,
        lease: &'a Ownership,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn wait<'a>(
        &'a self,
        key: &'a StorageKey,
        seen: FencingToken,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn get<'a>(&'a self, key: &'a StorageKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>>;
    fn put_raw<'a>(
        &'a self,
        key: &'a StorageKey,
        bytes: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn purge<'a>(&'a self, key: &'a StorageKey) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

/// A store without raw access.
struct Plain<S>(S);
/// A store with raw access ([`RawStore`]).
struct Raw<S>(S);

fn no_raw_access() -> StoreError {
    StoreError::new(
        StoreErrorKind::Rejected,
        "this store was erased without raw access (build the DynStore with DynStore::with_raw)",
    )
}

macro_rules! erase_store {
    ($wrapper:ident, $bound:path, $raw:expr, $purge:expr) => {
        impl<S: $bound + fmt::Debug> Erased for $wrapper<S> {
            fn max_ttl(&self) -> Duration {
                self.0.max_ttl()
            }
            fn call_timeout(&self) -> Option<Duration> {
                self.0.call_timeout()
            }
            fn uses_reservation(&self) -> bool {
                self.0.uses_reservation()
            }
            fn begin<'a>(
                &'a self,
                req: &'a BeginRequest<'a>,
            ) -> BoxFuture<'a, Result<Claim, StoreError>> {
                Box::pin(self.0.begin(req))
            }
            fn begin_many<'a>(
                &'a self,
                reqs: &'a [BeginRequest<'a>],
            ) -> BoxFuture<'a, Vec<Result<Claim, StoreError>>> {
                Box::pin(self.0.begin_many(reqs))
            }
            fn renew<'a>(
                &'a self,
                key: &'a StorageKey,
                lease: &'a Ownership,
                duration: Duration,
            ) -> BoxFuture<'a, Result<(), StoreError>> {
                Box::pin(self.0.renew(key, lease, duration))
            }
            fn complete<'a>(
                &'a self,
                key: &'a StorageKey,
                lease: &'a Ownership,
                completion: &'a CompleteRequest,
            ) -> BoxFuture<'a, Result<(), StoreError>> {
                Box::pin(self.0.complete(key, lease, completion))
            }
            fn release<'a>(
                &'a self,
                key: &'a StorageKey,
                lease: &'a Ownership,
            ) -> BoxFuture<'a, Result<(), StoreError>> {
                Box::pin(self.0.release(key, lease))
            }
            fn wait<'a>(
                &'a self,
                key: &'a StorageKey,
                seen: FencingToken,
                timeout: Duration,
            ) -> BoxFuture<'a, Result<(), StoreError>> {
                Box::pin(self.0.wait(key, seen, timeout))
            }
            fn get<'a>(
                &'a self,
                key: &'a StorageKey,
            ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
                Box::pin(self.0.get(key))
            }
            fn put_raw<'a>(
                &'a self,
                key: &'a StorageKey,
                bytes: Bytes,
                ttl: Duration,
            ) -> BoxFuture<'a, Result<(), StoreError>> {
                let raw: fn(&'a S, &'a StorageKey, Bytes, Duration) -> BoxFuture<'a, _> = $raw;
                raw(&self.0, key, bytes, ttl)
            }
            fn purge<'a>(&'a self, key: &'a StorageKey) -> BoxFuture<'a, Result<bool, StoreError>> {
                let purge: fn(&'a S, &'a StorageKey) -> BoxFuture<'a, _> = $purge;
                purge(&self.0, key)
            }
            fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }
    };
}

erase_store!(
    Plain,
    Store,
    |_, _, _, _| Box::pin(async { Err(no_raw_access()) }),
    |_, _| Box::pin(async { Err(no_raw_access()) })
);
erase_store!(
    Raw,
    RawStore,
    |s, key, bytes, ttl| Box::pin(s.put_raw(key, bytes, ttl)),
    |s, key| Box::pin(s.purge(key))
);

/// Any [`Store`] behind one type, so that a program can pick its store at run time (from a
/// URL, a config file) without making everything generic: `Coordinator<DynStore>`. Each call
/// boxes its future (one allocation per store call).
///
/// [`DynStore::with_raw`] keeps [`RawStore`] access too (operator tools, tests); a store
/// erased with [`DynStore::new`] answers `put_raw` and `purge` with
/// [`StoreErrorKind::Rejected`].
///
/// # Example
///
/// ```
/// use idemkit_core::{Coordinator, DynStore, Key, MemoryStore, Operation};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let store = match std::env::var("STORE").as_deref() {
///     // Ok("redis") => DynStore::new(idemkit_redis::RedisStore::connect(url).await?),
///     _ => DynStore::with_raw(MemoryStore::new()),
/// };
/// let coordinator = Coordinator::new(store);
/// let (op, key) = (Operation::new("mail.invoice")?, Key::new("order-9.invoice")?);
/// let out = coordinator.call(&op, &key)
///     .run(|_| async { Ok::<_, std::io::Error>("em_1".to_string()) })
///     .await?;
/// assert_eq!(out.value, "em_1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct DynStore(Arc<dyn Erased>);

impl DynStore {
    /// Erases a store.
    ///
    /// # Example
    ///
    /// See [`DynStore`].
    pub fn new<S: Store + fmt::Debug>(store: S) -> Self {
        DynStore(Arc::new(Plain(store)))
    }

    /// Erases a store, keeping its raw access.
    ///
    /// # Example
    ///
    /// See [`DynStore`].
    pub fn with_raw<S: RawStore + fmt::Debug>(store: S) -> Self {
        DynStore(Arc::new(Raw(store)))
    }
}

impl fmt::Debug for DynStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DynStore(")?;
        self.0.describe(f)?;
        f.write_str(")")
    }
}

impl Store for DynStore {
    fn max_ttl(&self) -> Duration {
        self.0.max_ttl()
    }

    fn call_timeout(&self) -> Option<Duration> {
        self.0.call_timeout()
    }

    fn uses_reservation(&self) -> bool {
        self.0.uses_reservation()
    }

    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Claim, StoreError> {
        self.0.begin(req).await
    }

    async fn begin_many(&self, reqs: &[BeginRequest<'_>]) -> Vec<Result<Claim, StoreError>> {
        self.0.begin_many(reqs).await
    }

    async fn renew(
        &self,
        key: &StorageKey,
        owner: &Ownership,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.0.renew(key, owner, lease).await
    }

    async fn complete(
        &self,
        key: &StorageKey,
        lease: &Ownership,
        completion: &CompleteRequest,
    ) -> Result<(), StoreError> {
        self.0.complete(key, lease, completion).await
    }

    async fn release(&self, key: &StorageKey, lease: &Ownership) -> Result<(), StoreError> {
        self.0.release(key, lease).await
    }

    async fn wait(
        &self,
        key: &StorageKey,
        seen: FencingToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.0.wait(key, seen, timeout).await
    }

    async fn get(&self, key: &StorageKey) -> Result<Option<Record>, StoreError> {
        self.0.get(key).await
    }
}

impl RawStore for DynStore {
    async fn put_raw(
        &self,
        key: &StorageKey,
        bytes: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.0.put_raw(key, bytes, ttl).await
    }

    async fn purge(&self, key: &StorageKey) -> Result<bool, StoreError> {
        self.0.purge(key).await
    }
}
