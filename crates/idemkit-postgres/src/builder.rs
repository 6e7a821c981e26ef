//! [`PgStoreBuilder`]: the schema and table, the waiters' re-check, the pool `connect`
//! opens; the names checked at the end.

use std::time::Duration;

use idemkit_core::{StoreError, StoreErrorKind};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::names::{NameError, Table, check};
use crate::store::PgStore;

/// Builds a [`PgStore`]: the schema and table, how often a waiter re-checks on its own, and
/// the pool [`connect`](PgStoreBuilder::connect) opens. Every option takes its value as it
/// is; the names are checked at the end, by [`build`](PgStoreBuilder::build) or
/// [`connect`](PgStoreBuilder::connect), as sqlx's `PgPoolOptions` does.
///
/// # Example
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use idemkit_postgres::PgStore;
///
/// let store = PgStore::builder()
///     .schema("billing")
///     .table("idempotency")
///     .recheck(Duration::from_secs(1))
///     .build(pool)?;
/// store.migrate().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgStoreBuilder {
    pub(crate) schema: String,
    pub(crate) table: String,
    pub(crate) recheck: Duration,
    pub(crate) coalesce: bool,
    max_connections: u32,
}

impl Default for PgStoreBuilder {
    fn default() -> Self {
        PgStoreBuilder {
            schema: "public".into(),
            table: "idemkit_records".into(),
            recheck: Duration::from_secs(2),
            coalesce: true,
            max_connections: 10,
        }
    }
}

