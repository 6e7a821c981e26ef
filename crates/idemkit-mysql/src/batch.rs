//! Coalescing concurrent `begin`s into one statement (issue 51 item 4); the queue is
//! `idemkit_coalesce`'s, the one coalescer of every store, and this is the store's side: the
//! queued calls and the statements a batch sends.
//!
//! A miss costs the server two statements, and under load a statement's fixed cost (the
//! round trip, the execution's setup, the commit) is most of it. So while two `begin`s are
//! running, a new one queues, and the queue goes out as one multi-row `INSERT … SELECT … ON
//! DUPLICATE KEY UPDATE` (one commit for many keys) and one read of the rows it left. A call
//! that finds a place free and nobody queued is sent at once, on its own, as without
//! coalescing: nothing waits at concurrency 1.
//!
//! The batch statement reserves **absent keys only** (one fencing token for the statement,
//! from the clock and the high-water mark, as the single `begin`), and renews a live
//! reservation of the caller's own made with the same fingerprint (a `begin` sent again);
//! it leaves every other row as it is. The read that follows tells each caller whether the
//! key now holds its live reservation: then it is reserved (never a takeover: an expired
//! row is left for the single statement, which reports it); anything else (a live row of
//! another owner, a completed record, an expired row, a row that changed between the two
//! statements) sends that call alone, where the single `begin` decides as it always did.
//!
//! MySQL's upsert cannot say per row what it did (`LAST_INSERT_ID` carries one value), hence
//! the read. Rows are written in key order by every batch, and a batch's lock waits are
//! bounded (one second, the server's smallest `innodb_lock_wait_timeout`): a deadlock or a
//! row locked past the bound (say by a transactional call's open transaction) rolls the
//! statement back and sends the batch's calls alone, so only the locked key's own call
//! waits for it. A key is in a batch once; a queued call whose caller has gone is dropped
//! before it is sent.
//!
//! Completions coalesce the same way, as one multi-row owner-checked `UPDATE` (each row's
//! result, kind and TTL picked by its key): when it completes every row of the batch, every
//! caller is answered; otherwise every caller is sent alone, where the single `UPDATE` and
//! its check for a completion already made (a retried completion, or this batch's) tell a
//! completed row from a lost lease.

use idemkit_coalesce::{Entry, Limits, Reply};
use idemkit_core::{BeginRequest, Claim, FencingToken, OwnerToken, Ownership, StoreError};
use idemkit_sql::guess::Guess;
use sqlx::Row as _;

use crate::sql::NOW;
use crate::store::MySqlStore;

/// How the lanes batch: at most 16 keys a statement (each key is five parameters and a
/// `SELECT` arm of the begin statement's derived table), at most 16 MiB of results (one
/// statement's packet), two statements of a kind running at once (a lone call or a batch
/// each, both alone when the lane is idle), each key once, in key order.
pub(crate) const LIMITS: Limits = Limits::new(16, 2)
    .max_bytes(16 << 20)
    .alone(2)
    .each_key_once();

/// The two lanes of one store (the jobs are `idemkit_sql`'s, shared with PostgreSQL).
pub(crate) type Lanes = idemkit_sql::batch::Lanes<Claim>;

/// A queued `begin`: answered with its claim, or `Alone`.
pub(crate) type BeginJob = idemkit_sql::batch::BeginJob<Claim>;

pub(crate) use idemkit_sql::batch::CompleteJob;

pub(crate) use idemkit_sql::batch::Batches;

impl idemkit_sql::batch::Batching for MySqlStore {
    type Begun = Claim;
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

/// Which server the store talks to: how a statement bounds its own lock waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    MariaDb,
    MySql,
}

