//! The seed's consumer on JetStream, from the same building block as on Kafka
//! (`idemkit_postgres::Inbox::handler` under a `Processor`): an order paid event published
//! twice (a retrying producer: two messages, one effect) makes one invoice row and one email.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, Message, consumer::pull, stream};
use idemkit_core::{Attempt, Coordinator, Key, KeyError, Operation};
use idemkit_nats::JetStreamRunner;
use idemkit_postgres::sqlx::{self, PgPool};
use idemkit_postgres::{Inbox, PgStore};
use idemkit_runner::{Processor, Settlement};
use support::{server, unique};

fn postgres_url() -> String {
    std::env::var("IDEMKIT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn invoice_of(m: &Message) -> Result<Key, KeyError> {
    Key::compose([String::from_utf8_lossy(&m.payload).as_ref(), "invoice"])
}

async fn tables(pool: &PgPool) {
    Inbox::new().migrate(pool).await.unwrap();
    for ddl in [
        "CREATE TABLE IF NOT EXISTS nats_invoices (order_id text NOT NULL)",
        "CREATE TABLE IF NOT EXISTS nats_mail_api (idempotency_key text PRIMARY KEY, order_id text NOT NULL, calls int NOT NULL DEFAULT 1)",
    ] {
        sqlx::query(ddl).execute(pool).await.unwrap();
    }
}

/// A JetStream stream with a pull consumer, and PostgreSQL with the keys' and the tables'.
struct Setup {
    store: PgStore,
    pool: PgPool,
    js: jetstream::Context,
    subject: String,
    consumer: jetstream::consumer::PullConsumer,
    order: String,
}

async fn setup() -> Option<Setup> {
    let url = server()?;
    let store = PgStore::connect(&postgres_url()).await;
    if !idemkit_test::require_service("postgres", store.is_ok()) {
        return None;
    }
    let store = store.unwrap();
    store.migrate().await.unwrap();
    let pool = store.pool().clone();
    tables(&pool).await;
    let js = jetstream::new(async_nats::connect(&url).await.expect("nats"));
    let (name, subject, durable, order) = (
        unique("S"),
        unique("paid"),
        unique("billing"),
        unique("order"),
    );
    let s = js
        .create_stream(stream::Config {
            name,
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let consumer = s
        .create_consumer(pull::Config {
            durable_name: Some(durable),
            ..Default::default()
        })
        .await
        .unwrap();
    Some(Setup {
        store,
        pool,
        js,
        subject,
        consumer,
        order,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_order_paid_twice_makes_one_invoice_and_one_email() {
    let Some(Setup {
        store,
        pool,
        js,
        subject,
        consumer,
        order,
    }) = setup().await
    else {
        return;
    };

    let handler = Inbox::new()
        .handler(
            pool.clone(),
            "billing",
            invoice_of,
            |m: &Message, conn| {
                let order = String::from_utf8_lossy(&m.payload).into_owned();
                Box::pin(async move {
                    sqlx::query("INSERT INTO nats_invoices (order_id) VALUES ($1)")
                        .bind(order)
                        .execute(conn)
                        .await?;
                    Ok::<_, sqlx::Error>(())
                })
            },
            {
                let pool = pool.clone();
                move |m: Message, attempt: Attempt| {
                    let pool = pool.clone();
                    async move {
                        let order = String::from_utf8_lossy(&m.payload).into_owned();
                        let key = attempt.downstream_key().expect("a protected attempt");
                        sqlx::query(
                            "INSERT INTO nats_mail_api (idempotency_key, order_id) VALUES ($1, $2)
                             ON CONFLICT (idempotency_key) DO UPDATE SET calls = nats_mail_api.calls + 1",
                        )
                        .bind(key.to_string())
                        .bind(&order)
                        .execute(&pool)
                        .await?;
                        Ok::<_, sqlx::Error>(format!("em_{order}"))
                    }
                }
            },
        )
        .unwrap();
    let processor = Processor::new(
        Coordinator::new(store),
        Operation::new("invoice.send").unwrap(),
        invoice_of,
        handler,
    );
    let acked = Arc::new(AtomicU32::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let (a, d) = (acked.clone(), done.clone());
    let runner = JetStreamRunner::new(consumer, processor).on_settled(move |x| {
        if x.processed.settlement == Settlement::Ack && a.fetch_add(1, Ordering::SeqCst) + 1 == 2 {
            d.notify_one();
        }
    });
    for _ in 0..2 {
        js.publish(subject.clone(), order.clone().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    tokio::time::timeout(
        Duration::from_secs(60),
        runner.run(async move { done.notified().await }),
    )
    .await
    .expect("both messages settled")
    .unwrap();

    let invoices: i64 =
        sqlx::query_scalar("SELECT count(*) FROM nats_invoices WHERE order_id = $1")
            .bind(&order)
            .fetch_one(&pool)
            .await
            .unwrap();
    let emails: i64 = sqlx::query_scalar("SELECT count(*) FROM nats_mail_api WHERE order_id = $1")
        .bind(&order)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((invoices, emails, acked.load(Ordering::SeqCst)), (1, 1, 2));
}

/// Issue 52: the inbox and the key take the message's dedupe id by default. A message an
/// idemkit producer published once (`publish_once`: its `Nats-Msg-Id` is the producer's
/// effect's key) is claimed in the inbox under that id and keyed on it, with no key function
/// given to either (`()` for the inbox's claim, no `.key(...)` for the processor).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_inbox_and_the_key_take_the_dedupe_id_by_default() {
    let Some(Setup {
        store,
        pool,
        js,
        subject,
        consumer,
        order,
    }) = setup().await
    else {
        return;
    };
    let handler = Inbox::new()
        .handler(
            pool.clone(),
            "billing-by-id",
            (),
            |m: &Message, conn| {
                let order = String::from_utf8_lossy(&m.payload).into_owned();
                Box::pin(async move {
                    sqlx::query("INSERT INTO nats_invoices (order_id) VALUES ($1)")
                        .bind(order)
                        .execute(conn)
                        .await?;
                    Ok::<_, sqlx::Error>(())
                })
            },
            |m: Message, _attempt: Attempt| async move {
                Ok::<_, sqlx::Error>(format!("em_{}", m.payload.len()))
            },
        )
        .unwrap();
    let processor = Processor::builder(
        Coordinator::new(store),
        Operation::new("invoice.send").unwrap(),
    )
    .handler(handler);
    let done = Arc::new(tokio::sync::Notify::new());
    let d = done.clone();
    let runner = JetStreamRunner::new(consumer, processor).on_settled(move |x| {
        assert_eq!(x.processed.settlement, Settlement::Ack);
        d.notify_one();
    });
    let id = format!("idk1_{}", unique("paid").replace('-', ""));
    idemkit_nats::publish_once(&js, subject.clone(), &id, order.clone().into(), None)
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(60),
        runner.run(async move { done.notified().await }),
    )
    .await
    .expect("the message settled")
    .unwrap();
    let claimed: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {} WHERE consumer = 'billing-by-id' AND message_id = $1",
        Inbox::new().name()
    ))
    .bind(&id)
    .fetch_one(&pool)
    .await
    .unwrap();
    let invoices: i64 =
        sqlx::query_scalar("SELECT count(*) FROM nats_invoices WHERE order_id = $1")
            .bind(&order)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((claimed, invoices), (1, 1));
}
