//! [`RedisStore`]: idemkit's store on Redis 7, single node or Cluster.
//!
//! - **One round trip per phase.** `begin`, `renew`, `complete` and `release` are each one
//!   `EVALSHA` of a Lua script (`lua/*.lua`, loaded once, reloaded on `NOSCRIPT` after a
//!   server restart). A replay costs one command; a fresh run two.
//! - **Fencing.** Every write checks the caller's owner token inside the script. Fencing
//!   tokens come from Redis' `TIME` in microseconds (or one past a just-released token), so
//!   they increase per key; leases and TTLs expire by Redis' clock (`PX`), never the client's.
//! - **Push wake-ups.** `complete` and `release` publish on a per-key channel; a waiter
//!   subscribes to it (RESP3 push on the same connection), re-checks the record, and wakes
//!   within about one round trip of the owner finishing. Its wait never outlasts the
//!   owner's lease, which covers a missed message.
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

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{
    Begin, BeginRequest, Completed, Completion, FencingToken, Lease, RawStore, Record, RecordState,
    StorageKey, Store, StoreError, StoreErrorKind,
};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, IntoConnectionInfo, Pipeline, ProtocolVersion, PushInfo, PushKind, RedisError,
    RedisFuture, RedisWrite, Script, ToRedisArgs, Value,
};
use tokio::sync::Notify;

mod scripts {
    use super::*;

    /// One of our Lua scripts: its SHA for `EVALSHA`, and its source for `SCRIPT LOAD` when
    /// the server does not know it (after a restart).
    pub(crate) struct Lua {
        pub(crate) script: Script,
        pub(crate) source: String,
    }

    impl Lua {
        fn new(source: &str) -> Self {
            Lua {
                script: Script::new(source),
                source: source.to_owned(),
            }
        }

        /// The Cluster variant of a script that wakes waiters: sharded pub/sub (`SPUBLISH`),
        /// whose channel lives in the key's slot. Scripts name the command literally
        /// rather than taking it as an argument: every argument costs Redis time.
        fn sharded(source: &str) -> Self {
            assert!(source.contains("'PUBLISH'"), "a script that publishes");
            Lua::new(&source.replace("'PUBLISH'", "'SPUBLISH'"))
        }
    }

    macro_rules! lua {
        ($file:literal) => {
            LazyLock::new(|| Lua::new(include_str!($file)))
        };
        (sharded $file:literal) => {
            LazyLock::new(|| Lua::sharded(include_str!($file)))
        };
    }

    pub(crate) static BEGIN: LazyLock<Lua> = lua!("../lua/begin.lua");
    pub(crate) static RENEW: LazyLock<Lua> = lua!("../lua/renew.lua");
    pub(crate) static COMPLETE: LazyLock<Lua> = lua!("../lua/complete.lua");
    pub(crate) static COMPLETE_SHARDED: LazyLock<Lua> = lua!(sharded "../lua/complete.lua");
    pub(crate) static RELEASE: LazyLock<Lua> = lua!("../lua/release.lua");
    pub(crate) static RELEASE_SHARDED: LazyLock<Lua> = lua!(sharded "../lua/release.lua");
    pub(crate) static WATCH: LazyLock<Lua> = lua!("../lua/watch.lua");
}

/// A store on Redis. Cheap to clone: clones share the connection and the waiter registry.
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

struct Shared {
    /// Every key this store writes starts with `{prefix}:`.
    prefix: String,
    /// The durability guard: after a reservation or a completion, wait until this many
    /// replicas acknowledged the write (`WAIT`), for at most this long.
    replicas: Option<(usize, Duration)>,
    /// Local waiters per wake-up channel. The push handler (called by the connection for
    /// each pub/sub message) notifies them; a channel is subscribed while it has waiters.
    waiters: Arc<Waiters>,
}

/// A channel's wake-up and how many local waiters use it.
type Channel = (Arc<Notify>, usize);

#[derive(Default)]
struct Waiters {
    channels: Mutex<HashMap<Vec<u8>, Channel>>,
}

impl Waiters {
    fn notify(&self, channel: &[u8]) {
        let map = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((n, _)) = map.get(channel) {
            n.notify_waiters();
        }
    }

