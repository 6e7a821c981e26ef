//! `MySqlStore`: the [`Store`] on a MySQL or MariaDB table.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, FencingToken, Ownership, RawStore, Record, StorageKey,
    Store, StoreError, StoreErrorKind,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{Executor as _, Row as _};

use crate::row::{columns, map_err, read_record};
use crate::sql::Statements;
use idemkit_coalesce::Entry;
use idemkit_sql::guess::{Guess, Guesser};
use idemkit_sql::row::Columns;

/// The store on a MySQL 8 or MariaDB 10.11 table (InnoDB): one `INSERT ... ON DUPLICATE KEY
/// UPDATE` reserves, one owner-checked `UPDATE` completes, fencing tokens from the server's
/// clock, expiry by the server's clock. Waiters re-read the row (MySQL has no
/// notifications): at most every [`recheck`](MySqlStoreBuilder::recheck), and at the
/// lease's end.
///
/// Create the table once with [`migrate`](MySqlStore::migrate). Expired rows are ignored by
/// every call and removed by [`purge_expired`](MySqlStore::purge_expired).
///
/// # Example
///
/// ```no_run
/// use idemkit_core::{Coordinator, Key, Operation};
/// use idemkit_mysql::MySqlStore;
///
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MySqlStore::connect("mysql://root@127.0.0.1:3306/test").await?;
/// store.migrate().await?;
/// let c = Coordinator::new(store);
/// let (op, key) = (Operation::new("mail.invoice")?, Key::new("order-9")?);
/// let sent = c.call(&op, &key).run(|_| async { Ok::<_, std::io::Error>("em_1".to_string()) }).await?;
/// assert_eq!(sent.value, "em_1");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pool: MySqlPool,
    pub(crate) table: String,
    pub(crate) sql: Statements,
    recheck: Duration,
    /// What recent `begin`s met: after a run of replays, `begin` reads first.
    pub(crate) guess: Guesser,
    /// The queues of concurrent `begin`s and `complete`s, when coalescing is on (see
    /// batch.rs).
    pub(crate) lanes: Option<crate::batch::Lanes>,
    /// MariaDB or MySQL, asked once by the first batch (its statement's lock-wait bound is
    /// written in each server's syntax).
    pub(crate) flavor: tokio::sync::OnceCell<crate::batch::Flavor>,
}

/// A table name the store refuses: 1 to 48 of `a-z`, `0-9` and `_`, not starting with a
/// digit (the fencing table adds `_fencing`, within MySQL's 64).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameError {
    name: String,
}

impl std::fmt::Display for NameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid table name {:?}: use 1 to 48 of a-z, 0-9 and _, not starting with a digit",
            self.name
        )
    }
}

impl std::error::Error for NameError {}

pub(crate) fn check_name(name: &str) -> Result<(), NameError> {
    let ok = (1..=48).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(NameError { name: name.into() })
    }
}

/// Builds a [`MySqlStore`]: the table, the waiters' re-check, the pool
/// [`connect`](MySqlStoreBuilder::connect) opens.
///
/// # Example
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let store = idemkit_mysql::MySqlStore::builder()
///     .table("idempotency")
///     .recheck(Duration::from_millis(100))
///     .build(pool)?;
/// store.migrate().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MySqlStoreBuilder {
    table: String,
    recheck: Duration,
    max_connections: u32,
    coalesce: bool,
}

impl Default for MySqlStoreBuilder {
    fn default() -> Self {
        MySqlStoreBuilder {
            table: "idemkit_records".into(),
            recheck: Duration::from_millis(200),
            max_connections: 10,
            coalesce: true,
        }
    }
}

impl MySqlStoreBuilder {
    /// The table (default `idemkit_records`), in the connection's database; checked by
    /// [`build`](Self::build) and [`connect`](Self::connect).
    ///
    /// # Example
    ///
    /// ```
    /// let b = idemkit_mysql::MySqlStore::builder().table("keys");
    /// # drop(b);
    /// ```
    pub fn table(mut self, table: &str) -> Self {
        table.clone_into(&mut self.table);
        self
    }