impl PgStoreBuilder {
    /// The schema (default `public`); [`migrate`](PgStore::migrate) creates it if needed. It
    /// must be 1 to 30 of `a-z`, `0-9` and `_`, not starting with a digit: checked by
    /// [`build`](PgStoreBuilder::build) and [`connect`](PgStoreBuilder::connect).
    ///
    /// # Example
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let pool = sqlx::PgPool::connect_lazy("postgres://localhost/test")?;
    /// let err = idemkit_postgres::PgStore::builder().schema("Billing").build(pool).unwrap_err();
    /// assert_eq!(err.what(), "schema");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn schema(mut self, schema: &str) -> Self {
        schema.clone_into(&mut self.schema);
        self
    }

    /// The table (default `idemkit_records`), named as [`schema`](PgStoreBuilder::schema) is.
    ///
    /// # Example
    ///
    /// ```
    /// let b = idemkit_postgres::PgStore::builder().table("keys");
    /// # drop(b);
    /// ```
    pub fn table(mut self, table: &str) -> Self {
        table.clone_into(&mut self.table);
        self
    }

    /// The longest a waiter sleeps without a notification before it reads the row again
    /// (default 2 s, at least 10 ms). Notifications normally wake it at once; the re-check
    /// bounds the wait if one is lost (the listening connection dropped).
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = idemkit_postgres::PgStore::builder().recheck(Duration::from_millis(500));
    /// # drop(b);
    /// ```
    pub fn recheck(mut self, every: Duration) -> Self {
        self.recheck = every.max(Duration::from_millis(10));
        self
    }

    /// Whether concurrent `begin`s (and `complete`s) are coalesced (default on): while two
    /// statements of one kind are running, later calls queue, and the queue goes out as one
    /// statement when one of them answers: one commit for many keys, where a miss otherwise
    /// costs two commits of its own (docs/benchmarks.md). A call that finds nothing queued and
    /// a statement's slot free is sent at once, so nothing waits at concurrency 1. A call in
    /// a transaction of yours ([`TxCall`](crate::TxCall)) completes in that transaction,
    /// never in a batch. Off sends every call on its own (for comparison).
    ///
    /// # Example
    ///
    /// ```
    /// let b = idemkit_postgres::PgStore::builder().coalesce(false);
    /// # drop(b);
    /// ```
    pub fn coalesce(mut self, on: bool) -> Self {
        self.coalesce = on;
        self
    }

    /// The size of the pool [`connect`](PgStoreBuilder::connect) opens (default 10, at
    /// least 2: a waiter's `LISTEN` connection beside the calls'). Ignored by
    /// [`build`](PgStoreBuilder::build), which takes your pool.
    ///
    /// # Example
    ///
    /// ```
    /// let b = idemkit_postgres::PgStore::builder().max_connections(16);
    /// # drop(b);
    /// ```
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(2);
        self
    }

    /// The schema and table, checked.
    fn names(&self) -> Result<Table, NameError> {
        Ok(Table {
            schema: check("schema", &self.schema)?,
            name: check("table", &self.table)?,
        })
    }

    /// The store on `pool`. A pool of your own works; for one round trip per call, build it
    /// with `test_before_acquire(false)` (sqlx's default pings every connection it hands out).
    ///
    /// # Errors
    ///
    /// [`NameError`] if the schema or the table is not a name this store accepts.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::postgres::PgPoolOptions::new()
    ///     .test_before_acquire(false)
    ///     .connect("postgres://postgres@127.0.0.1/test").await?;
    /// let store = idemkit_postgres::PgStore::builder().build(pool)?;
    /// # drop(store); Ok(()) }
    /// ```
    pub fn build(self, pool: PgPool) -> Result<PgStore, NameError> {
        Ok(PgStore::assemble(
            pool,
            self.names()?,
            self.recheck,
            self.coalesce,
        ))
    }

    /// Checks the names, then connects a pool of [`max_connections`] to `url` (without
    /// sqlx's ping before each use) and builds the store on it.
    ///
    /// [`max_connections`]: PgStoreBuilder::max_connections
    ///
    /// # Errors
    ///
    /// [`StoreError`]: `Other` if a name is refused (its source is the [`NameError`]: nothing
    /// was connected), the URL is invalid, TLS fails (a certificate not trusted, a server
    /// without TLS under `sslmode=require`) or the login is refused; `Unavailable` if the
    /// server cannot be reached.
    ///
    /// # TLS
    ///
    /// The URL's `sslmode` decides, as libpq's does: `disable`; `prefer` (the default: TLS
    /// when the server offers it, else plain text); `require` (TLS, the certificate not
    /// checked); `verify-ca` (TLS, the certificate signed by `sslrootcert` or, without it,
    /// by a root of the system's store); `verify-full` (as `verify-ca`, and the host name
    /// is the certificate's). `sslcert` and `sslkey` give a client certificate. A managed
    /// PostgreSQL: `postgres://app:secret@db.example.com/app?sslmode=verify-full&sslrootcert=/etc/idemkit/db-ca.pem`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_postgres::PgStore::builder()
    ///     .schema("billing")
    ///     .max_connections(16)
    ///     .connect("postgres://postgres@127.0.0.1/test").await?;
    /// # drop(store); Ok(()) }
    /// ```
    pub async fn connect(self, url: &str) -> Result<PgStore, StoreError> {
        self.names()
            .map_err(|e| StoreError::new(StoreErrorKind::Other, e))?;
        let options: PgConnectOptions = url
            .parse()
            .map_err(|e| StoreError::new(StoreErrorKind::Other, e))?;
        let pool = PgPoolOptions::new()
            .max_connections(self.max_connections)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(connect_error)?;
        self.build(pool)
            .map_err(|e| StoreError::new(StoreErrorKind::Other, e))
    }
}

/// A failed first connect: a TLS failure (a certificate not trusted, a server without TLS
/// under `sslmode=require`) or a refused login is a configuration to fix, not an outage to
/// wait out; anything else (a server down, a timeout) is `Unavailable`.
fn connect_error(e: sqlx::Error) -> StoreError {
    let refused_login = matches!(
        &e,
        sqlx::Error::Database(db) if db.code().is_some_and(|c| LOGIN_REFUSED.contains(&c.as_ref()))
    );
    match e {
        sqlx::Error::Tls(_) | sqlx::Error::Configuration(_) => {
            StoreError::new(StoreErrorKind::Other, e)
        }
        // rustls' handshake errors (`InvalidCertificate(UnknownIssuer)`, a name mismatch)
        // come as I/O errors of invalid data: a peer that answered, wrongly.
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => {
            StoreError::new(StoreErrorKind::Other, sqlx::Error::Io(io))
        }
        _ if refused_login => StoreError::new(StoreErrorKind::Other, e),
        e => StoreError::unavailable(e),
    }
}

/// SQLSTATEs of a refused login: `28000` (no such role or `pg_hba.conf` entry), `28P01`
/// (wrong password), `3D000` (no such database).
const LOGIN_REFUSED: [&str; 3] = ["28000", "28P01", "3D000"];
