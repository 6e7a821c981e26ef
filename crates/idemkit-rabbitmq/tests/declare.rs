//! `RabbitRunner::declare_queue`: the runner declares its queue before consuming it
//! (opt-in), so a worker can start before anything made the queue; a declaration that
//! differs from the queue's (another durability) fails `run` instead of consuming a queue
//! other than the one described.
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
use idemkit_rabbitmq::lapin::options::QueueDeclareOptions;
use idemkit_rabbitmq::lapin::types::FieldTable;
use idemkit_rabbitmq::{Message, RabbitRunner};
use idemkit_runner::{Processor, Settlement};
use idemkit_test::eventually;
use support::*;

type Log = Arc<Mutex<Vec<(Settlement, Option<String>)>>>;

fn runner(
    uri: &str,
    queue: &str,
    sent: Arc<Mutex<Vec<String>>>,
    log: Log,
) -> RabbitRunner<
    MemoryStore,
    impl Fn(&Message) -> Result<Key, idemkit_core::KeyError> + Send + Sync + 'static,
    impl idemkit_runner::Handle<Message, Output = String> + 'static,
> {
    let processor = Processor::builder(
        Coordinator::new(MemoryStore::new()),
        Operation::new("mail.invoice").unwrap(),
    )
    .key(|m: &Message| Key::compose([m.text().unwrap_or(""), "invoice"]))
    .handler(move |m: Message, _| {
        let sent = sent.clone();
        async move {
            let order = m.text().unwrap_or("").to_string();
            sent.lock().unwrap().push(order.clone());
            Ok::<_, std::io::Error>(format!("em_{order}"))
        }
    });
    RabbitRunner::new(uri, queue, processor).on_settled(move |x| {
        log.lock().unwrap().push((
            x.processed.settlement.clone(),
            x.processed.receipt.as_ref().map(|r| r.value.clone()),
        ));
    })
}

/// Whether `queue` exists, asked on a channel of its own (a refused passive declaration
/// closes its channel).
async fn exists(uri: &str, queue: &str) -> bool {
    channel(uri)
        .await
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_declares_its_queue_consumes_it_from_the_start() {
    let Some(uri) = server() else { return };
    let q = unique("declared");
    assert!(!exists(&uri, &q).await);
    let (sent, log) = (Arc::new(Mutex::new(Vec::new())), Log::default());
    let run = runner(&uri, &q, sent.clone(), log.clone()).declare_queue(
        QueueDeclareOptions::default(),
        expiring(FieldTable::default()),
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run.run(async move {
        let _ = rx.await;
    }));
    assert!(
        eventually(Duration::from_secs(30), || exists(&uri, &q)).await,
        "the runner declared its queue"
    );
    let ch = channel(&uri).await;
    publish(&ch, &q, "order-9").await;
    publish(&ch, &q, "order-9").await;
    let settled = eventually(Duration::from_secs(30), || async {
        log.lock().unwrap().len() >= 2
    })
    .await;
    let _ = tx.send(());
    task.await.unwrap().expect("the runner");
    assert!(settled, "{:?}", log.lock().unwrap());
    assert_eq!(*sent.lock().unwrap(), ["order-9"]);
    assert!(
        log.lock()
            .unwrap()
            .iter()
            .all(|(s, _)| *s == Settlement::Ack)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declaration_the_queue_does_not_match_fails_run_and_takes_nothing() {
    let Some(uri) = server() else { return };
    let q = unique("mismatch");
    let ch = channel(&uri).await;
    queue(&ch, &q, false, None).await; // classic, not durable, expiring
    publish(&ch, &q, "order-1").await;
    let sent = Arc::new(Mutex::new(Vec::new()));
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        runner(&uri, &q, sent.clone(), Log::default())
            .declare_queue(durable, expiring(FieldTable::default()))
            .run(std::future::pending::<()>()),
    )
    .await
    .expect("run returns on a refused first connection");
    let e = result.expect_err("a declaration that differs from the queue");
    assert!(
        e.to_string().contains("PRECONDITION_FAILED")
            || format!("{e:?}").contains("PreconditionFailed"),
        "{e:?}"
    );
    assert!(sent.lock().unwrap().is_empty());
    assert_eq!(ready(&ch, &q).await, 1, "the message is still there");
}
