//! The store's side of coalescing (coalesce.rs has the queues): the queued calls, the
//! statements a batch sends, and the task that sends them.

use bytes::Bytes;
use idemkit_core::StoreError;
use sqlx::Row as _;
use sqlx::postgres::PgRow;

use crate::coalesce::{Job, Lane, Reply, Responder};
use crate::store::PgStore;

/// The two lanes of one store.
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    pub(crate) begin: Lane<BeginJob>,
    pub(crate) complete: Lane<CompleteJob>,
}

/// A queued `begin`: its parameters, owned; answered with its row of `begin_many`.
#[derive(Debug)]
pub(crate) struct BeginJob {
    pub(crate) key: String,
    pub(crate) owner: [u8; 16],
    pub(crate) lease_us: i64,
    pub(crate) fingerprint: Option<[u8; 16]>,
    pub(crate) holder: Option<Vec<u8>>,
    pub(crate) reply: Responder<PgRow>,
}

/// One key's parameters of `begin_many`.
pub(crate) struct BeginColumns<'a> {
    pub(crate) key: &'a str,
    pub(crate) owner: &'a [u8],
    pub(crate) lease_us: i64,
    pub(crate) fingerprint: Option<&'a [u8]>,
    pub(crate) holder: Option<&'a [u8]>,
}

/// A queued `complete`; answered once its row is completed (and its waiters notified).
#[derive(Debug)]
pub(crate) struct CompleteJob {
    pub(crate) key: String,
    pub(crate) owner: [u8; 16],
    pub(crate) fencing: i64,
    pub(crate) kind: i16,
    pub(crate) bytes: Bytes,
    pub(crate) ttl_us: i64,
    pub(crate) reply: Responder<()>,
}

impl Job for BeginJob {
    fn key(&self) -> &str {
        &self.key
    }
    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }
}

impl Job for CompleteJob {
    fn key(&self) -> &str {
        &self.key
    }
    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }
    fn size(&self) -> usize {
        self.bytes.len()
    }
}

/// A kind of queued call: its lane, and the statement its batch goes out as.
trait Batch: Job + Sized {
    fn lane(lanes: &Lanes) -> &Lane<Self>;
    fn send(store: &PgStore, batch: Vec<Self>) -> impl Future<Output = ()> + Send;
}

impl Batch for BeginJob {
    fn lane(lanes: &Lanes) -> &Lane<Self> {
        &lanes.begin
    }
    fn send(store: &PgStore, batch: Vec<Self>) -> impl Future<Output = ()> + Send {
        store.begin_batch(batch)
    }
}

impl Batch for CompleteJob {
    fn lane(lanes: &Lanes) -> &Lane<Self> {
        &lanes.complete
    }
    fn send(store: &PgStore, batch: Vec<Self>) -> impl Future<Output = ()> + Send {
        store.complete_batch(batch)
    }
}

/// Which lane a slot belongs to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Begin,
    Complete,
}

/// A slot taken by a call sent alone; dropping it (the call answered, or its caller gone)
/// hands the slot to the calls queued meanwhile.
pub(crate) struct Slot<'a> {
    pub(crate) store: &'a PgStore,
    pub(crate) kind: Kind,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.store.hand_over(self.kind);
    }
}

/// Frees the slot and fails the queue if the sending task ends early (it panicked, or the
/// runtime shut down and dropped it): no queued caller waits for a batch that never comes.
/// Built before the task is spawned and moved into it, so that a task dropped before its
/// first poll (its runtime shut down, or a current-thread runtime dropped after `block_on`)
/// frees the slot too. Built inside the task, an unpolled task kept its slot for ever, and
/// two such leaks left the lane with no slot (review M1 of `e047556`, the wedge fixed in the
/// Redis coalescer before).
struct Abandon<J: Batch> {
    store: PgStore,
    armed: bool,
    kind: std::marker::PhantomData<fn() -> J>,
}

impl<J: Batch> Drop for Abandon<J> {
    fn drop(&mut self) {
        if self.armed {
            J::lane(self.store.lanes()).abandon();
        }
    }
}

/// Whether a batch's failure is one a call sent on its own handles: a deadlock (two
/// batches met in different orders), a serialization failure, or a row lock held past the
/// batch's bound (`BATCH_LOCK_TIMEOUT`: only the locked key's own call waits for it).
fn retry_alone(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if matches!(db.code().as_deref(), Some("40P01" | "40001" | "55P03")))
}

/// Copies of `e`, one for each caller of a batch.
pub(crate) fn copies(e: &StoreError) -> impl Fn() -> StoreError + '_ {
    let text = e.to_string();
    move || StoreError::new(e.kind(), text.clone())
}

/// Sends batches in one slot until its queue is empty; `guard` frees the slot if the task
/// ends early.
async fn drain<J: Batch>(mut guard: Abandon<J>, mut batch: Vec<J>) {
    let store = guard.store.clone();
    let lane = J::lane(store.lanes());
    loop {
        J::send(&store, batch).await;
        match lane.next() {
            Some(next) => batch = next,
            None => break,
        }
    }
    guard.armed = false;
}

impl PgStore {
    pub(crate) fn lanes(&self) -> &Lanes {
        // Slots exist only on a store with lanes.
        self.inner
            .lanes
            .as_ref()
            .expect("a slot of a store that coalesces")
    }

    /// A slot is free again: sends what queued meanwhile, from a task of its own.
    pub(crate) fn hand_over(&self, kind: Kind) {
        match kind {
            Kind::Begin => self.hand_over_to::<BeginJob>(),
            Kind::Complete => self.hand_over_to::<CompleteJob>(),
        }
    }

    fn hand_over_to<J: Batch>(&self) {
        let lane = J::lane(self.lanes());
        let Some(batch) = lane.next() else { return };
        // Armed from here: whatever becomes of the task, the slot is freed or handed on.
        let guard = Abandon::<J> {
            store: self.clone(),
            armed: true,
            kind: std::marker::PhantomData,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(drain(guard, batch))),
            // No runtime (it is shutting down): the batch is dropped unsent, its callers
            // answered with an error, and the guard frees the slot.
            Err(_) => drop((batch, guard)),
        }
    }

    /// Answers each caller of a batch whose statement failed: `Alone` for a failure a
    /// single statement handles, else the typed error.
    fn failed<T>(&self, replies: impl Iterator<Item = Responder<T>>, e: sqlx::Error) {
        if retry_alone(&e) {
            for reply in replies {
                let _ = reply.send(Ok(Reply::Alone));
            }
            return;
        }
        let e = self.err(e);
        let copy = copies(&e);
        for reply in replies {
            let _ = reply.send(Err(copy()));
        }
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
