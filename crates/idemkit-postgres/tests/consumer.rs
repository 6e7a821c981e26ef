//! The seed's consumer on real servers: a handler that writes a ledger row (a database
//! effect, protected by the inbox) and sends an invoice email (an external effect,
//! protected by its key), with the key on Redis and on PostgreSQL.
//!
//! Every scenario also runs with one protection removed, and asserts the duplicate it then
//! lets through: the tests can fail, and show what each protection is for.

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use idemkit_core::{Coordinator, InFlight, Key, Operation, Policy, Store};
use idemkit_postgres::{Inbox, PgStore, Seen, TxFuture};
use idemkit_redis::RedisStore;
use idemkit_test::Mailer;
use sqlx::{PgConnection, PgPool};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Crash {
    Never,
    /// The email is out, the transaction not yet committed.
    AfterEmailBeforeCommit,
}

#[derive(Clone, Copy, Debug)]
struct Protections {
    inbox: bool,
    key: bool,
}

const BOTH: Protections = Protections {
    inbox: true,
    key: true,
};
const NO_INBOX: Protections = Protections {
    inbox: false,
    key: true,
};
const NO_KEY: Protections = Protections {
    inbox: true,
    key: false,
};

struct Service<S: Store> {
    pool: PgPool,
    inbox: Inbox,
    keys: Coordinator<S>,
    mailer: Mailer,
}

impl<S: Store> Service<S> {
    async fn new(pool: PgPool, keys: S) -> Arc<Self> {
        support::ledger(&pool).await;
        let inbox = Inbox::new().schema("idemkit_test").unwrap();
        inbox.migrate(&pool).await.unwrap();
        let keys = Coordinator::builder(keys)
            .policy(
                Policy::default()
                    .in_flight(InFlight::Wait)
                    .lease(Duration::from_secs(2)),
            )
            .build();
        Arc::new(Service {
            pool,
            inbox,
            keys,
            mailer: Mailer::default(),
        })
    }

