#![doc = include_str!("../README.md")]
//!
//! # Optional features
//!
//! - `redis`: the module `redis` re-exports `idemkit-redis` (`RedisStore`; `rediss://` and
//!   ACL users built in).
//! - `postgres`: the module `postgres` re-exports `idemkit-postgres` (`PgStore`, `Inbox`,
//!   `TxCall`; TLS by the URL's `sslmode`).
//! - `mysql`: the module `mysql` re-exports `idemkit-mysql` (`MySqlStore`, `Inbox`, `TxCall`;
//!   TLS by the URL's `ssl-mode`).
//! - `kafka`: the module `kafka` re-exports `idemkit-kafka` (`KafkaRunner`).
//! - `nats`: the module `nats` re-exports `idemkit-nats` (`JetStreamRunner`).
//! - `rabbitmq`: the module `rabbitmq` re-exports `idemkit-rabbitmq` (`RabbitRunner`).
//! - `tower`: the module `tower` re-exports `idemkit-tower` (`IdempotencyLayer`).
//! - `http`: the module `http` re-exports `idemkit-http` (the `Idempotency-Key` layer).
//! - `seal`: the module `seal` re-exports `idemkit-seal` (`Sealed`: results encrypted at
//!   rest, key names hashed).
#![forbid(unsafe_code)]

pub use idemkit_core::*;

/// The runner skeleton the queue and stream runners share (`Processor`, `Settlement`,
/// `RetryPolicy`): `idemkit-runner`.
pub mod runner {
    pub use idemkit_runner::*;
}

/// The Redis store: `idemkit-redis`.
#[cfg(feature = "redis")]
pub mod redis {
    pub use idemkit_redis::*;
}

/// The PostgreSQL store, the inbox and the transactional call: `idemkit-postgres`.
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use idemkit_postgres::*;
}

/// The MySQL and MariaDB store, the inbox and the transactional call: `idemkit-mysql`.
#[cfg(feature = "mysql")]
pub mod mysql {
    pub use idemkit_mysql::*;
}

/// The Kafka consumer runner: `idemkit-kafka`.
#[cfg(feature = "kafka")]
pub mod kafka {
    pub use idemkit_kafka::*;
}

/// The NATS JetStream runner: `idemkit-nats`.
#[cfg(feature = "nats")]
pub mod nats {
    pub use idemkit_nats::*;
}

/// The RabbitMQ runner: `idemkit-rabbitmq`.
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq {
    pub use idemkit_rabbitmq::*;
}

/// The idempotency layer for job services: `idemkit-tower`.
#[cfg(feature = "tower")]
pub mod tower {
    pub use idemkit_tower::*;
}

/// The `Idempotency-Key` layer for tower and axum: `idemkit-http`.
#[cfg(feature = "http")]
pub mod http {
    pub use idemkit_http::*;
}

/// Encryption at rest and hashed key names for any store: `idemkit-seal`.
#[cfg(feature = "seal")]
pub mod seal {
    pub use idemkit_seal::*;
}
