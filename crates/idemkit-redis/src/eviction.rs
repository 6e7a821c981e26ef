//! The eviction check at connect: a server whose `maxmemory-policy` may evict keys would
//! lose reservations and records silently, and actions would run again.

use idemkit_core::{StoreError, StoreErrorKind};

use crate::conn::Conn;

/// What [`RedisStoreBuilder::eviction_check`](crate::RedisStoreBuilder::eviction_check) does about a server that may evict our keys.
///
/// # Example
///
/// ```
/// use idemkit_redis::EvictionCheck;
/// assert_ne!(EvictionCheck::Warn, EvictionCheck::Refuse);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EvictionCheck {
    /// Connect, and log a warning naming the policy. The default.
    Warn,
    /// Refuse to connect ([`StoreErrorKind::Rejected`]).
    Refuse,
    /// Do not check (the server may forbid `CONFIG`).
    Skip,
}

/// `CONFIG GET maxmemory-policy`, judged by `check`.
pub(crate) async fn check_eviction(
    conn: &mut Conn,
    check: EvictionCheck,
) -> Result<(), StoreError> {
    if check == EvictionCheck::Skip {
        return Ok(());
    }
    // A map in RESP3, a flat array in RESP2: the map type reads both.
    let reply: Result<std::collections::HashMap<String, String>, _> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(conn)
        .await;
    let policy = match reply {
        Ok(config) => config.get("maxmemory-policy").cloned().unwrap_or_default(),
        Err(e) => {
            tracing::warn!(error = %e, "could not read maxmemory-policy; make sure it is noeviction");
            return Ok(());
        }
    };
    if policy == "noeviction" {
        return Ok(());
    }
    let what = format!(
        "maxmemory-policy is {policy:?}: a full server would silently evict reservations and \
         records, and actions would run again; set it to noeviction (or use a dedicated server)"
    );
    match check {
        EvictionCheck::Refuse => Err(StoreError::new(StoreErrorKind::Rejected, what)),
        _ => {
            tracing::warn!("{what}");
            Ok(())
        }
    }
}
