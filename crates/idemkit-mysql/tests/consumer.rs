//! The seed's consumer on MariaDB in one piece: `Inbox::handler` under a `Processor` on the
//! effect's key, a message delivered again and again (and twice at once), a database effect
//! that fails, and a process killed between the inbox's commit and the email is the
//! RabbitMQ example's test (`idemkit-rabbitmq/tests/paid_orders.rs`, `..._on_mariadb`).
//!
//! What must hold: one ledger row and one email per order, whatever the deliveries; a
//! failed database effect leaves nothing and sends nothing, and its retry does both once.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idemkit_core::{Attempt, Coordinator, Key, KeyError, Operation, Policy};
use idemkit_mysql::{HandlerError, Inbox};
use idemkit_runner::{Processor, Settlement};
use idemkit_test::Mailer;

#[derive(Clone)]
struct Paid {
    order: String,
}

fn invoice_of(m: &Paid) -> Result<Key, KeyError> {
    Key::compose([m.order.as_str(), "invoice"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_consumer_credits_and_mails_once_per_order() {
    let Some(store) = support::store().await else {
        return;
    };
    let pool = store.pool().clone();
    support::ledger(&pool).await;
    let inbox = Inbox::new();
    inbox.migrate(&pool).await.unwrap();
    let mailer = Mailer::default();
    // The database effect fails once, on demand: nothing may be left of that run.
    let fail_db = Arc::new(AtomicBool::new(false));
    let handler = {
        let (mailer, fail_db) = (mailer.clone(), fail_db.clone());
        Inbox::new()
            .handler(
                pool.clone(),
                "billing",
                invoice_of,
                move |m: &Paid, conn| {
                    let fail = fail_db.swap(false, Ordering::SeqCst);
                    Box::pin(async move {
                        support::credit(conn, &m.order).await?;
                        if fail {
                            return Err(sqlx::Error::Protocol("the ledger refused".into()));
                        }
                        Ok::<_, sqlx::Error>(())
                    })
                },
                move |m: Paid, attempt: Attempt| {
                    let mailer = mailer.clone();
                    async move {
                        assert!(attempt.downstream_key().is_some());
                        let id = mailer.send(Duration::ZERO).await.unwrap();
                        Ok::<_, sqlx::Error>(format!("{id} for {}", m.order))
                    }
                },
            )
            .unwrap()
    };
    // The keys on MySQL too, beside the handler's tables.
    let processor = Processor::new(
        Coordinator::builder(store)
            .policy(Policy::new().lease(Duration::from_secs(5)))
            .build(),
        Operation::new("invoice.send").unwrap(),
        invoice_of,
        handler,
    );

    // Three deliveries of one order: one row, one email, the same receipt each time.
    let nine = Paid {
        order: support::order("nine"),
    };
    let mut receipts = Vec::new();
    for delivery in 1..=3 {
        let done = processor.process(&nine, delivery).await;
        assert_eq!(done.settlement, Settlement::Ack, "{:?}", done.settlement);
        receipts.push(done.receipt.unwrap().value);
    }
    assert!(receipts.iter().all(|r| *r == receipts[0]), "{receipts:?}");
    assert_eq!(support::ledger_rows(&pool, &nine.order).await, 1);
    assert_eq!(mailer.sent(), 1);

    // Two deliveries at once (a redelivery racing the first): one row, one email.
    let seven = Paid {
        order: support::order("seven"),
    };
    let (a, b) = tokio::join!(processor.process(&seven, 1), processor.process(&seven, 2));
    assert_eq!(
        (a.settlement, b.settlement),
        (Settlement::Ack, Settlement::Ack)
    );
    assert_eq!(support::ledger_rows(&pool, &seven.order).await, 1);
    assert_eq!(mailer.sent(), 2);

    // A database effect that fails: its row rolls back with the inbox's, no email, and the
    // retry credits and mails once.
    let five = Paid {
        order: support::order("five"),
    };
    fail_db.store(true, Ordering::SeqCst);
    let failed = processor.process(&five, 1).await;
    assert!(
        matches!(failed.settlement, Settlement::Retry { .. }),
        "{:?}",
        failed.settlement
    );
    assert_eq!(support::ledger_rows(&pool, &five.order).await, 0);
    assert_eq!(mailer.sent(), 2);
    let retried = processor.process(&five, 2).await;
    assert_eq!(retried.settlement, Settlement::Ack);
    assert_eq!(support::ledger_rows(&pool, &five.order).await, 1);
    assert_eq!(mailer.sent(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_consumer_name_is_refused_before_anything_runs() {
    let Some(store) = support::store().await else {
        return;
    };
    let refused = Inbox::new().handler(
        store.pool().clone(),
        "bad consumer\n",
        invoice_of,
        |_: &Paid, _| Box::pin(async { Ok::<_, sqlx::Error>(()) }),
        |_: Paid, _: Attempt| async { Ok::<_, sqlx::Error>(()) },
    );
    assert!(matches!(
        refused,
        Err(idemkit_sql::InboxError::InvalidId(_))
    ));
    // The error type a handler reports is the runner's, under this crate's path.
    let e: HandlerError<sqlx::Error> = HandlerError::Database(sqlx::Error::PoolClosed);
    assert!(e.to_string().contains("database effect"));
}
