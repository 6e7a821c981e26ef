//! Fenced writes: apply a write only if no newer fencing token has written the same resource.

use idemkit_core::{FencingToken, StoreError, StoreErrorKind};
use sqlx::{PgConnection, PgPool};

use crate::errors::map_err;
use crate::names::{NameError, Table, check};

const MIGRATE: &str = "Fences::migrate(&pool)";

/// A high-water mark of fencing tokens per resource, for writers that must never let a stale
/// attempt overwrite a newer one.
///
/// A worker whose lease was lost (it stalled, the store was unreachable for a whole lease)
/// may still be running its action while a newer attempt, with a larger
/// [fencing token](idemkit_core::Attempt::fencing_token), runs the same effect. Before its
/// write, each attempt calls [`advance`](Fences::advance) in the transaction that writes:
/// it records the token for the resource unless a larger one is recorded already, and says
/// whether the write may go on. The upsert locks the resource's row until the transaction
/// ends, so two writers of one resource run one after the other: a stale writer that comes
/// second is refused; one that comes first is overwritten by the newer writer after it. The
/// same token may advance any number of times (one attempt's several writes, or its retry).
///
/// Compare tokens of one store only: a key's tokens strictly increase on its store, and on
/// PostgreSQL (one sequence per records table) and MemoryStore (one counter) all keys share
/// one order; Redis' tokens are its clock in microseconds.
///
/// Where the resource is a row of your own, the same guard fits in the row itself: a
/// `fencing bigint` column and `UPDATE ... SET ..., fencing = $token WHERE id = $1 AND
/// fencing <= $token` (no row updated: a newer writer was there first).
///
/// # Example
///
/// ```no_run
/// use idemkit_postgres::Fences;
///
/// # async fn f(pool: sqlx::PgPool, attempt: idemkit_core::Attempt) -> Result<(), Box<dyn std::error::Error>> {
/// let fences = Fences::new();
/// fences.migrate(&pool).await?;
/// let token = attempt.fencing_token().expect("a protected attempt");
/// let mut tx = pool.begin().await?;
/// if fences.advance(&mut tx, "account/42", token).await? {
///     sqlx::query("UPDATE accounts SET plan = 'pro' WHERE id = 42").execute(&mut *tx).await?;
///     tx.commit().await?;
/// } else {
///     // A newer attempt wrote account/42: this one is stale, and writes nothing.
///     tx.rollback().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Fences {
    table: Table,
    advance_sql: String,
}

impl Default for Fences {
    fn default() -> Self {
        Fences::with_table(Table {
            schema: "public".into(),
            name: "idemkit_fences".into(),
        })
    }
}

impl Fences {
    /// The fences in `public.idemkit_fences`.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(idemkit_postgres::Fences::new().name(), "public.idemkit_fences");
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    fn with_table(table: Table) -> Self {
        let t = table.quoted();
        Fences {
            // Inserted, or raised (or kept) by a token at least as large: a row comes back.
            // A larger token recorded already: no row. The row stays locked until the
            // transaction ends, so the guarded write runs under it.
            advance_sql: format!(
                "INSERT INTO {t} AS f (resource, fencing, written_at) \
                 VALUES ($1, $2, clock_timestamp()) \
                 ON CONFLICT (resource) DO UPDATE \
                   SET fencing = excluded.fencing, written_at = excluded.written_at \
                 WHERE f.fencing <= excluded.fencing \
                 RETURNING true"
            ),
            table,
        }
    }

    /// Another schema (default `public`).
    ///
    /// # Errors
    ///
    /// [`NameError`] unless it is 1 to 30 of `a-z`, `0-9` and `_`, not starting with a digit.
    ///
    /// # Example
    ///
    /// ```
    /// let fences = idemkit_postgres::Fences::new().schema("billing")?.table("fences")?;
    /// assert_eq!(fences.name(), "billing.fences");
    /// # Ok::<(), idemkit_postgres::NameError>(())
    /// ```
    pub fn schema(self, schema: &str) -> Result<Self, NameError> {
        Ok(Fences::with_table(Table {
            schema: check("schema", schema)?,
            name: self.table.name,
        }))
    }

    /// Another table (default `idemkit_fences`).
    ///
    /// # Errors
    ///
    /// [`NameError`] unless it is 1 to 30 of `a-z`, `0-9` and `_`, not starting with a digit.
    ///
    /// # Example
    ///
    /// See [`schema`](Fences::schema).
    pub fn table(self, table: &str) -> Result<Self, NameError> {
        Ok(Fences::with_table(Table {
            schema: self.table.schema,
            name: check("table", table)?,
        }))
    }

    /// `schema.table`.
    ///
    /// # Example
    ///
    /// See [`new`](Fences::new).
    pub fn name(&self) -> String {
        format!("{}.{}", self.table.schema, self.table.name)
    }

    /// Creates the table if needed (safe to call from every replica at start-up).
    ///
    /// # Errors
    ///
    /// The database's errors.
    ///
    /// # Example
    ///
    /// See [`Fences`].
    pub async fn migrate(&self, pool: &PgPool) -> Result<(), StoreError> {
        crate::migrate::apply(pool, &self.table, crate::migrate::FENCES)
            .await
            .map_err(|e| map_err(e, &self.table, MIGRATE))
    }

    /// In the transaction `conn` is in, before the write it guards: records `token` as the
    /// highest that has written `resource` and returns `true`, or returns `false` (and
    /// changes nothing) when a larger token has. On `false`, roll back: the attempt is stale.
    ///
    /// # Errors
    ///
    /// `Rejected` for an empty resource or one longer than 1024 bytes (checked before
    /// anything is sent); the database's errors.
    ///
    /// # Example
    ///
    /// See [`Fences`].
    pub async fn advance(
        &self,
        conn: &mut PgConnection,
        resource: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        if resource.is_empty() || resource.len() > 1024 {
            return Err(StoreError::new(
                StoreErrorKind::Rejected,
                format!(
                    "a fence's resource is 1 to 1024 bytes, not {}",
                    resource.len()
                ),
            ));
        }
        let advanced: Option<bool> = sqlx::query_scalar(&self.advance_sql)
            .bind(resource)
            .bind(token.get() as i64)
            .fetch_optional(conn)
            .await
            .map_err(|e| map_err(e, &self.table, MIGRATE))?;
        Ok(advanced.is_some())
    }
}
