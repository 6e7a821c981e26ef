//! Experiment 4: the seed's consumer, with a database effect (a ledger row) and an external
//! one (the invoice email), under each combination of protections.
//!
//! One message is delivered three times: delivery 1 dies after its commit and before its
//! email, delivery 2 dies after its email and before its ack, delivery 3 finishes and acks.
//! Every handler follows the seed's order (database effect, commit, email, ack); they differ
//! in what protects what. On PostgreSQL the ledger and the inbox are real tables, written in
//! a real transaction; on the other stores an in-memory stand-in plays the database (its
//! "transaction" applies its writes at commit), and the table says so.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use idemkit_core::{Coordinator, Key, Operation, Store};

use crate::demo::Mailer;

/// A database with a ledger and an inbox, in transactions.
pub trait Database: Send + Sync {
    /// An open transaction.
    type Tx: Send;
    /// Opens one.
    fn begin(&self) -> impl Future<Output = Self::Tx> + Send;
    /// Records the message in the inbox; `true` if it is new.
    fn claim(&self, tx: &mut Self::Tx, message: &str) -> impl Future<Output = bool> + Send;
    /// Writes a ledger row for the order.
    fn credit(&self, tx: &mut Self::Tx, order: &str) -> impl Future<Output = ()> + Send;
    /// Commits.
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = ()> + Send;
    /// The order's committed ledger rows.
    fn rows(&self, order: &str) -> impl Future<Output = usize> + Send;
    /// What plays the database, for the table's heading.
    fn name(&self) -> String;
}

/// The in-memory stand-in: committed state behind a lock, writes staged in the transaction.
#[derive(Debug, Default, Clone)]
pub struct MemoryDb {
    committed: Arc<Mutex<(HashSet<String>, Vec<String>)>>,
}

/// A [`MemoryDb`] transaction: its staged writes.
#[derive(Debug, Default)]
pub struct MemoryTx {
    inbox: Vec<String>,
    ledger: Vec<String>,
}

impl Database for MemoryDb {
    type Tx = MemoryTx;

    async fn begin(&self) -> MemoryTx {
        MemoryTx::default()
    }

    async fn claim(&self, tx: &mut MemoryTx, message: &str) -> bool {
        let committed = self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let new = !committed.0.contains(message);
        if new {
            tx.inbox.push(message.to_owned());
        }
        new
    }

    async fn credit(&self, tx: &mut MemoryTx, order: &str) {
        tx.ledger.push(order.to_owned());
    }

    async fn commit(&self, tx: MemoryTx) {
        let mut committed = self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        committed.0.extend(tx.inbox);
        committed.1.extend(tx.ledger);
    }

    async fn rows(&self, order: &str) -> usize {
        let committed = self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        committed.1.iter().filter(|o| *o == order).count()
    }

    fn name(&self) -> String {
        "an in-memory stand-in for the database and its transaction".into()
    }
}

/// Which protections a handler has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// Neither inbox nor key.
    Plain,
    /// The inbox only; the email is sent on every delivery.
    InboxOnly,
    /// The inbox, and the handler returns early when it reports a duplicate.
    InboxEarlyReturn,
    /// The key on the email only; the ledger row is written on every delivery.
    KeyOnly,
    /// The inbox for the ledger row, the key for the email, on every delivery
    /// (`Inbox::deliver`'s order).
    InboxAndKey,
}

impl Handler {
    const ALL: [Handler; 5] = [
        Handler::Plain,
        Handler::InboxOnly,
        Handler::InboxEarlyReturn,
        Handler::KeyOnly,
        Handler::InboxAndKey,
    ];

    fn label(self) -> &'static str {
        match self {
            Handler::Plain => "plain handler",
            Handler::InboxOnly => "inbox only",
            Handler::InboxEarlyReturn => "inbox, return early on a duplicate",
            Handler::KeyOnly => "key on the email only",
            Handler::InboxAndKey => "inbox + key, email on every delivery",
        }
    }

    fn note(self) -> &'static str {
        match self {
            Handler::Plain => "both effects repeat",
            Handler::InboxOnly => "the inbox protects the database effect, not the email",
            Handler::InboxEarlyReturn => "the trap: delivery 1's email is never sent",
            Handler::KeyOnly => "the key protects the email, not the ledger row",
            Handler::InboxAndKey => "each effect under its own protection: once each",
        }
    }
}

