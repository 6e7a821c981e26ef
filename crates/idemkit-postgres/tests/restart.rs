//! A database restart in the middle of a handler, on a PostgreSQL server this test owns
//! (initdb in a temporary directory, on a free port): the open transaction fails cleanly,
//! nothing half-written survives, and the next delivery succeeds.

mod support;

use std::time::Duration;

use idemkit_core::{Coordinator, Error, Key, Operation, StoreErrorKind};
use idemkit_postgres::{Inbox, PgStore, Seen};
use idemkit_test::Mailer;
use idemkit_test::pg_server::PgServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_transaction_leaves_nothing_half_written_and_the_next_delivery_succeeds() {
    let server = match PgServer::start() {
        Ok(server) => server,
        Err(what) => {
            idemkit_test::require_service(&what, false);
            return;
        }
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .test_before_acquire(true)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&server.url())
        .await
        .unwrap();
    support::ledger(&pool).await;
    let store = PgStore::new(pool.clone());
    store.migrate().await.unwrap();
    let inbox = Inbox::new();
    inbox.migrate(&pool).await.unwrap();
    let keys = Coordinator::new(store.clone());
    let (op, key) = (
        Operation::new("mail.invoice").unwrap(),
        Key::new("order-1.invoice").unwrap(),
    );
    let mailer = Mailer::default();

    // Delivery 1: inbox row and ledger row written, then the server crashes before the
    // commit.
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        inbox.claim(&mut tx, "billing", "m-1").await.unwrap(),
        Seen::New
    );
    sqlx::query("INSERT INTO idemkit_test.ledger (order_id) VALUES ('order-1')")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(server.crash());
    // While it is down, the key fails closed: the email is not sent unprotected.
    let down = keys
        .call(&op, &key)
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert!(
        matches!(&down, Err(Error::Store { source, .. }) if source.kind() == StoreErrorKind::Unavailable),
        "{down:?}"
    );
    assert!(server.start_again());
    assert!(
        tx.commit().await.is_err(),
        "the commit on a crashed server must fail"
    );

    // Nothing half-written survived.
    assert_eq!(support::ledger_rows(&pool, "order-1").await, 0);
    let inbox_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM public.idemkit_inbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(inbox_rows, 0);

    // Delivery 2 succeeds: one row, one email.
    let done = inbox
        .deliver(
            &pool,
            "billing",
            "m-1",
            |conn| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO idemkit_test.ledger (order_id) VALUES ('order-1')")
                        .execute(conn)
                        .await
                        .map(drop)
                })
            },
            keys.call(&op, &key),
            |_| async { Ok::<_, sqlx::Error>(mailer.send(Duration::ZERO).await.unwrap()) },
        )
        .await
        .unwrap();
    assert_eq!(done.seen, Seen::New);
    assert_eq!(support::ledger_rows(&pool, "order-1").await, 1);
    assert_eq!(mailer.sent(), 1);
}
