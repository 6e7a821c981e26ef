//! One worker process: it takes jobs from a real at-least-once queue (a PostgreSQL table
//! with visibility leases, or a Kafka topic through the Kafka runner) and runs each job's
//! effect under idemkit. The effect is a ledger row carrying the attempt's fencing token,
//! with no unique constraint: a second effect is a second row, for the checker to find.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idemkit_core::{Attempt, Coordinator, Key, Operation, Policy, Receipt, Source, Store};
use idemkit_kafka::KafkaRunner;
use idemkit_postgres::PgStore;
use idemkit_redis::RedisStore;
use idemkit_runner::{Processor, RetryPolicy};
use rdkafka::ClientConfig;
use rdkafka::Message as _;
use rdkafka::message::OwnedMessage;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::Args;
use crate::events::{Event, EventLog, now_ms};

/// The operation every job's effect runs under.
pub(crate) const OPERATION: &str = "chaos.effect";

/// The job's key: it names the effect (the job's ledger row), not the delivery.
pub(crate) fn key(job: u32) -> Key {
    Key::new(format!("job-{job}.effect")).expect("a valid key")
}

/// How long a job's queue visibility lasts before the queue hands it out again.
const VISIBILITY: Duration = Duration::from_secs(3);

/// What every job's effect needs.
struct Ctx {
    db: PgPool,
    log: EventLog,
    run: String,
    lease: Duration,
    /// Effects without idemkit (`--unprotected`): the checker must then fail.
    unprotected: bool,
}

impl Ctx {
    /// The effect: a ledger row with the attempt's fencing token, between two stretches of
    /// work. Some jobs take longer than the lease (renewals carry them), so a pause or an
    /// outage can strand an owner on either side of its row.
    async fn effect(&self, job: u32, attempt: Attempt) -> Result<u64, sqlx::Error> {
        let fencing = attempt.fencing_token().map_or(0, |f| f.get());
        let work = match fastrand::u32(0..100) {
            0..85 => Duration::from_millis(fastrand::u64(1..15)),
            85..97 => Duration::from_millis(fastrand::u64(50..300)),
            _ => self.lease.mul_f64(1.2 + fastrand::f64() * 0.8),
        };
        tokio::time::sleep(work / 2).await;
        let start = now_ms();
        let inserted = sqlx::query(
            "INSERT INTO chaos_ledger (run, job, fencing, pid, started) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&self.run)
        .bind(job as i32)
        .bind(fencing as i64)
        .bind(std::process::id() as i32)
        .bind(start as i64)
        .execute(&self.db)
        .await;
        match inserted {
            Ok(_) => self.log.write(&Event::Effect {
                job,
                fencing,
                start,
                at: now_ms(),
            }),
            Err(e) => {
                self.log.write(&Event::EffectFailed { job, at: now_ms() });
                return Err(e);
            }
        }
        tokio::time::sleep(work / 2).await;
        Ok(fencing)
    }

    fn done(&self, job: u32, fencing: u64, source: Source, stored: bool) {
        self.log.write(&Event::Done {
            job,
            fencing,
            fresh: source == Source::Fresh,
            stored,
            at: now_ms(),
        });
    }

    fn failed(&self, job: u32, kind: String) {
        self.log.write(&Event::Failed {
            job,
            kind,
            at: now_ms(),
        });
    }
}

/// Runs a worker until it is killed.
pub(crate) async fn main(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let store_url = args.get("--store")?;
    let lease = Duration::from_millis(args.get("--lease-ms")?.parse()?);
    let options = PgConnectOptions::from_str(&args.get("--db")?)?.application_name("idemkit-chaos");
    let db = PgPoolOptions::new()
        .max_connections(args.number("--concurrency")? as u32 + 2)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options);
    let ctx = Arc::new(Ctx {
        db,
        log: EventLog::create(args.get("--log")?.as_ref())?,
        run: args.get("--run")?,
        lease,
        unprotected: args.flag("--unprotected"),
    });
    let policy = Policy::new()
        .lease(lease)
        .wait_timeout(Duration::from_secs(5))
        .store_timeout(Duration::from_millis(800))
        .ttl(Duration::from_secs(3600));
    if store_url.starts_with("redis") {
        let mut builder = RedisStore::builder()
            .prefix(args.get("--prefix")?)
            .response_timeout(Duration::from_millis(800));
        if args.flag("--guard") {
            builder = builder.wait_for_replicas(1, Duration::from_millis(300));
        }
        let store = retry(|| builder.clone().connect(&store_url)).await;
        serve(
            Coordinator::builder(store).policy(policy).build(),
            ctx,
            &args,
        )
        .await
    } else {
        let builder = PgStore::builder().table(&args.get("--table")?);
        let store = retry(|| builder.clone().connect(&store_url)).await;
        serve(
            Coordinator::builder(store).policy(policy).build(),
            ctx,
            &args,
        )
        .await
    }
}

