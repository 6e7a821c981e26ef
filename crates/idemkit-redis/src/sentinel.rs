//! Redis behind Sentinel: the master found through the sentinels at connect, and found again
//! after a failover.
//!
//! The store talks to the master through one auto-reconnecting connection, as to a single
//! server. What Sentinel adds is that the master's address changes: after a failover the old
//! master is down (its connection refused) or demoted to a replica, which Sentinel makes drop
//! its clients (`CLIENT KILL`) and which refuses writes (`READONLY`). Any such error on a
//! call makes the store ask the sentinels for the master again (`SENTINEL
//! get-master-addr-by-name`, each in turn, the answer checked with `ROLE`), at most every
//! 250 ms; if it is another server the store swaps to a connection to it, subscribed again to
//! every channel that has waiters, and sends the failed command once more there. A call that
//! still fails (the sentinels have not promoted anyone yet) fails as unavailable: a
//! fail-closed caller ran nothing, and its retry goes to the new master.
//!
//! What it keeps: the records are the master's; a failover that promotes a replica which
//! missed the last writes loses them unless the durability guard waited for that replica
//! ([`RedisStoreBuilder::wait_for_replicas`](crate::RedisStoreBuilder::wait_for_replicas):
//! Sentinel promotes the replica with the largest replication offset). A waiter's push sent
//! during the swap is lost; the waiter wakes at the lease's end at the latest, as after any
//! lost push (ARCHITECTURE row R4).

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use idemkit_core::{StoreError, StoreErrorKind};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionInfo, IntoConnectionInfo, RedisError, Value};
use tokio::time::Instant;

use crate::wake::Waiters;

/// Makes a client for the master at `(host, port)`: the builder's scheme, TLS material,
/// credentials, database and protocol.
pub(crate) type MakeClient =
    Box<dyn Fn(&str, u16) -> Result<redis::Client, StoreError> + Send + Sync>;

/// Makes a client for a sentinel: the builder's TLS material for a `rediss://` one.
pub(crate) type MakeSentinel =
    Box<dyn Fn(&ConnectionInfo) -> Result<redis::Client, StoreError> + Send + Sync>;

/// The master's connection, and how to find the next one.
pub(crate) struct Follower {
    sentinels: Vec<ConnectionInfo>,
    master: String,
    make_client: MakeClient,
    make_sentinel: MakeSentinel,
    config: ConnectionManagerConfig,
    timeout: Duration,
    waiters: Arc<Waiters>,
    state: RwLock<State>,
    /// One refresh at a time, and none more often than every [`REFRESH_EVERY`].
    refreshing: tokio::sync::Mutex<Option<Instant>>,
    /// Dropped with the store: its announcement listener ends.
    _alive: tokio::sync::watch::Sender<()>,
}

#[derive(Clone)]
struct State {
    generation: u64,
    addr: (String, u16),
    manager: ConnectionManager,
    client: redis::Client,
}

const REFRESH_EVERY: Duration = Duration::from_millis(250);

impl Follower {
    /// Asks the sentinels for `master`'s address and connects to it.
    pub(crate) async fn connect(
        sentinels: Vec<ConnectionInfo>,
        master: String,
        make_client: MakeClient,
        make_sentinel: MakeSentinel,
        config: ConnectionManagerConfig,
        timeout: Duration,
        waiters: Arc<Waiters>,
    ) -> Result<Arc<Follower>, StoreError> {
        if sentinels.is_empty() {
            return Err(StoreError::new(
                StoreErrorKind::Other,
                "no sentinel given: a Sentinel store needs at least one sentinel's address",
            ));
        }
        let (addr, client) =
            find_master(&sentinels, &master, &make_client, &make_sentinel, timeout).await?;
        let manager = client
            .get_connection_manager_with_config(config.clone())
            .await
            .map_err(crate::errors::map_err)?;
        let (alive, dropped) = tokio::sync::watch::channel(());
        let follower = Arc::new(Follower {
            sentinels,
            master,
            make_client,
            make_sentinel,
            config,
            timeout,
            waiters,
            state: RwLock::new(State {
                generation: 0,
                addr,
                manager,
                client,
            }),
            refreshing: tokio::sync::Mutex::new(None),
            _alive: alive,
        });
        // The sentinels announce a failover (`+switch-master`): the store moves at once,
        // not at its next failed call. Until then a forced failover leaves the old master
        // taking writes its successor never sees.
        tokio::spawn(watch(Arc::downgrade(&follower), dropped));
        Ok(follower)
    }

    /// The current master's connection, and its generation (see [`Follower::failed`]).
    pub(crate) fn current(&self) -> (u64, ConnectionManager) {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        (state.generation, state.manager.clone())
    }

