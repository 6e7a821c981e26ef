//! [`RedisStore`]: idemkit's store on Redis 7 or later and Valkey, single node or Cluster.
//!
//! - **One round trip per phase.** `begin`, `renew`, `complete` and `release` are each one
//!   `EVALSHA` of a Lua script (`lua/*.lua`, loaded once, reloaded on `NOSCRIPT` after a
//!   server restart). On one server (single node or Sentinel) without the durability guard,
//!   the `begin`s of a coalesced batch (or of `begin_many`) are one pipeline of plain
//!   commands instead (`TIME`, a `SET key reservation NX PX lease GET` per key, `TIME`:
//!   about half the server's work), their fencing token stamped by the client and kept only
//!   when the `TIME`s prove it; a key that held anything but a completed record, or a stamp
//!   not proven, goes to the script in the same call ([`RedisStoreBuilder::plain_begins`]). On a server with a conditional `SET` (Valkey 8.1 and later, Redis 8.4
//!   and later: the store asks the server, [`RedisStore::conditional_set`]), a completion is
//!   one plain `SET key record IFEQ reservation PX ttl`, far cheaper for the server than a
//!   script; the script only when that wrote nothing (a waiter to wake, a lost lease, a
//!   retried completion). A replay costs one command; a fresh run two. After a run of replays
//!   (three quarters of about the last eight `begin`s), `begin` reads the key with a plain
//!   `GET` first, far cheaper for Redis than the script (docs/benchmarks.md); a key that
//!   holds no completed record then costs the `GET` and the script. A waiter adds a
//!   `SUBSCRIBE` (once per key and process), one `EVALSHA` of `watch.lua` and a background
//!   `UNSUBSCRIBE` when the last local waiter leaves; the durability guard adds one `WAIT`
//!   per write phase.
//! - **Fencing.** Every write checks the caller's owner token *and* fencing token inside the
//!   script. Fencing tokens come from Redis' `TIME` in microseconds (or one past a
//!   just-released token, or a client's stamp that the `TIME`s around its `SET` prove
//!   greater than every earlier token), so they increase per key; leases and TTLs expire by Redis' clock
//!   (`PX`), never the client's.
//! - **Push wake-ups.** `complete` and `release` publish on a per-key channel; a waiter
//!   subscribes to it (RESP3 push on the store's redis-rs connection), re-checks the record, and wakes
//!   within about one round trip of the owner finishing. Its wait never outlasts the
//!   owner's lease, which covers a missed message. A waiter whose future is dropped leaves
//!   no registration and no subscription behind.
//! - **Eviction.** Redis must not evict our keys: run it with `maxmemory-policy noeviction`
//!   (or a dedicated server). The store checks the policy at connect and warns, or refuses
//!   ([`RedisStoreBuilder::eviction_check`]).
//! - **Pipelined connections, coalesced calls.** On one server the store sends its calls over
//!   its lanes ([`RedisStoreBuilder::connections`]; a key's owner always uses the same
//!   one, so its commands keep their order). On a plain `redis://` URL the lane is one
//!   connection of the store's own client, lighter than redis-rs'
//!   ([`RedisStoreBuilder::own_client`]), which pipelines every caller's commands and sends
//!   them in few writes, and one redis-rs connection more carries the subscriptions; on
//!   redis-rs (`rediss://`) there are two lanes, and concurrent `begin`s and `complete`s on
//!   a lane go out together as one batch ([`RedisStoreBuilder::coalesce`], which the own
//!   client does not need by default).
//! - **Cluster.** A record's key and its channel share one hash tag (a digest of the storage
//!   key), so every script touches one slot; waiters use sharded pub/sub (`SSUBSCRIBE`).
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use idemkit_core::{Coordinator, Key, Operation};
//! use idemkit_redis::RedisStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let coordinator = Coordinator::new(store);
//! let (op, key) = (Operation::new("mail.invoice")?, Key::new("order-9.invoice")?);
//! let receipt = coordinator.call(&op, &key).ttl(Duration::from_secs(86_400))
//!     .run(|_| async { Ok::<_, std::io::Error>("em_1".to_string()) })
//!     .await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, FencingToken, Ownership, RawStore, Record, StorageKey,
    Store, StoreError, StoreErrorKind,
};
use redis::{Pipeline, Value};

