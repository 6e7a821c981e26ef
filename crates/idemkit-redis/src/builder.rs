//! Configuring and connecting a [`RedisStore`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use idemkit_core::StoreError;
use redis::aio::ConnectionManagerConfig;
use redis::cluster::ClusterClientBuilder;
use redis::{ConnectionInfo, IntoConnectionInfo, ProtocolVersion};

use crate::RedisStore;
use crate::conn::Conn;
use crate::durable::{Durable, Opener};
use crate::errors::map_err;
use crate::eviction::{EvictionCheck, check_eviction};
use crate::secure::{Credentials, Pem, Tls, connect_err, crypto_provider, plain_url_with_tls};
use crate::sentinel::{Follower, MakeClient, MakeSentinel, SentinelUrl};
use crate::wake::{Waiters, push_handler};

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
pub struct RedisStoreBuilder {
    prefix: String,
    response_timeout: Duration,
    connection_timeout: Duration,
    replicas: Option<(usize, Duration)>,
    /// `WAITAOF` for the guard: `Some(local)` (see `wait_for_aof`).
    aof: Option<bool>,
    eviction: EvictionCheck,
    /// `None`: the default of the client the lanes are on (see `coalesce`).
    coalesce: Option<bool>,
    plain_begins: bool,
    own_client: bool,
    /// `None`: the default of the client the lanes are on.
    connections: Option<usize>,
    tls: Tls,
    credentials: Option<Credentials>,
}

/// Connections per single-server store on redis-rs: two let Redis and the client work at
/// once. The store's own client needs one (it sends early, see `wire`), and one lane
/// gathers every caller's commands into few writes (measured in docs/benchmarks.md).
const DEFAULT_CONNECTIONS: usize = 2;
const DEFAULT_OWN_CONNECTIONS: usize = 1;

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        RedisStoreBuilder {
            prefix: "idemkit".to_string(),
            response_timeout: Duration::from_secs(1),
            connection_timeout: Duration::from_secs(1),
            replicas: None,
            aof: None,
            eviction: EvictionCheck::Warn,
            coalesce: None,
            plain_begins: true,
            own_client: true,
            connections: None,
            tls: Tls::default(),
            credentials: None,
        }
    }
}

