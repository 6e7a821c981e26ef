//! `amqps://`: the runner over TLS to a RabbitMQ node of the test's own whose certificate
//! (for `127.0.0.1`) the test made. The queue is declared and fed on the node's plain
//! listener; the runner consumes on the TLS one.
//!
//! What must hold: with the node's authority the runner consumes, and the handler runs
//! once per key; with another authority (or none: the system's roots) the first
//! connection fails and `run` returns the error, so no message is taken.
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
use idemkit_rabbitmq::{Message, RabbitRunner};
use idemkit_runner::{Processor, Settlement};
use idemkit_test::eventually;
use idemkit_test::tls::TestCerts;
use support::*;

type Log = Arc<Mutex<Vec<(Settlement, Option<String>)>>>;

fn node() -> Option<(TestCerts, String, String)> {
    let certs = TestCerts::make();
    if !idemkit_test::require_service("openssl (test certificates)", certs.is_ok()) {
        return None;
    }
    let certs = certs.unwrap();
    let node = idemkit_test::brokers::rabbitmq_tls_node(&certs);
    if !idemkit_test::require_service(
        "a RabbitMQ node of the test's own with TLS (rabbitmq-server)",
        node.is_some(),
    ) {
        return None;
    }
    let (amqps, amqp) = node.unwrap();
    Some((certs, amqps, amqp))
}

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
    let coordinator = Coordinator::new(MemoryStore::new());
    let processor = Processor::builder(coordinator, Operation::new("mail.invoice").unwrap())
        .key(|m: &Message| Key::compose([m.text().unwrap_or(""), "invoice"]))
        .handler(move |msg: Message, _| {
            let sent = sent.clone();
            async move {
                let order = msg.text().unwrap_or("").to_string();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_consumes_over_tls_with_the_nodes_authority() {
    let Some((certs, amqps, amqp)) = node() else {
        return;
    };
    let q = unique("tls-orders");
    let ch = channel(&amqp).await;
    queue(&ch, &q, false, None).await;
    // The same order twice: one email, the second delivery a replay.
    publish(&ch, &q, "order-9").await;
    publish(&ch, &q, "order-9").await;
    let (sent, log) = (Arc::new(Mutex::new(Vec::new())), Log::default());
    let run = runner(&amqps, &q, sent.clone(), log.clone()).tls_ca_file(certs.ca(), None);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run.run(async move {
        let _ = rx.await;
    }));
    let settled = eventually(Duration::from_secs(30), || async {
        log.lock().unwrap().len() >= 2
    })
    .await;
    let _ = tx.send(());
    task.await.unwrap().expect("the runner over TLS");
    assert!(
        settled,
        "both deliveries settled: {:?}",
        log.lock().unwrap()
    );
    assert_eq!(*sent.lock().unwrap(), ["order-9"]);
    assert!(
        log.lock()
            .unwrap()
            .iter()
            .all(|(s, v)| *s == Settlement::Ack && v.as_deref() == Some("em_order-9"))
    );
    assert_eq!(ready(&ch, &q).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_runner_does_not_trust_is_an_error_and_takes_nothing() {
    let Some((certs, amqps, amqp)) = node() else {
        return;
    };
    let q = unique("tls-orders");
    let ch = channel(&amqp).await;
    queue(&ch, &q, false, None).await;
    publish(&ch, &q, "order-1").await;
    let sent = Arc::new(Mutex::new(Vec::new()));
    for run in [
        runner(&amqps, &q, sent.clone(), Log::default()).tls_ca_file(certs.other_ca(), None),
        // No authority named: the system's roots, which do not have the test's.
        runner(&amqps, &q, sent.clone(), Log::default()),
        // An authority file that is not there.
        runner(&amqps, &q, sent.clone(), Log::default()).tls_ca_file("/nonexistent/ca.pem", None),
    ] {
        let result = tokio::time::timeout(
            Duration::from_secs(30),
            run.run(std::future::pending::<()>()),
        )
        .await
        .expect("run returns on a refused first connection");
        assert!(result.is_err(), "connected to an untrusted node");
    }
    assert!(sent.lock().unwrap().is_empty());
    assert_eq!(ready(&ch, &q).await, 1, "the message is still there");
}
