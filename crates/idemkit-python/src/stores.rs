//! The stores Python can connect, each a [`DynStore`] behind the `Store` class, and the
//! connects and the inbox's migration, which reply through a [`Bridge`] as calls do.

use super::*;

/// A store the coordinator can use: MemoryStore, RedisStore or PostgresStore.
#[pyclass(frozen, module = "idemkit._native", subclass)]
#[derive(Debug, Clone)]
pub(crate) struct Store {
    pub(crate) inner: DynStore,
    pub(crate) name: &'static str,
    /// The process the store belongs to: whose runtime drives its connections, or whose
    /// memory holds its records (`None`: a test store that may cross a fork).
    pub(crate) pid: Option<u32>,
}

#[pymethods]
impl Store {
    fn __repr__(&self) -> String {
        format!("<idemkit {} {:?}>", self.name, self.inner)
    }
}

impl Store {
    pub(crate) fn connected(inner: DynStore, name: &'static str) -> Self {
        Store {
            inner,
            name,
            pid: Some(std::process::id()),
        }
    }
}

/// The in-process store: records live in this process only (tests, one worker).
#[pyfunction]
pub(crate) fn memory_store() -> Store {
    Store {
        inner: DynStore::new(idemkit_core::MemoryStore::new()),
        name: "MemoryStore",
        // Its records and locks are this process's: a forked child that used them would get
        // a copy as of the fork, or wait for ever on a lock a runtime thread held at that
        // instant (review L7 of `e047556`). Refused there, as a connected store is.
        pid: Some(std::process::id()),
    }
}

