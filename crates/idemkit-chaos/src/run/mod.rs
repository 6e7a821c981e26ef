//! One scenario of the fault run: its servers, its jobs, its workers, the faults put on
//! them while they work, and what is read back for the checker once every job is done.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idemkit_core::{Operation, RecordState, StorageKey, Store};
use idemkit_postgres::PgStore;
use idemkit_redis::RedisStore;
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::PgPool;
use tokio::process::Child;
use tokio::time::Instant;

use crate::check::{Fault, Final, History, Row};
use crate::events::{self, now_ms};
use idemkit_test::pg_server::PgServer;

use crate::servers::{Proxy, Redis, redis_cli, signal};
use crate::worker;

mod faults;
mod scenarios;

pub(crate) use scenarios::{Backend, Queue, SCENARIOS, Scenario, prepare};

/// What every scenario of a run shares.
pub(crate) struct Settings {
    pub(crate) dir: PathBuf,
    pub(crate) db_url: String,
    pub(crate) db: PgPool,
    pub(crate) brokers: Option<String>,
    pub(crate) jobs: u32,
    pub(crate) workers: usize,
    pub(crate) lease: Duration,
    /// The mean time between two faults.
    pub(crate) every: Duration,
    /// Given up after this long: the jobs not done by then are lost.
    pub(crate) deadline: Duration,
    pub(crate) seed: u64,
    /// Workers without idemkit: the checker's own test (it must fail).
    pub(crate) unprotected: bool,
}

/// The store of a scenario, as the faults reach it.
enum Servers {
    Redis {
        primary: Redis,
        /// The replica and the proxy its replication link goes through (so that the
        /// link can be held down: the replica falls behind).
        replica: Option<(Redis, Proxy)>,
        proxy: Proxy,
    },
    Postgres {
        server: PgServer,
        table: String,
    },
}

struct WorkerProc {
    child: Child,
    pid: u32,
}

/// A scenario being run.
struct Running<'a> {
    s: &'a Settings,
    sc: Scenario,
    run: String,
    dir: PathBuf,
    servers: Servers,
    workers: Vec<WorkerProc>,
    /// Every worker process ever started: its pid and its event log.
    logs: Vec<(u32, PathBuf)>,
    spawned: usize,
    /// Faults put so far.
    put: usize,
    faults: Arc<Mutex<Vec<Fault>>>,
    stopped: Arc<Mutex<Vec<u32>>>,
    rng: fastrand::Rng,
}