    /// Registers a waiter; returns its `Notify` and whether the channel needs subscribing.
    fn join(&self, channel: &[u8]) -> (Arc<Notify>, bool) {
        let mut map = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = map
            .entry(channel.to_vec())
            .or_insert_with(|| (Arc::default(), 0));
        entry.1 += 1;
        (entry.0.clone(), entry.1 == 1)
    }

    /// Unregisters a waiter; returns whether the channel has no waiters left.
    fn leave(&self, channel: &[u8]) -> bool {
        let mut map = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get_mut(channel) {
            Some(entry) if entry.1 > 1 => {
                entry.1 -= 1;
                false
            }
            Some(_) => {
                map.remove(channel);
                true
            }
            None => false,
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.shared.prefix)
            .field("replicas", &self.shared.replicas)
            .field("cluster", &matches!(self.conn, Conn::Cluster(_)))
            .finish()
    }
}

/// Configures a [`RedisStore`].
///
/// # Example
///
/// ```no_run
/// # async fn run() -> Result<(), idemkit_core::StoreError> {
/// use std::time::Duration;
/// let store = idemkit_redis::RedisStore::builder()
///     .prefix("idemkit")
///     .response_timeout(Duration::from_millis(500))
///     .connect_cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"])
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Builder {
    prefix: String,
    response_timeout: Duration,
    connection_timeout: Duration,
    replicas: Option<(usize, Duration)>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            prefix: "idemkit".to_string(),
            response_timeout: Duration::from_secs(1),
            connection_timeout: Duration::from_secs(1),
            replicas: None,
        }
    }
}

impl Builder {
    /// The namespace every key starts with (default `idemkit`). It must not contain `{` or
    /// `}` (they would break Cluster hash tags); such characters are replaced with `_`.
    ///
    /// # Example
    ///
    /// See [`Builder`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into().replace(['{', '}'], "_");
        self
    }

    /// How long a command may take before it fails as unavailable (default 1 s).
    ///
    /// # Example
    ///
    /// See [`Builder`].
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The durability guard: after each reservation and each completion, wait until
    /// `replicas` replicas acknowledged the write (`WAIT replicas timeout`), and report the
    /// store unavailable if they did not within `timeout`.
    ///
    /// Redis replicates asynchronously: without the guard, a failover that promotes a
    /// replica which missed the last writes loses those reservations and results, and the
    /// action can run again. The guard narrows that window to writes whose acknowledgement
    /// is still in flight, at the cost of one more round trip on each write phase (hits are
    /// unaffected). A reservation that is not acknowledged fails `begin` (fail-closed: the
    /// action does not run); a completion that is not acknowledged is reported like any
    /// completion failure (the caller has its value, the failure is logged and counted).
    /// Keep `timeout` below the response timeout. On a Cluster, `WAIT` goes to every
    /// primary and the smallest acknowledgement counts.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// use std::time::Duration;
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .wait_for_replicas(1, Duration::from_millis(100))
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replicas = (replicas > 0).then_some((replicas, timeout));
        self
    }

    /// How long connecting may take (default 1 s).
    ///
    /// # Example
    ///
    /// See [`Builder`].
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Connects to one Redis server (a `redis://` URL). The connection reconnects by itself;
    /// calls made while it is down fail as [`StoreErrorKind::Unavailable`].
    ///
    /// # Errors
    ///
    /// An invalid URL, or a server that cannot be reached now.
    ///
    /// # Example
    ///
    /// See [`RedisStore::builder`].
    pub async fn connect(self, url: &str) -> Result<RedisStore, StoreError> {
        let info = url.into_connection_info().map_err(map_err)?;
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let info = info.set_redis_settings(settings);
        let client = redis::Client::open(info).map_err(map_err)?;
        let waiters = Arc::new(Waiters::default());
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            .set_number_of_retries(1)
            .set_automatic_resubscription()
            .set_push_sender(push_handler(waiters.clone()));
        let manager = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(map_err)?;
        Ok(RedisStore {
            conn: Conn::Single(manager),
            shared: Arc::new(Shared {
                prefix: self.prefix,
                replicas: self.replicas,
                waiters,
            }),
        })
    }

    /// Connects to a Redis Cluster through any of its nodes.
    ///
    /// # Errors
    ///
    /// Invalid URLs, or no node reachable now.
    ///
    /// # Example
    ///
    /// See [`Builder`].
    pub async fn connect_cluster<I, U>(self, nodes: I) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator<Item = U>,
        U: IntoConnectionInfo,
    {
        let waiters = Arc::new(Waiters::default());
        let client = ClusterClientBuilder::new(nodes)
            .use_protocol(ProtocolVersion::RESP3)
            .response_timeout(self.response_timeout)
            .connection_timeout(self.connection_timeout)
            .push_sender(push_handler(waiters.clone()))
            .build()
            .map_err(map_err)?;
        let conn = client.get_async_connection().await.map_err(map_err)?;
        Ok(RedisStore {
            conn: Conn::Cluster(conn),
            shared: Arc::new(Shared {
                prefix: self.prefix,
                replicas: self.replicas,
                waiters,
            }),
        })
    }
}

