//! `tls://`: the JetStream runner on a connection the application opened over TLS
//! (`async_nats::ConnectOptions` with the server's authority), to a nats-server of the
//! test's own that requires TLS, with a certificate (for `127.0.0.1`) the test made. The
//! runner takes the application's consumer, so TLS is the connection's: what this shows is
//! that it works end to end, and that a server the client does not trust is refused before
//! anything is consumed.
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, Message, consumer::pull, stream};
use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
use idemkit_nats::JetStreamRunner;
use idemkit_runner::{Processor, Settlement};
use idemkit_test::tls::TestCerts;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_consumes_over_tls_and_an_untrusted_server_is_refused() {
    let certs = TestCerts::make();
    if !idemkit_test::require_service("openssl (test certificates)", certs.is_ok()) {
        return;
    }
    let certs = certs.unwrap();
    let url = idemkit_test::brokers::nats_tls(&certs);
    if !idemkit_test::require_service("a nats-server of the test's own with TLS", url.is_some()) {
        return;
    }
    let url = url.unwrap();

    // Another authority: refused at connect.
    let refused = async_nats::ConnectOptions::new()
        .add_root_certificates(certs.other_ca())
        .require_tls(true)
        .connect(&url);
    let refused = tokio::time::timeout(Duration::from_secs(10), refused).await;
    assert!(
        !matches!(refused, Ok(Ok(_))),
        "connected to a server signed by another authority"
    );

    let client = async_nats::ConnectOptions::new()
        .add_root_certificates(certs.ca())
        .require_tls(true)
        .connect(&url)
        .await
        .expect("connect over TLS with the server's authority");
    let js = jetstream::new(client);
    let (name, subject) = (unique("S"), unique("orders"));
    let s = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await
        .expect("stream");
    let consumer = s
        .create_consumer(pull::Config {
            durable_name: Some(unique("workers")),
            ..Default::default()
        })
        .await
        .expect("consumer");
    // The same order twice: one email, the second delivery a replay.
    for _ in 0..2 {
        js.publish(subject.clone(), "order-9".into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let sent = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = Arc::new(Mutex::new(Vec::<(Settlement, Option<String>)>::new()));
    let processor = {
        let sent = sent.clone();
        Processor::new(
            Coordinator::new(MemoryStore::new()),
            Operation::new("mail.invoice").unwrap(),
            |m: &Message| Key::compose([String::from_utf8_lossy(&m.payload).as_ref(), "invoice"]),
            move |m: Message, _| {
                let sent = sent.clone();
                async move {
                    let order = String::from_utf8_lossy(&m.payload).into_owned();
                    sent.lock().unwrap().push(order.clone());
                    Ok::<_, std::io::Error>(format!("em_{order}"))
                }
            },
        )
    };
    let l = log.clone();
    let runner = JetStreamRunner::new(consumer, processor).on_settled(move |x| {
        l.lock().unwrap().push((
            x.processed.settlement.clone(),
            x.processed.receipt.as_ref().map(|r| r.value.clone()),
        ));
    });
    let stop = Arc::new(tokio::sync::Notify::new());
    let s1 = stop.clone();
    let task = tokio::spawn(runner.run(async move { s1.notified().await }));
    let settled = eventually(Duration::from_secs(30), || async {
        log.lock().unwrap().len() >= 2
    })
    .await;
    stop.notify_one();
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
}
