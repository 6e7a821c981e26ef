//! One effect key end to end, with every process killed at every point (issue 52): an order's
//! payment on Kafka (produced twice, as a retrying producer does, under one dedupe id) →
//! hop a (`examples/chain_hop.rs --role a`: a row through the inbox, a publish to RabbitMQ,
//! a charge at a payment service) → hop b (`--role b`: a row through the inbox, an email at a
//! mail service); both services behind idemkit's HTTP layer. Each hop is a process of its own, stopped at
//! each fault point (after its inbox commit, after its action, before its ack) and run again;
//! meanwhile the hops' store (a Redis server of the test's own) has every client connection
//! cut, and their database connections are terminated, again and again. With the effect's
//! ids every effect happens once at every hop; with ids that name the delivery (the switch)
//! a hop killed after its external effects repeats them downstream.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idemkit::kafka::dedupe_headers;
use idemkit::kafka::rdkafka::producer::FutureRecord;
use idemkit::postgres::sqlx::{self, PgPool};
use idemkit::rabbitmq::lapin::options::QueueDeclareOptions;
use idemkit::rabbitmq::lapin::types::FieldTable;
use idemkit::rabbitmq::lapin::{Channel, Connection, ConnectionProperties};
use idemkit_core::{Coordinator, Operation};
use idemkit_test::faults::{FaultPoint, stop_at_tokio, stopped};
use idemkit_test::redis_server::RedisProcess;
use support::{brokers, create_topic, producer, redis_url, unique};

/// The hops' database connections carry this name, so the faults cut theirs only.
const APPLICATION: &str = "idemkit-chain-hop";

