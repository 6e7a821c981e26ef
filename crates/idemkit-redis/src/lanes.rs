//! Lanes: the connections of a single-server store, and which one a command takes
//! (ARCHITECTURE row 35).

use std::sync::atomic::Ordering;

use crate::RedisStore;
use crate::coalesce::{BeginJob, Coalescer, CompleteJob};
use crate::conn::Conn;
use crate::keys;

/// One connection of a single-server store with its two queues. Every command about a key
/// goes through the key's lane (chosen by its hash tag), so a key's commands reach Redis in
/// the order they were sent, as on one connection; different lanes let Redis run one
/// connection's commands while the client reads another's replies (ARCHITECTURE row 35).
pub(crate) struct Lane {
    pub(crate) conn: Conn,
    pub(crate) begins: Coalescer<BeginJob>,
    pub(crate) completes: Coalescer<CompleteJob>,
}

impl Lane {
    pub(crate) fn new(conn: Conn) -> Self {
        Lane {
            conn,
            begins: Coalescer::default(),
            completes: Coalescer::default(),
        }
    }
}

impl RedisStore {
    /// The connection of a Redis key's lane.
    pub(crate) fn lane_conn(&self, rkey: &str) -> Conn {
        self.shared.lanes[self.lane(rkey)].conn.clone()
    }

    /// The lane of a Redis key of this store (see `Shared::lanes`).
    pub(crate) fn lane(&self, rkey: &str) -> usize {
        keys::lane(self.shared.prefix.len(), rkey, self.shared.lanes.len())
    }

    /// The lane of a `begin`: the lanes in turn, whatever the key. A begin is its caller's
    /// first command on the key and is never on the wire beside another of that caller's
    /// commands, so no order is at stake; taking turns spreads a hot key's replays too.
    pub(crate) fn begin_lane(&self) -> usize {
        let lanes = self.shared.lanes.len();
        if lanes == 1 {
            return 0;
        }
        self.shared.next_begin.fetch_add(1, Ordering::Relaxed) % lanes
    }
}
