//! The durability guard: a guarded write and its `WAIT` run on a connection checked out for
//! that call alone, so a `WAIT` blocks only its own caller (on the shared multiplexed
//! connection it would stall every other command of the process behind it), and on a
//! Cluster `WAIT` goes to the key's primary only.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use idemkit_core::StoreError;
use redis::cluster::ClusterClient;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{AsyncConnectionConfig, Cmd, Value};

use crate::conn::Conn;
use crate::errors::map_err;
use crate::keys::{ms, slot};
use crate::scripts::{self, eval_on};

/// How to open a connection of its own.
pub(crate) enum Opener {
    Single(Box<redis::Client>),
    Cluster(Box<ClusterClient>),
    /// The current master behind Sentinel.
    Sentinel(std::sync::Arc<crate::sentinel::Follower>),
}

/// Connections for guarded writes, reused: at most `IDLE` are kept; more are opened when
/// that many guarded writes run at once, and closed after.
pub(crate) struct Durable {
    pub(crate) replicas: usize,
    pub(crate) timeout: Duration,
    /// `WAITAOF` instead of `WAIT` (issue 52): `Some(local)`, the write also in the primary's
    /// own append-only file when `local`, and `replicas` means replicas that have it in
    /// theirs, not only in memory.
    pub(crate) aof: Option<bool>,
    response_timeout: Duration,
    opener: Opener,
    idle: Mutex<Vec<Conn>>,
}

const IDLE: usize = 16;

impl Durable {
    pub(crate) fn new(
        replicas: usize,
        timeout: Duration,
        aof: Option<bool>,
        response_timeout: Duration,
        opener: Opener,
    ) -> Self {
        Durable {
            replicas,
            timeout,
            aof,
            response_timeout,
            opener,
            idle: Mutex::default(),
        }
    }

    /// A connection no other call uses until [`checkin`](Durable::checkin).
    pub(crate) async fn checkout(&self) -> Result<Conn, StoreError> {
        while let Some(c) = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
        {
            // One to a master that Sentinel replaced since is closed, not reused.
            if let Conn::Pinned(p) = &c
                && p.generation != p.follower.current().0
            {
                continue;
            }
            return Ok(c);
        }
        // The `WAIT` itself may take `timeout`: the connection's own limit must allow it.
        let limit = self.response_timeout + self.timeout;
        match &self.opener {
            Opener::Single(client) => {
                let config = AsyncConnectionConfig::new().set_response_timeout(Some(limit));
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map(Conn::Dedicated)
                    .map_err(map_err)
            }
            Opener::Cluster(client) => client
                .get_async_connection()
                .await
                .map(Conn::Cluster)
                .map_err(map_err),
            Opener::Sentinel(follower) => {
                let config = AsyncConnectionConfig::new().set_response_timeout(Some(limit));
                let (generation, _) = follower.current();
                let conn = follower
                    .client()
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(map_err)?;
                Ok(Conn::Pinned(Box::new(crate::conn::Pinned {
                    follower: follower.clone(),
                    generation,
                    conn,
                    config,
                })))
            }
        }
    }

    /// Returns a connection that is still good.
    pub(crate) fn checkin(&self, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < IDLE {
            idle.push(conn);
        }
    }

    /// `WAIT replicas timeout` (or `WAITAOF local replicas timeout`) on `conn`, which just
    /// wrote `redis_key` (both count the writes of their own connection); on a Cluster, sent
    /// to the key's primary only.
    pub(crate) async fn replicated(
        &self,
        conn: &mut Conn,
        redis_key: &str,
    ) -> Result<(), StoreError> {
        let cmd = self.command();
        let reply = self.send(conn, redis_key, cmd).await?;
        self.acknowledged(reply)
    }

    /// The guard's command.
    fn command(&self) -> Cmd {
        let timeout = self.timeout;
        match self.aof {
            None => {
                let mut cmd = redis::cmd("WAIT");
                cmd.arg(self.replicas).arg(ms(timeout));
                cmd
            }
            Some(local) => {
                let mut cmd = redis::cmd("WAITAOF");
                cmd.arg(u8::from(local)).arg(self.replicas).arg(ms(timeout));
                cmd
            }
        }
    }

