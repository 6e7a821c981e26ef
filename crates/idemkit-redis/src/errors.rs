//! Redis errors and replies, mapped to what the coordinator must do about them.

use idemkit_core::{Record, StoreError, StoreErrorKind};
use redis::{RedisError, RetryMethod, Value};

/// Maps a Redis error to a [`StoreErrorKind`], from redis-rs's own retry classification:
/// anything it would retry (a dropped connection, `READONLY` after a failover, `LOADING`,
/// `TRYAGAIN`, `CLUSTERDOWN`, a redirect) is [`StoreErrorKind::Unavailable`], so fail-open
/// and renewal retries apply. Three transient refusals redis-rs does not classify are added:
/// `OOM` (a full `noeviction` server), `NOREPLICAS` (`min-replicas-to-write` not met) and
/// `BUSY` (a long script).
pub(crate) fn map_err(e: RedisError) -> StoreError {
    StoreError::new(kind_of(&e), e)
}

pub(crate) fn kind_of(e: &RedisError) -> StoreErrorKind {
    match e.code() {
        // Something else keeps a hash, list... under our key.
        Some("WRONGTYPE") => return StoreErrorKind::Corrupt,
        Some("OOM" | "NOREPLICAS" | "BUSY") => return StoreErrorKind::Unavailable,
        _ => {}
    }
    if e.is_timeout() || e.is_connection_refusal() || e.is_connection_dropped() {
        return StoreErrorKind::Unavailable;
    }
    match e.kind() {
        redis::ErrorKind::AuthenticationFailed | redis::ErrorKind::InvalidClientConfig => {
            return StoreErrorKind::Other;
        }
        _ => {}
    }
    match e.retry_method() {
        RetryMethod::NoRetry => StoreErrorKind::Other,
        _ => StoreErrorKind::Unavailable,
    }
}

/// `1` from an owner-checked script: done; anything else: the caller's lease is gone.
pub(crate) fn owner_checked(n: i64) -> Result<(), StoreError> {
    if n == 1 {
        Ok(())
    } else {
        Err(StoreError::lease_lost())
    }
}

pub(crate) fn int(v: Option<&Value>) -> Result<i64, StoreError> {
    match v {
        Some(Value::Int(i)) => Ok(*i),
        other => Err(unexpected(other)),
    }
}

pub(crate) fn unexpected(v: Option<&Value>) -> StoreError {
    StoreError::new(StoreErrorKind::Other, format!("unexpected reply {v:?}"))
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
    Record::decode(bytes).map_err(StoreError::corrupt)
}

/// A release tombstone (see `lua/release.lua`): the key is free.
pub(crate) fn is_tombstone(bytes: &[u8]) -> bool {
    bytes.len() == 13 && bytes.starts_with(b"IDK\x01\x03")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code_and_detail: &str) -> RedisError {
        // What the parser builds from a `-CODE detail` reply.
        redis::parse_redis_value(format!("-{code_and_detail}\r\n").as_bytes())
            .and_then(Value::extract_error)
            .expect_err("an error reply")
    }

    /// Before: READONLY, OOM and NOREPLICAS became `Other`: never fail-open, and a renewal
    /// "retried" against them for ever.
    #[test]
    fn transient_server_refusals_are_unavailable() {
        for reply in [
            "READONLY You can't write against a read only replica.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "NOREPLICAS Not enough good replicas to write.",
            "LOADING Redis is loading the dataset in memory",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "MASTERDOWN Link with MASTER is down",
            "BUSY Redis is busy running a script.",
        ] {
            assert_eq!(
                kind_of(&server(reply)),
                StoreErrorKind::Unavailable,
                "{reply}"
            );
        }
        assert_eq!(
            kind_of(&server(
                "WRONGTYPE Operation against a key holding the wrong kind of value"
            )),
            StoreErrorKind::Corrupt
        );
        assert_eq!(
            kind_of(&server("ERR user_script:1: some script error")),
            StoreErrorKind::Other
        );
    }
}