    /// How often a waiter re-reads the row it waits on (default 200 ms, at least 5 ms):
    /// MySQL has no notifications, so this bounds how late a waiter learns of a completion.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = idemkit_mysql::MySqlStore::builder().recheck(Duration::from_millis(50));
    /// # drop(b);
    /// ```
    pub fn recheck(mut self, every: Duration) -> Self {
        self.recheck = every.max(Duration::from_millis(5));
        self
    }

    /// The size of the pool [`connect`](Self::connect) opens (default 10, at least 1).
    ///
    /// # Example
    ///
    /// ```
    /// let b = idemkit_mysql::MySqlStore::builder().max_connections(16);
    /// # drop(b);
    /// ```
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Whether concurrent `begin`s and `complete`s are coalesced (default on): while two of a
    /// kind are running, later ones queue and go out together when one answers, a batch of
    /// `begin`s as one multi-row statement and one read, a batch of `complete`s as one
    /// multi-row owner-checked `UPDATE` (one statement and one commit for many keys). A
    /// call to an idle store goes alone, as with coalescing off: nothing waits at
    /// concurrency 1. A batch reserves absent keys only; every other key (a live row, a
    /// completed record, an expired row to take over) is sent again alone, where the single
    /// statement decides; a batch of completions that did not complete every row sends each
    /// alone. Off sends every call alone (for comparison; ARCHITECTURE row M12).
    ///
    /// # Example
    ///
    /// ```
    /// let b = idemkit_mysql::MySqlStore::builder().coalesce(false);
    /// # drop(b);
    /// ```
    pub fn coalesce(mut self, on: bool) -> Self {
        self.coalesce = on;
        self
    }

