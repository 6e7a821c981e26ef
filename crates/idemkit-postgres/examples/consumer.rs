//! The seed's consumer on PostgreSQL with the transactional call: the ledger row and its
//! idempotency record commit together, then the invoice email goes out under its own key,
//! on every delivery.
//!
//! ```sh
//! cargo run -p idemkit-postgres --example consumer -- postgres://postgres@127.0.0.1/test
//! ```
//!
//! One message is delivered three times: delivery 1 dies after its commit and before its
//! email, delivery 2 after its email and before its ack, delivery 3 acks. It prints one
//! ledger row and one email.

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};

use idemkit::postgres::{InTransaction, PgStore};
use idemkit::{Coordinator, Key, Operation};

static MAILS: AtomicUsize = AtomicUsize::new(0);

async fn send_invoice(order: &str) -> Result<String, std::io::Error> {
    let n = MAILS.fetch_add(1, Ordering::SeqCst) + 1;
    println!("  mail em_{n} sent for {order}");
    Ok(format!("em_{n}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1/test".into());
    let store = PgStore::builder()
        .schema("idemkit_examples")
        .max_connections(4)
        .connect(&url)
        .await?;
    store.migrate().await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS idemkit_examples.ledger (id bigserial PRIMARY KEY, order_id text NOT NULL)")
        .execute(store.pool())
        .await?;
    let c = Coordinator::new(store.clone());
    let order = format!("order-{:x}", fastrand::u32(..));
    let (credit, mail) = (
        Operation::new("ledger.credit")?,
        Operation::new("mail.invoice")?,
    );
    let (credit_key, mail_key) = (
        Key::new(&order)?,
        Key::compose([order.as_str(), "invoice"])?,
    );

    for delivery in 1..=3 {
        println!("delivery {delivery}");
        // The database effect and its record, in one transaction.
        let mut tx = store.pool().begin().await?;
        let o = order.clone();
        let row = c
            .call(&credit, &credit_key)
            .in_transaction(&mut tx)
            .run(|conn, _| {
                Box::pin(async move {
                    sqlx::query_scalar::<_, i64>(
                        "INSERT INTO idemkit_examples.ledger (order_id) VALUES ($1) RETURNING id",
                    )
                    .bind(o)
                    .fetch_one(conn)
                    .await
                })
            })
            .await?;
        tx.commit().await?;
        println!("  ledger row {} ({:?})", row.value, row.source);
        if delivery == 1 {
            println!("  dies after its commit, before its email");
            continue;
        }
        // The external effect under its own key, on every delivery.
        let sent = c
            .call(&mail, &mail_key)
            .run(|_| send_invoice(&order))
            .await?;
        println!("  email {} ({:?})", sent.value, sent.source);
        if delivery == 2 {
            println!("  dies after its email, before its ack");
        }
    }
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idemkit_examples.ledger WHERE order_id = $1")
            .bind(&order)
            .fetch_one(store.pool())
            .await?;
    let mails = MAILS.load(Ordering::SeqCst);
    println!("{order}: ledger rows={rows}  mails sent={mails}");
    Ok(if rows == 1 && mails == 1 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