/// The Redis client this crate is built on, so an application uses the same version as the
/// store without naming it in its manifest.
pub use redis;

mod builder;
mod claim;
mod coalesce;
mod conn;
mod durable;
mod errors;
mod eviction;
mod keys;
mod lanes;
mod many;
#[cfg(all(test, idemkit_loom))]
mod model;
mod plain;
mod replays;
mod resp;
mod scan;
mod scripts;
mod secure;
mod sentinel;
mod stamp;
mod wake;
mod wire;

pub use builder::RedisStoreBuilder;
pub use eviction::EvictionCheck;

use conn::Conn;
use durable::Durable;
use errors::{map_err, owner_checked};
use keys::{channel, key_for, ms};
use lanes::Lane;
use scripts::{LeaseArg, eval_on};
use wake::Waiters;

/// What [`RedisStore::plain_begin_counts`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PlainBegins {
    /// Keys whose `begin` went out as plain commands.
    pub sent: u64,
    /// Of those, the keys whose stamped fencing token was not proven, and was taken again
    /// from the server's clock by the script.
    pub stale: u64,
}

/// The bounds a store enforces itself: one call (see `Store::call_timeout`), one response.
pub(crate) struct Timeouts {
    pub(crate) call: Option<Duration>,
    pub(crate) response: Duration,
}

/// How many locks the subscribe steps of all channels share (see `Shared::pubsub`).
const PUBSUB_STRIPES: usize = 64;

/// A store on Redis. Cheap to clone: clones share the connections and the waiter registry.
///
/// # Example
///
/// ```no_run
/// # async fn run() -> Result<(), idemkit_core::StoreError> {
/// let store = idemkit_redis::RedisStore::builder()
///     .prefix("billing")
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    /// Every key this store writes starts with `{prefix}:`.
    prefix: String,
    /// The durability guard, when on (see [`RedisStoreBuilder::wait_for_replicas`]).
    durable: Option<Arc<Durable>>,
    /// Local waiters per wake-up channel. The push handler (called by the connection for
    /// each pub/sub message) notifies them; a channel is subscribed while it has waiters.
    waiters: Arc<Waiters>,
    /// Held while a `SUBSCRIBE` or `UNSUBSCRIBE` of a channel is on the wire, so that a
    /// background unsubscribe (the last waiter of a channel left) can never overtake a new
    /// waiter's subscribe to the same channel and cancel it: the unsubscribe re-checks, under
    /// the lock, that nobody waits on the channel again. One lock per stripe of channels (by
    /// the channel's digest), so waiters on different keys rarely queue behind each other.
    pubsub: Arc<[tokio::sync::Mutex<()>]>,
    /// The longest one call can take, enforced by the connection's response timeout (and,
    /// for a wait's subscription, by `response_timeout`).
    call_timeout: Option<Duration>,
    /// The connections' response timeout. It also bounds a wait's subscribe step (taking
    /// its channel's lock and `SUBSCRIBE`): past it the waiter goes on without a push, and
    /// wakes at the lease's end at the latest.
    response_timeout: Duration,
    /// Whether concurrent begins and completes are coalesced (see `coalesce`).
    coalesce: bool,
    /// The connections calls go out on, each with its queues of coalesced calls, shared by
    /// every prefix on them: a key's lane is picked by its hash tag (`keys::lane`). The
    /// first lane's connection is `RedisStore::conn`, which also carries the subscriptions.
    lanes: Arc<[Lane]>,
    /// The next `begin`'s lane (see `RedisStore::begin_lane`).
    next_begin: Arc<AtomicUsize>,
    /// What recent `begin`s met: whether the next one reads first (see `replays`).
    replays: replays::Replays,
    /// Whether the server has `SET … IFEQ` (see `plain`); shared by every prefix.
    caps: Arc<plain::Caps>,
    /// The estimate of the server's clock plain begins stamp their tokens with (see
    /// `stamp`); shared by every prefix.
    clock: Arc<stamp::Clock>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.shared.prefix)
            .field(
                "replicas",
                &self
                    .shared
                    .durable
                    .as_ref()
                    .map(|d| (d.replicas, d.timeout)),
            )
            .field("cluster", &matches!(self.conn, Conn::Cluster(_)))
            .finish()
    }
}