    /// The store on `pool`.
    ///
    /// # Errors
    ///
    /// [`NameError`] if the table name is refused.
    ///
    /// # Example
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let pool = sqlx::MySqlPool::connect_lazy("mysql://root@localhost/test")?;
    /// assert!(idemkit_mysql::MySqlStore::builder().table("Keys").build(pool).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build(self, pool: MySqlPool) -> Result<MySqlStore, NameError> {
        check_name(&self.table)?;
        Ok(MySqlStore {
            inner: Arc::new(Inner {
                sql: Statements::new(&self.table),
                pool,
                table: self.table,
                recheck: self.recheck,
                guess: Guesser::default(),
                lanes: self
                    .coalesce
                    .then(|| crate::batch::Lanes::new(crate::batch::LIMITS)),
                flavor: tokio::sync::OnceCell::new(),
            }),
        })
    }

    /// Checks the name, then connects a pool to `url` (without sqlx's ping before each use)
    /// and builds the store on it.
    ///
    /// # Errors
    ///
    /// [`StoreError`]: `Other` if the name or the URL is refused, TLS fails (a certificate
    /// not trusted, a server without TLS under `ssl-mode=REQUIRED`) or the login is refused;
    /// `Unavailable` if the server cannot be reached.
    ///
    /// # TLS
    ///
    /// The URL's `ssl-mode` decides: `DISABLED`; `PREFERRED` (the default: TLS when the
    /// server offers it, else plain text); `REQUIRED` (TLS, the certificate not checked);
    /// `VERIFY_CA` (TLS, the certificate signed by `ssl-ca` or, without it, by a root of the
    /// system's store); `VERIFY_IDENTITY` (as `VERIFY_CA`, and the host name is the
    /// certificate's). `ssl-cert` and `ssl-key` give a client certificate. A managed MySQL:
    /// `mysql://app:secret@db.example.com/app?ssl-mode=VERIFY_IDENTITY&ssl-ca=/etc/idemkit/db-ca.pem`.
    ///
    /// # Example
    ///
    /// See [`MySqlStore`].
    pub async fn connect(self, url: &str) -> Result<MySqlStore, StoreError> {
        check_name(&self.table).map_err(|e| StoreError::new(StoreErrorKind::Other, e))?;
        let options: MySqlConnectOptions = url
            .parse()
            .map_err(|e| StoreError::new(StoreErrorKind::Other, e))?;
        let pool = MySqlPoolOptions::new()
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

impl MySqlStore {
    /// A builder for another table or pool.
    ///
    /// # Example
    ///
    /// See [`MySqlStoreBuilder`].
    pub fn builder() -> MySqlStoreBuilder {
        MySqlStoreBuilder::default()
    }

    /// Connects a pool of 10 connections to `url` and builds the store on
    /// `idemkit_records`.
    ///
    /// # Errors
    ///
    /// As [`MySqlStoreBuilder::connect`].
    ///
    /// # Example
    ///
    /// See [`MySqlStore`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        MySqlStoreBuilder::default().connect(url).await
    }

    /// The pool the store uses.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f(store: idemkit_mysql::MySqlStore) -> Result<(), sqlx::Error> {
    /// let tx = store.pool().begin().await?;
    /// # drop(tx); Ok(()) }
    /// ```
    pub fn pool(&self) -> &MySqlPool {
        &self.inner.pool
    }

    /// Creates the table and its fencing table if they do not exist. Idempotent, and safe to
    /// run from every replica at once. Until it has run, every call fails with a `Rejected`
    /// error that names it.
    ///
    /// # Errors
    ///
    /// [`StoreError`] if the database refuses or cannot be reached.
    ///
    /// # Example
    ///
    /// See [`MySqlStore`].
    pub async fn migrate(&self) -> Result<(), StoreError> {
        for statement in &self.inner.sql.create {
            self.inner
                .pool
                .execute(statement.as_str())
                .await
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Deletes up to `batch` expired rows per statement, oldest first, until none are left;
    /// returns how many.
    ///
    /// Each batch is three short statements: the batch's keys and tokens read without a
    /// lock, the fencing high-water mark raised to the batch's largest token, and the
    /// batch deleted by key (a row reserved again meanwhile is kept). No lock is held across
    /// a scan: a reservation waits at most for one row's update of the mark, and a backlog
    /// costs time linear in its size.
    ///
    /// # Errors
    ///
    /// [`StoreError`] if the database cannot be reached.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f(store: idemkit_mysql::MySqlStore) -> Result<(), idemkit_core::StoreError> {
    /// let removed = store.purge_expired(1000).await?;
    /// # let _ = removed; Ok(()) }
    /// ```
    pub async fn purge_expired(&self, batch: u32) -> Result<u64, StoreError> {
        let batch = batch.max(1);
        let sql = &self.inner.sql;
        let mut total = 0;
        loop {
            let rows: Vec<(Vec<u8>, i64)> = sqlx::query_as(&sql.expired_batch)
                .bind(batch)
                .fetch_all(&self.inner.pool)
                .await
                .map_err(|e| self.err(e))?;
            let Some(mark) = rows.iter().map(|(_, fencing)| *fencing).max() else {
                return Ok(total);
            };
            sqlx::query(&sql.advance_fencing)
                .bind(mark)
                .execute(&self.inner.pool)
                .await
                .map_err(|e| self.err(e))?;
            // Not kept as a prepared statement: its text varies with the batch's size.
            let delete = format!(
                "{}({})",
                sql.purge_expired,
                vec!["?"; rows.len()].join(", ")
            );
            let mut q = sqlx::query(&delete).persistent(false).bind(mark);
            for (key, _) in &rows {
                q = q.bind(key.as_slice());
            }
            total += q
                .execute(&self.inner.pool)
                .await
                .map_err(|e| self.err(e))?
                .rows_affected();
            if rows.len() < batch as usize {
                return Ok(total);
            }
        }
    }

    pub(crate) fn err(&self, e: sqlx::Error) -> StoreError {
        map_err(e, &self.inner.table, "MySqlStore::migrate()")
    }

    /// The claim a live row read by `read` stands for.
    fn claim_of(
        &self,
        req: &BeginRequest<'_>,
        row: &sqlx::mysql::MySqlRow,
    ) -> Result<Claim, StoreError> {
        let get = |e| self.err(e);
        let left_us: i64 = row.try_get(7).map_err(get)?;
        let held_us: i64 = row.try_get(8).map_err(get)?;
        let checked = columns(row, 0).map_err(get)?.check(req.key)?;
        let block: Option<Vec<u8>> = row.try_get(9).map_err(get)?;
        let holder = idemkit_sql::row::holder(block.as_deref(), req.key)?;
        Ok(checked.claim(req, duration_us(left_us), duration_us(held_us), holder))
    }
}

fn owner_bytes(o: &Ownership) -> [u8; 16] {
    o.owner.as_u128().to_be_bytes()
}

pub(crate) fn fencing_i64(f: FencingToken) -> i64 {
    // A larger token cannot match any row.
    i64::try_from(f.get()).unwrap_or(-1)
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn duration_us(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// The largest fencing token the store keeps: `begin` answers twice the token (plus the
/// takeover bit) in `LAST_INSERT_ID`, a signed 64-bit integer.
const MAX_TOKEN: u64 = (1 << 62) - 1;

/// How many times `begin` is sent again when the live row it met was gone before it was read.
const BEGIN_ATTEMPTS: usize = 8;

impl Store for MySqlStore {
    fn max_ttl(&self) -> Duration {
        idemkit_core::Policy::MAX_DURATION
    }

    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Claim, StoreError> {
        let claim = match self.begin_queued(req).await? {
            Some(claim) => claim,
            None => self.begin_once(req).await?,
        };
        self.inner.guess.saw(&claim);
        Ok(claim)
    }

    async fn renew(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(&self.inner.sql.renew)
            .bind(micros(lease))
            .bind(key.as_str())
            .bind(&owner_bytes(ownership)[..])
            .bind(fencing_i64(ownership.fencing))
            .execute(&self.inner.pool)
            .await
            .map_err(|e| self.err(e))?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        self.completed_by(key, ownership).await
    }

    async fn complete(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> Result<(), StoreError> {
        if self.inner.lanes.is_some() {
            let answer =
                match idemkit_coalesce::queue(&crate::batch::Batches(self.clone()), |reply| {
                    crate::batch::CompleteJob::new(key, ownership, request, reply)
                }) {
                    Entry::Alone(_lead) => {
                        return self.complete_alone(key, ownership, request).await;
                    }
                    Entry::Queued(answer) => answer,
                };
            if let idemkit_coalesce::Reply::Done(()) = idemkit_coalesce::answer(answer).await? {
                return Ok(());
            }
        }
        self.complete_alone(key, ownership, request).await
    }

    async fn release(&self, key: &StorageKey, ownership: &Ownership) -> Result<(), StoreError> {
        let done = sqlx::query(&self.inner.sql.release)
            .bind(key.as_str())
            .bind(&owner_bytes(ownership)[..])
            .bind(fencing_i64(ownership.fencing))
            .execute(&self.inner.pool)
            .await
            .map_err(|e| self.err(e))?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StoreError::lease_lost())
        }
    }

    async fn wait(
        &self,
        key: &StorageKey,
        seen: FencingToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        // No push: the row is read again every `recheck` (and at the lease's end) until it is
        // no longer the reservation seen, or `timeout` has passed.
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let left: Option<i64> = sqlx::query(&self.inner.sql.wait)
                .bind(key.as_str())
                .bind(fencing_i64(seen))
                .fetch_optional(&self.inner.pool)
                .await
                .and_then(|row| row.map(|r| r.try_get(0)).transpose())
                .map_err(|e| self.err(e))?;
            let Some(left) = left else {
                // Completed, released, expired or taken over.
                return Ok(());
            };
            let now = tokio::time::Instant::now();
            if now >= until {
                return Ok(());
            }
            let nap = (until - now).min(duration_us(left)).min(self.inner.recheck);
            tokio::time::sleep(nap).await;
        }
    }

    async fn get(&self, key: &StorageKey) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(&self.inner.sql.get)
            .bind(key.as_str())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| self.err(e))?;
        let Some(row) = row else { return Ok(None) };
        let record = read_record(&row, 0, key).map_err(|e| self.err(e))??;
        Ok(Some(record))
    }
}

