//! `PgStore`: the [`Store`] on a PostgreSQL table.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, FencingToken, Ownership, RawStore, Record, StorageKey,
    Store, StoreError,
};
use sqlx::{PgConnection, PgPool, Row as _};

use idemkit_sql::row::Columns;

use crate::batch::{Batches, BeginJob, CompleteJob, Lanes};
use crate::builder::PgStoreBuilder;
use crate::errors::{map_err, read_record};
use crate::names::Table;
use crate::sql::Statements;
use crate::wake::{Listener, Waiters};
use idemkit_coalesce::{Entry, Reply};
use idemkit_sql::guess::{Guess, Guesser};

/// The migration call the "table is missing" error names.
const MIGRATE: &str = "PgStore::migrate()";

/// The store on a PostgreSQL table: one statement per phase, fencing tokens from one
/// sequence, expiry by the database's clock, push wake-ups through `LISTEN`/`NOTIFY`.
///
/// Create the table once with [`migrate`](PgStore::migrate) (at start-up; it is idempotent and
/// safe to run from every replica at once). Expired rows are ignored by every call and
/// removed by [`purge_expired`](PgStore::purge_expired), which you schedule, or by the
/// background task of [`spawn_purger`](PgStore::spawn_purger).
///
/// # Example
///
/// ```no_run
/// use idemkit_core::{Coordinator, Key, Operation};
/// use idemkit_postgres::PgStore;
///
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PgStore::connect("postgres://postgres@127.0.0.1/test").await?;
/// store.migrate().await?;
/// let c = Coordinator::new(store);
/// let (op, key) = (Operation::new("mail.invoice")?, Key::new("order-9")?);
/// let sent = c.call(&op, &key).run(|_| async { Ok::<_, std::io::Error>("em_1".to_string()) }).await?;
/// assert_eq!(sent.value, "em_1");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgStore {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pool: PgPool,
    pub(crate) table: Table,
    pub(crate) sql: Statements,
    waiters: Arc<Waiters>,
    listener: Listener,
    recheck: Duration,
    /// Which `begin` statement recent calls suggest (see `Guesser`).
    guess: Guesser,
    /// The queues of concurrent calls, when coalescing is on (see coalesce.rs).
    pub(crate) lanes: Option<Lanes>,
}

impl PgStore {
    /// The store on `pool`, in the table `public.idemkit_records`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), sqlx::Error> {
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/test").await?;
    /// let store = idemkit_postgres::PgStore::new(pool);
    /// # drop(store); Ok(()) }
    /// ```
    pub fn new(pool: PgPool) -> Self {
        let defaults = PgStoreBuilder::default();
        // The default names are valid names: nothing to check.
        let table = Table {
            schema: defaults.schema,
            name: defaults.table,
        };
        PgStore::assemble(pool, table, defaults.recheck, defaults.coalesce)
    }

    /// The store on `pool`, in `table` (checked).
    pub(crate) fn assemble(pool: PgPool, table: Table, recheck: Duration, coalesce: bool) -> Self {
        PgStore {
            inner: Arc::new(Inner {
                sql: Statements::new(&table),
                pool,
                table,
                waiters: Arc::default(),
                listener: Listener::default(),
                recheck,
                guess: Guesser::default(),
                lanes: coalesce.then(|| Lanes::new(crate::batch::LIMITS)),
            }),
        }
    }

    /// A builder for another schema or table.
    ///
    /// # Example
    ///
    /// See [`PgStoreBuilder`].
    pub fn builder() -> PgStoreBuilder {
        PgStoreBuilder::default()
    }

