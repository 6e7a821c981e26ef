//! The statements, one per phase, written once per store from its table's names.
//!
//! Every statement decides expiry by `clock_timestamp()` (the database's clock, read when the
//! statement runs, not when its transaction began: the transactional call's completion runs
//! late in a long transaction). Durations travel as microseconds.

use crate::names::Table;

/// The text of every statement of one store.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) begin: String,
    pub(crate) begin_read: String,
    pub(crate) begin_insert: String,
    pub(crate) notify: String,
    pub(crate) begin_many: String,
    pub(crate) begin_batch: String,
    pub(crate) renew: String,
    pub(crate) completed_by: String,
    pub(crate) advance_fencing: String,
    pub(crate) complete: String,
    pub(crate) complete_many: String,
    pub(crate) complete_batch: String,
    pub(crate) notify_many: String,
    pub(crate) release: String,
    pub(crate) wait: String,
    pub(crate) get: String,
    pub(crate) put_raw: String,
    pub(crate) purge: String,
    pub(crate) purge_expired: String,
    pub(crate) scan: String,
    pub(crate) remove: String,
    pub(crate) now: String,
    pub(crate) table_bytes: String,
    /// The notification channel: `<schema>.<table>`.
    pub(crate) channel: String,
}

/// How long a coalesced batch's statement waits for a row lock before it gives up (then
/// each of its calls is sent alone): a lock held by another transaction (a transactional
/// call's completion, a `SELECT ... FOR UPDATE`) stalls only the call of that key, not the
/// batch's other callers and, through its slot, the lane (review M2 of `e047556`). Set for
/// the statement's own transaction (`set_config(..., true)`), evaluated before its rows.
pub(crate) const BATCH_LOCK_TIMEOUT: &str = "250ms";

/// `statement` with its lock wait bounded by [`BATCH_LOCK_TIMEOUT`]: `from` (the source of its
/// rows) joined with the one row of the setting.
fn bounded(statement: &str, from: &str) -> String {
    let bound = format!(
        "{from}, (SELECT set_config('lock_timeout', '{BATCH_LOCK_TIMEOUT}', true)) AS bound"
    );
    assert!(statement.contains(from), "the statement has its source");
    statement.replacen(from, &bound, 1)
}

impl Statements {
    pub(crate) fn new(table: &Table) -> Self {
        let mut s = Self::unbounded(table);
        s.begin_batch = bounded(&s.begin_many, "AS q(k, o, l, f, h)");
        s.complete_batch = bounded(&s.complete_many, "AS q(k, o, f, kind, res, ttl)");
        s
    }