impl MySqlStore {
    /// Deletes rows in one transaction with raising the high-water mark of fencing tokens to
    /// theirs (`keep`, bound to `key` if given): a key deleted keeps its tokens increasing.
    /// Returns how many rows `delete` removed.
    pub(crate) async fn keeping_tokens<'q>(
        &'q self,
        keep: &'q str,
        key: Option<&'q str>,
        delete: impl FnOnce(()) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>,
    ) -> Result<u64, StoreError> {
        let mut tx = self.inner.pool.begin().await.map_err(|e| self.err(e))?;
        let q = sqlx::query(keep);
        let q = match key {
            Some(k) => q.bind(k),
            None => q,
        };
        q.execute(&mut *tx).await.map_err(|e| self.err(e))?;
        let n = delete(())
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected();
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(n)
    }

    /// The owner-checked `UPDATE`, then, if it completed nothing, whether this very lease
    /// completed the row already (a retried completion, whose first reply was lost, or a
    /// batch that completed it and was answered alone): that is success.
    async fn complete_alone(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> Result<(), StoreError> {
        let mut conn = self.inner.pool.acquire().await.map_err(|e| self.err(e))?;
        self.complete_on(&mut conn, key, ownership, request).await
    }

    /// `begin`: the upsert, which reserves an absent or expired key in one statement, then a
    /// read of the live row it met; or, after a run of replays (`Guesser`), the read first,
    /// so that a replay is one statement, then the upsert if the key had no live row.
    pub(crate) async fn begin_once(&self, req: &BeginRequest<'_>) -> Result<Claim, StoreError> {
        let owner = req.owner.as_u128().to_be_bytes();
        let fingerprint = req.fingerprint.map(|f| f.to_bytes());
        let lease_ms = u64::try_from(req.lease.as_millis()).unwrap_or(u64::MAX);
        let holder = req.holder.map(|h| h.block(lease_ms));
        let mut read_first = self.inner.guess.guess() == Guess::Live;
        for _ in 0..BEGIN_ATTEMPTS {
            if !read_first {
                let done = sqlx::query(&self.inner.sql.begin)
                    .bind(req.key.as_str())
                    .bind(&owner[..])
                    .bind(fingerprint.as_ref().map(|f| &f[..]))
                    .bind(micros(req.lease))
                    .bind(holder.as_deref())
                    .execute(&self.inner.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                let answer = done.last_insert_id();
                if answer != 0 {
                    return Ok(Claim::Reserved {
                        ownership: Ownership::new(req.owner, FencingToken::new(answer >> 1)),
                        took_over: answer & 1 == 1,
                    });
                }
            }
            read_first = false;
            // A live row (the upsert met one, or the guess expects one): read it.
            let row = sqlx::query(&self.inner.sql.read)
                .bind(req.key.as_str())
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| self.err(e))?;
            let Some(row) = row else {
                // None, or it ended between the two statements: reserve.
                continue;
            };
            let claim = self.claim_of(req, &row)?;
            if let Claim::Reserved { ownership, .. } = &claim {
                // The caller's own reservation, asked for again: a `begin` is a renewal.
                match self.renew(req.key, ownership, req.lease).await {
                    Ok(()) => {}
                    Err(e) if e.is_lease_lost() => continue,
                    Err(e) => return Err(e),
                }
            }
            return Ok(claim);
        }
        Err(StoreError::unavailable(format!(
            "begin met a row that ended before it was read {BEGIN_ATTEMPTS} times in a row"
        )))
    }

    /// A completion on `conn` (the caller's transaction): the owner-checked `UPDATE`, then,
    /// if it found no reservation of this lease, whether this lease completed it already.
    pub(crate) async fn complete_on(
        &self,
        conn: &mut sqlx::MySqlConnection,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> Result<(), StoreError> {
        let done = self
            .complete_query(key, ownership, request)
            .execute(&mut *conn)
            .await
            .map_err(|e| self.err(e))?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        self.completed_by_on(&mut *conn, key, ownership).await
    }

    fn complete_query<'q>(
        &'q self,
        key: &'q StorageKey,
        ownership: &Ownership,
        request: &'q CompleteRequest,
    ) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
        sqlx::query(&self.inner.sql.complete)
            .bind(i16::from(request.kind.to_byte()))
            .bind(&request.bytes[..])
            .bind(micros(request.ttl))
            .bind(key.as_str())
            .bind(owner_bytes(ownership).to_vec())
            .bind(fencing_i64(ownership.fencing))
    }

    /// Whether this very lease completed the row (a retried completion, a renewal that
    /// crossed the completion): success; otherwise the lease is lost.
    async fn completed_by(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
    ) -> Result<(), StoreError> {
        let mut conn = self.inner.pool.acquire().await.map_err(|e| self.err(e))?;
        self.completed_by_on(&mut conn, key, ownership).await
    }

    async fn completed_by_on(
        &self,
        conn: &mut sqlx::MySqlConnection,
        key: &StorageKey,
        ownership: &Ownership,
    ) -> Result<(), StoreError> {
        let found = sqlx::query(&self.inner.sql.completed_by)
            .bind(key.as_str())
            .bind(&owner_bytes(ownership)[..])
            .bind(fencing_i64(ownership.fencing))
            .fetch_optional(conn)
            .await
            .map_err(|e| self.err(e))?;
        match found {
            Some(_) => Ok(()),
            None => Err(StoreError::lease_lost()),
        }
    }
}