/// Called by the connection for every push message: wakes the waiters of its channel.
fn push_handler(waiters: Arc<Waiters>) -> impl Fn(PushInfo) -> Result<(), ()> + Send + Sync {
    move |push: PushInfo| {
        if let (PushKind::Message | PushKind::SMessage, Some(Value::BulkString(channel))) =
            (&push.kind, push.data.first())
        {
            waiters.notify(channel);
        }
        Ok(())
    }
}

impl RedisStore {
    /// Connects to one server with the default settings.
    ///
    /// # Errors
    ///
    /// See [`Builder::connect`].
    ///
    /// # Example
    ///
    /// See the [crate docs](crate).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Builder::default().connect(url).await
    }

    /// The same connection under another key prefix: a separate namespace of records that
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
                replicas: self.shared.replicas,
                waiters: self.shared.waiters.clone(),
            }),
        }
    }

    /// A builder, for a prefix, timeouts, or Cluster.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::builder().prefix("tests").connect("redis://127.0.0.1").await?;
    /// # Ok(()) }
    /// ```
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The Redis key a record is stored under: `{prefix}:{{tag}}:{storage key}`, where the
    /// tag is a 64-bit FNV-1a digest of the storage key in hex. The tag puts the record and
    /// its wake-up channel in one Cluster slot whatever characters the key holds.
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

    fn channel(&self, redis_key: &str) -> String {
        // Same hash tag as the record (the first `{...}`), hence the same slot.
        format!("{redis_key}:wake")
    }

    /// The variants of the scripts that wake waiters, for this deployment.
    fn complete_script(&self) -> &'static scripts::Lua {
        match self.conn {
            Conn::Single(_) => &scripts::COMPLETE,
            Conn::Cluster(_) => &scripts::COMPLETE_SHARDED,
        }
    }

    fn release_script(&self) -> &'static scripts::Lua {
        match self.conn {
            Conn::Single(_) => &scripts::RELEASE,
            Conn::Cluster(_) => &scripts::RELEASE_SHARDED,
        }
    }

    fn publish_command(&self) -> &'static str {
        match self.conn {
            Conn::Single(_) => "PUBLISH",
            Conn::Cluster(_) => "SPUBLISH",
        }
    }

    async fn subscribe(&self, channel: &str) -> Result<(), RedisError> {
        match self.conn.clone() {
            Conn::Single(mut c) => c.subscribe(channel).await,
            Conn::Cluster(mut c) => c.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&self, channel: &str) -> Result<(), RedisError> {
        match self.conn.clone() {
            Conn::Single(mut c) => c.unsubscribe(channel).await,
            Conn::Cluster(mut c) => c.sunsubscribe(channel).await,
        }
    }

    /// The durability guard (see [`Builder::wait_for_replicas`]): `Ok` at once without it.
    async fn replicated(&self) -> Result<(), StoreError> {
        let Some((replicas, timeout)) = self.shared.replicas else {
            return Ok(());
        };
        let acked: i64 = redis::cmd("WAIT")
            .arg(replicas)
            .arg(ms(timeout))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(map_err)?;
        if acked >= replicas as i64 {
            Ok(())
        } else {
            Err(StoreError::unavailable(format!(
                "write acknowledged by {acked} of {replicas} replicas within {} ms",
                ms(timeout)
            )))
        }
    }

    /// `EVALSHA` of `lua` on `rkey` with `args`: one round trip. After a server restart
    /// (`NOSCRIPT`) the script is loaded and the call sent again. Built as one command
    /// rather than through `Script::invoke_async`, which copies every argument twice.
    async fn eval<T: redis::FromRedisValue>(
        &self,
        lua: &scripts::Lua,
        rkey: &str,
        args: impl FnOnce(&mut Cmd),
    ) -> Result<T, StoreError> {
        // Sized for the largest call (complete: the key, three arguments, one of them the
        // result), so the argument buffer is rarely grown while writing.
        let mut cmd = Cmd::with_capacity(10, 128 + 2 * rkey.len());
        cmd.arg("EVALSHA")
            .arg(lua.script.get_hash())
            .arg(1)
            .arg(rkey);
        args(&mut cmd);
        let mut conn = self.conn.clone();
        match cmd.query_async(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                tracing::debug!("script not in the server's cache (restarted?): loading it");
                // On a Cluster redis-rs sends SCRIPT LOAD to every primary.
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(&lua.source)
                    .query_async::<String>(&mut conn)
                    .await
                    .map_err(map_err)?;
                cmd.query_async(&mut conn).await.map_err(map_err)
            }
            other => other.map_err(map_err),
        }
    }
}

