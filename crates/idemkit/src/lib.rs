#![doc = include_str!("../../../README.md")]
//!
//! # Optional features
//!
//! - `redis`: the module `redis` re-exports `idemkit-redis` (`RedisStore`).
//! - `postgres`: the module `postgres` re-exports `idemkit-postgres` (`PgStore`, `Inbox`,
//!   `TxCall`).
#![forbid(unsafe_code)]

pub use idemkit_core::*;

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