/// Raw access. A row has columns: `put_raw` of bytes that decode as an idemkit [`Record`]
/// writes its fields; anything else is kept as an unreadable row (version 0, the bytes in
/// `result`) that every call reports as `Corrupt` until it expires or is purged.
impl RawStore for MySqlStore {
    async fn put_raw(
        &self,
        key: &StorageKey,
        bytes: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let written = Columns::written(&bytes);
        if let Some(fencing) = written.fencing {
            if fencing.get() > MAX_TOKEN {
                return Err(StoreError::new(
                    StoreErrorKind::Rejected,
                    format!(
                        "fencing token {} is above {MAX_TOKEN}, the largest this store keeps \
                         (its begin answers a token times two in a signed 64-bit integer)",
                        fencing.get()
                    ),
                ));
            }
            // Later reservations' tokens stay above anything written by hand.
            sqlx::query(&self.inner.sql.advance_fencing)
                .bind(fencing_i64(fencing))
                .execute(&self.inner.pool)
                .await
                .map_err(|e| self.err(e))?;
        }
        let c = written.columns;
        let q = sqlx::query(&self.inner.sql.put_raw)
            .bind(key.as_str())
            .bind(c.version)
            .bind(c.state)
            .bind(c.owner)
            .bind(c.fencing)
            .bind(c.fingerprint)
            .bind(micros(ttl))
            .bind(c.kind)
            .bind(c.result)
            .bind(written.holder);
        q.execute(&self.inner.pool).await.map_err(|e| self.err(e))?;
        Ok(())
    }

    async fn purge(&self, key: &StorageKey) -> Result<bool, StoreError> {
        let n = self
            .keeping_tokens(&self.inner.sql.keep_token, Some(key.as_str()), |_| {
                sqlx::query(&self.inner.sql.purge).bind(key.as_str())
            })
            .await?;
        Ok(n > 0)
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

/// SQLSTATEs of a refused login: `28000` (access denied), `42000` (no such database,
/// `ER_BAD_DB_ERROR` 1049).
const LOGIN_REFUSED: [&str; 2] = ["28000", "42000"];
