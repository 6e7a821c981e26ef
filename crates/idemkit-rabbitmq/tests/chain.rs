//! One effect key end to end (issue 52), on the machine's brokers, Redis and a real HTTP
//! server: an order's payment on JetStream (published twice by its producer under one
//! `Nats-Msg-Id`) → consumer A, keyed by that id (by default: no key function), publishes
//! "invoice requested" to RabbitMQ and fails before its result is stored (the window between
//! an effect and its result: a worker killed there behaves the same, its redelivery runs the
//! action again) → its retry publishes again → consumer B, keyed by the message's
//! `message_id` (by default too), sends the email (its own keyed call) and charges the card
//! at a payment provider behind idemkit's HTTP layer, then fails before its result is stored
//! → its retry does both again. With the dedupe ids (A publishes under its effect's
//! downstream key, B sends its downstream key as the `Idempotency-Key`) the email goes once
//! and the card is charged once; with the switch off (a fresh id per attempt, as a client
//! that names the delivery would) twice and four times.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Operation};
use idemkit_nats::async_nats::jetstream::{self, consumer::pull, stream};
use idemkit_nats::{JetStreamRunner, publish_once as publish_to_stream};
use idemkit_rabbitmq::lapin::BasicProperties;
use idemkit_rabbitmq::{Message, RabbitRunner, publish_once};
use idemkit_redis::RedisStore;
use idemkit_runner::{Processor, RetryPolicy};
use tokio::sync::Notify;

/// What one run of the chain did.
#[derive(Debug, PartialEq, Eq)]
struct Counts {
    /// Messages the producer stored on the stream (its two publishes, one id).
    stream_messages: u64,
    /// Messages A published to RabbitMQ (its first attempt's and its retry's).
    published: usize,
    /// Emails B sent.
    emails: usize,
    /// Charges the provider made.
    charges: usize,
    /// Messages B settled (both copies).
    settled: usize,
}

