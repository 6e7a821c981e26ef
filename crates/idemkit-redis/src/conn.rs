//! One connection type for single-node, dedicated and Cluster connections, so scripts and
//! pipelines run on any of them.

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::sentinel::Follower;

#[derive(Clone)]
pub(crate) enum Conn {
    /// The shared, auto-reconnecting connection to one server.
    Single(ConnectionManager),
    /// A connection of its own, checked out for one guarded write (see `durable`).
    Dedicated(MultiplexedConnection),
    /// A Cluster connection (one connection per node inside).
    Cluster(ClusterConnection),
    /// The store's own connection to one server, for its lanes (see `wire`).
    Own(crate::wire::Wire),
    /// The master behind Sentinel, followed after a failover (see `sentinel`).
    Sentinel(Arc<Follower>),
    /// A connection of its own to the master behind Sentinel, checked out for one guarded
    /// write: moved to the new master, and the command sent again there, after a failover.
    Pinned(Box<Pinned>),
}

/// See [`Conn::Pinned`].
pub(crate) struct Pinned {
    pub(crate) follower: Arc<Follower>,
    pub(crate) generation: u64,
    pub(crate) conn: MultiplexedConnection,
    pub(crate) config: redis::AsyncConnectionConfig,
}

impl Clone for Pinned {
    fn clone(&self) -> Self {
        Pinned {
            follower: self.follower.clone(),
            generation: self.generation,
            conn: self.conn.clone(),
            config: self.config.clone(),
        }
    }
}

impl Pinned {
    /// After `e` on this connection: a connection to the new master if the master moved.
    async fn moved(&mut self, e: &redis::RedisError) -> Option<()> {
        self.follower.failed(e, self.generation).await?;
        let (generation, _) = self.follower.current();
        let conn = self
            .follower
            .client()
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .ok()?;
        (self.generation, self.conn) = (generation, conn);
        Some(())
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Own(w) => Box::pin(w.command(cmd)),
            Conn::Dedicated(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Pinned(p) => Box::pin(async move {
                match p.conn.req_packed_command(cmd).await {
                    Err(e) => match p.moved(&e).await {
                        Some(()) => p.conn.req_packed_command(cmd).await,
                        None => Err(e),
                    },
                    reply => reply,
                }
            }),
            Conn::Sentinel(f) => {
                let (generation, mut master) = f.current();
                let f = f.clone();
                Box::pin(async move {
                    match master.req_packed_command(cmd).await {
                        Err(e) => match f.failed(&e, generation).await {
                            Some(mut next) => next.req_packed_command(cmd).await,
                            None => Err(e),
                        },
                        reply => reply,
                    }
                })
            }
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
            Conn::Own(w) => Box::pin(w.pipeline(cmd, offset, count)),
            Conn::Dedicated(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Pinned(p) => Box::pin(async move {
                match p.conn.req_packed_commands(cmd, offset, count).await {
                    Err(e) => match p.moved(&e).await {
                        Some(()) => p.conn.req_packed_commands(cmd, offset, count).await,
                        None => Err(e),
                    },
                    replies => replies,
                }
            }),
            Conn::Sentinel(f) => {
                let (generation, mut master) = f.current();
                let f = f.clone();
                Box::pin(async move {
                    match master.req_packed_commands(cmd, offset, count).await {
                        Err(e) => match f.failed(&e, generation).await {
                            Some(mut next) => next.req_packed_commands(cmd, offset, count).await,
                            None => Err(e),
                        },
                        replies => replies,
                    }
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Own(w) => w.db(),
            Conn::Dedicated(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(f) => f.current().1.get_db(),
            Conn::Pinned(p) => p.conn.get_db(),
        }
    }
}