/// Connects, however long the store takes to come back (a worker may start mid-restart).
async fn retry<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    mut connect: impl FnMut() -> F,
) -> T {
    loop {
        match connect().await {
            Ok(t) => return t,
            Err(e) => {
                eprintln!("connect: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn serve<S: Store>(
    coordinator: Coordinator<S>,
    ctx: Arc<Ctx>,
    args: &Args,
) -> Result<(), Box<dyn std::error::Error>> {
    match args.get("--queue")?.as_str() {
        "pg" => {
            let coordinator = Arc::new(coordinator);
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..args.number("--concurrency")? {
                tasks.spawn(pg_loop(coordinator.clone(), ctx.clone()));
            }
            while tasks.join_next().await.is_some() {}
            Ok(())
        }
        "kafka" => kafka(coordinator, ctx, args).await,
        other => Err(format!("unknown queue {other}").into()),
    }
}

/// One consumer of the PostgreSQL queue: claim a visible job (hiding it for
/// [`VISIBILITY`]), run it, acknowledge it only when the call returned a value.
async fn pg_loop<S: Store>(coordinator: Arc<Coordinator<S>>, ctx: Arc<Ctx>) {
    let operation = Operation::new(OPERATION).expect("a valid operation");
    loop {
        let claimed: Result<Option<(i32, i32)>, _> = sqlx::query_as(
            "UPDATE chaos_queue SET visible_at = clock_timestamp() + $2 * interval '1 millisecond', \
                 deliveries = deliveries + 1 \
             WHERE run = $1 AND msg = (SELECT msg FROM chaos_queue \
                 WHERE run = $1 AND NOT done AND visible_at <= clock_timestamp() \
                 ORDER BY visible_at LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING msg, job",
        )
        .bind(&ctx.run)
        .bind(VISIBILITY.as_millis() as i64)
        .fetch_optional(&ctx.db)
        .await;
        let (msg, job) = match claimed {
            Ok(Some((msg, job))) => (msg, job as u32),
            // Nothing visible (or the queue's connection was cut): look again shortly.
            Ok(None) | Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let key = key(job);
        let called = if ctx.unprotected {
            // The checker's own check: without idemkit, redeliveries repeat effects.
            ctx.effect(job, Attempt::unprotected())
                .await
                .map(|v| Receipt::new(v, Source::Unprotected, None))
                .map_err(idemkit_core::Error::Action)
        } else {
            coordinator
                .call(&operation, &key)
                .run(|attempt| {
                    let ctx = ctx.clone();
                    async move { ctx.effect(job, attempt).await }
                })
                .await
        };
        match called {
            Ok(receipt) => {
                let fencing = receipt.fencing.map_or(0, |f| f.get());
                ctx.done(job, fencing, receipt.source, receipt.stored);
                // Not acknowledged if this fails: the job comes back and is replayed.
                let _ =
                    sqlx::query("UPDATE chaos_queue SET done = true WHERE run = $1 AND msg = $2")
                        .bind(&ctx.run)
                        .bind(msg)
                        .execute(&ctx.db)
                        .await;
            }
            Err(e) => {
                ctx.failed(job, format!("{:?}", e.kind()));
                // Handed back (a nack) after a random 0.1-1 s, as a queue's retry backoff
                // with jitter does: left to the 3-s visibility, a job refused in a failover
                // came back in step with the failovers (one every 3 s or so once the
                // run thins out) and was refused again and again (seed 568374). If this
                // fails, the visibility brings it back.
                let _ = sqlx::query(
                    "UPDATE chaos_queue SET visible_at = clock_timestamp() + $3 * interval '1 millisecond' \
                     WHERE run = $1 AND msg = $2 AND NOT done",
                )
                .bind(&ctx.run)
                .bind(msg)
                .bind(fastrand::i64(100..1000))
                .execute(&ctx.db)
                .await;
            }
        }
    }
}

fn job_of(m: &OwnedMessage) -> Option<u32> {
    std::str::from_utf8(m.key()?).ok()?.parse().ok()
}

/// The Kafka runner with the same effect: the runner commits a message's offset only after
/// its call returned, so a killed worker's partition is replayed by whoever takes it over.
async fn kafka<S: Store>(
    coordinator: Coordinator<S>,
    ctx: Arc<Ctx>,
    args: &Args,
) -> Result<(), Box<dyn std::error::Error>> {
    let effect_ctx = ctx.clone();
    let processor = Processor::new(
        coordinator,
        Operation::new(OPERATION)?,
        // A message without a job id names no effect: the key error dead-letters it.
        |m: &OwnedMessage| Key::new(job_of(m).map_or(String::new(), |j| key(j).to_string())),
        move |m: OwnedMessage, attempt: Attempt| {
            let ctx = effect_ctx.clone();
            async move {
                let job = job_of(&m).expect("keyed by the key function");
                ctx.effect(job, attempt).await
            }
        },
    )
    // A store down for a while must not send jobs to the dead-letter topic.
    .retry(
        RetryPolicy::new()
            .max_deliveries(10_000)
            .backoff(Duration::from_millis(50), Duration::from_millis(500)),
    )
    .protected(!ctx.unprotected);
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", args.get("--brokers")?)
        .set("group.id", args.get("--group")?)
        .set("auto.offset.reset", "earliest")
        // A killed worker's partitions move after this: short, so that a run with kills
        // spends its time working, not waiting for the group.
        .set("session.timeout.ms", "2000")
        .set("heartbeat.interval.ms", "300")
        .set("auto.commit.interval.ms", "200");
    let topic = args.get("--topic")?;
    // Every call's end is logged, settled or not: a call whose partition was revoked while it
    // ran ends unsettled (review L9 of `e047556`: the checker then had to explain a second
    // effect with the first call's end unlogged).
    let log = |ctx: Arc<Ctx>| {
        move |m: &OwnedMessage, processed: &idemkit_kafka::Processed<u64>| {
            let Some(job) = job_of(m) else { return };
            match (&processed.receipt, processed.error) {
                (Some(r), _) => ctx.done(job, r.fencing.map_or(0, |f| f.get()), r.source, r.stored),
                (None, kind) => ctx.failed(job, format!("{kind:?}")),
            }
        }
    };
    let (settled, unsettled) = (log(ctx.clone()), log(ctx.clone()));
    KafkaRunner::new(config, [topic.clone()], processor)
        .dead_letter_topic(format!("{topic}.dead"))
        .on_settled(move |s| settled(s.message, s.processed))
        .on_unsettled(unsettled)
        .run(std::future::pending::<()>())
        .await?;
    Ok(())
}