    /// A client for the current master (the durability guard's dedicated connections).
    pub(crate) fn client(&self) -> redis::Client {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .client
            .clone()
    }

    /// The current master's address.
    pub(crate) fn master_addr(&self) -> (String, u16) {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .addr
            .clone()
    }

    /// A call on generation `generation`'s connection failed with `e`. If `e` may mean a
    /// failover, the sentinels are asked again: the new master's connection if the master
    /// moved (now, or by another caller's refresh since), for the call to be sent again there.
    /// Sending it again is safe: every command of the store is conditional on its caller's
    /// tokens (a `begin` sent again by its owner finds its own reservation, a completion its
    /// own record, ARCHITECTURE rows 10 and 24), and one the old master refused wrote nothing.
    pub(crate) async fn failed(
        &self,
        e: &RedisError,
        generation: u64,
    ) -> Option<ConnectionManager> {
        if !may_be_failover(e) {
            return None;
        }
        self.refresh(generation, false).await
    }

    /// Asks the sentinels for the master, unless the store moved since generation `seen`
    /// or (unless `announced`: a sentinel said the master moved) asked a moment ago.
    async fn refresh(&self, seen: u64, announced: bool) -> Option<ConnectionManager> {
        let mut last = self.refreshing.lock().await;
        let (now, current) = self.current();
        if now != seen {
            return Some(current); // another caller moved to the new master meanwhile
        }
        if !announced && last.is_some_and(|at| at.elapsed() < REFRESH_EVERY) {
            return None; // asked a moment ago: the same master
        }
        *last = Some(Instant::now());
        let (addr, client) = match find_master(
            &self.sentinels,
            &self.master,
            &self.make_client,
            &self.make_sentinel,
            self.timeout,
        )
        .await
        {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!(error = %e, "no master from the sentinels yet");
                return None;
            }
        };
        if addr == self.master_addr() {
            return None; // the same master: a passing failure
        }
        let mut manager = match client
            .get_connection_manager_with_config(self.config.clone())
            .await
        {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "the new master does not answer yet");
                return None;
            }
        };
        // The waiters' channels, on the new master: a completion there publishes there.
        for channel in self.waiters.channels() {
            if let Err(e) = manager.subscribe(&channel).await {
                tracing::debug!(error = %e, "resubscribing after a failover");
            }
        }
        tracing::warn!(
            master = %self.master,
            host = %addr.0,
            port = addr.1,
            "followed a Sentinel failover to the new master"
        );
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        *state = State {
            generation: state.generation + 1,
            addr,
            manager: manager.clone(),
            client,
        };
        Some(manager)
    }
}

/// Listens to the sentinels' `+switch-master` announcements, one sentinel at a time (the
/// next one when it goes away), and moves the store when its master is named. After a
/// (re)subscription the master is asked for too: an announcement may have been missed.
/// Ends with the store.
async fn watch(follower: std::sync::Weak<Follower>, mut dropped: tokio::sync::watch::Receiver<()>) {
    use futures_util::StreamExt as _;
    let mut turn = 0usize;
    loop {
        let Some(f) = follower.upgrade() else { return };
        let sentinel = f.sentinels[turn % f.sentinels.len()].clone();
        turn += 1;
        let subscribed = async {
            let mut pubsub = (f.make_sentinel)(&sentinel)
                .ok()?
                .get_async_pubsub()
                .await
                .ok()?;
            pubsub.subscribe("+switch-master").await.ok()?;
            Some(pubsub)
        };
        let Some(pubsub) = tokio::time::timeout(f.timeout, subscribed)
            .await
            .ok()
            .flatten()
        else {
            drop(f);
            tokio::time::sleep(REFRESH_EVERY).await;
            continue;
        };
        let master = f.master.clone();
        f.refresh(f.current().0, true).await;
        drop(f);
        let mut messages = pubsub.into_on_message();
        loop {
            let message = tokio::select! {
                // The store was dropped (the sender with it): stop listening.
                _ = dropped.changed() => return,
                message = messages.next() => message,
            };
            let Some(message) = message else { break };
            // `<master> <old ip> <old port> <new ip> <new port>`
            let payload: String = message.get_payload().unwrap_or_default();
            if payload.split(' ').next() != Some(master.as_str()) {
                continue;
            }
            let Some(f) = follower.upgrade() else { return };
            f.refresh(f.current().0, true).await;
        }
        tokio::time::sleep(REFRESH_EVERY).await;
    }
}