/// `begin.lua`'s first argument: the new record's flags byte and owner token, built here so
/// the script copies them in one piece.
struct OwnerWithFlags {
    owner: u128,
    fingerprint: bool,
}

impl ToRedisArgs for OwnerWithFlags {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = [0u8; 17];
        arg[0] = u8::from(self.fingerprint);
        arg[1..].copy_from_slice(&self.owner.to_be_bytes());
        out.write_arg(&arg);
    }
}

/// `complete.lua`'s outcome argument: the completed record's tail (kind, length, bytes),
/// written straight into the command without an intermediate buffer.
struct RecordTail<'a>(&'a Completion);

impl ToRedisArgs for RecordTail<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        use std::io::Write as _;
        let Completion { kind, bytes, .. } = self.0;
        // The record format's length field is 32 bits; `complete` refuses larger results
        // before building the command.
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        let mut w = out.writer_for_next_arg();
        // Writing into the command's own buffer cannot fail.
        let _ = w.write_all(&[kind.to_byte()]);
        let _ = w.write_all(&len.to_be_bytes());
        let _ = w.write_all(bytes);
    }
}

/// Clears the Redis-only "watched" flag of a reservation (see `lua/begin.lua`) so that the
/// bytes are exactly idemkit's record format.
fn clear_watched(bytes: &mut [u8]) {
    if bytes.len() > 5 && bytes.starts_with(b"IDK\x01\x01") {
        bytes[5] &= 1;
    }
}

/// `{prefix}:{<digest>}:{key}`, built by hand: `format!` with a hex width spec cost more
/// than the rest of a replay's client-side work put together (measured with callgrind).
fn key_for(prefix: &str, key: &StorageKey) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let key = key.as_str();
    let mut out = String::with_capacity(prefix.len() + key.len() + 21);
    out.push_str(prefix);
    out.push_str(":{");
    let tag = fnv1a(key.as_bytes());
    for shift in (0..16).rev() {
        out.push(HEX[(tag >> (shift * 4)) as usize & 0xf] as char);
    }
    out.push_str("}:");
    out.push_str(key);
    out
}

/// 64-bit FNV-1a: stable across processes and versions (it names keys), and fast.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn ms(d: Duration) -> u64 {
    // Round up: a sub-millisecond remainder must not shorten a TTL, and PX 0 is an error.
    let ms = d.as_millis() as u64;
    if Duration::from_millis(ms) < d {
        ms + 1
    } else {
        ms.max(1)
    }
}

/// Maps a Redis error to what the coordinator must do about it.
fn map_err(e: RedisError) -> StoreError {
    let kind = if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.code(),
            Some("LOADING" | "MASTERDOWN" | "CLUSTERDOWN" | "TRYAGAIN" | "BUSY")
        ) {
        StoreErrorKind::Unavailable
    } else if e.code() == Some("WRONGTYPE") {
        // Something else keeps a hash, list... under our key.
        StoreErrorKind::Corrupt
    } else {
        StoreErrorKind::Other
    };
    StoreError::new(kind, e)
}