fn database_url() -> String {
    std::env::var("IDEMKIT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    A,
    B,
}

/// Where the services are, shared by the runs.
struct Chain {
    brokers: String,
    amqp: String,
    keys: String,
    services: String,
    /// What the services did, by (what, order).
    done: Arc<Mutex<HashMap<(&'static str, String), usize>>>,
    pool: PgPool,
    channel: Channel,
}

/// What one run left.
#[derive(Debug, PartialEq, Eq)]
struct Effects {
    /// Hop a's rows for the order (its inbox's database effect).
    a_rows: i64,
    /// Messages hop a left on RabbitMQ (a republish after a kill is a copy).
    published: u32,
    /// Charges the payment service made for the order.
    charges: usize,
    /// Hop b's rows.
    b_rows: i64,
    /// Emails the mail service sent for the order.
    emails: usize,
}

impl Chain {
    fn hop(
        &self,
        hop: Hop,
        topic: &str,
        queue: &str,
        ids: &str,
        exit_after: u32,
    ) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(idemkit_test::example_binary("chain_hop"));
        let role = if hop == Hop::A { "a" } else { "b" };
        c.args(["--role", role, "--brokers", &self.brokers, "--topic", topic])
            .args([
                "--group",
                &format!("{topic}-a"),
                "--amqp",
                &self.amqp,
                "--queue",
                queue,
            ])
            .args([
                "--keys",
                &self.keys,
                "--services",
                &self.services,
                "--ids",
                ids,
            ])
            .args([
                "--database",
                &format!("{}?application_name={APPLICATION}", database_url()),
            ])
            // A short lease: the second process waits out the stopped one's reservation.
            .args([
                "--lease-ms",
                "1500",
                "--exit-after",
                &exit_after.to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true);
        c
    }

    /// Runs `hop` to `exit_after` settled messages; stopped at `point` first, then again.
    async fn run_hop(
        &self,
        hop: Hop,
        stop: Option<FaultPoint>,
        topic: &str,
        queue: &str,
        ids: &str,
        exit_after: u32,
    ) {
        let limit = Duration::from_secs(120);
        if let Some(point) = stop {
            let mut first = self.hop(hop, topic, queue, ids, exit_after);
            stop_at_tokio(&mut first, point);
            let status = tokio::time::timeout(limit, first.status())
                .await
                .unwrap_or_else(|_| panic!("{hop:?} reached {point}"))
                .unwrap();
            assert!(stopped(&status), "{hop:?} stopped at {point}: {status}");
        }
        let status =
            tokio::time::timeout(limit, self.hop(hop, topic, queue, ids, exit_after).status())
                .await
                .unwrap_or_else(|_| panic!("{hop:?} settled {exit_after} after {stop:?}"))
                .unwrap();
        assert!(
            status.success(),
            "{hop:?} after {stop:?}: {status} (3: a dead letter)"
        );
    }

    /// One order through both hops, `kill` stopping one hop's first process at a point.
    async fn run(&self, kill: Option<(Hop, FaultPoint)>, ids: &str) -> Effects {
        let (topic, queue, order) = (unique("paid"), unique("invoices"), unique("order"));
        create_topic(&self.brokers, &topic, 1).await;
        self.channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("queue");
        // The producer retried its send: two records, one dedupe id.
        let p = producer(&self.brokers);
        let headers = dedupe_headers(None, &format!("{order}.paid"));
        for _ in 0..2 {
            p.send(
                FutureRecord::to(&topic)
                    .key(&order)
                    .payload(&order)
                    .headers(headers.clone()),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("produced");
        }
        let stop = |hop| kill.filter(|(h, _)| *h == hop).map(|(_, p)| p);
        self.run_hop(Hop::A, stop(Hop::A), &topic, &queue, ids, 2)
            .await;
        // Hop a has exited: what it published is all on the queue.
        let published = self
            .channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("queue")
            .message_count();
        self.run_hop(Hop::B, stop(Hop::B), &topic, &queue, ids, published)
            .await;
        let _ = self
            .channel
            .queue_delete(queue.as_str().into(), Default::default())
            .await;
        let rows = |hop: &'static str| {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM chain_rows WHERE hop = $1 AND order_id = $2",
            )
            .bind(hop)
            .bind(&order)
            .fetch_one(&self.pool)
        };
        let (a_rows, b_rows) = (rows("a").await.unwrap(), rows("b").await.unwrap());
        let done = |what: &'static str| {
            let all = self.done.lock().unwrap_or_else(PoisonError::into_inner);
            all.get(&(what, order.clone())).copied().unwrap_or(0)
        };
        let (charges, emails) = (done("charge"), done("email"));
        Effects {
            a_rows,
            published,
            charges,
            b_rows,
            emails,
        }
    }
}