async fn chain(dedupe_ids: bool) -> Option<Counts> {
    let nats = idemkit_test::brokers::nats()?;
    let amqp = support::server()?;
    let prefix = support::unique("chain");
    let store = || async {
        RedisStore::builder()
            .prefix(prefix.clone())
            .connect(&support::redis_url())
            .await
            .expect("redis")
    };

    // Hop 0: the payment, published twice by its producer (a retried publish) under one id.
    let js = jetstream::new(
        idemkit_nats::async_nats::connect(&nats)
            .await
            .expect("nats"),
    );
    let (name, subject) = (support::unique("S"), support::unique("orders-paid"));
    let mut s = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await
        .expect("stream");
    let consumer = s
        .create_consumer(pull::Config {
            durable_name: Some(support::unique("a")),
            ack_wait: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .expect("consumer");
    let mut duplicates = Vec::new();
    for _ in 0..2 {
        let p = publish_to_stream(&js, subject.clone(), "order-9.paid", "order-9".into(), None)
            .await
            .expect("publish to the stream");
        duplicates.push(p.duplicate);
    }
    assert_eq!(duplicates, [false, true], "the stream's answers");
    let stream_messages = s.info().await.expect("stream info").state.messages;

    // Hop 1: A, keyed by the stream's id; its publish is its external effect.
    let channel = support::channel(&amqp).await;
    channel
        .confirm_select(Default::default())
        .await
        .expect("confirms");
    let queue = support::unique("invoices");
    support::queue(&channel, &queue, false, None).await;
    let (published, attempts) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a_done = Arc::new(Notify::new());
    let a = {
        let (channel, queue) = (channel.clone(), queue.clone());
        let (published, attempts) = (published.clone(), attempts.clone());
        Processor::builder(
            Coordinator::new(store().await),
            Operation::new("invoice.request").unwrap(),
        )
        // No key function: the message's dedupe id (`Nats-Msg-Id`) is the key.
        .handler(
            move |m: jetstream::Message, attempt: idemkit_core::Attempt| {
                let (channel, queue) = (channel.clone(), queue.clone());
                let (published, attempts) = (published.clone(), attempts.clone());
                async move {
                    let id = if dedupe_ids {
                        attempt.downstream_key().expect("protected").into_string()
                    } else {
                        support::unique("delivery")
                    };
                    publish_once(
                        &channel,
                        "",
                        &queue,
                        &id,
                        &m.payload,
                        BasicProperties::default(),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                    published.fetch_add(1, Ordering::SeqCst);
                    // The first attempt fails after its effect, before its result is stored.
                    if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                        return Err("the worker died after publishing".to_string());
                    }
                    Ok("invoice requested".to_string())
                }
            },
        )
        .retry(RetryPolicy::new().backoff(Duration::from_millis(10), Duration::from_millis(10)))
    };
    let done = a_done.clone();
    let runner_a = JetStreamRunner::new(consumer, a).on_settled(move |_| done.notify_one());

    // Hop 3: the payment provider, behind idemkit's HTTP layer (keys on Redis).
    let charges = Arc::new(AtomicUsize::new(0));
    let provider = {
        let charges = charges.clone();
        let layer = idemkit_http::IdempotencyLayer::builder(
            Coordinator::new(store().await),
            Operation::new("provider.charge").unwrap(),
        )
        .global_scope("provider")
        .unwrap()
        .build()
        .unwrap();
        axum::Router::new()
            .route(
                "/charges",
                axum::routing::post(move || {
                    let charges = charges.clone();
                    async move {
                        let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
                        (axum::http::StatusCode::CREATED, format!("ch_{n}"))
                    }
                }),
            )
            .layer(layer)
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let charges_url = format!("http://{}/charges", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, provider).await.unwrap() });

    // Hop 2: B, keyed by the message's id: the email (a keyed call of its own) and the
    // charge (the provider's key), then it fails once before its result is stored.
    let emails = Arc::new(AtomicUsize::new(0));
    let settled = Arc::new(AtomicUsize::new(0));
    let b_done = Arc::new(Notify::new());
    let b = {
        let (emails, b_attempts) = (emails.clone(), Arc::new(AtomicUsize::new(0)));
        let mail = Coordinator::new(store().await);
        let http = reqwest::Client::new();
        Processor::builder(
            Coordinator::new(store().await),
            Operation::new("invoice.send").unwrap(),
        )
        // No key function: the message's dedupe id (`message_id`) is the key.
        .handler(move |m: Message, attempt: idemkit_core::Attempt| {
            let (emails, b_attempts) = (emails.clone(), b_attempts.clone());
            let (mail, http, url) = (mail.clone(), http.clone(), charges_url.clone());
            async move {
                let id = m.message_id().unwrap_or_default().to_string();
                mail.call(
                    &Operation::new("mail.invoice").unwrap(),
                    &idemkit_core::Key::new(&id).unwrap(),
                )
                .run(|_| async {
                    emails.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>("em_1".to_string())
                })
                .await
                .map_err(|e| e.to_string())?;
                let key = if dedupe_ids {
                    attempt.downstream_key().expect("protected").into_string()
                } else {
                    support::unique("attempt")
                };
                let charged = http
                    .post(&url)
                    .header("idempotency-key", key)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                if charged.status() != 201 {
                    return Err(format!("the provider answered {}", charged.status()));
                }
                // The first attempt of each message fails after its effects.
                if b_attempts.fetch_add(1, Ordering::SeqCst) % 2 == 0 {
                    return Err("the worker died after the charge".to_string());
                }
                Ok("sent and charged".to_string())
            }
        })
        .retry(RetryPolicy::new().backoff(Duration::from_millis(10), Duration::from_millis(10)))
    };
    let (count, done) = (settled.clone(), b_done.clone());
    let runner_b = RabbitRunner::new(amqp, queue.clone(), b).on_settled(move |_| {
        if count.fetch_add(1, Ordering::SeqCst) + 1 == 2 {
            done.notify_one();
        }
    });

    // Both hops run until A settled its message and B both copies.
    let a_task = tokio::spawn(runner_a.run(async move { a_done.notified().await }));
    let b_task = tokio::spawn(runner_b.run(async move { b_done.notified().await }));
    let limit = Duration::from_secs(60);
    tokio::time::timeout(limit, a_task)
        .await
        .expect("A settled its message")
        .unwrap()
        .unwrap();
    tokio::time::timeout(limit, b_task)
        .await
        .expect("B settled both copies")
        .unwrap()
        .unwrap();
    let _ = js.delete_stream(&name).await;
    let _ = channel
        .queue_delete(queue.as_str().into(), Default::default())
        .await;
    Some(Counts {
        stream_messages,
        published: published.load(Ordering::SeqCst),
        emails: emails.load(Ordering::SeqCst),
        charges: charges.load(Ordering::SeqCst),
        settled: settled.load(Ordering::SeqCst),
    })
}

/// The chain with or without the dedupe ids: the stream dropped the producer's second
/// publish, A's retry published again (RabbitMQ keeps both copies), B settled both; the
/// emails and the charges are what the ids decide.
async fn check(dedupe_ids: bool, emails: usize, charges: usize) {
    let Some(counts) = chain(dedupe_ids).await else {
        return;
    };
    let want = Counts {
        stream_messages: 1,
        published: 2,
        emails,
        charges,
        settled: 2,
    };
    assert_eq!(counts, want, "dedupe ids: {dedupe_ids}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_dedupe_ids_one_key_makes_every_hop_happen_once() {
    check(true, 1, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_dedupe_ids_the_next_hop_sends_twice() {
    check(false, 2, 4).await;
}