impl RedisStore {
    #[allow(clippy::too_many_arguments)] // one private constructor, called by the builder only
    fn new(
        conn: Conn,
        lanes: Vec<Conn>,
        prefix: String,
        durable: Option<Durable>,
        waiters: Arc<Waiters>,
        timeouts: Timeouts,
        coalesce: bool,
        plain_begins: bool,
    ) -> Self {
        let Timeouts {
            call: call_timeout,
            response: response_timeout,
        } = timeouts;
        let lanes = lanes.into_iter().map(Lane::new).collect();
        RedisStore {
            conn,
            shared: Arc::new(Shared {
                prefix,
                durable: durable.map(Arc::new),
                waiters,
                pubsub: (0..PUBSUB_STRIPES)
                    .map(|_| tokio::sync::Mutex::new(()))
                    .collect(),
                call_timeout,
                response_timeout,
                coalesce,
                lanes,
                next_begin: Arc::default(),
                replays: replays::Replays::default(),
                caps: Arc::default(),
                clock: Arc::new(stamp::Clock::new(plain_begins)),
            }),
        }
    }

    /// Connects to one server with the default settings.
    ///
    /// # Errors
    ///
    /// See [`RedisStoreBuilder::connect`].
    ///
    /// # Example
    ///
    /// See the [crate docs](crate).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        RedisStoreBuilder::default().connect(url).await
    }

    /// The same connections under another key prefix: a separate namespace of records that
    /// costs no new connection.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::connect("redis://127.0.0.1").await?;
    /// let billing = store.with_prefix("billing");
    /// # Ok(()) }
    /// ```
    pub fn with_prefix(&self, prefix: impl Into<String>) -> Self {
        RedisStore {
            conn: self.conn.clone(),
            shared: Arc::new(Shared {
                prefix: prefix.into().replace(['{', '}'], "_"),
                durable: self.shared.durable.clone(),
                waiters: self.shared.waiters.clone(),
                pubsub: self.shared.pubsub.clone(),
                call_timeout: self.shared.call_timeout,
                response_timeout: self.shared.response_timeout,
                coalesce: self.shared.coalesce,
                lanes: self.shared.lanes.clone(),
                next_begin: self.shared.next_begin.clone(),
                // Another prefix, another table of records: a history of its own.
                replays: replays::Replays::default(),
                caps: self.shared.caps.clone(),
                clock: self.shared.clock.clone(),
            }),
        }
    }

    /// A builder, for a prefix, timeouts, the durability guard, or Cluster.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::builder().prefix("tests").connect("redis://127.0.0.1").await?;
    /// # Ok(()) }
    /// ```
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// The Redis key a record is stored under: `{prefix}:{{tag}}:{storage key}`, where the
    /// tag is a 64-bit FNV-1a digest of the storage key in hex. The tag puts the record and
    /// its wake-up channel (the key followed by `:wake`) in one Cluster slot whatever
    /// characters the key holds.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(store: idemkit_redis::RedisStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use idemkit_core::{Key, Operation, StorageKey};
    /// let sk = StorageKey::new(&Operation::new("op")?, None, &Key::new("k")?);
    /// assert!(store.redis_key(&sk).ends_with("}:op:0::k"));
    /// # Ok(()) }
    /// ```
    pub fn redis_key(&self, key: &StorageKey) -> String {
        key_for(&self.shared.prefix, key)
    }

    /// Wake-up channels that have local waiters now: 0 once every wait has ended, however
    /// it ended. For tests and diagnostics.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(store: idemkit_redis::RedisStore) {
    /// assert_eq!(store.waiting_channels(), 0);
    /// # }
    /// ```
    pub fn waiting_channels(&self) -> usize {
        self.shared.waiters.len()
    }

    /// Whether the server has a conditional `SET` (`SET … IFEQ`: Valkey 8.1 and later, Redis
    /// 8.4 and later), so that a completion goes out as one plain command rather than a
    /// script, as last asked: at connect, and again after a script call found the server's
    /// script cache empty (a restart, or a failover to another server). `None` before the
    /// first answer. For diagnostics: a store uses what the server has by itself.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// // Valkey 9: Some(true); Redis 7: Some(false).
    /// println!("plain completions: {:?}", store.conditional_set());
    /// # Ok(()) }
    /// ```
    pub fn conditional_set(&self) -> Option<bool> {
        self.shared.caps.known()
    }

    /// How many `begin`s this store's connections sent as plain commands (see
    /// [`RedisStoreBuilder::plain_begins`]), and how many of their fencing-token stamps the
    /// server's clock did not prove (each then taken again by the script, in the same
    /// call). For tests and diagnostics: a steady share of stale stamps means the client
    /// stalls between building a command and the server running it.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// let counts = store.plain_begin_counts();
    /// println!("{} plain begins, {} stamps taken again", counts.sent, counts.stale);
    /// # Ok(()) }
    /// ```
    pub fn plain_begin_counts(&self) -> PlainBegins {
        let (sent, stale) = self.shared.clock.counts();
        PlainBegins { sent, stale }
    }

    /// Moves this store's estimate of the server's clock by `by_us` microseconds, as a
    /// client whose stamps come out early (negative) or late would. For tests of the stamp's
    /// proof only.
    #[doc(hidden)]
    pub fn skew_stamps_for_tests(&self, by_us: i64) {
        self.shared.clock.skew(by_us);
    }

    /// Asks the server whether it has `SET … IFEQ` (see `plain`).
    pub(crate) async fn ask_conditional_set(&self) -> Result<bool, StoreError> {
        self.shared
            .caps
            .ifeq(&mut self.conn.clone(), &self.shared.prefix)
            .await
    }

    /// The variants of the scripts that wake waiters, for this deployment.
    fn complete_script(&self) -> &'static scripts::Lua {
        match self.conn {
            Conn::Cluster(_) => &scripts::COMPLETE_SHARDED,
            _ => &scripts::COMPLETE,
        }
    }

    fn release_script(&self) -> &'static scripts::Lua {
        match self.conn {
            Conn::Cluster(_) => &scripts::RELEASE_SHARDED,
            _ => &scripts::RELEASE,
        }
    }

    fn publish_command(&self) -> &'static str {
        match self.conn {
            Conn::Cluster(_) => "SPUBLISH",
            _ => "PUBLISH",
        }
    }
}