/// The payment and mail services, behind idemkit's HTTP layer (its keys on the shared Redis,
/// which the faults leave alone: the services are other companies'), each charge and email
/// counted per order (the request's body). Their base URL.
async fn services(done: Arc<Mutex<HashMap<(&'static str, String), usize>>>) -> String {
    let store = idemkit_redis::RedisStore::builder()
        .prefix(unique("services"))
        .connect(&redis_url())
        .await
        .expect("redis");
    let layer = idemkit_http::IdempotencyLayer::builder(
        Coordinator::new(store),
        Operation::new("services.call").unwrap(),
    )
    .global_scope("services")
    .unwrap()
    .build()
    .unwrap();
    let service = |what: &'static str| {
        let done = done.clone();
        axum::routing::post(move |order: String| {
            let done = done.clone();
            async move {
                let mut all = done.lock().unwrap_or_else(PoisonError::into_inner);
                let n = all.entry((what, order.clone())).or_default();
                *n += 1;
                (
                    axum::http::StatusCode::CREATED,
                    format!("{what}_{order}_{n}"),
                )
            }
        })
    };
    let app = axum::Router::new()
        .route("/charges", service("charge"))
        .route("/emails", service("email"))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// Until `stop`: every client connection of the hops' Redis cut, and every database
/// connection of theirs terminated, every 150 ms. How many of each it cut.
async fn faults(port: u16, pool: PgPool, stop: Arc<AtomicBool>) -> (u64, u64) {
    let (mut redis_cut, mut db_cut) = (0, 0);
    while !stop.load(Ordering::SeqCst) {
        let out = tokio::process::Command::new("redis-cli")
            .args(["-p", &port.to_string(), "client", "kill", "type", "normal"])
            .output()
            .await
            .expect("redis-cli");
        let killed: u64 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0);
        redis_cut += killed;
        let terminated: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = $1) t",
        )
        .bind(APPLICATION)
        .fetch_one(&pool)
        .await
        .unwrap_or(0);
        db_cut += terminated as u64;
        // The faults' pace; nothing waits on it.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    (redis_cut, db_cut)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_happens_once_at_every_hop_wherever_a_hop_dies() {
    let Some(brokers) = brokers() else { return };
    let Some(amqp) = idemkit_test::brokers::rabbitmq() else {
        return;
    };
    // The hops' keys, on a server of this test's own: its connections are cut at will.
    let redis = RedisProcess::start(&[]);
    let pool = PgPool::connect(&database_url()).await.expect("postgres");
    let connection = Connection::connect(&amqp, ConnectionProperties::default())
        .await
        .expect("rabbitmq");
    let done = Arc::new(Mutex::new(HashMap::new()));
    let chain = Arc::new(Chain {
        services: services(done.clone()).await,
        brokers,
        amqp,
        keys: redis.url(),
        done,
        pool: pool.clone(),
        channel: connection.create_channel().await.expect("channel"),
    });
    // The tables exist before the faults start (a hop creates them too).
    let status = chain
        .hop(Hop::A, "none", "none", "effect", 0)
        .arg("--setup-only")
        .status()
        .await
        .unwrap();
    assert!(status.success(), "setup: {status}");

    let stop = Arc::new(AtomicBool::new(false));
    let faulting = tokio::spawn(faults(redis.port, pool, stop.clone()));
    let mut runs = tokio::task::JoinSet::new();
    for hop in [Hop::A, Hop::B] {
        for point in FaultPoint::ALL {
            let chain = chain.clone();
            runs.spawn(async move {
                (
                    Some((hop, point)),
                    "effect",
                    chain.run(Some((hop, point)), "effect").await,
                )
            });
        }
    }
    // The switch: ids that name the delivery, a hop killed after its external effects.
    for hop in [Hop::A, Hop::B] {
        let chain = chain.clone();
        let kill = Some((hop, FaultPoint::AfterAction));
        runs.spawn(async move { (kill, "delivery", chain.run(kill, "delivery").await) });
    }
    let mut results = Vec::new();
    while let Some(run) = runs.join_next().await {
        results.push(run.unwrap());
    }
    stop.store(true, Ordering::SeqCst);
    let (redis_cut, db_cut) = faulting.await.unwrap();
    eprintln!("connections cut: redis {redis_cut}, database {db_cut}");
    assert!(
        redis_cut > 0 && db_cut > 0,
        "the faults cut connections: redis {redis_cut}, database {db_cut}"
    );

    for (kill, ids, effects) in results {
        let republished = u32::from(
            kill.is_some_and(|(hop, point)| hop == Hop::A && point == FaultPoint::AfterAction),
        );
        let want = match (ids, kill) {
            // Every effect once; a hop a that died after its publish published a copy (the
            // same `message_id`), which hop b replays.
            ("effect", _) => Effects {
                a_rows: 1,
                published: 1 + republished,
                charges: 1,
                b_rows: 1,
                emails: 1,
            },
            // Hop a repeated its publish and its charge under fresh ids: hop b took the copy
            // for a new message (a second row, a second email), the payment service for a new
            // charge.
            (_, Some((Hop::A, _))) => Effects {
                a_rows: 1,
                published: 2,
                charges: 2,
                b_rows: 2,
                emails: 2,
            },
            // Hop b repeated its email under a fresh key; its row is the inbox's, once.
            _ => Effects {
                a_rows: 1,
                published: 1,
                charges: 1,
                b_rows: 1,
                emails: 2,
            },
        };
        assert_eq!(effects, want, "killed at {kill:?}, ids {ids}");
    }
}
