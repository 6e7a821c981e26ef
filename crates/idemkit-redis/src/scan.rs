//! Listing and fenced removal for operators' tools ([`Scan`]): `SCAN` with a `MATCH` on our
//! prefix (node by node on a Cluster, never `KEYS`), then one read-only script per key found
//! (`lua/peek.lua`: bytes, time left and the server's clock together), sent concurrently
//! over the multiplexed connection.

use idemkit_core::scan::{Listed, Scan, ScanCursor, ScanPage};
use idemkit_core::{FencingToken, Operation, Record, StorageKey, StoreError, StoreErrorKind};
use redis::Value;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use crate::conn::Conn;
use crate::errors::{decode, int, is_tombstone, map_err, unexpected};
use crate::scripts::{self, clear_watched};
use crate::{RedisStore, eval_on};

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

/// The cursor's text: `{node}:{SCAN cursor}`, the node being an index into the Cluster's
/// primaries in address order (always 0 on one server).
fn parse_cursor(cursor: Option<&ScanCursor>) -> Result<(usize, u64), StoreError> {
    let Some(c) = cursor else { return Ok((0, 0)) };
    c.as_str()
        .split_once(':')
        .and_then(|(n, c)| Some((n.parse().ok()?, c.parse().ok()?)))
        .ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Rejected,
                format!("{:?} is not a Redis scan cursor", c.as_str()),
            )
        })
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
        let (node, at) = parse_cursor(cursor)?;
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
        let (route, nodes) = match &mut conn {
            Conn::Cluster(c) => {
                let nodes = primaries(&mut Conn::Cluster(c.clone())).await?;
                let Some((host, port)) = nodes.get(node).cloned() else {
                    return Ok(ScanPage::new(Vec::new(), None, 0));
                };
                let route =
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                (Some(route), nodes.len())
            }
            _ => (None, 1),
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
            Some(ScanCursor::new(format!("{node}:{next_at}")))
        } else if node + 1 < nodes {
            Some(ScanCursor::new(format!("{}:0", node + 1)))
        } else {
            None
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
