//! Experiment 4 on PostgreSQL: the ledger and the inbox are tables of the demo's schema,
//! written in real transactions.

use idemkit_postgres::{Inbox, Seen};
use sqlx::{PgPool, Postgres, Transaction};

use crate::consumer::Database;

/// The demo's database: a ledger table and an [`Inbox`] in the run's schema.
#[derive(Debug, Clone)]
pub struct PgDb {
    pool: PgPool,
    schema: String,
    inbox: Inbox,
}

impl PgDb {
    /// Creates the ledger and the inbox in `schema` (a valid, run-specific name).
    ///
    /// # Errors
    ///
    /// When the database refuses or cannot be reached.
    pub async fn create(pool: PgPool, schema: &str) -> Result<Self, Box<dyn std::error::Error>> {
        let inbox = Inbox::new().schema(schema)?;
        inbox.migrate(&pool).await?;
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS \"{schema}\".ledger (id bigserial PRIMARY KEY, order_id text NOT NULL)"
        ))
        .execute(&pool)
        .await?;
        Ok(PgDb {
            pool,
            schema: schema.to_owned(),
            inbox,
        })
    }
}

impl Database for PgDb {
    type Tx = Transaction<'static, Postgres>;

    async fn begin(&self) -> Self::Tx {
        self.pool.begin().await.expect("begin")
    }

    async fn claim(&self, tx: &mut Self::Tx, message: &str) -> bool {
        self.inbox
            .claim(tx, "billing", message)
            .await
            .expect("inbox")
            == Seen::New
    }

    async fn credit(&self, tx: &mut Self::Tx, order: &str) {
        sqlx::query(&format!(
            "INSERT INTO \"{}\".ledger (order_id) VALUES ($1)",
            self.schema
        ))
        .bind(order)
        .execute(&mut **tx)
        .await
        .expect("ledger row");
    }

    async fn commit(&self, tx: Self::Tx) {
        tx.commit().await.expect("commit");
    }

    async fn rows(&self, order: &str) -> usize {
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{}\".ledger WHERE order_id = $1",
            self.schema
        ))
        .bind(order)
        .fetch_one(&self.pool)
        .await
        .expect("count");
        n as usize
    }

    fn name(&self) -> String {
        format!("PostgreSQL, tables ledger and {}", self.inbox.name())
    }
}