impl Store for RedisStore {
    fn max_ttl(&self) -> Duration {
        keys::MAX_TTL
    }

    fn call_timeout(&self) -> Option<Duration> {
        self.shared.call_timeout
    }

    /// Yes: a completion whose reservation the client knows byte for byte is one `GET` to
    /// compare and one write of the record it built (`lua/complete.lua`).
    fn uses_reservation(&self) -> bool {
        true
    }

    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Claim, StoreError> {
        let lane = self.begin_lane();
        // Read only where a fast failure may go to another lane.
        let sent = (self.shared.lanes.len() > 1).then(tokio::time::Instant::now);
        let claimed = match self.begin_on(lane, req).await {
            // A connection idle through an outage reports it on its next call, while the
            // others work again: a begin takes the next lane then (sent again with the same
            // owner token, it is answered as once, ARCHITECTURE row 24). Only after a fast
            // failure: one that timed out has used the time `call_timeout` allows for it.
            Err(e)
                if e.kind() == StoreErrorKind::Unavailable
                    && sent.is_some_and(|sent| sent.elapsed() < self.shared.response_timeout) =>
            {
                Box::pin(self.begin_on((lane + 1) % self.shared.lanes.len(), req)).await
            }
            claimed => claimed,
        };
        if let Ok(claim) = &claimed {
            // A mismatch is most often a completed record's: one a `GET` answers too.
            let replayed = matches!(claim, Claim::Replay(_) | Claim::Mismatch);
            self.shared.replays.saw(replayed);
        }
        claimed
    }