    /// The seed's handler: inbox row and ledger row in one transaction, the email under the
    /// key `<order>.invoice` (on every delivery), then the commit. `crash` stops the task at
    /// that point for ever (the test aborts it).
    async fn handle(&self, message_id: &str, order: &str, p: Protections, crash: Crash) {
        let mut tx = self.pool.begin().await.unwrap();
        let seen = if p.inbox {
            self.inbox
                .claim(&mut tx, "billing", message_id)
                .await
                .unwrap()
        } else {
            Seen::New
        };
        if seen == Seen::New {
            sqlx::query("INSERT INTO idemkit_test.ledger (order_id, amount) VALUES ($1, 100)")
                .bind(order)
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        self.email(order, p).await;
        if crash == Crash::AfterEmailBeforeCommit {
            std::future::pending::<()>().await;
        }
        tx.commit().await.unwrap();
    }

    async fn email(&self, order: &str, p: Protections) {
        if p.key {
            let (op, key) = (
                Operation::new("mail.invoice").unwrap(),
                Key::compose([order, "invoice"]).unwrap(),
            );
            self.keys
                .call(&op, &key)
                .run(|_| self.mailer.send(Duration::from_millis(50)))
                .await
                .unwrap();
        } else {
            self.mailer.send(Duration::from_millis(50)).await.unwrap();
        }
    }

    /// (ledger rows, emails) for an order.
    async fn counts(&self, order: &str) -> (i64, usize) {
        (
            support::ledger_rows(&self.pool, order).await,
            self.mailer.sent(),
        )
    }
}

async fn redis() -> Option<RedisStore> {
    let url =
        std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let store = RedisStore::builder()
        .prefix(format!("idemkit-consumer-{:x}", fastrand::u64(..)))
        .connect(&url)
        .await;
    idemkit_test::require_service(&format!("redis at {url}"), store.is_ok()).then(|| store.unwrap())
}

/// A message delivered three times: one ledger row, one email.
async fn delivered_three_times<S: Store>(keys: S, pool: PgPool, p: Protections) -> (i64, usize) {
    let svc = Service::new(pool, keys).await;
    let order = support::order("order");
    let message = format!("orders.paid/0/{order}");
    for _ in 0..3 {
        svc.handle(&message, &order, p, Crash::Never).await;
    }
    svc.counts(&order).await
}

/// A crash between the email and the commit: the ledger row rolls back; the redelivery
/// writes it, and the key replays the email instead of sending a second.
async fn crash_between_email_and_commit<S: Store>(
    keys: S,
    pool: PgPool,
    p: Protections,
) -> (i64, usize) {
    let svc = Service::new(pool, keys).await;
    let order = support::order("crash");
    let message = format!("orders.paid/0/{order}");
    let first = {
        let (svc, message, order) = (svc.clone(), message.clone(), order.clone());
        tokio::spawn(async move {
            svc.handle(&message, &order, p, Crash::AfterEmailBeforeCommit)
                .await;
        })
    };
    while svc.mailer.sent() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Let the key's completion land (the call returned before the crash point).
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.abort();
    let _ = first.await;
    assert_eq!(
        support::ledger_rows(&svc.pool, &order).await,
        0,
        "the crash rolled the ledger row back"
    );
    svc.handle(&message, &order, p, Crash::Never).await;
    svc.counts(&order).await
}

/// The same message to two handlers at once (a rebalance, an expired visibility timeout).
async fn delivered_concurrently<S: Store>(keys: S, pool: PgPool, p: Protections) -> (i64, usize) {
    let svc = Service::new(pool, keys).await;
    let order = support::order("twice");
    let message = format!("orders.paid/0/{order}");
    let handlers: Vec<_> = (0..2)
        .map(|_| {
            let (svc, message, order) = (svc.clone(), message.clone(), order.clone());
            tokio::spawn(async move { svc.handle(&message, &order, p, Crash::Never).await })
        })
        .collect();
    for h in handlers {
        h.await.unwrap();
    }
    svc.counts(&order).await
}

macro_rules! scenarios {
    ($($name:ident: $store:expr;)*) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn three_deliveries_give_one_row_and_one_email() {
                let Some(pool) = support::pool().await else { return };
                let Some(keys) = $store(pool.clone()).await else { return };
                assert_eq!(delivered_three_times(keys.clone(), pool.clone(), BOTH).await, (1, 1));
                // Without the inbox the ledger row repeats; without the key, the email.
                assert_eq!(delivered_three_times(keys.clone(), pool.clone(), NO_INBOX).await, (3, 1));
                assert_eq!(delivered_three_times(keys, pool, NO_KEY).await, (1, 3));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_crash_between_email_and_commit_sends_one_email() {
                let Some(pool) = support::pool().await else { return };
                let Some(keys) = $store(pool.clone()).await else { return };
                assert_eq!(crash_between_email_and_commit(keys.clone(), pool.clone(), BOTH).await, (1, 1));
                assert_eq!(crash_between_email_and_commit(keys, pool, NO_KEY).await, (1, 2));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_concurrent_duplicate_gives_one_row_and_one_email() {
                let Some(pool) = support::pool().await else { return };
                let Some(keys) = $store(pool.clone()).await else { return };
                assert_eq!(delivered_concurrently(keys.clone(), pool.clone(), BOTH).await, (1, 1));
                assert_eq!(delivered_concurrently(keys.clone(), pool.clone(), NO_INBOX).await, (2, 1));
                assert_eq!(delivered_concurrently(keys, pool, NO_KEY).await, (1, 2));
            }
        }
    )*};
}

async fn on_postgres(pool: PgPool) -> Option<PgStore> {
    let store = PgStore::builder()
        .schema("idemkit_test")
        .table("records")
        .build(pool)
        .unwrap();
    store.migrate().await.unwrap();
    Some(store)
}

async fn on_redis(_: PgPool) -> Option<RedisStore> {
    redis().await
}

scenarios! {
    key_on_postgres: on_postgres;
    key_on_redis: on_redis;
}

/// The database effect given to `Inbox::deliver` here: a ledger row for `order`.
fn ledger_row(
    order: String,
) -> impl for<'t> FnOnce(&'t mut PgConnection) -> TxFuture<'t, Result<(), sqlx::Error>> {
    move |conn| {
        Box::pin(async move {
            sqlx::query("INSERT INTO idemkit_test.ledger (order_id) VALUES ($1)")
                .bind(order)
                .execute(conn)
                .await
                .map(drop)
        })
    }
}