pub(crate) async fn scenario(s: &Settings, sc: Scenario, index: usize) -> History {
    // Unique per run (rows, topic, group and prefix are named after it); the seed repeats.
    let run = format!("s{}i{index}t{}", s.seed, now_ms() % 1_000_000_000);
    let dir = s.dir.join(sc.name.replace('/', "-"));
    // A fresh directory: event logs are appended to, and a rerun's must start empty.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scenario dir");
    let servers = match sc.backend {
        Backend::Redis => {
            let primary = Redis::start(&dir, None);
            let replica = match sc.failover {
                Some(_) => {
                    let link = Proxy::start(primary.port).await;
                    let replica = Redis::start(&dir, Some(link.port));
                    wait_for_sync(primary.port);
                    Some((replica, link))
                }
                None => None,
            };
            let proxy = Proxy::start(primary.port).await;
            Servers::Redis {
                primary,
                replica,
                proxy,
            }
        }
        Backend::Postgres => {
            let server = PgServer::start().expect("a PostgreSQL of the run's own");
            let table = format!("chaos_{run}");
            let store = PgStore::builder()
                .table(&table)
                .connect(&server.url())
                .await
                .expect("the store's PostgreSQL");
            store.migrate().await.expect("migrate");
            Servers::Postgres { server, table }
        }
    };
    let mut r = Running {
        s,
        sc,
        run,
        dir,
        servers,
        workers: Vec::new(),
        logs: Vec::new(),
        spawned: 0,
        put: 0,
        faults: Arc::default(),
        stopped: Arc::default(),
        rng: fastrand::Rng::with_seed(s.seed ^ index as u64),
    };
    r.enqueue().await;
    for _ in 0..s.workers {
        r.spawn();
    }
    let started = Instant::now();
    let mut finished = false;
    let mut next_fault = Instant::now() + s.every;
    let mut next_check = Instant::now();
    while started.elapsed() < s.deadline {
        if Instant::now() >= next_check {
            if r.all_done().await {
                finished = true;
                break;
            }
            next_check = Instant::now() + Duration::from_millis(500);
        }
        if Instant::now() >= next_fault {
            r.fault().await;
            let jitter = 0.5 + r.rng.f64();
            next_fault = Instant::now() + s.every.mul_f64(jitter);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    // Let paused workers go (their pause ends), then stop everything.
    for pid in r
        .stopped
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .drain(..)
    {
        signal(pid, "CONT");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for w in &mut r.workers {
        let _ = w.child.start_kill();
        let _ = w.child.wait().await;
    }
    r.history(finished, seconds).await
}

/// Waits until a replica reports its link to the primary up.
fn wait_for_sync(primary: u16) {
    for _ in 0..200 {
        if redis_cli(primary, &["info", "replication"]).contains("state=online") {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the replica never synced");
}

impl Running<'_> {
    fn store_url(&self) -> String {
        match &self.servers {
            Servers::Redis { proxy, .. } => format!("redis://127.0.0.1:{}", proxy.port),
            Servers::Postgres { server, .. } => server.url(),
        }
    }

    fn topic(&self) -> String {
        format!("chaos-{}", self.run)
    }

    async fn enqueue(&mut self) {
        match self.sc.queue {
            Queue::Pg => {
                // Every job once, and a tenth of them again later, as a retrying producer
                // sends them: a copy of a completed job must be a replay.
                sqlx::query(
                    "INSERT INTO chaos_queue (run, msg, job) SELECT $1, g, g FROM generate_series(1, $2) g",
                )
                .bind(&self.run)
                .bind(self.s.jobs as i32)
                .execute(&self.s.db)
                .await
                .expect("enqueue");
                sqlx::query(
                    "INSERT INTO chaos_queue (run, msg, job, visible_at) \
                     SELECT $1, $2 + g, (g * 7919) % $2 + 1, now() + random() * $3 * interval '1 millisecond' \
                     FROM generate_series(1, $2 / 10) g",
                )
                .bind(&self.run)
                .bind(self.s.jobs as i32)
                .bind(self.s.jobs as f64 * 10.0)
                .execute(&self.s.db)
                .await
                .expect("enqueue the copies");
            }
            Queue::Kafka => {
                let brokers = self.s.brokers.as_deref().expect("a Kafka broker");
                create_topic(brokers, &self.topic()).await;
                let producer: FutureProducer = ClientConfig::new()
                    .set("bootstrap.servers", brokers)
                    .set("linger.ms", "5")
                    .create()
                    .expect("producer");
                let topic = self.topic();
                // Every job once, and a tenth of them again, in a seeded order.
                let mut jobs: Vec<u32> = (1..=self.s.jobs).collect();
                jobs.extend((1..=self.s.jobs / 10).map(|g| (g * 7919) % self.s.jobs + 1));
                self.rng.shuffle(&mut jobs);
                let mut sent = Vec::new();
                for job in jobs {
                    let key = job.to_string();
                    let record = FutureRecord::to(&topic).key(&key).payload(&key);
                    sent.push(
                        producer
                            .send_result(record)
                            .map_err(|(e, _)| e)
                            .expect("queue a message"),
                    );
                }
                for d in sent {
                    d.await
                        .expect("delivered")
                        .map_err(|(e, _)| e)
                        .expect("produced");
                }
            }
        }
    }

    fn spawn(&mut self) {
        self.spawned += 1;
        let log = self.dir.join(format!("events-{}.log", self.spawned));
        let out = std::fs::File::create(self.dir.join(format!("worker-{}.out", self.spawned)))
            .expect("worker output");
        let mut c = tokio::process::Command::new(std::env::current_exe().expect("own binary"));
        c.arg("worker")
            .args([
                "--queue",
                if self.sc.queue == Queue::Pg {
                    "pg"
                } else {
                    "kafka"
                },
            ])
            .args(["--store", &self.store_url()])
            .args(["--prefix", &format!("chaos-{}", self.run)])
            .args(["--db", &self.s.db_url])
            .args(["--run", &self.run])
            .args(["--log", log.to_str().expect("utf-8 path")])
            .args(["--concurrency", "8"])
            .args(["--lease-ms", &self.s.lease.as_millis().to_string()])
            .args(["--topic", &self.topic()])
            .args(["--group", &format!("chaos-{}", self.run)]);
        if let Some(b) = &self.s.brokers {
            c.args(["--brokers", b]);
        }
        if let Servers::Postgres { table, .. } = &self.servers {
            c.args(["--table", table]);
        }
        if self.sc.failover == Some(true) {
            c.arg("--guard");
        }
        if self.s.unprotected {
            c.arg("--unprotected");
        }
        c.stdout(Stdio::null())
            .stderr(out)
            .env("RUST_BACKTRACE", "1")
            .kill_on_drop(true);
        let child = c.spawn().expect("a worker");
        let pid = child.id().expect("a pid");
        self.logs.push((pid, log));
        self.workers.push(WorkerProc { child, pid });
    }

    /// Every job acknowledged (a `Done` event), and for the PostgreSQL queue every row done.
    async fn all_done(&self) -> bool {
        let mut done = vec![false; self.s.jobs as usize + 1];
        for (_, log) in &self.logs {
            for e in events::read(log) {
                if let events::Event::Done { job, .. } = e
                    && let Some(d) = done.get_mut(job as usize)
                {
                    *d = true;
                }
            }
        }
        if done[1..].iter().any(|d| !d) {
            return false;
        }
        if self.sc.queue == Queue::Pg {
            let left: Result<(i64,), _> =
                sqlx::query_as("SELECT count(*) FROM chaos_queue WHERE run = $1 AND NOT done")
                    .bind(&self.run)
                    .fetch_one(&self.s.db)
                    .await;
            return matches!(left, Ok((0,)));
        }
        true
    }

    /// Everything the checker reads: the ledger, the workers' events, the faults, and each
    /// job's record as the store holds it now.
    async fn history(self, finished: bool, seconds: f64) -> History {
        let rows: Vec<(i64, i32, i64, i32, i64)> = sqlx::query_as(
            "SELECT id, job, fencing, pid, started FROM chaos_ledger WHERE run = $1 ORDER BY id",
        )
        .bind(&self.run)
        .fetch_all(&self.s.db)
        .await
        .expect("the ledger");
        let rows = rows
            .into_iter()
            .map(|(id, job, fencing, pid, started)| Row {
                id,
                job: job as u32,
                fencing: fencing as u64,
                pid: pid as u32,
                started: started as u64,
            })
            .collect();
        let mut events = HashMap::new();
        for (pid, log) in &self.logs {
            events.insert(*pid, events::read(log));
        }
        let panics = self
            .logs
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                std::fs::read_to_string(self.dir.join(format!("worker-{}.out", i + 1)))
                    .unwrap_or_default()
                    .contains("panicked")
            })
            .count();
        let finals = self.finals().await;
        let faults =
            std::mem::take(&mut *self.faults.lock().unwrap_or_else(PoisonError::into_inner));
        let listed: String = faults
            .iter()
            .map(|f| format!("{} {} {:?} {}\n", f.start, f.end, f.pid, f.kind.name()))
            .collect();
        let _ = std::fs::write(self.dir.join("faults.log"), listed);
        History {
            scenario: self.sc.name,
            jobs: self.s.jobs,
            lease_ms: self.s.lease.as_millis() as u64,
            finished,
            seconds,
            rows,
            events,
            faults,
            finals,
            panics,
        }
    }

    /// Each job's record now, read through the store's own client.
    async fn finals(&self) -> BTreeMap<u32, Final> {
        let operation = Operation::new(worker::OPERATION).expect("a valid operation");
        let keys: Vec<(u32, StorageKey)> = (1..=self.s.jobs)
            .map(|j| (j, StorageKey::new(&operation, None, &worker::key(j))))
            .collect();
        match &self.servers {
            Servers::Redis { .. } => {
                let store = RedisStore::builder()
                    .prefix(format!("chaos-{}", self.run))
                    .connect(&self.store_url())
                    .await
                    .expect("the store, to read it back");
                read_finals(&store, keys).await
            }
            Servers::Postgres { table, .. } => {
                let store = PgStore::builder()
                    .table(table)
                    .connect(&self.store_url())
                    .await
                    .expect("the store, to read it back");
                read_finals(&store, keys).await
            }
        }
    }
}

async fn read_finals<S: Store>(store: &S, keys: Vec<(u32, StorageKey)>) -> BTreeMap<u32, Final> {
    let mut out = BTreeMap::new();
    for (job, key) in keys {
        let f = match store.get(&key).await {
            Ok(Some(r)) => match r.state {
                RecordState::Completed(_) => Final::Completed(r.fencing.get()),
                _ => Final::Reserved,
            },
            Ok(None) => Final::Missing,
            Err(e) => Final::Unreadable(e.to_string()),
        };
        out.insert(job, f);
    }
    out
}

async fn create_topic(brokers: &str, topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<_> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let _ = admin
        .create_topics(
            &[NewTopic::new(topic, 4, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await;
}
