//! Experiment 4 on MySQL or MariaDB: the ledger and the inbox are tables of the run's own
//! (named after it, dropped at its end), written in real transactions.

use idemkit_mysql::{Inbox, Seen};
use sqlx::{MySql, MySqlPool, Transaction};

use crate::consumer::Database;

/// The demo's database: a ledger table and an [`Inbox`], both named after the run.
#[derive(Debug, Clone)]
pub struct MySqlDb {
    pool: MySqlPool,
    ledger: String,
    inbox: Inbox,
}

impl MySqlDb {
    /// Creates the tables `{run}_ledger` and `{run}_inbox` (`run`: a valid, run-specific
    /// table name prefix of at most 40 characters).
    ///
    /// # Errors
    ///
    /// When the name is refused, or the database refuses or cannot be reached.
    pub async fn create(pool: MySqlPool, run: &str) -> Result<Self, Box<dyn std::error::Error>> {
        let inbox = Inbox::new().table(&format!("{run}_inbox"))?;
        inbox.migrate(&pool).await?;
        let ledger = format!("{run}_ledger");
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS `{ledger}` \
             (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, order_id VARCHAR(200) NOT NULL) \
             ENGINE = InnoDB"
        ))
        .execute(&pool)
        .await?;
        Ok(MySqlDb {
            pool,
            ledger,
            inbox,
        })
    }

    /// The tables this database created.
    pub fn tables(&self) -> [&str; 2] {
        [&self.ledger, self.inbox.name()]
    }
}

impl Database for MySqlDb {
    type Tx = Transaction<'static, MySql>;

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
            "INSERT INTO `{}` (order_id) VALUES (?)",
            self.ledger
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
            "SELECT COUNT(*) FROM `{}` WHERE order_id = ?",
            self.ledger
        ))
        .bind(order)
        .fetch_one(&self.pool)
        .await
        .expect("count");
        n as usize
    }

    fn name(&self) -> String {
        format!("MySQL, tables {} and {}", self.ledger, self.inbox.name())
    }
}