/// The order of effects, encoded (`Inbox::deliver`): a delivery that committed its database
/// effect and died before its email. The redelivery finds the inbox row (a duplicate) and
/// still sends the email, once. The handler that returns early on a duplicate (the trap)
/// loses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_sends_the_email_after_a_crash_between_commit_and_email() {
    let Some(pool) = support::pool().await else {
        return;
    };
    let Some(keys) = on_postgres(pool.clone()).await else {
        return;
    };
    let svc = Service::new(pool.clone(), keys).await;
    let op = Operation::new("mail.invoice").unwrap();
    for early_return in [false, true] {
        let order = support::order("deliver");
        let message = format!("orders.paid/0/{order}");
        let key = Key::compose([order.as_str(), "invoice"]).unwrap();
        let sent_before = svc.mailer.sent();
        // Delivery 1: commits, then dies before the email goes out.
        let first = {
            let (svc, message, order, key, op) = (
                svc.clone(),
                message.clone(),
                order.clone(),
                key.clone(),
                op.clone(),
            );
            tokio::spawn(async move {
                let o = order.clone();
                let _ = svc
                    .inbox
                    .deliver(
                        &svc.pool,
                        "billing",
                        &message,
                        ledger_row(o),
                        svc.keys.call(&op, &key),
                        |_| std::future::pending::<Result<String, sqlx::Error>>(),
                    )
                    .await;
            })
        };
        while support::ledger_rows(&pool, &order).await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        first.abort();
        let _ = first.await;
        // Delivery 2.
        if early_return {
            // The trap: "the inbox says duplicate, so the handler does not run".
            let mut tx = pool.begin().await.unwrap();
            let seen = svc.inbox.claim(&mut tx, "billing", &message).await.unwrap();
            assert_eq!(seen, Seen::Duplicate);
            tx.commit().await.unwrap();
        } else {
            let o = order.clone();
            let done = svc
                .inbox
                .deliver(
                    &svc.pool,
                    "billing",
                    &message,
                    ledger_row(o),
                    svc.keys.call(&op, &key).in_flight(InFlight::Wait),
                    |_| async {
                        Ok::<_, sqlx::Error>(
                            svc.mailer
                                .send(Duration::ZERO)
                                .await
                                .unwrap_or_else(|e: Infallible| match e {}),
                        )
                    },
                )
                .await
                .unwrap();
            assert_eq!(done.seen, Seen::Duplicate);
            // Delivery 3: a replay, no second email.
            let again = svc
                .inbox
                .deliver(
                    &svc.pool,
                    "billing",
                    &message,
                    |_| Box::pin(async { unreachable!("the inbox has the row") }),
                    svc.keys.call(&op, &key),
                    |_| async { Ok::<_, sqlx::Error>("second".to_string()) },
                )
                .await
                .unwrap();
            assert!(again.external.is_replay());
        }
        let emails = svc.mailer.sent() - sent_before;
        assert_eq!(support::ledger_rows(&pool, &order).await, 1);
        assert_eq!(
            emails,
            if early_return { 0 } else { 1 },
            "early_return={early_return}"
        );
    }
}

/// Bad ids are typed errors before anything runs; the database effect's failure rolls the
/// inbox row back, so the next delivery is new again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_bad_ids_and_a_failed_effect_leave_nothing() {
    let Some(pool) = support::pool().await else {
        return;
    };
    let inbox = Inbox::new().schema("idemkit_test").unwrap();
    inbox.migrate(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for (consumer, message) in [
        ("", "m"),
        ("billing", ""),
        ("billing", "   "),
        ("bad consumer!", "m"),
    ] {
        let err = inbox.claim(&mut tx, consumer, message).await.unwrap_err();
        assert!(
            matches!(err, idemkit_postgres::InboxError::InvalidId(_)),
            "{err}"
        );
    }
    let long = "m".repeat(idemkit_core::ident::MAX_KEY_LEN + 1);
    assert!(matches!(
        inbox.claim(&mut tx, "billing", &long).await,
        Err(idemkit_postgres::InboxError::InvalidId(_))
    ));
    tx.commit().await.unwrap();

    let Some(keys) = on_postgres(pool.clone()).await else {
        return;
    };
    let c = Coordinator::new(keys);
    let (op, key) = (
        Operation::new("mail.invoice").unwrap(),
        Key::new(support::order("k")).unwrap(),
    );
    let message = support::order("failing");
    let failed = inbox
        .deliver(
            &pool,
            "billing",
            &message,
            |_| Box::pin(async { Err::<(), _>("ledger constraint") }),
            c.call(&op, &key),
            |_| async { Ok::<_, &str>(1) },
        )
        .await;
    assert!(matches!(
        failed,
        Err(idemkit_postgres::DeliverError::Database(
            "ledger constraint"
        ))
    ));
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        inbox.claim(&mut tx, "billing", &message).await.unwrap(),
        Seen::New
    );
    tx.rollback().await.unwrap();
}
