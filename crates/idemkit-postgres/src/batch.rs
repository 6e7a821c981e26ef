//! Coalescing concurrent `begin`s (and `complete`s) into one statement each; the queue is
//! `idemkit_coalesce`'s, the one coalescer of every store, and this is the store's side:
//! the queued calls and the statements a batch sends.
//!
//! A miss costs PostgreSQL two committed statements, and under load most of a statement's
//! cost is its own (parse, plan, the commit's WAL flush), not the key's. So while two
//! statements of one kind are running, a new call queues, and the queue goes out as one
//! statement (`begin_many`, `complete_many`: one commit for many keys). A call that finds a
//! place free and nobody queued is sent at once, on its own, as without coalescing: nothing
//! waits at concurrency 1.
//!
//! A batch holds each key once (a statement cannot reserve or complete one row twice); a
//! second call for a key waits for the next batch, so two concurrent duplicates are answered
//! as two calls one after the other. A queued call whose caller has gone (its future
//! dropped, say by a timeout) is dropped before it is sent, so nothing is reserved for
//! nobody. Rows are written in key order by both statements, as by every batch of this
//! store: two batches never wait on each other's rows in opposite orders. A batch
//! statement's lock waits are bounded (`BATCH_LOCK_TIMEOUT`, sql.rs): a locked row sends
//! the batch's calls alone, so only the locked key's own call waits for it.

use idemkit_coalesce::{Limits, Reply, copies};
use sqlx::Row as _;
use sqlx::postgres::PgRow;

use crate::store::PgStore;

/// How a lane batches. At most 64 keys a statement: one commit serves a whole burst of the
/// default pool's callers, and a longer queue goes out in several. At most 16 MiB of results
/// (review L1 of `e047556`): a batch's results go as one `bytea[]` parameter, a single datum,
/// which PostgreSQL caps at 1 GB, and one huge statement holds its connection and its
/// callers while it is sent; a call whose own result is over this goes in a batch of its
/// own. At most two statements of one kind running at once (a lone call or a batch each),
/// and two may go alone: one batch fills while the other runs, and `begin`s and `complete`s
/// together keep four of the pool's connections busy at most, leaving the rest to waits,
/// renewals and the caller's own transactions. Each key once, in key order.
pub(crate) const LIMITS: Limits = Limits::new(64, 2)
    .max_bytes(16 << 20)
    .alone(2)
    .each_key_once();

type Responder<T> = idemkit_coalesce::Responder<Reply<T>>;

/// The two lanes of one store (the jobs are `idemkit_sql`'s, shared with MySQL).
pub(crate) type Lanes = idemkit_sql::batch::Lanes<PgRow>;

/// A queued `begin`: answered with its row of `begin_many`.
pub(crate) type BeginJob = idemkit_sql::batch::BeginJob<PgRow>;

pub(crate) use idemkit_sql::batch::CompleteJob;

/// One key's parameters of `begin_many`.
pub(crate) struct BeginColumns<'a> {
    pub(crate) key: &'a str,
    pub(crate) owner: &'a [u8],
    pub(crate) lease_us: i64,
    pub(crate) fingerprint: Option<&'a [u8]>,
    pub(crate) holder: Option<&'a [u8]>,
}

pub(crate) use idemkit_sql::batch::Batches;

impl idemkit_sql::batch::Batching for PgStore {
    type Begun = PgRow;
    fn lanes(&self) -> Option<&Lanes> {
        self.inner.lanes.as_ref()
    }
    fn send_begins(&self, batch: Vec<BeginJob>) -> impl Future<Output = ()> + Send {
        self.begin_batch(batch)
    }
    fn send_completes(&self, batch: Vec<CompleteJob>) -> impl Future<Output = ()> + Send {
        self.complete_batch(batch)
    }
}

/// Whether a batch's failure is one a call sent on its own handles: a deadlock (two
/// batches met in different orders), a serialization failure, or a row lock held past the
/// batch's bound (`BATCH_LOCK_TIMEOUT`: only the locked key's own call waits for it).
fn retry_alone(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if matches!(db.code().as_deref(), Some("40P01" | "40001" | "55P03")))
}

impl PgStore {
    /// Answers each caller of a batch whose statement failed: `Alone` for a failure a
    /// single statement handles, else the typed error.
    fn failed<T>(&self, replies: impl Iterator<Item = Responder<T>>, e: sqlx::Error) {
        let alone = retry_alone(&e);
        idemkit_sql::batch::failed(replies, alone, self.err(e));
    }