/// The batch `begin` for `n` keys (binds: key, owner, fingerprint, lease, holder per key).
pub(crate) fn begin_sql(table: &str, n: usize, flavor: Flavor) -> String {
    let t = format!("`{table}`");
    let f = format!("`{table}_fencing`");
    let mut rows = String::from("SELECT ? AS k, ? AS o, ? AS fp, ? AS l, ? AS h");
    for _ in 1..n {
        rows.push_str(" UNION ALL SELECT ?, ?, ?, ?, ?");
    }
    let (prefix, hint) = lock_bound(flavor);
    // A live reservation of the same owner and fingerprint: renewed (a `begin` sent again
    // renews, as the single statement's caller does). Every other row: left as it is.
    let own_live = format!(
        "{t}.owner = VALUES(owner) AND {t}.state = 1 AND {t}.version = 1 \
         AND {t}.expires_us > VALUES(created_us) AND {t}.fingerprint <=> VALUES(fingerprint)"
    );
    format!(
        "{prefix}INSERT {hint}INTO {t} (`key`, version, state, owner, fencing, fingerprint, \
           created_us, expires_us, kind, result, holder) \
         SELECT b.k, 1, 1, b.o, GREATEST(n.now, hw.v + 1), b.fp, n.now, n.now + b.l, NULL, NULL, b.h \
         FROM ({rows}) AS b, (SELECT {NOW} AS now) AS n, {f} AS hw \
         WHERE hw.id = 1 ORDER BY b.k \
         ON DUPLICATE KEY UPDATE expires_us = IF({own_live}, VALUES(expires_us), {t}.expires_us)"
    )
}

/// The statement's own bound on lock waits, in each server's syntax: a prefix and a hint
/// after the statement's first word.
fn lock_bound(flavor: Flavor) -> (&'static str, &'static str) {
    match flavor {
        Flavor::MariaDb => ("SET STATEMENT innodb_lock_wait_timeout = 1 FOR ", ""),
        Flavor::MySql => ("", "/*+ SET_VAR(innodb_lock_wait_timeout = 1) */ "),
    }
}

/// The batch completion for `n` keys (binds: the keys, then key and kind, key and result,
/// key and TTL, key and owner, key and fencing per key, then the keys again).
pub(crate) fn complete_sql(table: &str, n: usize, flavor: Flavor) -> String {
    let (prefix, hint) = lock_bound(flavor);
    let case = "CASE `key`".to_owned() + &" WHEN ? THEN ?".repeat(n) + " END";
    let marks = vec!["?"; n].join(", ");
    format!(
        "{prefix}UPDATE {hint}`{table}` SET state = 2, kind = {case}, result = {case},            expires_us = {NOW} + {case}          WHERE `key` IN ({marks}) AND owner = {case} AND fencing = {case}            AND version = 1 AND state = 1 AND expires_us > {NOW}"
    )
}

/// The rows a batch left, for `n` keys: key, owner, fencing, whether a live reservation.
pub(crate) fn read_sql(table: &str, n: usize) -> String {
    let marks = vec!["?"; n].join(", ");
    format!(
        "SELECT `key`, owner, fencing, version = 1 AND state = 1 AND expires_us > {NOW} \
         FROM `{table}` WHERE `key` IN ({marks})"
    )
}

/// Whether a batch's failure is one a call sent on its own handles: a deadlock (1213) or a
/// lock wait past the statement's bound (1205).
fn retry_alone(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "HY000"))
        && db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|m| matches!(m.number(), 1205 | 1213)))
}

impl MySqlStore {
    /// Sends one batch: the statement, then the read; answers each caller.
    async fn begin_batch(&self, batch: Vec<BeginJob>) {
        match self.begin_rows(&batch).await {
            Ok(rows) => {
                for job in batch {
                    let claim = rows.iter().find_map(|(key, owner, fencing, live)| {
                        (key.as_slice() == job.key.as_bytes() && *live && owner[..] == job.owner)
                            .then(|| Claim::Reserved {
                                ownership: Ownership::new(
                                    OwnerToken::from_u128(u128::from_be_bytes(job.owner)),
                                    FencingToken::new(*fencing as u64),
                                ),
                                took_over: false,
                            })
                    });
                    let _ = job.reply.send(Ok(claim.map_or(Reply::Alone, Reply::Done)));
                }
            }
            // A lock wait or deadlock that rolled the statement back: each alone.
            Err(e) => {
                let alone = retry_alone(&e);
                idemkit_sql::batch::failed(batch.into_iter().map(|j| j.reply), alone, self.err(e));
            }
        }
    }

