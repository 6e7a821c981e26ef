//! Listing and fenced removal for operators' tools ([`Scan`]): `SCAN` with a `MATCH` on our
//! prefix (node by node on a Cluster, never `KEYS`), then one read-only script per key found
//! (`lua/peek.lua`: bytes, time left and the server's clock together), sent concurrently
//! over the multiplexed connection.

use idemkit_core::scan::{Listed, Scan, ScanCursor, ScanPage};
use idemkit_core::{FencingToken, Operation, Record, StorageKey, StoreError, StoreErrorKind};
use redis::Value;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use crate::RedisStore;
use crate::conn::Conn;
use crate::errors::{decode, int, is_tombstone, map_err, unexpected};
use crate::scripts::eval_on;
use crate::scripts::{self, clear_watched};

/// The record a `GET` returned, with its expiry from `PTTL` and Redis' clock: `None` for a
/// release tombstone; `Corrupt` for bytes that are not a record of ours.
pub(crate) fn record_at(
    mut bytes: Vec<u8>,
    now_ms: u64,
    pttl: i64,
) -> Result<Option<Record>, StoreError> {
    if is_tombstone(&bytes) {
        return Ok(None);
    }
    clear_watched(&mut bytes);
    let mut record = decode(&bytes)?;
    // Redis writes no creation time (see `lua/begin.lua`): it is the fencing token's, which
    // is Redis' clock in microseconds at the reservation.
    if record.created_at_ms == 0 {
        record.created_at_ms = record.fencing.get() / 1000;
    }
    record.expires_at_ms = now_ms + pttl.max(0) as u64;
    Ok(Some(record))
}

/// `*`, `?`, `[`, `]` and `\` match literally in a `SCAN MATCH` pattern once escaped.
fn glob_escape(text: &str, out: &mut String) {
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// Where a walk stands: the `SCAN` cursor, and on a Cluster the primary it walks, by
/// address (review L7: an index into the primaries named another node once the topology
/// changed, and the walk skipped or repeated whole nodes).
#[derive(Debug, PartialEq, Eq)]
struct Cursor {
    at: u64,
    node: Option<(String, u16)>,
}

impl Cursor {
    /// The cursor's text: `{SCAN cursor}` on one server, `{SCAN cursor}@{host}:{port}` on a
    /// Cluster.
    fn parse(cursor: Option<&ScanCursor>) -> Result<Cursor, StoreError> {
        let Some(c) = cursor else {
            return Ok(Cursor { at: 0, node: None });
        };
        let text = c.as_str();
        let parsed = match text.split_once('@') {
            None => text.parse().ok().map(|at| Cursor { at, node: None }),
            Some((at, addr)) => addr.rsplit_once(':').and_then(|(host, port)| {
                Some(Cursor {
                    at: at.parse().ok()?,
                    node: Some((host.to_owned(), port.parse().ok()?)),
                })
            }),
        };
        parsed.ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Rejected,
                format!("{text:?} is not a Redis scan cursor"),
            )
        })
    }

    fn text(at: u64, node: Option<&(String, u16)>) -> ScanCursor {
        ScanCursor::new(match node {
            None => format!("{at}"),
            Some((host, port)) => format!("{at}@{host}:{port}"),
        })
    }

    /// Which of the Cluster's primaries (in address order) the walk goes on with, and from
    /// which `SCAN` cursor: the one it names; if that one is no longer a primary (a failover,
    /// a node removed), the next in address order from its start (the keys it held may be
    /// missed: a walk across a topology change is best effort, as `SCAN` is).
    fn resume(&self, primaries: &[(String, u16)]) -> Option<(usize, u64)> {
        let Some(node) = &self.node else {
            return (!primaries.is_empty()).then_some((0, self.at));
        };
        match primaries.binary_search(node) {
            Ok(i) => Some((i, self.at)),
            Err(i) => (i < primaries.len()).then_some((i, 0)),
        }
    }
}

