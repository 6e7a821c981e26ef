//! The scenarios of a run, and the tables they share on the machine's PostgreSQL.

use sqlx::PgPool;

/// Where the jobs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Queue {
    /// A PostgreSQL table with visibility leases (`FOR UPDATE SKIP LOCKED`).
    Pg,
    /// A Kafka topic (tansu), consumed by the Kafka runner in a consumer group.
    Kafka,
}

/// Where idemkit keeps its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Redis,
    Postgres,
}

/// One scenario: a queue, a store, and for Redis optionally a replica to fail over to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scenario {
    pub(crate) name: &'static str,
    pub(crate) queue: Queue,
    pub(crate) backend: Backend,
    /// A lagging replica to fail over to; `Some(true)`: with the durability guard.
    pub(crate) failover: Option<bool>,
}

pub(crate) const SCENARIOS: [Scenario; 6] = [
    Scenario {
        name: "pg-queue/redis",
        queue: Queue::Pg,
        backend: Backend::Redis,
        failover: None,
    },
    Scenario {
        name: "pg-queue/postgres",
        queue: Queue::Pg,
        backend: Backend::Postgres,
        failover: None,
    },
    Scenario {
        name: "kafka/redis",
        queue: Queue::Kafka,
        backend: Backend::Redis,
        failover: None,
    },
    Scenario {
        name: "kafka/postgres",
        queue: Queue::Kafka,
        backend: Backend::Postgres,
        failover: None,
    },
    Scenario {
        name: "failover/no-guard",
        queue: Queue::Pg,
        backend: Backend::Redis,
        failover: Some(false),
    },
    Scenario {
        name: "failover/guard",
        queue: Queue::Pg,
        backend: Backend::Redis,
        failover: Some(true),
    },
];

/// The tables of the queue and the ledger, on the machine's PostgreSQL.
pub(crate) async fn prepare(db: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS chaos_queue (
            run text NOT NULL, msg int NOT NULL, job int NOT NULL,
            visible_at timestamptz NOT NULL DEFAULT now(),
            deliveries int NOT NULL DEFAULT 0, done bool NOT NULL DEFAULT false,
            PRIMARY KEY (run, msg));
         CREATE INDEX IF NOT EXISTS chaos_queue_visible ON chaos_queue (run, visible_at) WHERE NOT done;
         -- No unique constraint: a second effect is a second row.
         CREATE TABLE IF NOT EXISTS chaos_ledger (
            id bigserial PRIMARY KEY, run text NOT NULL, job int NOT NULL,
            fencing bigint NOT NULL, pid int NOT NULL, started bigint NOT NULL);",
    )
    .execute(db)
    .await?;
    Ok(())
}