impl RedisStoreBuilder {
    /// The namespace every key starts with (default `idemkit`). It must not contain `{` or
    /// `}` (they would break Cluster hash tags); such characters are replaced with `_`.
    ///
    /// # Example
    ///
    /// See [`RedisStoreBuilder`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into().replace(['{', '}'], "_");
        self
    }

    /// How long a command may take before it fails as unavailable (default 1 s). On the
    /// store's own client ([`own_client`](Self::own_client)) one watchdog a connection
    /// times its commands, ticking every eighth of this: a command is answered within an
    /// eighth more than it.
    ///
    /// # Example
    ///
    /// See [`RedisStoreBuilder`].
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The durability guard: after each reservation, renewal and completion, wait until
    /// `replicas` replicas acknowledged the write (`WAIT replicas timeout`), and report the
    /// store unavailable if they did not within `timeout`. A renewal the replicas did not
    /// acknowledge is a failed renewal (retried, as any): the lease end the owner counts on
    /// is one a promoted replica keeps.
    ///
    /// Redis replicates asynchronously: without the guard, a failover that promotes a
    /// replica which missed the last writes loses those reservations and results, and the
    /// action can run again. The guard narrows that window to writes whose acknowledgement
    /// is still in flight, at the cost of one more round trip on each write phase and on
    /// each replay: a replay writes its record's expiry again, unchanged, and waits too, so
    /// that it is called stored only once the replicas have the record (a replay they do not
    /// acknowledge in time still returns the stored value, with `Receipt::stored` false).
    /// Each guarded write and its `WAIT` run on a connection checked out for
    /// that call (a small pool, opened on demand), so a slow `WAIT` holds up only its own
    /// caller; on a Cluster `WAIT` goes to the key's primary only.
    ///
    /// A reservation that is not acknowledged is released again (by its owner token) and
    /// `begin` fails as unavailable: the action does not run under fail-closed, and under
    /// fail-open it runs unprotected without a reservation left behind. A completion that
    /// is not acknowledged is reported like any completion failure (retried while the lease
    /// lasts, then logged and counted).
    ///
    /// What the guard needs of the deployment: `WAIT` counts *any* `replicas` replicas that
    /// acknowledged, so an acknowledged write survives a failover only if the promoted
    /// replica is one of them. Either set `replicas` to every replica of the primary
    /// (connected or not: a replica whose link is down counts too, so that a write it misses
    /// is not acknowledged), or fail over by replication offset, promoting the most
    /// up-to-date replica (Redis Sentinel and Cluster failovers do; a promotion by hand with
    /// `REPLICAOF NO ONE` of any replica does not). With fewer, and a failover that promotes
    /// a replica that lagged, a result called stored is lost and its action can run again
    /// (`tests/replicas.rs`, `an_acknowledged_write_survives_a_failover_only_when_every_replica_counts`).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// use std::time::Duration;
    /// // A primary with one replica: every replica acknowledges each write.
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .wait_for_replicas(1, Duration::from_millis(100))
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replicas = (replicas > 0).then_some((replicas, timeout));
        self.aof = None;
        self
    }

    /// The durability guard for keys that move money (issue 52): as
    /// [`wait_for_replicas`](Self::wait_for_replicas), but each reservation, renewal,
    /// completion and replay waits until the write is **on disk**: in the primary's own
    /// append-only file when `local`, and in the append-only files of `replicas` replicas
    /// (`WAITAOF local replicas timeout`), so the action starts, and its result is called
    /// stored, only once the record survives a crash of the primary (`local`) and a failover
    /// (`replicas`, under the same deployment rule as `wait_for_replicas`: every replica, or
    /// failovers by replication offset). Replaces `wait_for_replicas`' `WAIT` (the last of
    /// the two called applies); `local` false and `replicas` 0 turns the guard off.
    ///
    /// Needs `WAITAOF` (Redis 7.2 and later, Valkey 7.2 and later) and, for `local`, the
    /// append-only file on (`appendonly yes`; replicas counted need theirs on too). The
    /// store asks the server at connect, by sending the command itself (not by reading its
    /// version): a server without it, or with `local` and no append-only file, fails
    /// [`connect`](Self::connect) with `StoreErrorKind::Rejected`. A write not on disk in
    /// time is answered as `wait_for_replicas` answers one not replicated: `begin` fails as
    /// unavailable (its reservation released), a completion is retried while the lease
    /// lasts. Costs what the guard costs (a connection of its own per guarded write, no
    /// coalescing) plus the disk: with `appendfsync everysec`, up to a second a write.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// use std::time::Duration;
    /// // On the primary's disk and on one replica's before the charge runs.
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .wait_for_aof(true, 1, Duration::from_secs(2))
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn wait_for_aof(mut self, local: bool, replicas: usize, timeout: Duration) -> Self {
        let on = local || replicas > 0;
        self.replicas = on.then_some((replicas, timeout));
        self.aof = on.then_some(local);
        self
    }

    /// What to do when the server's `maxmemory-policy` is not `noeviction` (checked once at
    /// connect; on a Cluster, on one primary). Under any `volatile-*` or `allkeys-*` policy
    /// Redis silently evicts reservations and records when it is full, and actions run
    /// again. Default [`EvictionCheck::Warn`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// use idemkit_redis::{EvictionCheck, RedisStore};
    /// let store = RedisStore::builder()
    ///     .eviction_check(EvictionCheck::Refuse)
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn eviction_check(mut self, check: EvictionCheck) -> Self {
        self.eviction = check;
        self
    }

    /// Whether concurrent `begin`s (and `complete`s) are coalesced: while one is on the
    /// wire, later ones queue and go out together as one script call or pipeline when it
    /// answers (one script entry and one clock read for many keys, which is most of what a
    /// call costs Redis: fewer instructions per miss, docs/benchmarks.md); nothing waits
    /// when nothing is queued. Each connection (see [`connections`](Self::connections)) has
    /// its own queues. Applies to one server without
    /// [`wait_for_replicas`](Self::wait_for_replicas); a Cluster never coalesces (keys of one
    /// slot rarely meet).
    ///
    /// Default: on for connections on redis-rs, **off on the store's own client**
    /// ([`own_client`](Self::own_client), the default for `redis://`), which already
    /// pipelines every caller's commands on its connection and sends them in few writes:
    /// there coalescing saved the server little and held calls back (at 64 concurrent
    /// first deliveries, 1.7× the misses a second on Valkey 9 and 1.2× on Redis 7 without
    /// it; docs/benchmarks.md, "Coalescing on the store's own client"). Off, each call is
    /// sent on its own: a `begin` as the plain pipeline (see
    /// [`plain_begins`](Self::plain_begins)), or as the script when its connection has
    /// nothing else on the wire (one reply to read rather than three).
    /// A queued call waits for room on the wire, so with coalescing on the store declares
    /// no bound of its own ([`Store::call_timeout`](idemkit_core::Store::call_timeout) is
    /// `None`) and the coordinator times each call with the policy's `store_timeout`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .coalesce(false)
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn coalesce(mut self, on: bool) -> Self {
        self.coalesce = Some(on);
        self
    }

    /// Whether first deliveries' `begin`s may go out as plain commands: `TIME`, then `SET
    /// key reservation NX PX lease GET` per key, then `TIME`, pipelined in one round trip,
    /// rather than a `begin` script: about half the server's work for a fresh key
    /// (docs/benchmarks.md). The fencing token is then stamped by the client from its
    /// estimate of the server's clock and kept only when the two `TIME`s prove it greater
    /// than every earlier token of the key; otherwise the script takes it again from the
    /// server's clock, in the same call (ARCHITECTURE row R13). Whatever the key holds (a
    /// completed record to replay, a reservation, a tombstone) is answered as the script
    /// answers it. Coalesced batches and `begin_many` go plain, and every `begin` when
    /// [`coalesce`](Self::coalesce) is off; a `begin` that goes alone to an idle lane stays
    /// the script, which costs the client less. Default on; applies to one server (a single
    /// node or behind Sentinel) without [`wait_for_replicas`](Self::wait_for_replicas): a
    /// Cluster and the durability guard keep the script. Off sends every `begin` as the
    /// script (for comparison).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .plain_begins(false)
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn plain_begins(mut self, on: bool) -> Self {
        self.plain_begins = on;
        self
    }

    /// Whether the connections that carry the calls (every command about a key: see
    /// [`connections`](Self::connections)) are the store's own client rather than redis-rs'
    /// connection manager: one pipelining TCP connection per lane that parses replies in
    /// place, fewer client instructions a call (measured in docs/benchmarks.md, "The store's
    /// own client").
    /// The store then opens one redis-rs connection more, for subscriptions (waiters'
    /// wake-ups) and its other commands (scans, the eviction check). Applies to a plain
    /// `redis://` URL (one server, without TLS); `rediss://`, Sentinel and Cluster keep
    /// redis-rs. Default on; off puts the calls on redis-rs' connections (for comparison).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .own_client(false)
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn own_client(mut self, on: bool) -> Self {
        self.own_client = on;
        self
    }

    /// How many connections to one server the store spreads its calls over (at least 1;
    /// by default 1 on the store's own client, [`own_client`](Self::own_client), the
    /// default on a plain `redis://` URL, and 2 on redis-rs). Each key always uses the same
    /// one, so a key's commands keep their order. On one redis-rs connection the client and
    /// Redis take turns: Redis idles while the client reads a batch of replies, and the
    /// client idles while Redis runs the next batch; with two, Redis runs one connection's
    /// commands while the client handles the other's replies. The store's own client does
    /// not take turns on one connection (a caller sends the requests gathered so far once
    /// sixteen wait, so Redis starts on them while the client handles the rest), and one
    /// connection gathers every caller's commands into the same writes: fewer, larger
    /// writes and reads on both sides. Both choices are measured in
    /// docs/benchmarks.md ("One connection"). Pub/sub for wake-ups uses the first, or, with
    /// the store's own client, one connection more. A Cluster ignores it (it keeps one
    /// connection per node), and so does Sentinel (one connection, which follows the master).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .connections(1)
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = Some(n.max(1));
        self
    }

    /// Trust only this certificate authority (PEM) for a `rediss://` server's certificate,
    /// instead of the system's roots: a managed Redis whose certificate a private
    /// authority signed. Read when the store connects; a file that cannot be read fails the
    /// connect. Given with a plain `redis://` URL, the connect fails rather than talk in
    /// plain text.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .tls_ca_file("/etc/idemkit/redis-ca.pem")
    ///     .connect("rediss://app:secret@redis.internal:6380")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls.ca = Some(Pem::File(path.into()));
        self
    }

    /// [`tls_ca_file`](Self::tls_ca_file) with the PEM's bytes.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(ca: Vec<u8>) -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .tls_ca_pem(ca)
    ///     .connect("rediss://redis.internal:6380")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(Pem::Bytes(pem.into()));
        self
    }

    /// The client certificate and its private key (PEM files) a `rediss://` server that
    /// authenticates clients by certificate asks for (`tls-auth-clients yes`). Read when the
    /// store connects.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .tls_ca_file("ca.pem")
    ///     .tls_client_cert_files("client.pem", "client.key")
    ///     .connect("rediss://redis.internal:6380")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tls_client_cert_files(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.tls.client = Some((Pem::File(cert.into()), Pem::File(key.into())));
        self
    }

    /// [`tls_client_cert_files`](Self::tls_client_cert_files) with the PEMs' bytes.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(cert: Vec<u8>, key: Vec<u8>) -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .tls_client_cert_pem(cert, key)
    ///     .connect("rediss://redis.internal:6380")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tls_client_cert_pem(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((Pem::Bytes(cert.into()), Pem::Bytes(key.into())));
        self
    }

    /// Authenticates as an ACL user (`AUTH username password`), overriding any user and
    /// password in the URL. The user needs the store's commands (`EVAL`, `EVALSHA`,
    /// `SCRIPT`, `GET`, `SET`, `SUBSCRIBE`; `WAIT` for the durability guard) on its keys and
    /// channels, which all start with the [prefix](Self::prefix) and a colon: `~prefix:*
    /// &prefix:*`. `CONFIG` may be refused (the eviction check then only warns).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// // ACL SETUSER worker on >s3cret ~jobs:* &jobs:* +@all -@dangerous
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .prefix("jobs")
    ///     .user("worker", "s3cret")
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn user(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            user: Some(username.into()),
            password: password.into(),
        });
        self
    }

    /// Authenticates the default user with `password` (`requirepass`), overriding any in the
    /// URL.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .password("s3cret")
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            user: None,
            password: password.into(),
        });
        self
    }

    /// A node's connection info with the builder's credentials and RESP3.
    fn connection_info(&self, info: ConnectionInfo) -> ConnectionInfo {
        let mut settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        if let Some(credentials) = &self.credentials {
            if let Some(user) = &credentials.user {
                settings = settings.set_username(user);
            }
            settings = settings.set_password(&credentials.password);
        }
        info.set_redis_settings(settings)
    }

    /// A client for one server, with the builder's TLS material (refused on a plain URL).
    fn client(&self, info: ConnectionInfo) -> Result<redis::Client, StoreError> {
        let info = self.connection_info(info);
        match self.tls.certificates()? {
            None => redis::Client::open(info).map_err(map_err),
            Some(certs) => {
                if !matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
                    return Err(plain_url_with_tls());
                }
                redis::Client::build_with_tls(info, certs).map_err(map_err)
            }
        }
    }

    /// How long connecting may take (default 1 s).
    ///
    /// # Example
    ///
    /// See [`RedisStoreBuilder`].
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Connects to one Redis server: a `redis://` URL, or `rediss://` for TLS (the server's
    /// certificate checked against the system's roots, or [`tls_ca_file`](Self::tls_ca_file);
    /// `rediss://…/#insecure` skips the check, for tests only). A user and password in the
    /// URL (`redis://user:password@host:port/db`) authenticate as that ACL user. The
    /// connection reconnects by itself; calls made while it is down fail as
    /// [`StoreErrorKind::Unavailable`](idemkit_core::StoreErrorKind::Unavailable).
    ///
    /// # Errors
    ///
    /// An invalid URL, or a server that cannot be reached now.
    ///
    /// # Example
    ///
    /// See [`RedisStore::builder`].
    pub async fn connect(self, url: &str) -> Result<RedisStore, StoreError> {
        crypto_provider();
        if let Some(sentinel) = SentinelUrl::parse(url) {
            let sentinel = sentinel?;
            let mut builder = self;
            if let (None, Some(password)) = (&builder.credentials, sentinel.password) {
                builder.credentials = Some(Credentials {
                    user: sentinel.username,
                    password,
                });
            }
            return builder
                .sentinel(
                    sentinel.sentinels,
                    sentinel.master,
                    sentinel.tls,
                    sentinel.db,
                )
                .await;
        }
        let info = url.into_connection_info().map_err(map_err)?;
        let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        let own = match (self.own_client, info.addr()) {
            (true, redis::ConnectionAddr::Tcp(host, port)) => {
                let settings = self.connection_info(info.clone());
                let settings = settings.redis_settings();
                Some(crate::wire::Settings {
                    host: host.clone(),
                    port: *port,
                    username: settings.username().map(str::to_owned),
                    password: settings.password().map(str::to_owned),
                    db: settings.db(),
                    connection_timeout: self.connection_timeout,
                    response_timeout: self.response_timeout,
                })
            }
            _ => None,
        };
        let client = self.client(info)?;
        let waiters = Arc::new(Waiters::default());
        let config = self.manager_config(&waiters);
        let manager = client
            .get_connection_manager_with_config(config.clone())
            .await
            .map_err(|e| connect_err(e, tls))?;
        let manager = Conn::Single(manager);
        let opener = Opener::Single(Box::new(client.clone()));
        let connections = self.connections.unwrap_or(if own.is_some() {
            DEFAULT_OWN_CONNECTIONS
        } else {
            DEFAULT_CONNECTIONS
        });
        let mut lanes = Vec::with_capacity(connections + 1);
        if let Some(settings) = own {
            // The first connection (a redis-rs one) carries the subscriptions only.
            for _ in 0..connections {
                let wire = crate::wire::Wire::connect(settings.clone())
                    .await
                    .map_err(|e| connect_err(e, false))?;
                lanes.push(Conn::Own(wire));
            }
            return self.finish(manager, lanes, opener, waiters).await;
        }
        lanes.push(manager.clone());
        for _ in 1..connections {
            let lane = client
                .get_connection_manager_with_config(config.clone())
                .await
                .map_err(|e| connect_err(e, tls))?;
            lanes.push(Conn::Single(lane));
        }
        self.finish(manager, lanes, opener, waiters).await
    }

    /// Connects to the master that Redis Sentinel names `master`, found through any of
    /// `sentinels` (their addresses: `redis://host:26379`, or `rediss://` for TLS to the
    /// sentinels and the master), and follows it: after a failover, the first call that
    /// fails on the old master (its connection dropped or refused, `READONLY` from a
    /// demoted one) makes the store ask the sentinels again and move to the new master, with
    /// its waiters subscribed again there. The failed call itself fails as unavailable. The
    /// builder's credentials, TLS material and response timeout apply to the master (the
    /// sentinels get the TLS material, not the credentials); one connection carries every
    /// call ([`connections`](Self::connections) does not apply). The same from a URL:
    /// [`connect`](Self::connect) with
    /// `redis+sentinel://[user:password@]host:port[,host:port…]/master[/db]`.
    ///
    /// Records survive a failover only if the promoted replica had them: with the
    /// durability guard ([`wait_for_replicas`](Self::wait_for_replicas)) every reservation
    /// and completion is acknowledged by the replicas first, and Sentinel promotes the
    /// replica with the largest replication offset.
    ///
    /// # Errors
    ///
    /// No sentinel given, no sentinel answering, a master name the sentinels do not know
    /// (`Other`), or a master that cannot be reached now.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idemkit_core::StoreError> {
    /// use std::time::Duration;
    /// let store = idemkit_redis::RedisStore::builder()
    ///     .wait_for_replicas(1, Duration::from_millis(100))
    ///     .connect_sentinel(["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"], "mymaster")
    ///     .await?;
    /// // or: .connect("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster")
    /// # Ok(()) }
    /// ```
    pub async fn connect_sentinel<I, U>(
        self,
        sentinels: I,
        master: &str,
    ) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator<Item = U>,
        U: IntoConnectionInfo,
    {
        crypto_provider();
        let sentinels = sentinels
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<Result<Vec<_>, _>>()
            .map_err(map_err)?;
        let tls = sentinels
            .iter()
            .any(|s| matches!(s.addr(), redis::ConnectionAddr::TcpTls { .. }));
        self.sentinel(sentinels, master.to_string(), tls, 0).await
    }

    async fn sentinel(
        self,
        sentinels: Vec<ConnectionInfo>,
        master: String,
        tls: bool,
        db: i64,
    ) -> Result<RedisStore, StoreError> {
        let waiters = Arc::new(Waiters::default());
        let config = self.manager_config(&waiters);
        let for_master = self.clone();
        let make_client: MakeClient = Box::new(move |host, port| {
            let scheme = if tls { "rediss" } else { "redis" };
            let info = format!("{scheme}://{host}:{port}/{db}")
                .into_connection_info()
                .map_err(map_err)?;
            for_master.client(info)
        });
        let for_sentinels = self.tls.clone();
        let make_sentinel: MakeSentinel =
            Box::new(move |info| match for_sentinels.certificates()? {
                Some(certs) if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) => {
                    redis::Client::build_with_tls(info.clone(), certs).map_err(map_err)
                }
                _ => redis::Client::open(info.clone()).map_err(map_err),
            });
        let follower = Follower::connect(
            sentinels,
            master,
            make_client,
            make_sentinel,
            config,
            self.connection_timeout.max(self.response_timeout),
            waiters.clone(),
        )
        .await?;
        let conn = Conn::Sentinel(follower.clone());
        self.finish(
            conn.clone(),
            vec![conn],
            Opener::Sentinel(follower),
            waiters,
        )
        .await
    }

    /// The configuration of a store's shared connections.
    fn manager_config(&self, waiters: &Arc<Waiters>) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            .set_number_of_retries(1)
            .set_automatic_resubscription()
            .set_push_sender(push_handler(waiters.clone()))
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://`, or `rediss://` for a
    /// Cluster over TLS: the builder's TLS material and credentials apply to every node).
    ///
    /// # Errors
    ///
    /// Invalid URLs, or no node reachable now.
    ///
    /// # Example
    ///
    /// See [`RedisStoreBuilder`].
    pub async fn connect_cluster<I, U>(self, nodes: I) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator<Item = U>,
        U: IntoConnectionInfo,
    {
        crypto_provider();
        let waiters = Arc::new(Waiters::default());
        let nodes = nodes
            .into_iter()
            .map(|n| n.into_connection_info().map(|i| self.connection_info(i)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(map_err)?;
        let tls = nodes
            .iter()
            .any(|n| matches!(n.addr(), redis::ConnectionAddr::TcpTls { .. }));
        let mut builder = ClusterClientBuilder::new(nodes)
            .use_protocol(ProtocolVersion::RESP3)
            .response_timeout(self.response_timeout)
            .connection_timeout(self.connection_timeout)
            .push_sender(push_handler(waiters.clone()));
        if let Some(certs) = self.tls.certificates()? {
            if !tls {
                return Err(plain_url_with_tls());
            }
            builder = builder.certs(certs);
        }
        let client = builder.build().map_err(map_err)?;
        let conn = Conn::Cluster(
            client
                .get_async_connection()
                .await
                .map_err(|e| connect_err(e, tls))?,
        );
        let opener = Opener::Cluster(Box::new(client));
        self.finish(conn.clone(), vec![conn], opener, waiters).await
    }

    /// What both connects share once connected: the eviction check, the durability guard
    /// (its connections come from `opener`) and the call bound. `lanes`: the connections
    /// commands about keys take (`conn` among them, except with `own_client`).
    async fn finish(
        self,
        mut conn: Conn,
        lanes: Vec<Conn>,
        opener: Opener,
        waiters: Arc<Waiters>,
    ) -> Result<RedisStore, StoreError> {
        check_eviction(&mut conn, self.eviction).await?;
        let limit = self.call_limit();
        let durable = self
            .replicas
            .map(|(n, timeout)| Durable::new(n, timeout, self.aof, self.response_timeout, opener));
        if let Some(d) = &durable {
            d.probe().await?;
        }
        let (durable_off, cluster) = (durable.is_none(), matches!(conn, Conn::Cluster(_)));
        let own = lanes.iter().all(|l| matches!(l, Conn::Own(_)));
        let coalesce = self.coalesce.unwrap_or(!own) && durable_off && !cluster;
        let store = RedisStore::new(
            conn,
            lanes,
            self.prefix,
            durable,
            waiters,
            crate::Timeouts {
                // A queued (coalesced) call waits for room on the wire, untimed: no bound
                // of ours holds then, and the coordinator times every call itself.
                call: if coalesce { None } else { limit },
                response: self.response_timeout,
            },
            coalesce,
            self.plain_begins && durable_off && !cluster,
        );
        // Whether completions can be plain `SET … IFEQ`s: asked now, not on the first call.
        store.ask_conditional_set().await?;
        Ok(store)
    }

    /// The longest one store call can take (see `Store::call_timeout`) without coalescing:
    /// a script call is at most three commands (`EVALSHA`, and after `NOSCRIPT` a `SCRIPT
    /// LOAD` and the `EVALSHA` again), each bounded by the response timeout, plus one
    /// reconnect; four response timeouts more cover what comes before it: a `begin`'s
    /// replay read (`GET`) and its plain pipeline (`stamp`), and a `begin` whose first lane failed fast and is sent on the
    /// next one, or a wait's subscribe step (bounded by the response timeout itself), or a
    /// completion's plain `SET … IFEQ` and the probe before it after a reload (`plain`). With the
    /// durability guard, none: a guarded write also opens connections and waits for
    /// replicas, and the coordinator times it itself. With coalescing, none either (see
    /// `connect`). Eight response timeouts for the seven commands: the store's own client
    /// answers a command within an eighth more than its response timeout (`wire::watch`).
    fn call_limit(&self) -> Option<Duration> {
        if self.replicas.is_some() {
            return None;
        }
        Some(self.response_timeout * 8 + self.connection_timeout.max(self.response_timeout))
    }
}