    /// The batch statement and the read of what it left: (key, owner, fencing, live
    /// reservation) per row found.
    async fn begin_rows(
        &self,
        batch: &[BeginJob],
    ) -> Result<Vec<(Vec<u8>, Vec<u8>, i64, bool)>, sqlx::Error> {
        let flavor = self.flavor().await?;
        let sql = begin_sql(&self.inner.table, batch.len(), flavor);
        let mut q = sqlx::query(&sql);
        for j in batch {
            q = q
                .bind(j.key.as_str())
                .bind(&j.owner[..])
                .bind(j.fingerprint.as_ref().map(|f| &f[..]))
                .bind(j.lease_us)
                .bind(j.holder.as_deref());
        }
        q.execute(&self.inner.pool).await?;
        let sql = read_sql(&self.inner.table, batch.len());
        let mut q = sqlx::query(&sql);
        for j in batch {
            q = q.bind(j.key.as_str());
        }
        let rows = q.fetch_all(&self.inner.pool).await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<Vec<u8>, _>(0)?,
                    r.try_get::<Vec<u8>, _>(1)?,
                    r.try_get::<i64, _>(2)?,
                    r.try_get::<i64, _>(3)? == 1,
                ))
            })
            .collect()
    }

    /// Sends one batch of completions: done for every caller when every row was completed,
    /// else each caller alone (see the module's docs).
    async fn complete_batch(&self, batch: Vec<CompleteJob>) {
        let done = async {
            let flavor = self.flavor().await?;
            let sql = complete_sql(&self.inner.table, batch.len(), flavor);
            let mut q = sqlx::query(&sql);
            // Binds in the statement's order: kinds, results, TTLs (SET), keys (IN),
            // owners, fencings (WHERE).
            for j in &batch {
                q = q.bind(j.key.as_str()).bind(j.kind);
            }
            for j in &batch {
                q = q.bind(j.key.as_str()).bind(&j.bytes[..]);
            }
            for j in &batch {
                q = q.bind(j.key.as_str()).bind(j.ttl_us);
            }
            for j in &batch {
                q = q.bind(j.key.as_str());
            }
            for j in &batch {
                q = q.bind(j.key.as_str()).bind(&j.owner[..]);
            }
            for j in &batch {
                q = q.bind(j.key.as_str()).bind(j.fencing);
            }
            q.execute(&self.inner.pool).await
        }
        .await;
        match done {
            Ok(done) if done.rows_affected() == batch.len() as u64 => {
                for job in batch {
                    let _ = job.reply.send(Ok(Reply::Done(())));
                }
            }
            // Some row not completed here (a lost lease, a retried completion), or a lock
            // wait or deadlock that rolled the statement back: each alone decides.
            Ok(_) => {
                for job in batch {
                    let _ = job.reply.send(Ok(Reply::Alone));
                }
            }
            // A lock wait or deadlock that rolled the statement back: each alone.
            Err(e) => {
                let alone = retry_alone(&e);
                idemkit_sql::batch::failed(batch.into_iter().map(|j| j.reply), alone, self.err(e));
            }
        }
    }

    /// A `begin` through the coalescer (batch.rs): its claim from a batch, or `None` when it
    /// goes alone (an idle lane, coalescing off, a run of replays: the read-first `begin`
    /// answers those in one statement; or the batch sent it back).
    pub(crate) async fn begin_queued(
        &self,
        req: &BeginRequest<'_>,
    ) -> Result<Option<Claim>, StoreError> {
        if self.inner.lanes.is_none() || self.inner.guess.guess() == Guess::Live {
            return Ok(None);
        }
        let answer = match idemkit_coalesce::queue(&crate::batch::Batches(self.clone()), |reply| {
            crate::batch::BeginJob::new(req, reply)
        }) {
            // Alone: the lane's place is held until this call's statements are done.
            Entry::Alone(_lead) => return self.begin_once(req).await.map(Some),
            Entry::Queued(answer) => answer,
        };
        match idemkit_coalesce::answer(answer).await? {
            idemkit_coalesce::Reply::Done(claim) => Ok(Some(claim)),
            idemkit_coalesce::Reply::Alone => Ok(None),
        }
    }

    /// MariaDB or MySQL, asked once.
    pub(crate) async fn flavor(&self) -> Result<crate::batch::Flavor, sqlx::Error> {
        self.inner
            .flavor
            .get_or_try_init(|| async {
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(&self.inner.pool)
                    .await?;
                Ok(if version.to_ascii_lowercase().contains("mariadb") {
                    crate::batch::Flavor::MariaDb
                } else {
                    crate::batch::Flavor::MySql
                })
            })
            .await
            .copied()
    }
}