/// One row of experiment 4.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerRow {
    /// The handler.
    pub handler: Handler,
    /// Committed ledger rows for the order.
    pub ledger_rows: usize,
    /// Emails sent.
    pub mails: usize,
}

/// Experiment 4's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerTable {
    /// What played the database.
    pub database: String,
    /// One row per handler.
    pub rows: Vec<ConsumerRow>,
}

/// Runs experiment 4: each handler on a fresh key store (`store()`), against `db`.
///
/// # Example
///
/// ```
/// use idemkit_demo::consumer::{self, MemoryDb};
/// use idemkit_core::MemoryStore;
///
/// # tokio::runtime::Builder::new_multi_thread().enable_time().build().unwrap().block_on(async {
/// let table = consumer::run(&MemoryDb::default(), MemoryStore::new).await;
/// let last = table.rows.last().unwrap();
/// assert_eq!((last.ledger_rows, last.mails), (1, 1));
/// # });
/// ```
pub async fn run<D, S, F>(db: &D, store: F) -> ConsumerTable
where
    D: Database,
    S: Store,
    F: Fn() -> S,
{
    let mut rows = Vec::new();
    for (i, handler) in Handler::ALL.into_iter().enumerate() {
        // Each handler on its own order, message and key store.
        let order = format!("order-{}", 9 + i);
        let c = Coordinator::new(store());
        let mailer = Mailer::default();
        for delivery in 1..=3 {
            deliver(db, &c, &mailer, handler, &order, delivery).await;
        }
        rows.push(ConsumerRow {
            handler,
            ledger_rows: db.rows(&order).await,
            mails: mailer.sent(),
        });
    }
    ConsumerTable {
        database: db.name(),
        rows,
    }
}

/// One delivery; `delivery` 1 dies after the commit, 2 after the email.
async fn deliver<D: Database, S: Store>(
    db: &D,
    c: &Coordinator<S>,
    mailer: &Mailer,
    handler: Handler,
    order: &str,
    delivery: u32,
) {
    let message = format!("orders.paid/{order}");
    let mut tx = db.begin().await;
    let uses_inbox = matches!(
        handler,
        Handler::InboxOnly | Handler::InboxEarlyReturn | Handler::InboxAndKey
    );
    let new = !uses_inbox || db.claim(&mut tx, &message).await;
    if new {
        db.credit(&mut tx, order).await;
    }
    db.commit(tx).await;
    if handler == Handler::InboxEarlyReturn && !new {
        return; // "the handler does not run on a duplicate"
    }
    if delivery == 1 {
        return; // died after the commit, before the email
    }
    if matches!(handler, Handler::KeyOnly | Handler::InboxAndKey) {
        let op = Operation::new("mail.invoice").expect("valid");
        let key = Key::compose([order, "invoice"]).expect("valid");
        c.call(&op, &key)
            .run(|_| mailer.send_invoice(9))
            .await
            .expect("the email");
    } else {
        let _ = mailer.send_invoice(9).await;
    }
    // Delivery 2 dies here, before its ack; delivery 3 acks.
}

impl fmt::Display for ConsumerTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Experiment 4: a consumer with a ledger row and an invoice email (database: {})",
            self.database
        )?;
        writeln!(
            f,
            "  delivery 1 dies after its commit, delivery 2 after its email, delivery 3 acks"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<41}ledger rows={}  mails sent={}   ({})",
                r.handler.label(),
                r.ledger_rows,
                r.mails,
                r.handler.note()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemkit_core::MemoryStore;

    #[tokio::test]
    async fn each_protection_covers_its_own_effect() {
        let table = run(&MemoryDb::default(), MemoryStore::new).await;
        let got: Vec<_> = table
            .rows
            .iter()
            .map(|r| (r.handler, r.ledger_rows, r.mails))
            .collect();
        assert_eq!(
            got,
            [
                (Handler::Plain, 3, 2),
                (Handler::InboxOnly, 1, 2),
                (Handler::InboxEarlyReturn, 1, 0),
                (Handler::KeyOnly, 3, 1),
                (Handler::InboxAndKey, 1, 1),
            ]
        );
    }
}
