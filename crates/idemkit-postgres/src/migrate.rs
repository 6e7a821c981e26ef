//! Migrations: SQL files embedded in the crate, applied in order under an advisory lock, each
//! recorded in `<schema>.idemkit_migrations` so that it runs once per table.

use sqlx::{Executor as _, PgConnection, PgPool, Row};

use crate::names::Table;

/// One embedded migration.
pub(crate) struct Migration {
    pub(crate) version: i32,
    pub(crate) sql: &'static str,
}

pub(crate) const RECORDS: &[Migration] = &[
    Migration {
        version: 1,
        sql: include_str!("../migrations/records/0001_create.sql"),
    },
    Migration {
        version: 2,
        sql: include_str!("../migrations/records/0002_holder.sql"),
    },
];

pub(crate) const INBOX: &[Migration] = &[Migration {
    version: 1,
    sql: include_str!("../migrations/inbox/0001_create.sql"),
}];

pub(crate) const FENCES: &[Migration] = &[Migration {
    version: 1,
    sql: include_str!("../migrations/fences/0001_create.sql"),
}];

/// Applies the migrations of `table` that its schema has not recorded yet, in one
/// transaction. Concurrent callers (every replica at start-up) queue on an advisory lock.
pub(crate) async fn apply(
    pool: &PgPool,
    table: &Table,
    migrations: &[Migration],
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    apply_on(&mut tx, table, migrations).await?;
    tx.commit().await
}

async fn apply_on(
    conn: &mut PgConnection,
    table: &Table,
    migrations: &[Migration],
) -> Result<(), sqlx::Error> {
    let schema = &table.schema;
    let bookkeeping = format!(
        "CREATE SCHEMA IF NOT EXISTS \"{schema}\";
         CREATE TABLE IF NOT EXISTS \"{schema}\".idemkit_migrations (
             name text COLLATE \"C\" NOT NULL,
             version integer NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
             PRIMARY KEY (name, version)
         );"
    );
    let applied_sql = format!(
        "SELECT coalesce(max(version), 0) FROM \"{schema}\".idemkit_migrations WHERE name = $1"
    );
    let record_sql =
        format!("INSERT INTO \"{schema}\".idemkit_migrations (name, version) VALUES ($1, $2)");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('idemkit.migrate'))")
        .execute(&mut *conn)
        .await?;
    conn.execute(bookkeeping.as_str()).await?;
    let applied: i32 = sqlx::query(&applied_sql)
        .bind(&table.name)
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
    // A plain loop: an iterator adaptor's closure held across the awaits below makes the
    // future not `Send` (a known rustc limitation with sqlx's executor lifetimes).
    for m in migrations {
        if m.version <= applied {
            continue;
        }
        let sql = table.fill(m.sql);
        conn.execute(sql.as_str()).await?;
        sqlx::query(&record_sql)
            .bind(&table.name)
            .bind(m.version)
            .execute(&mut *conn)
            .await?;
        tracing::info!(table = %table, version = m.version, "applied an idemkit migration");
    }
    Ok(())
}
