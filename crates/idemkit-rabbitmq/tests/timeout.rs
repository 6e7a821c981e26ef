//! A handler slower than the broker's `consumer_timeout`, on a RabbitMQ node of the test's
//! own whose timeout is 2 s (the machine's broker keeps its 30 minutes): the broker closes
//! the channel and requeues the message while the handler still runs.
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation, Policy};
use idemkit_rabbitmq::{Message, RabbitRunner};
use idemkit_redis::RedisStore;
use idemkit_runner::{Processor, Settlement};
use support::*;

type Log = Arc<Mutex<Vec<(u32, Settlement, Option<String>)>>>;

/// One message, a handler that mails and then takes 3.5 s, a lease of 1 s (renewed while
/// it runs). The mails and what the runner settled.
async fn outlived(
    uri: &str,
    protected: bool,
) -> (
    BTreeMap<String, u32>,
    Vec<(u32, Settlement, Option<String>)>,
) {
    let (prefix, q, log) = (unique("prefix"), unique("orders"), Log::default());
    let mails = format!("{prefix}:mails");
    let ch = channel(uri).await;
    queue(&ch, &q, false, None).await;
    let store = RedisStore::builder()
        .prefix(&prefix)
        .connect(&redis_url())
        .await
        .unwrap();
    let coordinator = Coordinator::builder(store)
        .policy(Policy::new().lease(Duration::from_secs(1)))
        .build();
    let m = mails.clone();
    let processor = Processor::builder(coordinator, Operation::new("mail.invoice").unwrap())
        .key(|m: &Message| Key::compose([m.text().unwrap_or(""), "invoice"]))
        .handler(move |msg: Message, _| {
            let mails = m.clone();
            async move {
                let order = msg.text().unwrap_or("").to_string();
                let mut r = redis().await;
                redis::cmd("RPUSH")
                    .arg(&mails)
                    .arg(&order)
                    .query_async::<()>(&mut r)
                    .await?;
                tokio::time::sleep(Duration::from_millis(3500)).await;
                Ok::<_, redis::RedisError>(format!("em_{order}_{}", msg.delivered()))
            }
        })
        .protected(protected);
    let l = log.clone();
    let runner = RabbitRunner::new(uri, &q, processor).on_settled(move |x| {
        l.lock().unwrap().push((
            x.delivered,
            x.processed.settlement.clone(),
            x.processed.receipt.as_ref().map(|r| r.value.clone()),
        ));
    });
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(runner.run(async move {
        let _ = rx.await;
    }));
    publish(&ch, &q, "order-1").await;
    let settled = eventually(Duration::from_secs(30), || async {
        log.lock()
            .unwrap()
            .iter()
            .filter(|e| e.1 == Settlement::Ack)
            .count()
            >= 2
    })
    .await;
    let _ = tx.send(());
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the runner stopped")
        .unwrap()
        .unwrap();
    assert!(
        settled,
        "both deliveries settled: {:?}",
        log.lock().unwrap()
    );
    let log = log.lock().unwrap().clone();
    (effects(&mails).await, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_that_outlives_the_consumer_timeout_mails_once() {
    let Some(uri) = idemkit_test::brokers::rabbitmq_consumer_timeout() else {
        return;
    };
    let ((mails, log), (without, _)) = tokio::join!(outlived(&uri, true), outlived(&uri, false));
    eprintln!("with idemkit: {mails:?} {log:?}; without: {without:?}");
    assert_eq!(mails["order-1"], 1, "one mail: {log:?}");
    assert!(
        log.iter().any(|e| e.0 == 2),
        "the broker redelivered it while the handler ran: {log:?}"
    );
    // The first delivery's result, replayed to the redelivery (its ack was refused: the
    // channel it came on was closed).
    assert!(
        log.iter()
            .all(|e| e.1 == Settlement::Ack && e.2.as_deref() == Some("em_order-1_1")),
        "{log:?}"
    );
    assert!(
        without["order-1"] >= 2,
        "without: the redelivery mails again"
    );
}
