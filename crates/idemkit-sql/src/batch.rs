//! What a SQL store's coalesced calls are (`idemkit_coalesce`'s [`Job`]s), the same for
//! PostgreSQL and MySQL: a queued `begin` and a queued `complete` with their parameters
//! owned, the two lanes of one store, and the answer of a batch that failed.
//!
//! How a batch goes out is each store's own (one statement over arrays on PostgreSQL; a
//! multi-row statement and a read on MySQL); what is queued, and how a failure reaches the
//! callers, is written once here.

use bytes::Bytes;
use idemkit_coalesce::{Job, Lane, Limits, Reply, Responder, Sender, copies};
use idemkit_core::{BeginRequest, CompleteRequest, Ownership, StorageKey, StoreError};

/// A queued `begin`: its parameters, owned; answered with the store's `R` for its key (a
/// row, a claim), or [`Reply::Alone`].
///
/// # Example
///
/// ```
/// # use std::time::Duration;
/// use idemkit_core::{BeginRequest, Key, Operation, OwnerToken, StorageKey};
///
/// let key = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
/// let req = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(30));
/// let (reply, _answer) = tokio::sync::oneshot::channel();
/// let job: idemkit_sql::batch::BeginJob<()> = idemkit_sql::batch::BeginJob::new(&req, reply);
/// assert_eq!(job.lease_us, 30_000_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct BeginJob<R> {
    /// The storage key.
    pub key: String,
    /// The caller's owner token, big-endian.
    pub owner: [u8; 16],
    /// The lease, in microseconds.
    pub lease_us: i64,
    /// The request's fingerprint, if any.
    pub fingerprint: Option<[u8; 16]>,
    /// The holder block the row keeps (`Holder::block`), if the caller said who it is.
    pub holder: Option<Vec<u8>>,
    /// Where the batch answers.
    pub reply: Responder<Reply<R>>,
}

impl<R> BeginJob<R> {
    /// The queued form of `req`.
    pub fn new(req: &BeginRequest<'_>, reply: Responder<Reply<R>>) -> Self {
        let lease_ms = u64::try_from(req.lease.as_millis()).unwrap_or(u64::MAX);
        BeginJob {
            key: req.key.as_str().to_owned(),
            owner: req.owner.as_u128().to_be_bytes(),
            lease_us: micros(req.lease),
            fingerprint: req.fingerprint.map(|f| f.to_bytes()),
            holder: req.holder.map(|h| h.block(lease_ms)),
            reply,
        }
    }
}

/// A queued `complete`: its parameters, owned; answered [`Reply::Done`] once its row is
/// completed, or [`Reply::Alone`].
#[derive(Debug)]
#[non_exhaustive]
pub struct CompleteJob {
    /// The storage key.
    pub key: String,
    /// The lease's owner token, big-endian.
    pub owner: [u8; 16],
    /// The lease's fencing token.
    pub fencing: i64,
    /// The result's kind (`ResultKind::to_byte`).
    pub kind: i16,
    /// The encoded result.
    pub bytes: Bytes,
    /// The retention, in microseconds.
    pub ttl_us: i64,
    /// Where the batch answers.
    pub reply: Responder<Reply<()>>,
}

impl CompleteJob {
    /// The queued form of a completion.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// use idemkit_core::{CompleteRequest, FencingToken, Key, Operation, OwnerToken, Ownership, ResultKind, StorageKey};
    ///
    /// let key = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
    /// let lease = Ownership::new(OwnerToken::random(), FencingToken::new(7));
    /// let done = CompleteRequest::new(ResultKind::Value, &b"em_1"[..], Duration::from_secs(60));
    /// let (reply, _answer) = tokio::sync::oneshot::channel();
    /// let job = idemkit_sql::batch::CompleteJob::new(&key, &lease, &done, reply);
    /// assert_eq!((job.fencing, job.ttl_us), (7, 60_000_000));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(
        key: &StorageKey,
        lease: &Ownership,
        request: &CompleteRequest,
        reply: Responder<Reply<()>>,
    ) -> Self {
        CompleteJob {
            key: key.as_str().to_owned(),
            owner: lease.owner.as_u128().to_be_bytes(),
            // A larger token cannot match any row.
            fencing: i64::try_from(lease.fencing.get()).unwrap_or(-1),
            kind: i16::from(request.kind.to_byte()),
            bytes: request.bytes.clone(),
            ttl_us: micros(request.ttl),
            reply,
        }
    }
}

impl<R: Send + 'static> Job for BeginJob<R> {
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

/// The two lanes of one SQL store.
#[derive(Debug)]
#[non_exhaustive]
pub struct Lanes<R> {
    /// Queued `begin`s.
    pub begin: Lane<BeginJob<R>>,
    /// Queued `complete`s.
    pub complete: Lane<CompleteJob>,
}

impl<R> Lanes<R> {
    /// Both lanes with the same limits.
    pub fn new(limits: Limits) -> Self {
        Lanes {
            begin: Lane::new(limits),
            complete: Lane::new(limits),
        }
    }
}

/// A SQL store that coalesces: its lanes, and how a batch of each kind goes out.
pub trait Batching: Clone + Send + Sync + 'static {
    /// What a batch answers a queued `begin` (a row to settle, a claim).
    type Begun: Send + 'static;
    /// The store's lanes; `None` when it does not coalesce (then no [`Batches`] of it is
    /// ever made).
    fn lanes(&self) -> Option<&Lanes<Self::Begun>>;
    /// Sends a batch of `begin`s and answers each job.
    fn send_begins(&self, batch: Vec<BeginJob<Self::Begun>>) -> impl Future<Output = ()> + Send;
    /// Sends a batch of `complete`s and answers each job.
    fn send_completes(&self, batch: Vec<CompleteJob>) -> impl Future<Output = ()> + Send;
}

/// A [`Batching`] store as the coalescer sends on it (`idemkit_coalesce::queue(&Batches(store),
/// …)`).
#[derive(Debug, Clone)]
pub struct Batches<S>(pub S);

impl<S: Batching> Batches<S> {
    fn lanes(&self) -> &Lanes<S::Begun> {
        self.0.lanes().expect("a Batches of a store that coalesces")
    }
}

impl<S: Batching> Sender<BeginJob<S::Begun>> for Batches<S> {
    fn lane(&self) -> &Lane<BeginJob<S::Begun>> {
        &self.lanes().begin
    }
    fn send(&self, batch: Vec<BeginJob<S::Begun>>) -> impl Future<Output = ()> + Send {
        self.0.send_begins(batch)
    }
}

impl<S: Batching> Sender<CompleteJob> for Batches<S> {
    fn lane(&self) -> &Lane<CompleteJob> {
        &self.lanes().complete
    }
    fn send(&self, batch: Vec<CompleteJob>) -> impl Future<Output = ()> + Send {
        self.0.send_completes(batch)
    }
}

/// Answers every caller of a batch whose statement failed: [`Reply::Alone`] when a call sent
/// on its own handles the failure (`alone`: a deadlock, a lock held past the batch's bound),
/// else a copy of the typed error.
pub fn failed<T>(replies: impl Iterator<Item = Responder<Reply<T>>>, alone: bool, e: StoreError) {
    if alone {
        for reply in replies {
            let _ = reply.send(Ok(Reply::Alone));
        }
        return;
    }
    let copy = copies(&e);
    for reply in replies {
        let _ = reply.send(Err(copy()));
    }
}

/// Microseconds of `d`, saturating (SQL stores keep durations as `BIGINT` µs).
fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}
