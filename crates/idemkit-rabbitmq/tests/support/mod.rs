//! Helpers for tests against the machine's RabbitMQ, with keys and effects on Redis.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemkit_rabbitmq::lapin::options::{
    BasicGetOptions, BasicPublishOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use idemkit_rabbitmq::lapin::types::{AMQPValue, FieldTable};
use idemkit_rabbitmq::lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind,
};
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};

/// The broker (see [`idemkit_test::brokers::rabbitmq`]).
pub fn server() -> Option<String> {
    idemkit_test::brokers::rabbitmq()
}

pub fn redis_url() -> String {
    std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

/// A name no other test uses.
pub fn unique(what: &str) -> String {
    format!("idemkit-{what}-{:016x}", fastrand::u64(..))
}

pub async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis is up (scripts/test starts it)")
}

/// How many times each effect happened: the "mails" list the handlers append to.
pub async fn effects(list: &str) -> std::collections::BTreeMap<String, u32> {
    let mut r = redis().await;
    let all: Vec<String> = redis::cmd("LRANGE")
        .arg(list)
        .arg(0)
        .arg(-1)
        .query_async(&mut r)
        .await
        .unwrap();
    let mut m = std::collections::BTreeMap::new();
    for e in all {
        *m.entry(e).or_insert(0) += 1;
    }
    m
}

/// A channel of the test's own, for declaring, publishing and inspecting.
pub async fn channel(uri: &str) -> Channel {
    let c = Connection::connect(uri, ConnectionProperties::default())
        .await
        .expect("rabbitmq");
    let ch = c.create_channel().await.unwrap();
    // The connection closes when its last channel handle is dropped.
    std::mem::forget(c);
    ch
}

/// Queue arguments: the queue goes away 10 minutes after its last use, so test runs do not
/// pile up queues on the machine's broker.
pub fn expiring(mut args: FieldTable) -> FieldTable {
    args.insert("x-expires".into(), AMQPValue::LongInt(600_000));
    args
}

/// Declares a classic queue (or a quorum one with `quorum`, and a delivery limit if given).
pub async fn queue(ch: &Channel, name: &str, quorum: bool, delivery_limit: Option<i32>) {
    let mut args = FieldTable::default();
    if quorum {
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
    }
    if let Some(n) = delivery_limit {
        args.insert("x-delivery-limit".into(), AMQPValue::LongInt(n));
    }
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            // Quorum queues are durable.
            durable: quorum,
            ..QueueDeclareOptions::default()
        },
        expiring(args),
    )
    .await
    .expect("queue");
}

/// A fanout exchange and, if `bound` names one, a queue bound to it.
pub async fn dead_letters(ch: &Channel, exchange: &str, bound: Option<&str>) {
    ch.exchange_declare(
        exchange.into(),
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            auto_delete: true,
            ..ExchangeDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("exchange");
    if let Some(q) = bound {
        queue(ch, q, false, None).await;
        ch.queue_bind(
            q.into(),
            exchange.into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind");
    }
}

pub async fn publish(ch: &Channel, queue: &str, body: &str) {
    ch.basic_publish(
        "".into(),
        queue.into(),
        BasicPublishOptions::default(),
        body.as_bytes(),
        BasicProperties::default(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
}

/// How many messages wait in `queue`, ready (not counting those delivered and unacked).
pub async fn ready(ch: &Channel, queue: &str) -> u32 {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("the queue exists")
    .message_count()
}

/// Takes every message waiting in `queue` (acked), with its headers.
pub async fn drain(ch: &Channel, queue: &str) -> Vec<(String, FieldTable)> {
    let mut out = Vec::new();
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        let headers = m.delivery.properties.headers().clone().unwrap_or_default();
        out.push((
            String::from_utf8_lossy(&m.delivery.data).into_owned(),
            headers,
        ));
    }
    out
}

/// A header's string value.
pub fn text(headers: &FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// A TCP relay to the broker whose connections a test can cut, as a network failure would
/// (the broker sees the socket close, and requeues what the connection had unacked).
pub struct Relay {
    /// `amqp://…@127.0.0.1:<port>/%2f`: the broker, through the relay.
    pub uri: String,
    live: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Relay {
    pub async fn start(uri: &str) -> Relay {
        let (scheme, rest) = uri.split_once("://").unwrap();
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (credentials, host) = match authority.rsplit_once('@') {
            Some((c, h)) => (format!("{c}@"), h.to_string()),
            None => (String::new(), authority.to_string()),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let live: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let l = live.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                let host = host.clone();
                let task = tokio::spawn(async move {
                    let Ok(mut broker) = TcpStream::connect(&host).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut broker).await;
                });
                l.lock().unwrap().push(task.abort_handle());
            }
        });
        Relay {
            uri: format!("{scheme}://{credentials}127.0.0.1:{port}/{path}"),
            live,
        }
    }

    /// Cuts every connection open through the relay (new ones are still let through).
    pub fn cut(&self) {
        for t in self.live.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

pub use idemkit_test::eventually;