    /// Sends `begin_many` for keys in the order given (`bounded`: a coalesced batch, whose
    /// lock waits are bounded); rows come back keyed.
    pub(crate) async fn begin_many_rows<'a>(
        &self,
        keys: impl Iterator<Item = BeginColumns<'a>>,
        bounded: bool,
    ) -> Result<Vec<PgRow>, sqlx::Error> {
        let (mut k, mut o, mut l, mut f, mut h) = (vec![], vec![], vec![], vec![], vec![]);
        for c in keys {
            k.push(c.key);
            o.push(c.owner);
            l.push(c.lease_us);
            f.push(c.fingerprint);
            h.push(c.holder);
        }
        let sql = &self.inner.sql;
        sqlx::query(if bounded {
            &sql.begin_batch
        } else {
            &sql.begin_many
        })
        .bind(&k)
        .bind(&o)
        .bind(&l)
        .bind(&f)
        .bind(&h)
        .fetch_all(&self.inner.pool)
        .await
    }

    async fn begin_batch(&self, batch: Vec<BeginJob>) {
        let rows = self
            .begin_many_rows(
                batch.iter().map(|j| BeginColumns {
                    key: &j.key,
                    owner: &j.owner,
                    lease_us: j.lease_us,
                    fingerprint: j.fingerprint.as_ref().map(|f| &f[..]),
                    holder: j.holder.as_deref(),
                }),
                true,
            )
            .await;
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => return self.failed(batch.into_iter().map(|j| j.reply), e),
        };
        let mut answers: Vec<Option<PgRow>> = batch.iter().map(|_| None).collect();
        for row in rows {
            let Ok(key) = row.try_get::<&str, _>(0) else {
                continue;
            };
            // The batch is in key order (`Lane::next`).
            if let Ok(i) = batch.binary_search_by(|j| j.key.as_str().cmp(key)) {
                answers[i] = Some(row);
            }
        }
        for (job, row) in batch.into_iter().zip(answers) {
            // No row: the snapshot race of `begin` (sql.rs); the call is sent again alone.
            let _ = job.reply.send(Ok(row.map_or(Reply::Alone, Reply::Done)));
        }
    }

    async fn complete_batch(&self, batch: Vec<CompleteJob>) {
        let keys: Vec<&str> = batch.iter().map(|j| j.key.as_str()).collect();
        let owners: Vec<&[u8]> = batch.iter().map(|j| &j.owner[..]).collect();
        let fencings: Vec<i64> = batch.iter().map(|j| j.fencing).collect();
        let kinds: Vec<i16> = batch.iter().map(|j| j.kind).collect();
        let results: Vec<&[u8]> = batch.iter().map(|j| &j.bytes[..]).collect();
        let ttls: Vec<i64> = batch.iter().map(|j| j.ttl_us).collect();
        let rows = sqlx::query(&self.inner.sql.complete_batch)
            .bind(&keys)
            .bind(&owners)
            .bind(&fencings)
            .bind(&kinds)
            .bind(&results)
            .bind(&ttls)
            .fetch_all(&self.inner.pool)
            .await;
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => return self.failed(batch.into_iter().map(|j| j.reply), e),
        };
        // Per key: not completed here (None), completed (Some(waited on)).
        let mut done: Vec<Option<bool>> = vec![None; batch.len()];
        for row in &rows {
            let (Ok(key), Ok(waiting)) = (row.try_get::<&str, _>(0), row.try_get::<bool, _>(1))
            else {
                continue;
            };
            if let Ok(i) = batch.binary_search_by(|j| j.key.as_str().cmp(key)) {
                done[i] = Some(waiting);
            }
        }
        let waited: Vec<&str> = batch
            .iter()
            .zip(&done)
            .filter(|(_, d)| **d == Some(true))
            .map(|(j, _)| j.key.as_str())
            .collect();
        // Waiters wake once the results are committed: a statement after the update's.
        let notified = if waited.is_empty() {
            Ok(())
        } else {
            sqlx::query(&self.inner.sql.notify_many)
                .bind(&waited)
                .execute(&self.inner.pool)
                .await
                .map(drop)
                .map_err(|e| self.err(e))
        };
        drop(waited);
        let copy = notified.as_ref().err().map(copies);
        for (job, d) in batch.into_iter().zip(done) {
            let answer = match (d, &copy) {
                // Not ours now, or completed by this same lease before (a retried call):
                // `complete` alone tells which.
                (None, _) => Ok(Reply::Alone),
                // Stored, but its waiters were not told: as `complete` alone reports it.
                (Some(true), Some(copy)) => Err(copy()),
                (Some(_), _) => Ok(Reply::Done(())),
            };
            let _ = job.reply.send(answer);
        }
    }
}