    async fn begin_many(&self, reqs: &[BeginRequest<'_>]) -> Vec<Result<Claim, StoreError>> {
        if reqs.len() < 2 || self.shared.durable.is_some() {
            // One key, or the durability guard's WAIT per reservation: key by key.
            let mut claims = Vec::with_capacity(reqs.len());
            for req in reqs {
                claims.push(self.begin(req).await);
            }
            return claims;
        }
        self.begin_grouped(reqs).await
    }

    async fn renew(
        &self,
        key: &StorageKey,
        lease: &Ownership,
        duration: Duration,
    ) -> Result<(), StoreError> {
        let rkey = self.redis_key(key);
        if self.shared.durable.is_none() {
            let renewed: i64 = self
                .eval(&scripts::RENEW, &rkey, |cmd| {
                    cmd.arg(LeaseArg(lease)).arg(ms(duration));
                })
                .await?;
            return owner_checked(renewed);
        }
        // With the durability guard a renewal is confirmed only once the replicas have it:
        // the lease end the owner counts on is one a failover keeps (a renewal the primary
        // took and no replica saw would leave the promoted replica with the older, shorter
        // lease, and a waiter there would take the key over from a working owner).
        let lane = self.lane(&rkey);
        let (reply, acked) = self
            .eval_guarded(
                lane,
                &scripts::RENEW,
                &rkey,
                |cmd| {
                    cmd.arg(LeaseArg(lease)).arg(ms(duration));
                },
                |reply| matches!(reply, Value::Int(1)),
            )
            .await?;
        owner_checked(crate::errors::int(Some(&reply))?)?;
        acked
    }

    async fn complete(
        &self,
        key: &StorageKey,
        lease: &Ownership,
        completion: &CompleteRequest,
    ) -> Result<(), StoreError> {
        if u32::try_from(completion.bytes.len()).is_err() {
            // The record's length field is 32 bits (and Redis refuses values over 512 MB).
            return Err(StoreError::new(
                StoreErrorKind::Rejected,
                "a result of 4 GiB or more cannot be stored",
            ));
        }
        self.complete_on(key, lease, completion).await
    }

    async fn release(&self, key: &StorageKey, lease: &Ownership) -> Result<(), StoreError> {
        let rkey = self.redis_key(key);
        let done: i64 = self
            .eval(self.release_script(), &rkey, |cmd| {
                cmd.arg(LeaseArg(lease));
            })
            .await?;
        owner_checked(done)
    }

    async fn wait(
        &self,
        key: &StorageKey,
        seen: FencingToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.wait_pushed(key, seen, timeout).await
    }

    async fn get(&self, key: &StorageKey) -> Result<Option<Record>, StoreError> {
        let rkey = self.redis_key(key);
        // Redis keeps the expiry as the key's PX; read it with the clock of the node that
        // holds the key, in one script there (a `TIME` pipelined beside the `GET` went to
        // any node of a Cluster: review L10).
        let reply: Value =
            eval_on(&mut self.lane_conn(&rkey), &scripts::PEEK, &rkey, |_| {}).await?;
        scan::peeked(reply)
    }
}

impl RawStore for RedisStore {
    async fn put_raw(
        &self,
        key: &StorageKey,
        bytes: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let rkey = self.redis_key(key);
        redis::cmd("SET")
            .arg(&rkey)
            .arg(&bytes[..])
            .arg("PX")
            .arg(ms(ttl))
            .query_async::<()>(&mut self.lane_conn(&rkey))
            .await
            .map_err(map_err)
    }

    async fn purge(&self, key: &StorageKey) -> Result<bool, StoreError> {
        let rkey = self.redis_key(key);
        let mut pipe = Pipeline::new();
        pipe.del(&rkey)
            .cmd(self.publish_command())
            .arg(channel(&rkey))
            .arg("")
            .ignore();
        let (deleted,): (i64,) = pipe
            .query_async(&mut self.lane_conn(&rkey))
            .await
            .map_err(map_err)?;
        Ok(deleted > 0)
    }
}