fn int(v: Option<&Value>) -> Result<i64, StoreError> {
    match v {
        Some(Value::Int(i)) => Ok(*i),
        other => Err(unexpected(other)),
    }
}

fn unexpected(v: Option<&Value>) -> StoreError {
    StoreError::new(StoreErrorKind::Other, format!("unexpected reply {v:?}"))
}

fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
    Record::decode(bytes).map_err(StoreError::corrupt)
}

/// A release tombstone (see `lua/release.lua`): the key is free.
fn is_tombstone(bytes: &[u8]) -> bool {
    bytes.len() == 13 && bytes.starts_with(b"IDK\x01\x03")
}

impl Store for RedisStore {
    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Begin, StoreError> {
        let rkey = self.redis_key(req.key);
        let fingerprint = req.fingerprint.map(|f| f.to_bytes());
        let reply: Value = self
            .eval(&scripts::BEGIN, &rkey, |cmd| {
                cmd.arg(OwnerWithFlags {
                    owner: req.owner.as_u128(),
                    fingerprint: fingerprint.is_some(),
                })
                .arg(ms(req.lease))
                .arg(fingerprint.as_ref().map_or(&[][..], |f| &f[..]));
            })
            .await?;
        match reply {
            Value::Int(0) => Ok(Begin::Mismatch),
            Value::Int(fencing) => {
                self.replicated().await?;
                let fencing = FencingToken::new(fencing as u64);
                Ok(Begin::Reserved {
                    lease: Lease::new(req.owner, fencing),
                    took_over: false,
                })
            }
            // A completed record to replay (its result shares the reply's buffer), or
            // foreign bytes (decoding reports them).
            Value::BulkString(bytes) => {
                let record = Record::decode_shared(bytes.into()).map_err(StoreError::corrupt)?;
                match record.state {
                    RecordState::Completed(outcome) => {
                        Ok(Begin::Completed(Completed::new(record.fencing, outcome)))
                    }
                    _ => Err(StoreError::corrupt("a reservation returned as a result")),
                }
            }
            // A live reservation and its remaining lease.
            Value::Array(mut items) => {
                let pttl = int(items.get(1))?;
                let record = match items.first_mut() {
                    Some(Value::BulkString(b)) => {
                        clear_watched(b);
                        decode(b)?
                    }
                    other => return Err(unexpected(other.as_deref())),
                };
                Ok(Begin::InFlight {
                    retry_after: Duration::from_millis(pttl.max(0) as u64),
                    fencing: record.fencing,
                })
            }
            other => Err(unexpected(Some(&other))),
        }
    }

    async fn renew(
        &self,
        key: &StorageKey,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let rkey = self.redis_key(key);
        let renewed: i64 = self
            .eval(&scripts::RENEW, &rkey, |cmd| {
                cmd.arg(&lease.owner.as_u128().to_be_bytes()[..])
                    .arg(ms(ttl));
            })
            .await?;
        if renewed == 1 {
            Ok(())
        } else {
            Err(StoreError::lease_lost())
        }
    }

    async fn complete(
        &self,
        key: &StorageKey,
        lease: &Lease,
        completion: &Completion,
    ) -> Result<(), StoreError> {
        if u32::try_from(completion.bytes.len()).is_err() {
            // The record's length field is 32 bits (and Redis refuses values over 512 MB).
            return Err(StoreError::new(
                StoreErrorKind::Rejected,
                "a result of 4 GiB or more cannot be stored",
            ));
        }
        let rkey = self.redis_key(key);
        let done: i64 = self
            .eval(self.complete_script(), &rkey, |cmd| {
                cmd.arg(&lease.owner.as_u128().to_be_bytes()[..])
                    .arg(ms(completion.ttl))
                    .arg(RecordTail(completion));
            })
            .await?;
        if done != 1 {
            return Err(StoreError::lease_lost());
        }
        self.replicated().await
    }