    /// Connects a pool of 10 connections to `url` and builds the store on
    /// `public.idemkit_records`.
    ///
    /// # Errors
    ///
    /// [`StoreError`]: `Other` if the URL is invalid, `Unavailable` if the server cannot be
    /// reached.
    ///
    /// # Example
    ///
    /// See [`PgStore`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        PgStoreBuilder::default().connect(url).await
    }

    /// The pool the store uses.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f(store: idemkit_postgres::PgStore) -> Result<(), sqlx::Error> {
    /// let tx = store.pool().begin().await?;
    /// # drop(tx); Ok(()) }
    /// ```
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// `schema.table`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # fn f(store: idemkit_postgres::PgStore) {
    /// assert_eq!(store.table(), "public.idemkit_records");
    /// # }
    /// ```
    pub fn table(&self) -> String {
        self.inner.table.to_string()
    }

    /// Creates the schema, table, index and fencing sequence if they do not exist, from the
    /// SQL files embedded in this crate (`migrations/records/`), and records what it applied
    /// in `<schema>.idemkit_migrations`. Idempotent; concurrent calls queue on an advisory
    /// lock. Until it has run, every call fails with a `Rejected` error that names it.
    ///
    /// # Errors
    ///
    /// [`StoreError`] if the database refuses (no right to create) or cannot be reached.
    ///
    /// # Example
    ///
    /// See [`PgStore`].
    pub async fn migrate(&self) -> Result<(), StoreError> {
        crate::migrate::apply(&self.inner.pool, &self.inner.table, crate::migrate::RECORDS)
            .await
            .map_err(|e| self.err(e))
    }

    /// Deletes up to `batch` rows whose lease or retention has ended, oldest first, per
    /// statement, until none are left; returns how many. Rows a concurrent call holds are
    /// skipped (`SKIP LOCKED`), so this never waits on an owner. Schedule it (say, hourly),
    /// or use [`spawn_purger`](PgStore::spawn_purger).
    ///
    /// # Errors
    ///
    /// [`StoreError`] if the database cannot be reached; rows deleted by earlier statements
    /// stay deleted.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f(store: idemkit_postgres::PgStore) -> Result<(), idemkit_core::StoreError> {
    /// let removed = store.purge_expired(1000).await?;
    /// println!("purged {removed} expired records");
    /// # Ok(()) }
    /// ```
    pub async fn purge_expired(&self, batch: u32) -> Result<u64, StoreError> {
        purge_in_batches(&self.inner.pool, &self.inner.sql.purge_expired, batch)
            .await
            .map_err(|e| self.err(e))
    }

    /// Runs [`purge_expired`](PgStore::purge_expired) every `every` in a background task
    /// until the returned handle is dropped. Failures are logged and retried next time.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f(store: idemkit_postgres::PgStore) {
    /// # use std::time::Duration;
    /// let _purger = store.spawn_purger(Duration::from_secs(3600), 1000);
    /// // ... the service runs; dropping `_purger` stops it.
    /// # }
    /// ```
    pub fn spawn_purger(&self, every: Duration, batch: u32) -> Purger {
        let store = self.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match store.purge_expired(batch).await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(table = %store.inner.table, purged = n, "purged expired idemkit records")
                    }
                    Err(e) => {
                        tracing::warn!(table = %store.inner.table, error = %e, "purging expired idemkit records failed; retrying at the next tick")
                    }
                }
            }
        });
        Purger { task }
    }

    /// How many keys have a waiter of this store registered (a diagnostic: a finished or
    /// cancelled wait leaves none behind).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # fn f(store: idemkit_postgres::PgStore) {
    /// assert_eq!(store.waiting_keys(), 0);
    /// # }
    /// ```
    pub fn waiting_keys(&self) -> usize {
        self.inner.waiters.len()
    }

    pub(crate) fn err(&self, e: sqlx::Error) -> StoreError {
        map_err(e, &self.inner.table, MIGRATE)
    }

    /// Completes on `conn`: the pool's for [`Store::complete`], the caller's transaction for
    /// the transactional call.
    pub(crate) async fn complete_on(
        &self,
        conn: &mut PgConnection,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> Result<(), StoreError> {
        let waiting: Option<bool> = sqlx::query(&self.inner.sql.complete)
            .bind(key.as_str())
            .bind(owner_bytes(ownership))
            .bind(fencing_i64(ownership.fencing))
            .bind(i16::from(request.kind.to_byte()))
            .bind(&request.bytes[..])
            .bind(micros(request.ttl))
            .fetch_optional(&mut *conn)
            .await
            .and_then(|row| row.map(|row| row.try_get(0)).transpose())
            .map_err(|e| self.err(e))?;
        let waiting = match waiting {
            Some(waiting) => waiting,
            // Not ours to complete now, unless this very lease completed it already (a
            // retried completion, whose first reply was lost): that is success, and its
            // waiters are woken again (the first try may have stopped before its NOTIFY).
            None => sqlx::query(&self.inner.sql.completed_by)
                .bind(key.as_str())
                .bind(&owner_bytes(ownership)[..])
                .bind(fencing_i64(ownership.fencing))
                .fetch_optional(&mut *conn)
                .await
                .and_then(|row| row.map(|row| row.try_get::<bool, _>(0)).transpose())
                .map_err(|e| self.err(e))?
                .ok_or_else(StoreError::lease_lost)?,
        };
        if waiting {
            // A waiter flagged the row: wake it (a statement of its own, needed only then).
            sqlx::query(&self.inner.sql.notify)
                .bind(key.as_str())
                .execute(&mut *conn)
                .await
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }
}

/// The background purge of [`PgStore::spawn_purger`]; dropping it stops the task.
#[derive(Debug)]
pub struct Purger {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Purger {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) async fn purge_in_batches(
    pool: &PgPool,
    statement: &str,
    batch: u32,
) -> Result<u64, sqlx::Error> {
    let batch = i64::from(batch.max(1));
    let mut total = 0u64;
    loop {
        let n: i64 = sqlx::query(statement)
            .bind(batch)
            .fetch_one(pool)
            .await?
            .try_get(0)?;
        total += n as u64;
        if n < batch {
            return Ok(total);
        }
    }
}

fn owner_bytes(o: &Ownership) -> [u8; 16] {
    o.owner.as_u128().to_be_bytes()
}

fn fencing_i64(f: FencingToken) -> i64 {
    // Our tokens come from a bigint sequence; a larger one cannot match any row.
    i64::try_from(f.get()).unwrap_or(-1)
}

/// Microseconds, the database's resolution (the coordinator clamps durations to
/// `max_ttl`, so this never saturates in practice).
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn duration_us(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// How many times `begin` is sent again when its row was committed after the statement's
/// snapshot (see sql.rs); each retry takes a new snapshot, so one suffices in practice.
const BEGIN_ATTEMPTS: usize = 8;

impl PgStore {
    /// The claim a `begin` row stands for; its columns start at `at` (0 for `begin`, 1 for
    /// `begin_many`, whose first column is the key).
    fn claim_of(
        &self,
        req: &BeginRequest<'_>,
        row: &sqlx::postgres::PgRow,
        at: usize,
    ) -> Result<Claim, StoreError> {
        let get = |e| self.err(e);
        let mine: bool = row.try_get(at).map_err(get)?;
        let fencing: i64 = row.try_get(at + 4).map_err(get)?;
        if mine {
            return Ok(Claim::Reserved {
                ownership: Ownership::new(req.owner, FencingToken::new(fencing as u64)),
                took_over: row.try_get(at + 10).map_err(get)?,
            });
        }
        let left_us: i64 = row.try_get(at + 8).map_err(get)?;
        let held_us: i64 = row.try_get(at + 9).map_err(get)?;
        // The row's columns start after `mine` (the first column of `begin`'s shape).
        let checked = crate::errors::columns(row, at + 1)
            .map_err(get)?
            .check(req.key)?;
        let block: Option<Vec<u8>> = row.try_get(at + 11).map_err(get)?;
        let holder = idemkit_sql::row::holder(block.as_deref(), req.key)?;
        Ok(checked.claim(req, duration_us(left_us), duration_us(held_us), holder))
    }
}

impl Store for PgStore {
    fn max_ttl(&self) -> Duration {
        // 100 years: far within timestamptz (to year 294276) and exact in microseconds.
        idemkit_core::Policy::MAX_DURATION
    }

    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Claim, StoreError> {
        if self.inner.lanes.is_none() {
            return self.begin_alone(req).await;
        }
        let answer = match idemkit_coalesce::queue(&Batches(self.clone()), |reply| {
            BeginJob::new(req, reply)
        }) {
            Entry::Alone(_lead) => return self.begin_alone(req).await,
            Entry::Queued(answer) => answer,
        };
        let answer = idemkit_coalesce::answer(answer).await?;
        if let Reply::Done(row) = answer
            && let Some(claim) = self.settle(req, &row, 1).await?
        {
            return Ok(claim);
        }
        self.begin_alone(req).await
    }

    async fn complete(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> Result<(), StoreError> {
        if self.inner.lanes.is_some() {
            let answer = match idemkit_coalesce::queue(&Batches(self.clone()), |reply| {
                CompleteJob::new(key, ownership, request, reply)
            }) {
                Entry::Alone(_lead) => return self.complete_alone(key, ownership, request).await,
                Entry::Queued(answer) => answer,
            };
            match idemkit_coalesce::answer(answer).await? {
                Reply::Done(()) => return Ok(()),
                // Not completed by the batch: alone, it tells a retried completion from a
                // lost lease.
                Reply::Alone => {}
            }
        }
        self.complete_alone(key, ownership, request).await
    }

    async fn begin_many(&self, reqs: &[BeginRequest<'_>]) -> Vec<Result<Claim, StoreError>> {
        if reqs.len() < 2 {
            let mut claims = Vec::with_capacity(reqs.len());
            for req in reqs {
                claims.push(self.begin(req).await);
            }
            return claims;
        }
        let keys: Vec<&str> = reqs.iter().map(|r| r.key.as_str()).collect();
        let owners: Vec<[u8; 16]> = reqs
            .iter()
            .map(|r| r.owner.as_u128().to_be_bytes())
            .collect();
        let fingerprints: Vec<Option<[u8; 16]>> = reqs
            .iter()
            .map(|r| r.fingerprint.map(|f| f.to_bytes()))
            .collect();
        let holders: Vec<Option<Vec<u8>>> = reqs.iter().map(holder_block).collect();
        let rows = self
            .begin_many_rows(
                (0..reqs.len()).map(|i| crate::batch::BeginColumns {
                    key: keys[i],
                    owner: &owners[i],
                    lease_us: micros(reqs[i].lease),
                    fingerprint: fingerprints[i].as_ref().map(|f| &f[..]),
                    holder: holders[i].as_deref(),
                }),
                false,
            )
            .await;
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                let e = self.err(e);
                let copy = idemkit_coalesce::copies(&e);
                return reqs.iter().map(|_| Err(copy())).collect();
            }
        };
        let mut claims: Vec<Option<Result<Claim, StoreError>>> =
            reqs.iter().map(|_| None).collect();
        for row in &rows {
            let key: Result<String, _> = row.try_get(0);
            let Some(i) = key.ok().and_then(|k| keys.iter().position(|x| *x == k)) else {
                continue;
            };
            let claim = self.claim_of(&reqs[i], row, 1);
            let mine: bool = row.try_get(1).unwrap_or(true);
            // The caller's own reservation, asked for again: `begin` renews it (below).
            claims[i] = match claim {
                Ok(Claim::Reserved { .. }) if !mine => None,
                other => Some(other),
            };
        }
        let mut out = Vec::with_capacity(reqs.len());
        for (req, claim) in reqs.iter().zip(claims) {
            out.push(match claim {
                Some(c) => c,
                // The snapshot race, or the caller's own reservation to renew: this key
                // alone again.
                None => self.begin(req).await,
            });
        }
        out
    }

    async fn renew(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(&self.inner.sql.renew)
            .bind(key.as_str())
            .bind(&owner_bytes(ownership)[..])
            .bind(fencing_i64(ownership.fencing))
            .bind(micros(lease))
            .execute(&self.inner.pool)
            .await
            .map_err(|e| self.err(e))?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        // Completed by this very lease meanwhile (the renewal crossed the completion):
        // nothing to extend, nothing lost.
        let completed = sqlx::query(&self.inner.sql.completed_by)
            .bind(key.as_str())
            .bind(&owner_bytes(ownership)[..])
            .bind(fencing_i64(ownership.fencing))
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| self.err(e))?;
        match completed {
            Some(_) => Ok(()),
            None => Err(StoreError::lease_lost()),
        }
    }

    async fn release(&self, key: &StorageKey, ownership: &Ownership) -> Result<(), StoreError> {
        let deleted: i64 = sqlx::query(&self.inner.sql.release)
            .bind(key.as_str())
            .bind(&owner_bytes(ownership)[..])
            .bind(fencing_i64(ownership.fencing))
            .fetch_one(&self.inner.pool)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|e| self.err(e))?;
        if deleted == 1 {
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
        let inner = &self.inner;
        let listening = inner
            .listener
            .ensure(&inner.pool, &inner.sql.channel, &inner.waiters)
            .await;
        if let Err(e) = &listening {
            // No push: wait for the re-check (bounded) instead of failing the caller.
            tracing::warn!(error = %e, "idemkit-postgres: cannot LISTEN; waiting by re-check");
        }
        let registration = inner.waiters.register(key.as_str());
        let notified = registration.notify().notified();
        let mut notified = std::pin::pin!(notified);
        // Enabled before the row is flagged: a notification from here on is not missed.
        notified.as_mut().enable();
        let left: Option<i64> = sqlx::query(&inner.sql.wait)
            .bind(key.as_str())
            .bind(fencing_i64(seen))
            .fetch_optional(&inner.pool)
            .await
            .and_then(|row| row.map(|r| r.try_get(0)).transpose())
            .map_err(|e| self.err(e))?;
        let Some(left) = left else {
            // Already completed, released, expired or taken over.
            return Ok(());
        };
        // Expiry has no event to push: wake at the lease's end at the latest.
        let until = timeout.min(duration_us(left)).min(inner.recheck);
        let _ = tokio::time::timeout(until, notified).await;
        Ok(())
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

impl PgStore {
    /// `begin` sent on its own: the statement the guess picks, then `begin` if needed.
    async fn begin_alone(&self, req: &BeginRequest<'_>) -> Result<Claim, StoreError> {
        let owner = req.owner.as_u128().to_be_bytes();
        let fingerprint = req.fingerprint.map(|f| f.to_bytes());
        let holder = holder_block(req);
        // One statement for the case the recent calls say is likely, which answers it alone
        // at the cost of a plain read or insert; when it does not apply, `begin` after it.
        let guess = self.inner.guess.guess();
        let fast: Option<fn(&Statements) -> &String> = match guess {
            Guess::Live => Some(|sql| &sql.begin_read),
            Guess::Absent => Some(|sql| &sql.begin_insert),
            Guess::Either => None,
        };
        let send = |statement: fn(&Statements) -> &String| {
            sqlx::query(statement(&self.inner.sql))
                .bind(req.key.as_str())
                .bind(&owner[..])
                .bind(micros(req.lease))
                .bind(fingerprint.as_ref().map(|f| &f[..]))
                .bind(holder.as_deref())
                .fetch_optional(&self.inner.pool)
        };
        if let Some(statement) = fast
            && let Some(row) = send(statement).await.map_err(|e| self.err(e))?
            && let Some(claim) = self.settle(req, &row, 0).await?
        {
            return Ok(claim);
        }
        // Otherwise the guess was wrong (the key is absent or expired, or there): `begin`
        // decides, and its claim moves the next guess.
        for _ in 0..BEGIN_ATTEMPTS {
            let Some(row) = send(|sql| &sql.begin).await.map_err(|e| self.err(e))? else {
                continue;
            };
            if let Some(claim) = self.settle(req, &row, 0).await? {
                return Ok(claim);
            }
        }
        Err(StoreError::unavailable(format!(
            "begin found no row {BEGIN_ATTEMPTS} times in a row under contention"
        )))
    }

    /// The claim a `begin` row answers (its columns from `at`), noted by the guesser; the
    /// caller's own live reservation read back (a lost reply, a batch's claim confirmed
    /// late) is renewed, since a `begin` is a renewal (the `Store::begin` contract): rare, so
    /// a second statement rather than a costlier first one. `None`: that reservation ended
    /// between the two statements, and the caller reserves anew.
    async fn settle(
        &self,
        req: &BeginRequest<'_>,
        row: &sqlx::postgres::PgRow,
        at: usize,
    ) -> Result<Option<Claim>, StoreError> {
        let claim = self.claim_of(req, row, at)?;
        self.inner.guess.saw(&claim);
        if let Claim::Reserved { ownership, .. } = &claim
            && !row.try_get::<bool, _>(at).map_err(|e| self.err(e))?
        {
            return match self.renew(req.key, ownership, req.lease).await {
                Ok(()) => Ok(Some(claim)),
                Err(e) if e.is_lease_lost() => Ok(None),
                Err(e) => Err(e),
            };
        }
        Ok(Some(claim))
    }

    /// `complete` sent on its own, on a connection of the pool.
    async fn complete_alone(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> Result<(), StoreError> {
        let mut conn = self.inner.pool.acquire().await.map_err(|e| self.err(e))?;
        self.complete_on(&mut conn, key, ownership, request).await
    }
}

/// Raw access. A row has columns, not one byte string: `put_raw` of bytes that decode as an
/// idemkit [`Record`] writes its fields; anything else is kept as an unreadable row (version
/// 0, the bytes in `result`) that every call reports as `Corrupt` until it expires or is
/// purged, like foreign bytes under a Redis key.
impl RawStore for PgStore {
    async fn put_raw(
        &self,
        key: &StorageKey,
        bytes: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let written = Columns::written(&bytes);
        if let Some(fencing) = written.fencing {
            // Keep the fencing sequence above anything written by hand: tokens of later
            // reservations must still increase (as on every store).
            sqlx::query(&self.inner.sql.advance_fencing)
                .bind(fencing_i64(fencing))
                .fetch_optional(&self.inner.pool)
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
        let deleted: i64 = sqlx::query(&self.inner.sql.purge)
            .bind(key.as_str())
            .fetch_one(&self.inner.pool)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|e| self.err(e))?;
        Ok(deleted > 0)
    }
}

/// A `begin`'s holder column: the record format's holder block (the reserving process and
/// the lease), or `NULL` without a holder.
fn holder_block(req: &BeginRequest<'_>) -> Option<Vec<u8>> {
    let lease_ms = u64::try_from(req.lease.as_millis()).unwrap_or(u64::MAX);
    req.holder.map(|h| h.block(lease_ms))
}
