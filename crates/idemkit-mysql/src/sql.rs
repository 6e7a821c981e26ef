//! The statements, written once per store from its table's name.
//!
//! Every statement decides expiry by `NOW(6)`, the server's clock when the statement started
//! (constant within one statement, so every column of one `begin` sees the same instant), in
//! microseconds since the epoch: the session's time zone is UTC (sqlx sets it at connect), so
//! the conversion has no daylight-saving fold. Durations travel as microseconds.

/// The server's clock, µs since the epoch.
pub(crate) const NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)";

/// The text of every statement of one store.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) create: [String; 3],
    pub(crate) begin: String,
    pub(crate) read: String,
    pub(crate) renew: String,
    pub(crate) completed_by: String,
    pub(crate) complete: String,
    pub(crate) release: String,
    pub(crate) wait: String,
    pub(crate) get: String,
    pub(crate) put_raw: String,
    pub(crate) advance_fencing: String,
    pub(crate) keep_token: String,
    pub(crate) purge: String,
    pub(crate) expired_batch: String,
    pub(crate) purge_expired: String,
    pub(crate) scan: String,
    pub(crate) remove: String,
    pub(crate) now_ms: String,
    pub(crate) table_bytes: String,
}

impl Statements {
    pub(crate) fn new(table: &str) -> Self {
        let t = format!("`{table}`");
        let f = format!("`{table}_fencing`");
        let owned = "`key` = ? AND owner = ? AND fencing = ? AND version = 1";
        let live = format!("expires_us > {NOW}");
        let columns = "version, state, owner, fencing, fingerprint, kind, result, \
                       created_us DIV 1000, expires_us DIV 1000, holder";
        Statements {
            create: [
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} ( \
                       `key` VARBINARY(1024) NOT NULL PRIMARY KEY, \
                       version SMALLINT NOT NULL, \
                       state SMALLINT NOT NULL, \
                       owner VARBINARY(16) NOT NULL, \
                       fencing BIGINT NOT NULL, \
                       fingerprint VARBINARY(16) NULL, \
                       created_us BIGINT NOT NULL, \
                       expires_us BIGINT NOT NULL, \
                       kind SMALLINT NULL, \
                       result LONGBLOB NULL, \
                       holder BLOB NULL, \
                       INDEX expiry (expires_us) \
                     ) ENGINE = InnoDB"
                ),
                // The high-water mark of fencing tokens written by hand (`put_raw`): a new
                // reservation's token is above it, also after that row is purged.
                format!(
                    "CREATE TABLE IF NOT EXISTS {f} (id TINYINT NOT NULL PRIMARY KEY, v BIGINT NOT NULL) \
                     ENGINE = InnoDB"
                ),
                format!("INSERT IGNORE INTO {f} (id, v) VALUES (1, 0)"),
            ],
            // Reserves: inserts the row, or takes over an expired one; a live row is left
            // as it is. The server answers in the statement's OK packet, without a second
            // read: `LAST_INSERT_ID` carries the new fencing token times two plus one if the
            // row replaced was a reservation (a takeover), or 0 when the row is live (the
            // client then reads it, `read`). The token is the clock in µs, at least one above
            // the row's last token and above any token written by hand. `ON DUPLICATE KEY
            // UPDATE` assigns left to right, each assignment seeing the ones before: the
            // fencing column (which reads the old state) comes first and the expiry, which
            // every condition reads, last. Binds: key, owner, fingerprint, lease, holder.
            begin: {
                let expired = format!("{t}.expires_us <= VALUES(created_us)");
                let take = |column: &str| {
                    format!("{column} = IF({expired}, VALUES({column}), {t}.{column})")
                };
                format!(
                    "INSERT INTO {t} (`key`, version, state, owner, fencing, fingerprint, created_us, \
                       expires_us, kind, result, holder) \
                     SELECT ?, 1, 1, ?, LAST_INSERT_ID(GREATEST(n.now, hw.v + 1) * 2) DIV 2, ?, n.now, \
                       n.now + ?, NULL, NULL, ? \
                     FROM (SELECT {NOW} AS now) AS n, {f} AS hw WHERE hw.id = 1 \
                     ON DUPLICATE KEY UPDATE \
                       fencing = IF({expired}, \
                         LAST_INSERT_ID(GREATEST({t}.fencing + 1, VALUES(fencing)) * 2 + ({t}.state = 1)) DIV 2, \
                         {t}.fencing + LAST_INSERT_ID(0)), \
                       {}, {}, {}, {}, {}, {}, {}, {}, {}",
                    take("version"),
                    take("state"),
                    take("owner"),
                    take("fingerprint"),
                    take("kind"),
                    take("result"),
                    take("holder"),
                    take("created_us"),
                    take("expires_us"),
                )
            },
            // A live row as `begin` meets it, with its lease left and age in µs, and its
            // holder (what a refused duplicate is told of the process running the original).
            read: format!(
                "SELECT version, state, owner, fencing, fingerprint, kind, result, \
                   expires_us - {NOW}, {NOW} - created_us, holder \
                 FROM {t} WHERE `key` = ? AND {live}"
            ),
            renew: format!(
                "UPDATE {t} SET expires_us = {NOW} + ? WHERE {owned} AND state = 1 AND {live}"
            ),
            // After a renewal or a completion found no reservation of its owner: whether the
            // same lease completed the row already (a retried completion, whose first reply
            // was lost; a renewal that crossed the completion).
            completed_by: format!("SELECT 1 FROM {t} WHERE {owned} AND state = 2 AND {live}"),
            complete: format!(
                "UPDATE {t} SET state = 2, kind = ?, result = ?, expires_us = {NOW} + ? \
                 WHERE {owned} AND state = 1 AND {live}"
            ),
            // A release ends the reservation now instead of deleting the row: the row keeps
            // its fencing token, so the next reservation's is above it (its takeover reads
            // it) even when that token came from the high-water mark, ahead of the clock.
            // State 3 is a released row: never read (it is expired), never taken over as a
            // reservation (`took_over` is false).
            release: format!(
                "UPDATE {t} SET state = 3, expires_us = {NOW} WHERE {owned} AND state = 1 AND {live}"
            ),
            wait: format!(
                "SELECT expires_us - {NOW} FROM {t} \
                 WHERE `key` = ? AND fencing = ? AND version = 1 AND state = 1 AND {live}"
            ),
            get: format!("SELECT {columns} FROM {t} WHERE `key` = ? AND {live}"),
            put_raw: format!(
                "INSERT INTO {t} (`key`, version, state, owner, fencing, fingerprint, created_us, \
                   expires_us, kind, result, holder) \
                 VALUES (?, ?, ?, ?, ?, ?, {NOW}, {NOW} + ?, ?, ?, ?) \
                 ON DUPLICATE KEY UPDATE version = VALUES(version), state = VALUES(state), \
                   owner = VALUES(owner), fencing = VALUES(fencing), fingerprint = VALUES(fingerprint), \
                   created_us = VALUES(created_us), expires_us = VALUES(expires_us), \
                   kind = VALUES(kind), result = VALUES(result), holder = VALUES(holder)"
            ),
            advance_fencing: format!("UPDATE {f} SET v = GREATEST(v, ?) WHERE id = 1"),
            // Before rows are deleted, the high-water mark takes their tokens, so a later
            // reservation of their keys draws a larger one (run in one transaction with the
            // delete).
            keep_token: format!(
                "UPDATE {f} SET v = GREATEST(v, COALESCE((SELECT MAX(fencing) FROM {t} WHERE `key` = ?), 0)) \
                 WHERE id = 1"
            ),
            purge: format!("DELETE FROM {t} WHERE `key` = ?"),
            // `purge_expired`, one batch: the oldest expired rows and their tokens, read
            // without a lock (review M3 of `e047556`: the mark's row was locked while a
            // subquery scanned every expired row, and every `begin` reads that row). Then
            // the mark takes the batch's largest token (`advance_fencing`, a statement of its
            // own: the mark's lock lasts one row's update), and the batch is deleted by key,
            // each row only if still expired and its token no larger than the mark took
            // (a key reserved again meanwhile is live, or has a larger token: kept).
            expired_batch: format!(
                "SELECT `key`, fencing FROM {t} WHERE expires_us <= {NOW} ORDER BY expires_us LIMIT ?"
            ),
            purge_expired: format!(
                "DELETE FROM {t} WHERE expires_us <= {NOW} AND fencing <= ? AND `key` IN "
            ),
            // A page in key order (bytewise: the key is VARBINARY) from after the cursor,
            // within [from, until). Released rows (state 3) are read too, so that a page of
            // them still moves the cursor on; the caller skips them. The size is the row's
            // key, result and holder bytes. Binds: cursor, from, until, until, count.
            scan: format!(
                "SELECT `key`, version, state, owner, fencing, fingerprint, kind, result, \
                   created_us DIV 1000, expires_us DIV 1000, holder, \
                   CAST(LENGTH(`key`) + COALESCE(LENGTH(result), 0) + COALESCE(LENGTH(holder), 0) \
                     AS SIGNED), \
                   {NOW} DIV 1000 \
                 FROM {t} WHERE `key` > ? AND `key` >= ? AND (? IS NULL OR `key` < ?) \
                 ORDER BY `key` LIMIT ?"
            ),
            // A record of ours (reserved or completed, live or not) under its fencing token;
            // run in one transaction with `keep_token`.
            remove: format!(
                "DELETE FROM {t} WHERE `key` = ? AND fencing = ? AND version = 1 AND state IN (1, 2)"
            ),
            now_ms: format!("SELECT {NOW} DIV 1000"),
            table_bytes: "SELECT CAST(COALESCE(SUM(data_length + index_length), 0) AS SIGNED) \
                 FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name IN (?, ?)"
                .to_string(),
        }
    }
}