/// An error after which the master may have moved: its connection dropped or refused, a
/// timeout, a write refused by a replica (`READONLY`), a master that lost its sentinels or
/// its link (`MASTERDOWN`, `LOADING`).
fn may_be_failover(e: &RedisError) -> bool {
    matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_io_error()
}

/// Asks each sentinel in turn for `master`'s address, and keeps the first whose server
/// says it is a master (`ROLE`).
async fn find_master(
    sentinels: &[ConnectionInfo],
    master: &str,
    make_client: &MakeClient,
    make_sentinel: &MakeSentinel,
    timeout: Duration,
) -> Result<((String, u16), redis::Client), StoreError> {
    let mut last = None;
    for sentinel in sentinels {
        match ask(sentinel, master, make_client, make_sentinel, timeout).await {
            Ok(found) => return Ok(found),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| StoreError::unavailable("no sentinel answered")))
}

async fn ask(
    sentinel: &ConnectionInfo,
    master: &str,
    make_client: &MakeClient,
    make_sentinel: &MakeSentinel,
    timeout: Duration,
) -> Result<((String, u16), redis::Client), StoreError> {
    let unavailable = |e: RedisError| StoreError::unavailable(e);
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let mut conn = make_sentinel(sentinel)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(unavailable)?;
    let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(master)
        .query_async(&mut conn)
        .await
        .map_err(unavailable)?;
    let Some((host, port)) = addr else {
        return Err(StoreError::new(
            StoreErrorKind::Other,
            format!("the sentinels know no master named {master:?}"),
        ));
    };
    let client = make_client(&host, port)?;
    let mut node = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(unavailable)?;
    let role: Value = redis::cmd("ROLE")
        .query_async(&mut node)
        .await
        .map_err(unavailable)?;
    let is_master = match &role {
        Value::Array(parts) => {
            matches!(parts.first(), Some(Value::BulkString(b)) if b == b"master")
        }
        _ => false,
    };
    if !is_master {
        return Err(StoreError::unavailable(format!(
            "{host}:{port}, named master by a sentinel, is not one (yet)"
        )));
    }
    Ok(((host, port), client))
}

/// A Sentinel URL: `redis+sentinel://[user:password@]host:port[,host:port…]/master[/db]`
/// (`rediss+sentinel://` for TLS to the master and the sentinels). The sentinels' addresses,
/// the master's name, and the master's connection settings (scheme, credentials, db).
pub(crate) struct SentinelUrl {
    pub(crate) sentinels: Vec<ConnectionInfo>,
    pub(crate) master: String,
    pub(crate) tls: bool,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
}

impl SentinelUrl {
    /// `None` if `url` is not a Sentinel URL.
    pub(crate) fn parse(url: &str) -> Option<Result<SentinelUrl, StoreError>> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("rediss+sentinel://") {
            (true, rest)
        } else {
            return None;
        };
        Some(Self::parse_rest(tls, rest))
    }

    fn parse_rest(tls: bool, rest: &str) -> Result<SentinelUrl, StoreError> {
        let bad = |what: &str| {
            StoreError::new(
                StoreErrorKind::Other,
                format!(
                    "a Sentinel URL is redis+sentinel://[user:password@]host:port[,host:port...]/master[/db]: {what}"
                ),
            )
        };
        let (authority, path) = rest.split_once('/').ok_or_else(|| bad("no master name"))?;
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => match u.split_once(':') {
                Some((user, pw)) => ((!user.is_empty()).then(|| decode(user)), Some(decode(pw))),
                None => (None, Some(decode(u))),
            },
        };
        let mut segments = path.trim_end_matches('/').split('/');
        let master = segments
            .next()
            .filter(|m| !m.is_empty())
            .ok_or_else(|| bad("no master name"))?
            .to_string();
        let db = match segments.next() {
            None => 0,
            Some(db) => db
                .parse()
                .map_err(|_| bad("the database is not a number"))?,
        };
        let scheme = if tls { "rediss" } else { "redis" };
        let sentinels = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| {
                let h = if h.contains(':') {
                    h.to_string()
                } else {
                    format!("{h}:26379")
                };
                format!("{scheme}://{h}")
                    .into_connection_info()
                    .map_err(crate::errors::map_err)
            })
            .collect::<Result<Vec<_>, _>>()?;
        if sentinels.is_empty() {
            return Err(bad("no sentinel address"));
        }
        Ok(SentinelUrl {
            sentinels,
            master,
            tls,
            username,
            password,
            db,
        })
    }
}

/// Percent-decoding of a URL's user or password.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%' && i + 2 < bytes.len())
            .then(|| std::str::from_utf8(&bytes[i + 1..i + 3]).ok())
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