    async fn release(&self, key: &StorageKey, lease: &Lease) -> Result<(), StoreError> {
        let rkey = self.redis_key(key);
        let done: i64 = self
            .eval(self.release_script(), &rkey, |cmd| {
                cmd.arg(&lease.owner.as_u128().to_be_bytes()[..]);
            })
            .await?;
        if done == 1 {
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
        let rkey = self.redis_key(key);
        let channel = self.channel(&rkey);
        let (notify, first) = self.shared.waiters.join(channel.as_bytes());
        // Created before subscribing: a message from then on is not lost.
        let notified = notify.notified();
        let result = async {
            if first {
                self.subscribe(&channel).await.map_err(map_err)?;
            }
            // Subscribed; now check the reservation is still the live state and ask for a
            // wake-up (the owner may have finished between the caller's `begin` and here).
            let pttl: i64 = self
                .eval(&scripts::WATCH, &rkey, |cmd| {
                    cmd.arg(&seen.get().to_be_bytes()[..]);
                })
                .await?;
            if pttl > 0 {
                // Never past the lease: an owner that died publishes nothing.
                let until = timeout.min(Duration::from_millis(pttl as u64));
                let _ = tokio::time::timeout(until, notified).await;
            }
            Ok(())
        }
        .await;
        if self.shared.waiters.leave(channel.as_bytes()) {
            // Nobody else waits on this key here: unsubscribe in the background, off the
            // waiter's path (a failure only leaves a harmless subscription until reconnect).
            let store = self.clone();
            tokio::spawn(async move {
                if let Err(e) = store.unsubscribe(&channel).await {
                    tracing::debug!(error = %e, "unsubscribe failed");
                }
            });
        }
        result
    }

    async fn get(&self, key: &StorageKey) -> Result<Option<Record>, StoreError> {
        let rkey = self.redis_key(key);
        // Redis keeps the expiry as the key's PX; read it with Redis' own clock.
        let mut pipe = Pipeline::new();
        pipe.cmd("TIME").get(&rkey).pttl(&rkey);
        let ((secs, micros), bytes, pttl): ((u64, u64), Option<Vec<u8>>, i64) = pipe
            .query_async(&mut self.conn.clone())
            .await
            .map_err(map_err)?;
        match bytes {
            Some(mut b) if !is_tombstone(&b) => {
                clear_watched(&mut b);
                let mut record = decode(&b)?;
                // Redis writes no creation time (see `lua/begin.lua`): it is the fencing
                // token's, which is Redis' clock in microseconds at the reservation.
                if record.created_at_ms == 0 {
                    record.created_at_ms = record.fencing.get() / 1000;
                }
                record.expires_at_ms = secs * 1000 + micros / 1000 + pttl.max(0) as u64;
                Ok(Some(record))
            }
            _ => Ok(None),
        }
    }
}

impl RawStore for RedisStore {
    async fn put_raw(
        &self,
        key: &StorageKey,
        bytes: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        redis::cmd("SET")
            .arg(self.redis_key(key))
            .arg(&bytes[..])
            .arg("PX")
            .arg(ms(ttl))
            .query_async::<()>(&mut self.conn.clone())
            .await
            .map_err(map_err)
    }

    async fn purge(&self, key: &StorageKey) -> Result<bool, StoreError> {
        let rkey = self.redis_key(key);
        let mut pipe = Pipeline::new();
        pipe.del(&rkey)
            .cmd(self.publish_command())
            .arg(self.channel(&rkey))
            .arg("")
            .ignore();
        let (deleted,): (i64,) = pipe
            .query_async(&mut self.conn.clone())
            .await
            .map_err(map_err)?;
        Ok(deleted > 0)
    }
}

// ===== connection =====

/// A single-node or Cluster connection, behind one `ConnectionLike` so scripts and
/// pipelines run on either.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_milliseconds() {
        assert_eq!(ms(Duration::from_millis(1_500)), 1_500);
        assert_eq!(ms(Duration::from_micros(1_500_001)), 1_501);
        assert_eq!(ms(Duration::from_nanos(1)), 1);
        assert_eq!(ms(Duration::ZERO), 1);
    }

    #[test]
    fn redis_keys_carry_the_digest_as_a_hash_tag() {
        let sk = StorageKey::new(
            &idemkit_core::Operation::new("op").unwrap(),
            None,
            &idemkit_core::Key::new("a{b}").unwrap(),
        );
        let digest = format!("{:016x}", fnv1a(sk.as_str().as_bytes()));
        assert_eq!(key_for("p", &sk), format!("p:{{{digest}}}:{}", sk.as_str()));
    }

    #[test]
    fn fnv1a_is_the_reference_function() {
        // Published test vectors of 64-bit FNV-1a.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