/// The Cluster's primaries, `(host, port)` in address order, from `CLUSTER SHARDS`'
/// predecessor `CLUSTER SLOTS` (Redis 3 and later).
async fn primaries(conn: &mut Conn) -> Result<Vec<(String, u16)>, StoreError> {
    let slots: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(conn)
        .await
        .map_err(map_err)?;
    let mut out = Vec::new();
    let Value::Array(ranges) = slots else {
        return Err(unexpected(Some(&slots)));
    };
    for range in ranges {
        // [start, end, [host, port, id, ...], replicas...]
        if let Value::Array(parts) = range
            && let Some(Value::Array(primary)) = parts.get(2)
            && let (Some(host), Some(Value::Int(port))) = (primary.first(), primary.get(1))
        {
            let host = match host {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                other => return Err(unexpected(Some(other))),
            };
            out.push((host, *port as u16));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// A `peek.lua` reply (the key's bytes, its PTTL and its node's `TIME`, read together on the
/// key's own node) as a record; `None` if the key is gone.
pub(crate) fn peeked(reply: Value) -> Result<Option<Record>, StoreError> {
    let Value::Array(parts) = reply else {
        return Err(unexpected(Some(&reply)));
    };
    let [bytes, pttl, time] = <[Value; 3]>::try_from(parts)
        .map_err(|p| StoreError::new(StoreErrorKind::Other, format!("{p:?}")))?;
    let Value::BulkString(bytes) = bytes else {
        return Ok(None);
    };
    record_at(bytes, millis_of(&time)?, int(Some(&pttl))?)
}

fn millis_of(time: &Value) -> Result<u64, StoreError> {
    let Value::Array(parts) = time else {
        return Err(unexpected(Some(time)));
    };
    let field = |i: usize| -> Result<u64, StoreError> {
        match parts.get(i) {
            Some(Value::BulkString(b)) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| unexpected(Some(time))),
            Some(v) => int(Some(v)).map(|n| n as u64),
            None => Err(unexpected(Some(time))),
        }
    };
    Ok(field(0)? * 1000 + field(1)? / 1000)
}

impl RedisStore {
    /// The storage key under a Redis key of ours: `{prefix}:{<16 hex>}:{storage key}`.
    fn storage_key_of(&self, rkey: &str) -> Option<StorageKey> {
        let rest = rkey.strip_prefix(self.shared.prefix.as_str())?;
        let rest = rest.strip_prefix(":{")?;
        let (tag, text) = rest.split_at_checked(16)?;
        let text = text.strip_prefix("}:")?;
        if !tag.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let (op, scope, key) = StorageKey::parse(text)?;
        let sk = StorageKey::new(&op, scope.as_ref(), &key);
        // A key built by hand with the wrong tag is not one of ours.
        (self.redis_key(&sk) == rkey).then_some(sk)
    }

    /// The server's `maxmemory-policy` (`noeviction` is the only policy that never evicts
    /// reservations and records: every key of ours has a TTL, so `volatile-*` policies evict
    /// them too). On a Cluster, the policy of the node that answers.
    ///
    /// # Errors
    ///
    /// The store's errors; `Rejected` where the server forbids `CONFIG`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(store: idemkit_redis::RedisStore) -> Result<(), idemkit_core::StoreError> {
    /// if store.eviction_policy().await? != "noeviction" {
    ///     eprintln!("a full server would evict records: set maxmemory-policy noeviction");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn eviction_policy(&self) -> Result<String, StoreError> {
        let config: std::collections::HashMap<String, String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(map_err)?;
        Ok(config.get("maxmemory-policy").cloned().unwrap_or_default())
    }
}

/// The most `SCAN` calls one page makes, and the most keys one of them asks Redis to examine
/// (a `SCAN` blocks the server while it examines: 16,384 keys is about a millisecond).
const SCAN_CALLS_PER_PAGE: usize = 8;
const SCAN_EXAMINE_MAX: usize = 16_384;

/// Lists the keys under this store's prefix only: other prefixes, other applications' keys
/// and tombstones are never listed, and [`Scan::remove`] only deletes a record of ours.
impl Scan for RedisStore {
    async fn scan(
        &self,
        operation: Option<&Operation>,
        cursor: Option<&ScanCursor>,
        count: usize,
    ) -> Result<ScanPage, StoreError> {
        let cursor = Cursor::parse(cursor)?;
        let mut pattern = String::new();
        glob_escape(&self.shared.prefix, &mut pattern);
        pattern.push_str(":{*}:");
        if let Some(op) = operation {
            glob_escape(op.as_str(), &mut pattern);
            pattern.push(':');
        }
        pattern.push('*');
        // `COUNT` is how many keys Redis examines, not how many match: on a server crowded
        // with other keys, one `SCAN` per page would make a walk of mostly empty pages. A page
        // keeps calling while it has found fewer than `count`, and examines four times more
        // keys after a call that found none (growing after a call that found some would let a
        // page swallow a small keyspace whole).
        let mut conn = self.conn.clone();
        let (route, nodes, node, at) = match &mut conn {
            Conn::Cluster(c) => {
                let nodes = primaries(&mut Conn::Cluster(c.clone())).await?;
                let Some((node, at)) = cursor.resume(&nodes) else {
                    return Ok(ScanPage::new(Vec::new(), None, 0));
                };
                let (host, port) = nodes[node].clone();
                let route =
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                (Some(route), nodes, node, at)
            }
            _ => (None, Vec::new(), 0, cursor.at),
        };
        let want = count.max(1);
        let (mut at, mut examine, mut calls) = (at, want, 0);
        let mut rkeys: Vec<String> = Vec::new();
        let next_at = loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(at)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(examine);
            let reply = match (&mut conn, &route) {
                (Conn::Cluster(c), Some(route)) => c
                    .route_command(scan, route.clone())
                    .await
                    .map_err(map_err)?,
                (other, _) => scan.query_async(other).await.map_err(map_err)?,
            };
            let (next_at, found): (u64, Vec<String>) = redis::from_redis_value(reply)
                .map_err(|e| StoreError::new(StoreErrorKind::Other, e))?;
            let empty = found.is_empty();
            rkeys.extend(found);
            calls += 1;
            if next_at == 0 || rkeys.len() >= want || calls == SCAN_CALLS_PER_PAGE {
                break next_at;
            }
            at = next_at;
            if empty {
                examine = (examine * 4).min(SCAN_EXAMINE_MAX);
            }
        };
        let next = if next_at != 0 {
            Some(Cursor::text(next_at, nodes.get(node)))
        } else {
            nodes.get(node + 1).map(|next| Cursor::text(0, Some(next)))
        };
        let ours: Vec<(String, StorageKey)> = rkeys
            .into_iter()
            .filter_map(|r| self.storage_key_of(&r).map(|k| (r, k)))
            .collect();
        let reads = ours.iter().map(|(rkey, _)| {
            let mut conn = self.conn.clone();
            async move { eval_on::<Value>(&mut conn, &scripts::PEEK, rkey, |_| {}).await }
        });
        let replies = futures_util::future::join_all(reads).await;
        let mut now_ms = 0;
        let mut entries = Vec::with_capacity(ours.len());
        for ((_, key), reply) in ours.into_iter().zip(replies) {
            let Value::Array(parts) = reply? else {
                continue;
            };
            let [bytes, pttl, time] = <[Value; 3]>::try_from(parts)
                .map_err(|p| StoreError::new(StoreErrorKind::Other, format!("{p:?}")))?;
            now_ms = millis_of(&time)?;
            let Value::BulkString(bytes) = bytes else {
                continue; // expired or deleted since the SCAN
            };
            let size = bytes.len() as u64;
            match record_at(bytes, now_ms, int(Some(&pttl))?) {
                Ok(Some(record)) => entries.push(Listed::new(key, Some(record), size)),
                Ok(None) => {}
                Err(e) if e.kind() == StoreErrorKind::Corrupt => {
                    entries.push(Listed::new(key, None, size));
                }
                Err(e) => return Err(e),
            }
        }
        if now_ms == 0 {
            let time: Value = redis::cmd("TIME")
                .query_async(&mut self.conn.clone())
                .await
                .map_err(map_err)?;
            now_ms = millis_of(&time)?;
        }
        Ok(ScanPage::new(entries, next, now_ms))
    }

    async fn remove(&self, key: &StorageKey, fencing: FencingToken) -> Result<bool, StoreError> {
        let lua = match self.conn {
            Conn::Cluster(_) => &scripts::REMOVE_SHARDED,
            _ => &scripts::REMOVE,
        };
        let rkey = self.redis_key(key);
        let removed: i64 = eval_on(&mut self.lane_conn(&rkey), lua, &rkey, |cmd| {
            cmd.arg(&fencing.get().to_be_bytes()[..]);
        })
        .await?;
        Ok(removed == 1)
    }
}