    fn unbounded(table: &Table) -> Self {
        let t = table.quoted();
        let seq = format!("\"{}\".\"{}_fencing\"", table.schema, table.name);
        let channel = format!("{}.{}", table.schema, table.name);
        let owned = "key = $1 AND owner = $2 AND fencing = $3 AND version = 1";
        Statements {
            // Read the row; insert (or take an expired row over) only when there is no live
            // one; or return the live row: one statement. A hit is a plain read: the INSERT's
            // SELECT yields no row, so nothing is written, locked or drawn from the sequence,
            // and the statement commits without a WAL flush. When the upsert runs, `ON
            // CONFLICT ... DO UPDATE ... WHERE` locks a conflicting row and replaces it only if
            // it expired (judged on its newest committed version). The reads use the
            // statement's snapshot, so a row committed by a concurrent `begin` after the
            // snapshot can be missing from them while the upsert meets it: then no row comes
            // back at all and the client sends the statement again (rare: only under a race).
            // `took_over`: the row replaced was an (expired) reservation.
            begin: format!(
                "WITH c AS (SELECT clock_timestamp() AS now), \
                 cur AS ( \
                   SELECT version, state, owner, fencing, fingerprint, kind, result, created_at, expires_at, holder \
                   FROM {t} WHERE key = $1 \
                 ), \
                 ins AS ( \
                   INSERT INTO {t} AS r (key, version, state, owner, fencing, fingerprint, created_at, expires_at, waiting, holder) \
                   SELECT $1, 1, 1, $2, nextval('{seq}'), $4, c.now, c.now + $3 * interval '1 microsecond', false, $5 \
                   FROM c WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.expires_at > c.now) \
                   ON CONFLICT (key) DO UPDATE SET version = 1, state = 1, owner = excluded.owner, \
                     fencing = excluded.fencing, fingerprint = excluded.fingerprint, \
                     created_at = excluded.created_at, expires_at = excluded.expires_at, \
                     waiting = false, kind = NULL, result = NULL, holder = excluded.holder \
                   WHERE r.expires_at <= excluded.created_at \
                   RETURNING r.fencing \
                 ) \
                 SELECT true, 1::int2, 1::int2, NULL::bytea, ins.fencing, NULL::bytea, NULL::int2, NULL::bytea, \
                   0::int8, 0::int8, coalesce((SELECT cur.state = 1 FROM cur), false), NULL::bytea \
                 FROM ins \
                 UNION ALL \
                 SELECT false, cur.version, cur.state, cur.owner, cur.fencing, cur.fingerprint, cur.kind, cur.result, \
                   (extract(epoch FROM cur.expires_at - c.now) * 1000000)::int8, \
                   (extract(epoch FROM c.now - cur.created_at) * 1000000)::int8, false, cur.holder \
                 FROM cur, c WHERE cur.expires_at > c.now AND NOT EXISTS (SELECT 1 FROM ins)"
            ),
            // `begin` when the key is probably live (most calls replay, `PgStore::begin`): the
            // live row as `begin` returns one, a primary-key read and nothing else; no row
            // (absent or expired) and the client sends `begin`.
            begin_read: format!(
                "SELECT false, version, state, owner, fencing, fingerprint, kind, result, \
                   (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::int8, \
                   (extract(epoch FROM clock_timestamp() - created_at) * 1000000)::int8, false, holder \
                 FROM {t} WHERE key = $1 AND expires_at > clock_timestamp()"
            ),
            // `begin` when the key is probably absent (most calls are first deliveries): a plain
            // insert, the reservation as `begin` returns a new one; a row already there (live,
            // expired or just inserted by another caller) is left alone, no row comes back,
            // and the client sends `begin`. A conflict draws a fencing token it does not use
            // (the sequence only has to increase).
            begin_insert: format!(
                "INSERT INTO {t} AS r (key, version, state, owner, fencing, fingerprint, created_at, expires_at, waiting, holder) \
                 SELECT $1, 1, 1, $2, nextval('{seq}'), $4, c.now, c.now + $3 * interval '1 microsecond', false, $5 \
                 FROM (SELECT clock_timestamp() AS now) c \
                 ON CONFLICT (key) DO NOTHING \
                 RETURNING true, 1::int2, 1::int2, NULL::bytea, r.fencing, NULL::bytea, NULL::int2, NULL::bytea, \
                   0::int8, 0::int8, false, NULL::bytea"
            ),
            // `begin` for a batch of distinct keys ($1 keys, $2 owners, $3 leases, $4
            // fingerprints, $5 holders): the same decision per key, one statement. Rows come back keyed (the
            // first column); a key without a row met the snapshot race described above and
            // is sent again alone. Inserts go in key order, so two batches that share keys
            // lock them in the same order (no deadlock).
            begin_batch: String::new(),
            begin_many: format!(
                "WITH c AS (SELECT clock_timestamp() AS now), \
                 req AS (SELECT * FROM unnest($1::text[], $2::bytea[], $3::int8[], $4::bytea[], $5::bytea[]) AS q(k, o, l, f, h)), \
                 cur AS ( \
                   SELECT t.key, t.version, t.state, t.owner, t.fencing, t.fingerprint, t.kind, t.result, \
                     t.created_at, t.expires_at, t.holder \
                   FROM {t} t WHERE t.key = ANY($1::text[]) \
                 ), \
                 ins AS ( \
                   INSERT INTO {t} AS r (key, version, state, owner, fencing, fingerprint, created_at, expires_at, waiting, holder) \
                   SELECT req.k, 1, 1, req.o, nextval('{seq}'), req.f, c.now, c.now + req.l * interval '1 microsecond', false, req.h \
                   FROM req, c WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.key = req.k AND cur.expires_at > c.now) \
                   ORDER BY req.k \
                   ON CONFLICT (key) DO UPDATE SET version = 1, state = 1, owner = excluded.owner, \
                     fencing = excluded.fencing, fingerprint = excluded.fingerprint, \
                     created_at = excluded.created_at, expires_at = excluded.expires_at, \
                     waiting = false, kind = NULL, result = NULL, holder = excluded.holder \
                   WHERE r.expires_at <= excluded.created_at \
                   RETURNING r.key, r.fencing \
                 ) \
                 SELECT ins.key, true, 1::int2, 1::int2, NULL::bytea, ins.fencing, NULL::bytea, NULL::int2, NULL::bytea, \
                   0::int8, 0::int8, coalesce((SELECT cur.state = 1 FROM cur WHERE cur.key = ins.key), false), NULL::bytea \
                 FROM ins \
                 UNION ALL \
                 SELECT cur.key, false, cur.version, cur.state, cur.owner, cur.fencing, cur.fingerprint, cur.kind, cur.result, \
                   (extract(epoch FROM cur.expires_at - c.now) * 1000000)::int8, \
                   (extract(epoch FROM c.now - cur.created_at) * 1000000)::int8, false, cur.holder \
                 FROM cur, c WHERE cur.expires_at > c.now AND NOT EXISTS (SELECT 1 FROM ins WHERE ins.key = cur.key)"
            ),
            renew: format!(
                "UPDATE {t} SET expires_at = clock_timestamp() + $4 * interval '1 microsecond' \
                 WHERE {owned} AND state = 1 AND expires_at > clock_timestamp()"
            ),
            // After a renewal found no reservation to extend: whether the same lease has
            // completed the row (a renewal that crossed its owner's completion). A statement
            // of its own, so its snapshot sees a completion that committed while the
            // renewal's `UPDATE` waited on the row.
            // Returns the row's waiting flag: a retried completion notifies too, since the
            // first try's notification may never have gone out (review L10).
            completed_by: format!(
                "SELECT waiting FROM {t} WHERE {owned} AND state = 2 AND expires_at > clock_timestamp()"
            ),
            // Raises the fencing sequence past a token written by hand (`put_raw`), so that
            // the next reservation's token is larger. Only ever forward: the check and the
            // `setval` are one statement.
            advance_fencing: format!(
                "SELECT setval('{seq}', $1) FROM \"{}\".\"{}_fencing\" WHERE last_value < $1",
                table.schema, table.name
            ),
            // Completes; returns whether a waiter flagged the row (then the client sends
            // `notify` on the same connection, in the same transaction in the transactional
            // call, so a waiter wakes once the result is visible). No row: expired, taken
            // over, or completed by this same lease already (a retried completion: the client
            // asks `completed_by`). A plain update: the checks and the notification in one
            // statement cost every miss more database CPU (docs/benchmarks.md) for what only
            // a waited-on row needs.
            complete: format!(
                "UPDATE {t} SET state = 2, kind = $4, result = $5, \
                   expires_at = clock_timestamp() + $6 * interval '1 microsecond' \
                 WHERE {owned} AND state = 1 AND expires_at > clock_timestamp() \
                 RETURNING waiting"
            ),
            // `complete` for a batch of distinct keys, each with its owner, fencing, result
            // and TTL: the keys completed come back with their waiting flags (a key
            // missing is handled alone, as `complete` handles no row). The client sends the
            // keys sorted, so the rows are updated in key order as `begin_many` inserts them
            // (the plan's function scan drives the primary-key lookups); should a plan ever
            // meet two batches' rows in opposite orders, the deadlock's error sends each call
            // of the batch again on its own (batch.rs).
            complete_batch: String::new(),
            complete_many: format!(
                "UPDATE {t} AS r SET state = 2, kind = q.kind, result = q.res, \
                   expires_at = clock_timestamp() + q.ttl * interval '1 microsecond' \
                 FROM unnest($1::text[], $2::bytea[], $3::int8[], $4::int2[], $5::bytea[], $6::int8[]) \
                   AS q(k, o, f, kind, res, ttl) \
                 WHERE r.key = q.k AND r.owner = q.o AND r.fencing = q.f AND r.version = 1 \
                   AND r.state = 1 AND r.expires_at > clock_timestamp() \
                 RETURNING r.key, r.waiting"
            ),
            notify: format!("SELECT pg_notify('{channel}', $1)"),
            notify_many: format!(
                "SELECT count(pg_notify('{channel}', k)) FROM unnest($1::text[]) AS k"
            ),
            release: format!(
                "WITH d AS ( \
                   DELETE FROM {t} WHERE {owned} AND state = 1 AND expires_at > clock_timestamp() \
                   RETURNING waiting \
                 ), n AS (SELECT pg_notify('{channel}', $1) FROM d WHERE d.waiting) \
                 SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM n)"
            ),
            // Flags the reservation as waited on (so its completion or release notifies), if
            // it is still the live state of the key; returns its lease left.
            wait: format!(
                "UPDATE {t} SET waiting = true \
                 WHERE key = $1 AND fencing = $2 AND version = 1 AND state = 1 \
                   AND expires_at > clock_timestamp() \
                 RETURNING (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::int8"
            ),
            get: format!(
                "SELECT version, state, owner, fencing, fingerprint, kind, result, \
                   floor(extract(epoch FROM created_at) * 1000)::int8, \
                   floor(extract(epoch FROM expires_at) * 1000)::int8, holder \
                 FROM {t} WHERE key = $1 AND expires_at > clock_timestamp()"
            ),
            put_raw: format!(
                "INSERT INTO {t} (key, version, state, owner, fencing, fingerprint, created_at, expires_at, kind, result, holder) \
                 VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp(), \
                   clock_timestamp() + $7 * interval '1 microsecond', $8, $9, $10) \
                 ON CONFLICT (key) DO UPDATE SET version = excluded.version, state = excluded.state, \
                   owner = excluded.owner, fencing = excluded.fencing, fingerprint = excluded.fingerprint, \
                   created_at = excluded.created_at, expires_at = excluded.expires_at, waiting = false, \
                   kind = excluded.kind, result = excluded.result, holder = excluded.holder"
            ),
            // Wakes a waiter, as `release` does: an operator's purge of a stuck
            // reservation lets the next delivery run at once.
            purge: format!(
                "WITH d AS (DELETE FROM {t} WHERE key = $1 RETURNING waiting), \
                 n AS (SELECT pg_notify('{channel}', $1) FROM d WHERE d.waiting) \
                 SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM n)"
            ),
            // Oldest first, skipping rows another purger (or an owner) holds: bounded work
            // per statement, and no waiting on anyone.
            purge_expired: format!(
                "WITH d AS ( \
                   DELETE FROM {t} WHERE key IN ( \
                     SELECT key FROM {t} WHERE expires_at <= clock_timestamp() \
                     ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
                   RETURNING 1 \
                 ) SELECT count(*) FROM d"
            ),
            // Keyset pagination on the primary key: after the cursor's key, within the
            // operation's key range (`op:` up to `op;`, the next character in "C" order).
            // Expired rows not yet purged are listed too. The size is the row's.
            scan: format!(
                "SELECT key, version, state, owner, fencing, fingerprint, kind, result, \
                   floor(extract(epoch FROM created_at) * 1000)::int8, \
                   floor(extract(epoch FROM expires_at) * 1000)::int8, \
                   pg_column_size(r.*)::int8, \
                   floor(extract(epoch FROM clock_timestamp()) * 1000)::int8, holder \
                 FROM {t} AS r WHERE key > $1 AND key >= $2 AND ($3::text IS NULL OR key < $3) \
                 ORDER BY key LIMIT $4"
            ),
            remove: format!(
                "WITH d AS ( \
                   DELETE FROM {t} WHERE key = $1 AND fencing = $2 AND version = 1 \
                   RETURNING waiting \
                 ), n AS (SELECT pg_notify('{channel}', $1) FROM d WHERE d.waiting) \
                 SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM n)"
            ),
            now: "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8".to_string(),
            table_bytes: format!("SELECT pg_total_relation_size('{t}')::int8"),
            channel,
        }
    }
}