    async fn send(&self, conn: &mut Conn, redis_key: &str, cmd: Cmd) -> Result<Value, StoreError> {
        match conn {
            Conn::Cluster(c) => {
                let route = Route::new(slot(redis_key), SlotAddr::Master);
                c.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await
            }
            other => cmd.query_async::<Value>(other).await,
        }
        .map_err(map_err)
    }

    /// Whether the guard's reply says the write is where the guard asks it to be.
    fn acknowledged(&self, reply: Value) -> Result<(), StoreError> {
        let int = |v: Option<&Value>| match v {
            Some(Value::Int(n)) => Ok(*n),
            other => Err(crate::errors::unexpected(other)),
        };
        match self.aof {
            None => {
                let acked = int(Some(&reply))?;
                if acked >= self.replicas as i64 {
                    return Ok(());
                }
                Err(StoreError::unavailable(format!(
                    "write acknowledged by {acked} of {} replicas within {} ms",
                    self.replicas,
                    ms(self.timeout)
                )))
            }
            Some(local) => {
                // `[local fsyncs, replicas that fsynced]`.
                let Value::Array(counts) = &reply else {
                    return Err(crate::errors::unexpected(Some(&reply)));
                };
                let (on_disk, replicas) = (int(counts.first())?, int(counts.get(1))?);
                if on_disk >= i64::from(local) && replicas >= self.replicas as i64 {
                    return Ok(());
                }
                Err(StoreError::unavailable(format!(
                    "write in the append-only file locally: {}, on {replicas} of {} replicas, within {} ms",
                    if on_disk > 0 { "yes" } else { "no" },
                    self.replicas,
                    ms(self.timeout)
                )))
            }
        }
    }

    /// At connect, for `WAITAOF`: whether the server has it and can do what it is asked
    /// (the capability itself, not the version string: a server without the command, or
    /// without an append-only file when `local`, refuses it at once). A fresh connection has
    /// written nothing, so the probe returns at once on a server that can.
    pub(crate) async fn probe(&self) -> Result<(), StoreError> {
        let Some(local) = self.aof else {
            return Ok(());
        };
        let mut conn = self.checkout().await?;
        let mut cmd = redis::cmd("WAITAOF");
        cmd.arg(u8::from(local)).arg(0).arg(1);
        match cmd.query_async::<Value>(&mut conn).await {
            Ok(_) => {
                self.checkin(conn);
                Ok(())
            }
            Err(e)
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
                    || e.code().is_some() =>
            {
                Err(StoreError::new(
                    idemkit_core::StoreErrorKind::Rejected,
                    format!(
                        "the durability guard needs WAITAOF{} (Redis 7.2 and later, Valkey): the server refused it: {e}",
                        if local {
                            " with the append-only file on (appendonly yes)"
                        } else {
                            ""
                        }
                    ),
                ))
            }
            Err(e) => Err(map_err(e)),
        }
    }
}

/// The guarded half of [`RedisStore::eval_guarded`].
pub(crate) async fn eval(
    durable: &Durable,
    lua: &scripts::Lua,
    rkey: &str,
    args: impl FnOnce(&mut Cmd),
    needs_wait: impl FnOnce(&Value) -> bool,
) -> Result<(Value, Result<(), StoreError>), StoreError> {
    let mut conn = durable.checkout().await?;
    let reply: Value = eval_on(&mut conn, lua, rkey, args).await?;
    let acked = if needs_wait(&reply) {
        durable.replicated(&mut conn, rkey).await
    } else {
        Ok(())
    };
    // Acknowledged, or a clean "not enough replicas" answer: the connection is fine to reuse.
    let reusable = match &acked {
        Ok(()) => true,
        Err(e) => e.is_unavailable(),
    };
    if reusable {
        durable.checkin(conn);
    }
    Ok((reply, acked))
}