#[cfg(test)]
mod cursor_tests {
    use super::*;

    fn node(port: u16) -> (String, u16) {
        ("127.0.0.1".to_owned(), port)
    }

    #[test]
    fn a_cursor_names_its_node_by_address_and_reads_back() {
        for (at, n) in [
            (0, None),
            (17, None),
            (5, Some(node(7001))),
            (0, Some(node(9))),
        ] {
            let text = Cursor::text(at, n.as_ref());
            let back = Cursor::parse(Some(&text)).unwrap();
            assert_eq!(back, Cursor { at, node: n });
        }
        let v6 = ScanCursor::new("3@::1:7000");
        assert_eq!(
            Cursor::parse(Some(&v6)).unwrap().node,
            Some(("::1".to_owned(), 7000))
        );
        for bad in ["x", "1@host", "1@host:port", ""] {
            assert!(
                Cursor::parse(Some(&ScanCursor::new(bad))).is_err(),
                "{bad:?}"
            );
        }
    }

    /// Review L7: a node added before the cursor's in address order, or the cursor's node
    /// gone, must not send the walk back over nodes it walked or past nodes it did not.
    #[test]
    fn a_walk_resumes_at_its_node_after_a_topology_change() {
        let at_b = Cursor {
            at: 42,
            node: Some(node(7002)),
        };
        // Before: index 1 of [7001, 7002, 7003]; a node 7000 added made index 1 name 7001.
        let grown = [node(7000), node(7001), node(7002), node(7003)];
        assert_eq!(at_b.resume(&grown), Some((2, 42)));
        // 7002 failed over to 7005: go on with the next primary in order, from its start.
        let moved = [node(7001), node(7003), node(7005)];
        assert_eq!(at_b.resume(&moved), Some((1, 0)));
        // Nothing after it any more: the walk is over.
        assert_eq!(at_b.resume(&[node(7001)]), None);
    }
}
