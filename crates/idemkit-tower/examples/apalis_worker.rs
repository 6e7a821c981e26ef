//! Two apalis workers on one Redis queue, with the idempotency layer: an invoice job pushed
//! twice (a producer's retry) sends one mail.
//!
//! ```text
//! # Redis on 127.0.0.1:6379
//! cargo run -p idemkit-tower --example apalis_worker
//! cargo run -p idemkit-tower --example apalis_worker -- --without-layer   # two mails
//! ```
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use apalis::prelude::*;
use apalis_redis::RedisStorage;
use idemkit::redis::RedisStore;
use idemkit::tower::IdempotencyLayer;
use idemkit::{Coordinator, Key, Operation};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Invoice {
    order: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let with_layer = !std::env::args().any(|a| a == "--without-layer");
    // A queue and a key prefix of this run's own.
    let run = format!("idemkit-example-{:x}", fastrand::u64(..));
    let conn = apalis_redis::connect(url.as_str()).await?;
    let config = apalis_redis::Config::default().queue(&run);
    let mut queue = RedisStorage::<Invoice, _>::new(conn.clone()).with_config(config.clone());
    for _ in 0..2 {
        queue
            .push(Invoice {
                order: "order-9".into(),
            })
            .await?;
    }

    let store = RedisStore::builder()
        .prefix(run.clone())
        .connect(&url)
        .await?;
    let mails = Arc::new(AtomicU32::new(0));
    let mut workers = Vec::new();
    for name in ["worker-1", "worker-2"] {
        let mails = mails.clone();
        let send_invoice = move |job: Invoice| {
            let mails = mails.clone();
            async move {
                mails.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await; // the mail provider
                println!("{name}: mailed the invoice of {}", job.order);
                Ok::<_, BoxDynError>(format!("em_{}", job.order))
            }
        };
        let backend = RedisStorage::<Invoice, _>::new(conn.clone()).with_config(config.clone());
        let stop = async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok::<_, std::io::Error>(())
        };
        let worker_name = format!("{run}-{name}");
        if with_layer {
            // The job's effect: the invoice of its order, whichever job asks for it.
            let layer = IdempotencyLayer::new(
                Coordinator::new(store.clone()),
                Operation::new("mail.invoice")?,
                |task: &Task<Invoice>| Key::compose([task.args.order.as_str(), "invoice"]),
            );
            let w = WorkerBuilder::new(worker_name)
                .backend(backend)
                .layer(layer)
                .build(send_invoice);
            workers.push(tokio::spawn(w.run_until(stop)));
        } else {
            let w = WorkerBuilder::new(worker_name)
                .backend(backend)
                .build(send_invoice);
            workers.push(tokio::spawn(w.run_until(stop)));
        }
    }
    for w in workers {
        let _ = w.await?;
    }
    println!(
        "{} layer: 2 jobs for order-9 -> mails sent={}",
        if with_layer {
            "with the"
        } else {
            "without the"
        },
        mails.load(Ordering::SeqCst)
    );
    Ok(())
}
