#![doc = include_str!("../../../README.md")]
//!
//! # Optional features
//!
//! - `redis`: the module `redis` re-exports `idemkit-redis` (`RedisStore`).
#![forbid(unsafe_code)]

pub use idemkit_core::*;

/// The Redis store: `idemkit-redis`.
#[cfg(feature = "redis")]
pub mod redis {
    pub use idemkit_redis::*;
}