/// A MemoryStore that panics in `phase` (`"begin"` or `"complete"`): the Python tests'
/// way to prove that a panic in the runtime reaches its caller as an error.
#[pyfunction]
pub(crate) fn _panicking_store(phase: &str) -> PyResult<Store> {
    let phase = match phase {
        "begin" => PanicIn::Begin,
        "complete" => PanicIn::Complete,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "phase must be 'begin' or 'complete', got {other:?}"
            )));
        }
    };
    Ok(Store {
        inner: DynStore::new(PanickingStore {
            inner: idemkit_core::MemoryStore::new(),
            phase,
        }),
        name: "PanickingStore",
        pid: None,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PanicIn {
    Begin,
    Complete,
}

/// See [`_panicking_store`].
#[derive(Debug, Clone)]
pub(crate) struct PanickingStore {
    pub(crate) inner: idemkit_core::MemoryStore,
    pub(crate) phase: PanicIn,
}

impl idemkit_core::Store for PanickingStore {
    async fn begin(
        &self,
        req: &idemkit_core::BeginRequest<'_>,
    ) -> Result<idemkit_core::Claim, idemkit_core::StoreError> {
        assert!(
            self.phase != PanicIn::Begin,
            "a panic in begin (test store)"
        );
        self.inner.begin(req).await
    }

    async fn renew(
        &self,
        key: &idemkit_core::StorageKey,
        ownership: &idemkit_core::Ownership,
        lease: Duration,
    ) -> Result<(), idemkit_core::StoreError> {
        self.inner.renew(key, ownership, lease).await
    }

    async fn complete(
        &self,
        key: &idemkit_core::StorageKey,
        ownership: &idemkit_core::Ownership,
        request: &idemkit_core::CompleteRequest,
    ) -> Result<(), idemkit_core::StoreError> {
        assert!(
            self.phase != PanicIn::Complete,
            "a panic in complete (test store)"
        );
        self.inner.complete(key, ownership, request).await
    }

    async fn release(
        &self,
        key: &idemkit_core::StorageKey,
        ownership: &idemkit_core::Ownership,
    ) -> Result<(), idemkit_core::StoreError> {
        self.inner.release(key, ownership).await
    }

    async fn wait(
        &self,
        key: &idemkit_core::StorageKey,
        seen: idemkit_core::FencingToken,
        timeout: Duration,
    ) -> Result<(), idemkit_core::StoreError> {
        self.inner.wait(key, seen, timeout).await
    }

    async fn get(
        &self,
        key: &idemkit_core::StorageKey,
    ) -> Result<Option<idemkit_core::Record>, idemkit_core::StoreError> {
        self.inner.get(key).await
    }
}

/// Spawns `work` on the runtime; `bridge` gets its reply under `id` (or an error reply if
/// the task panics).
pub(crate) fn spawn_replying<F>(bridge: &Bridge, id: u64, work: F) -> PyResult<()>
where
    F: Future<Output = Reply> + Send + 'static,
{
    let task = Arc::new(TaskState::new(bridge.wake.clone(), id));
    runtime()?.spawn(async move {
        let guard = Unreplied(task);
        let reply = work.await;
        guard.0.reply(reply);
    });
    Ok(())
}

/// What decides how a Redis connection is secured and authenticated, beyond its URL:
/// redis-py's names (`ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`: PEM files) and an ACL
/// user's name and password.
#[derive(Default, FromPyObject)]
pub(crate) struct RedisAuth {
    #[pyo3(item)]
    ssl_ca_certs: Option<String>,
    #[pyo3(item)]
    ssl_certfile: Option<String>,
    #[pyo3(item)]
    ssl_keyfile: Option<String>,
    #[pyo3(item)]
    username: Option<String>,
    #[pyo3(item)]
    password: Option<String>,
}

impl RedisAuth {
    fn apply(
        self,
        mut builder: idemkit_redis::RedisStoreBuilder,
    ) -> Result<idemkit_redis::RedisStoreBuilder, idemkit_core::StoreError> {
        if let Some(ca) = self.ssl_ca_certs {
            builder = builder.tls_ca_file(ca);
        }
        match (self.ssl_certfile, self.ssl_keyfile) {
            (Some(cert), Some(key)) => builder = builder.tls_client_cert_files(cert, key),
            (None, None) => {}
            _ => {
                return Err(idemkit_core::StoreError::new(
                    idemkit_core::StoreErrorKind::Other,
                    "ssl_certfile and ssl_keyfile go together: a client certificate needs its key",
                ));
            }
        }
        match (self.username, self.password) {
            (Some(user), Some(password)) => builder = builder.user(user, password),
            (None, Some(password)) => builder = builder.password(password),
            (Some(_), None) => {
                return Err(idemkit_core::StoreError::new(
                    idemkit_core::StoreErrorKind::Other,
                    "a username needs its password",
                ));
            }
            (None, None) => {}
        }
        Ok(builder)
    }
}

/// Connects to Redis (one node); `bridge` gets the store under `id`. `prefix` is the Redis
/// key prefix every record lives under (the Rust crate's default, `idemkit`, so both
/// languages share records by default).
#[pyfunction]
#[pyo3(signature = (bridge, id, url, prefix=None, auth=None))]
pub(crate) fn redis_store(
    bridge: &Bridge,
    id: u64,
    url: String,
    prefix: Option<String>,
    auth: Option<RedisAuth>,
) -> PyResult<()> {
    connect_redis(bridge, id, prefix, auth, move |builder| async move {
        builder.connect(&url).await
    })
}

/// Connects to a Redis Cluster through any of its nodes.
#[pyfunction]
#[pyo3(signature = (bridge, id, urls, prefix=None, auth=None))]
pub(crate) fn redis_cluster_store(
    bridge: &Bridge,
    id: u64,
    urls: Vec<String>,
    prefix: Option<String>,
    auth: Option<RedisAuth>,
) -> PyResult<()> {
    connect_redis(bridge, id, prefix, auth, async move |builder| {
        builder
            .connect_cluster(urls.iter().map(String::as_str))
            .await
    })
}

pub(crate) fn connect_redis<F, Fut>(
    bridge: &Bridge,
    id: u64,
    prefix: Option<String>,
    auth: Option<RedisAuth>,
    connect: F,
) -> PyResult<()>
where
    F: FnOnce(idemkit_redis::RedisStoreBuilder) -> Fut + Send + 'static,
    Fut: Future<Output = Result<idemkit_redis::RedisStore, idemkit_core::StoreError>> + Send,
{
    spawn_replying(bridge, id, async move {
        let mut builder = idemkit_redis::RedisStore::builder();
        if let Some(prefix) = prefix {
            builder = builder.prefix(prefix);
        }
        let connected = match auth.unwrap_or_default().apply(builder) {
            Ok(builder) => connect(builder).await,
            Err(e) => Err(e),
        };
        match connected {
            Ok(store) => {
                Reply::Connected(Store::connected(DynStore::with_raw(store), "RedisStore"))
            }
            Err(e) => Reply::Failed(e),
        }
    })
}

/// Connects to PostgreSQL and migrates the table (`table`, default `idemkit_records`).
#[pyfunction]
#[pyo3(signature = (bridge, id, url, table=None))]
pub(crate) fn postgres_store(
    bridge: &Bridge,
    id: u64,
    url: String,
    table: Option<String>,
) -> PyResult<()> {
    spawn_replying(bridge, id, async move {
        let mut builder = idemkit_postgres::PgStore::builder();
        if let Some(table) = table {
            builder = builder.table(&table);
        }
        let store = match builder.connect(&url).await {
            Ok(store) => store,
            Err(e) => return Reply::Failed(e),
        };
        // Idempotent, and serialised by an advisory lock: every worker may run it.
        match store.migrate().await {
            Ok(()) => {
                Reply::Connected(Store::connected(DynStore::with_raw(store), "PostgresStore"))
            }
            Err(e) => Reply::Failed(e),
        }
    })
}

/// Migrates the transactional inbox's table (`schema.table`) on the database at `url`: the
/// same table and the same claim as the Rust crate's `Inbox`, so a message claimed by either
/// language is a duplicate to the other. `bridge` gets `None` under `id` when it is done.
#[pyfunction]
#[pyo3(signature = (bridge, id, url, schema, table))]
pub(crate) fn migrate_inbox(
    py: Python<'_>,
    bridge: &Bridge,
    id: u64,
    url: String,
    schema: String,
    table: String,
) -> PyResult<()> {
    let inbox = idemkit_postgres::Inbox::new()
        .schema(&schema)
        .and_then(|i| i.table(&table))
        .map_err(|e| raise(py, "InvalidKey", (e.to_string(),)))?;
    spawn_replying(bridge, id, async move {
        let pool = match idemkit_postgres::sqlx::PgPool::connect(&url).await {
            Ok(pool) => pool,
            Err(e) => {
                return Reply::Failed(idemkit_core::StoreError::unavailable(e));
            }
        };
        let migrated = inbox.migrate(&pool).await;
        pool.close().await;
        match migrated {
            Ok(()) => Reply::Stored(true),
            Err(e) => Reply::Failed(e),
        }
    })
}
