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
    response_timeout: Duration,
    opener: Opener,
    idle: Mutex<Vec<Conn>>,
}

const IDLE: usize = 16;

impl Durable {
    pub(crate) fn new(
        replicas: usize,
        timeout: Duration,
        response_timeout: Duration,
        opener: Opener,
    ) -> Self {
        Durable {
            replicas,
            timeout,
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

    /// `WAIT replicas timeout` on `conn`, which just wrote `redis_key` (`WAIT` counts the
    /// writes of its own connection); on a Cluster, sent to the key's primary only.
    pub(crate) async fn replicated(
        &self,
        conn: &mut Conn,
        redis_key: &str,
    ) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.replicas).arg(ms(self.timeout));
        let reply = match conn {
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
        .map_err(map_err)?;
        let acked = match reply {
            Value::Int(n) => n,
            other => return Err(crate::errors::unexpected(Some(&other))),
        };
        if acked >= self.replicas as i64 {
            Ok(())
        } else {
            Err(StoreError::unavailable(format!(
                "write acknowledged by {acked} of {} replicas within {} ms",
                self.replicas,
                ms(self.timeout)
            )))
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
