//! The operator's commands on one record: `inspect` it, `release` a stuck reservation; and
//! [`Target`], the store every operator command talks to. Part of the binary: they print.
//!
//! Every command takes the store's URL (`redis://`, `redis+cluster://`, `postgres://` or
//! `mysql://`, with `--prefix`, or `--schema` and `--table`), prints one line per fact (or JSON with
//! `--json`), and exits with a code a script can rely on ([`Exit`]). None ever touches a key
//! outside idemkit's prefix or table: a record is addressed by its operation, scope and key,
//! and listings only walk the prefix or the table.

use std::fmt::Write as _;
use std::process::ExitCode;

use idemkit_core::scan::{Scan, ScanCursor, ScanPage};
use idemkit_core::{
    FencingToken, Key, KeyError, Operation, Ownership, Record, RecordState, ResultKind, Scope,
    StorageKey, Store, StoreError, StoreErrorKind,
};
use idemkit_mysql::MySqlStore;
use idemkit_postgres::PgStore;
use idemkit_redis::RedisStore;
use idemkit_seal::{KeySecret, Sealed};

/// The exit codes of the operator's commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Exit {
    /// Done: the record was shown, the reservation released, the listing printed.
    Ok = 0,
    /// Bad arguments: an invalid operation, scope or key, an unknown store URL.
    Usage = 2,
    /// No live record under the key.
    NotFound = 3,
    /// The store is down or unreachable.
    Unavailable = 4,
    /// The bytes under the key are not a record of ours (written by something else).
    Foreign = 5,
    /// Refused: `release` of a completed record without `--force`, a `purge` not confirmed.
    Refused = 6,
    /// Any other store error.
    Store = 7,
    /// `stats` found a problem: a Redis server whose eviction policy may evict records.
    Check = 8,
    /// The record changed between its reading and its removal (completed, expired,
    /// reserved anew): nothing was removed.
    Changed = 9,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

/// Where the records are: the store's URL and its naming options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StoreArgs {
    /// The store: a `redis://` URL, `redis+cluster://HOST:PORT[,HOST:PORT...]` for a
    /// Cluster (any of its nodes), a `postgres://` URL, or a `mysql://` URL (MySQL or
    /// MariaDB; the database is the URL's).
    #[arg(long)]
    pub(crate) store: String,
    /// Redis: the key prefix the services use (`RedisStoreBuilder::prefix`).
    #[arg(long, default_value = "idemkit")]
    pub(crate) prefix: String,
    /// PostgreSQL: the schema of the records table.
    #[arg(long, default_value = "public")]
    pub(crate) schema: String,
    /// PostgreSQL and MySQL: the records table.
    #[arg(long, default_value = "idemkit_records")]
    pub(crate) table: String,
}

/// The record's address: operation, optional scope, key.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RecordArgs {
    /// The operation (`mail.invoice`).
    pub(crate) operation: String,
    /// The key (`order-9.invoice`).
    pub(crate) key: String,
    /// The scope (tenant), if the services scope their keys.
    #[arg(long)]
    pub(crate) scope: Option<String>,
    /// Print JSON instead of lines.
    #[arg(long)]
    pub(crate) json: bool,
    /// The services store key names hashed (`idemkit_seal::Sealed::hash_keys`): the
    /// environment variable that holds the secret (read from there, so that it is not on
    /// the command line).
    #[arg(long, value_name = "VAR")]
    pub(crate) key_secret_env: Option<String>,
}

pub(crate) fn fail(code: Exit, message: impl std::fmt::Display) -> Exit {
    eprintln!("idemkit: {message}");
    code
}

/// The record's name in the store: the storage key, or its keyed hash when the services
/// hash their key names.
fn storage_key(r: &RecordArgs) -> Result<StorageKey, String> {
    let named = |r: &RecordArgs| -> Result<StorageKey, KeyError> {
        let op = Operation::new(r.operation.as_str())?;
        let key = Key::new(r.key.as_str())?;
        let scope = r.scope.as_deref().map(Scope::new).transpose()?;
        Ok(StorageKey::new(&op, scope.as_ref(), &key))
    };
    let key = named(r).map_err(|e| e.to_string())?;
    let Some(var) = &r.key_secret_env else {
        return Ok(key);
    };
    let secret = std::env::var_os(var)
        .ok_or_else(|| format!("--key-secret-env {var}: the variable is not set"))?;
    let secret = KeySecret::new(secret.into_encoded_bytes())
        .map_err(|e| format!("--key-secret-env {var}: {e}"))?;
    Ok(Sealed::new(()).hash_keys(secret).stored_key(&key))
}

/// The store an operator's command talks to.
#[derive(Clone)]
pub(crate) enum Target {
    Redis(RedisStore),
    Postgres(PgStore),
    MySql(MySqlStore),
}

/// Calls the same method on whichever store `target` is.
macro_rules! on {
    ($target:expr, $s:ident => $e:expr) => {
        match $target {
            Target::Redis($s) => $e,
            Target::Postgres($s) => $e,
            Target::MySql($s) => $e,
        }
    };
}

impl Target {
    pub(crate) async fn get(&self, key: &StorageKey) -> Result<Option<Record>, StoreError> {
        on!(self, s => s.get(key).await)
    }

    pub(crate) async fn release(
        &self,
        key: &StorageKey,
        lease: &Ownership,
    ) -> Result<(), StoreError> {
        on!(self, s => s.release(key, lease).await)
    }

    pub(crate) async fn scan(
        &self,
        op: Option<&Operation>,
        cursor: Option<&ScanCursor>,
        count: usize,
    ) -> Result<ScanPage, StoreError> {
        on!(self, s => s.scan(op, cursor, count).await)
    }

    pub(crate) async fn remove(
        &self,
        key: &StorageKey,
        fencing: FencingToken,
    ) -> Result<bool, StoreError> {
        on!(self, s => s.remove(key, fencing).await)
    }
}

/// Query parameters that carry a secret (libpq's and redis-rs's names among them).
const SECRET_PARAMS: [&str; 6] = ["password", "passwd", "pass", "pwd", "sslpassword", "token"];

/// A store URL as every output prints it: without its password, in the userinfo or in a
/// query parameter (`?password=`), whatever the scheme; the one way the CLI prints a URL.
pub(crate) fn redact(url: &str) -> String {
    // redis+cluster://a:1,b:2 is not one URL: redact each node's part.
    if let Some(nodes) = url.strip_prefix("redis+cluster://") {
        let nodes: Vec<String> = nodes
            .split(',')
            .map(|n| redact(&format!("redis://{n}"))["redis://".len()..].to_string())
            .collect();
        return format!("redis+cluster://{}", nodes.join(","));
    }
    let Ok(mut parsed) = url::Url::parse(url) else {
        // Not a URL: keep only what cannot be a secret (the scheme), say it was cut.
        return match url.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://… (unparsable URL, not shown)"),
            None => "(unparsable URL, not shown)".to_string(),
        };
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(None);
    }
    if parsed.query().is_some() {
        let kept: Vec<(String, String)> = parsed
            .query_pairs()
            .filter(|(k, _)| !SECRET_PARAMS.contains(&k.to_ascii_lowercase().as_str()))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if kept.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(kept);
        }
    }
    parsed.to_string()
}

pub(crate) async fn connect(s: &StoreArgs) -> Result<Target, Exit> {
    let url = s.store.as_str();
    if let Some(nodes) = url.strip_prefix("redis+cluster://") {
        let nodes: Vec<String> = nodes
            .split(',')
            .filter(|n| !n.is_empty())
            .map(|n| format!("redis://{n}"))
            .collect();
        if nodes.is_empty() {
            return Err(fail(Exit::Usage, "redis+cluster:// names no node"));
        }
        let store = RedisStore::builder()
            .prefix(s.prefix.as_str())
            .connect_cluster(nodes)
            .await
            .map_err(|e| store_failed(&e))?;
        Ok(Target::Redis(store))
    } else if url.starts_with("redis://") || url.starts_with("rediss://") {
        let store = RedisStore::builder()
            .prefix(s.prefix.as_str())
            .connect(url)
            .await
            .map_err(|e| store_failed(&e))?;
        Ok(Target::Redis(store))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = PgStore::builder()
            .schema(&s.schema)
            .table(&s.table)
            .max_connections(4)
            .connect(url)
            .await
            .map_err(|e| {
                // A refused schema or table name is the operator's typo, not an outage.
                let name = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<idemkit_postgres::NameError>());
                match name {
                    Some(name) => fail(Exit::Usage, name),
                    None => store_failed(&e),
                }
            })?;
        Ok(Target::Postgres(store))
    } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        let store = MySqlStore::builder()
            .table(&s.table)
            .max_connections(4)
            .connect(url)
            .await
            .map_err(|e| {
                let name = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<idemkit_mysql::NameError>());
                match name {
                    Some(name) => fail(Exit::Usage, name),
                    None => store_failed(&e),
                }
            })?;
        Ok(Target::MySql(store))
    } else {
        Err(fail(
            Exit::Usage,
            format!(
                "unknown store {:?}: a redis://, redis+cluster://, postgres:// or mysql:// URL",
                redact(url)
            ),
        ))
    }
}

pub(crate) fn store_failed(e: &StoreError) -> Exit {
    let code = match e.kind() {
        StoreErrorKind::Unavailable => Exit::Unavailable,
        StoreErrorKind::Corrupt => Exit::Foreign,
        _ => Exit::Store,
    };
    fail(code, e)
}

/// Reads the record, or the exit code that explains why there is none.
async fn read(store: &Target, key: &StorageKey) -> Result<Record, Exit> {
    match store.get(key).await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(fail(Exit::NotFound, format!("no live record under {key}"))),
        Err(e) => Err(store_failed(&e)),
    }
}

/// A record's state as operators read it: `reserved`, `completed`, `permanent error`,
/// `result unavailable`, or `expired` (past its lease or retention, not yet swept: the next
/// call reserves the key afresh).
pub(crate) fn state_of(r: &Record, now_ms: u64) -> &'static str {
    if r.expires_at_ms <= now_ms {
        return "expired";
    }
    match &r.state {
        RecordState::Reserved => "reserved",
        RecordState::Completed(res) => match res.kind() {
            ResultKind::Value => "completed",
            ResultKind::PermanentError => "permanent error",
            ResultKind::Unavailable => "result unavailable",
            _ => "completed (unknown kind)",
        },
        _ => "unknown state",
    }
}

/// Who holds a record, as one line: `web-1 pid 4242 (billing)`; `-` for a record written
/// without a holder (before record format 2, or `without_holder`).
pub(crate) fn holder_text(r: &Record) -> String {
    r.holder.as_ref().map_or_else(
        || "-".to_string(),
        |h| format!("{} pid {} ({})", h.host, h.pid, h.name),
    )
}

/// The holder and its renewals, for JSON: `holder` (host, pid, name or null), `renewed_ms_ago`
/// (a reservation with a recorded lease), and `stale` (its holder stopped renewing it).
pub(crate) fn holder_fields(r: &Record, now_ms: u64, row: &mut serde_json::Value) {
    row["holder"] = r.holder.as_ref().map_or(
        serde_json::Value::Null,
        |h| serde_json::json!({"host": h.host, "pid": h.pid, "name": h.name}),
    );
    if matches!(r.state, RecordState::Reserved) {
        row["renewed_ms_ago"] = r.renewed_at_ms().map(|at| now_ms.saturating_sub(at)).into();
    }
    row["stale"] = r.is_stale(now_ms).into();
}

/// `stale` after a reservation's state when its holder stopped renewing it.
pub(crate) fn state_text(r: &Record, now_ms: u64) -> String {
    let state = state_of(r, now_ms);
    if state == "reserved" && r.is_stale(now_ms) {
        "reserved, STALE".to_string()
    } else {
        state.to_string()
    }
}

fn describe(key: &StorageKey, r: &Record, now_ms: u64, json: bool) -> String {
    let state = state_of(r, now_ms);
    let (kind, bytes) = match &r.state {
        RecordState::Completed(res) => (Some(res.kind()), Some(res.bytes().clone())),
        _ => (None, None),
    };
    let age_ms = now_ms.saturating_sub(r.created_at_ms);
    let left_ms = r.expires_at_ms.saturating_sub(now_ms);
    let preview = bytes
        .as_ref()
        .map(|b| match std::str::from_utf8(&b[..b.len().min(200)]) {
            Ok(text) => text.to_string(),
            Err(_) => b[..b.len().min(64)].iter().fold(String::new(), |mut s, x| {
                let _ = write!(s, "{x:02x}");
                s
            }),
        });
    if json {
        let mut v = serde_json::json!({
            "key": key.to_string(),
            "state": state,
            "owner": r.owner.to_string(),
            "fencing": r.fencing.get(),
            "age_ms": age_ms,
            "expires_in_ms": left_ms,
            "fingerprint": r.fingerprint.map(|f| f.to_string()),
            "result_bytes": bytes.as_ref().map(|b| b.len()),
            "result_kind": kind.map(|k| format!("{k:?}")),
            "preview": preview,
        });
        holder_fields(r, now_ms, &mut v);
        v.to_string()
    } else {
        let mut out = format!(
            "key          {key}\nstate        {}\nowner        {}\nheld by      {}\nfencing      {}\nage          {:.3} s\nexpires in   {:.3} s\n",
            state_text(r, now_ms),
            r.owner,
            holder_text(r),
            r.fencing.get(),
            age_ms as f64 / 1000.0,
            left_ms as f64 / 1000.0
        );
        if let (RecordState::Reserved, Some(at)) = (&r.state, r.renewed_at_ms()) {
            let _ = writeln!(
                out,
                "renewed      {:.3} s ago",
                now_ms.saturating_sub(at) as f64 / 1000.0
            );
        }
        if let Some(f) = r.fingerprint {
            let _ = writeln!(out, "fingerprint  {f}");
        }
        if let (Some(b), Some(p)) = (&bytes, &preview) {
            let _ = writeln!(out, "result       {} bytes: {p}", b.len());
        }
        out
    }
}

pub(crate) fn now_ms() -> u64 {
    #[allow(clippy::disallowed_methods)] // shown to an operator, not a deadline
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `idemkit inspect`.
pub(crate) async fn inspect(store: &StoreArgs, record: &RecordArgs) -> Exit {
    let key = match storage_key(record) {
        Ok(k) => k,
        Err(e) => return fail(Exit::Usage, e),
    };
    let store = match connect(store).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    match read(&store, &key).await {
        Ok(r) => {
            let text = describe(&key, &r, now_ms(), record.json);
            if record.json {
                println!("{text}");
            } else {
                print!("{text}");
            }
            Exit::Ok
        }
        Err(code) => code,
    }
}

/// What `release` does to the record `r` it read under `key`: the store's answer, or the
/// exit code of a refusal.
async fn apply_release(
    store: &Target,
    key: &StorageKey,
    r: &Record,
    force: bool,
) -> Result<Result<&'static str, StoreError>, Exit> {
    match (&r.state, force) {
        (RecordState::Reserved, _) => Ok(store
            .release(key, &Ownership::new(r.owner, r.fencing))
            .await
            .map(|()| "released the reservation")),
        // Fenced: removed only if it is still the record read above. Between the read and
        // the removal it may have expired and been reserved anew by a live owner, whose
        // reservation must not be deleted (`RawStore::purge` deletes whatever is there).
        (RecordState::Completed(_), true) => match store.remove(key, r.fencing).await {
            Ok(true) => Ok(Ok("removed the completed record")),
            Ok(false) => Err(fail(
                Exit::Changed,
                format!(
                    "{key} changed since it was read (fencing token {}): nothing removed",
                    r.fencing.get()
                ),
            )),
            Err(e) => Ok(Err(e)),
        },
        (RecordState::Completed(_), false) => Err(fail(
            Exit::Refused,
            format!(
                "{key} is completed: its result is replayed to every retry; --force removes it (the effect may then run again)"
            ),
        )),
        _ => Err(fail(
            Exit::Foreign,
            format!("{key} is in a state this version does not know"),
        )),
    }
}

/// `idemkit release`: the operator's override for a stuck reservation. The reservation is
/// released with its own owner and fencing token (so a live owner's later writes fail their
/// owner check, and the next owner gets a higher fencing token); a completed record is
/// refused unless `force`, which removes it.
pub(crate) async fn release(store: &StoreArgs, record: &RecordArgs, force: bool) -> Exit {
    let key = match storage_key(record) {
        Ok(k) => k,
        Err(e) => return fail(Exit::Usage, e),
    };
    let store = match connect(store).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let r = match read(&store, &key).await {
        Ok(r) => r,
        Err(code) => return code,
    };
    let result = match apply_release(&store, &key, &r, force).await {
        Ok(result) => result,
        Err(code) => return code,
    };
    match result {
        // One line, on stdout: what was done, to whose reservation.
        Ok(what) => {
            if record.json {
                println!("{}", {
                    let mut v = serde_json::json!({
                        "key": key.to_string(),
                        "done": what,
                        "owner": r.owner.to_string(),
                        "fencing": r.fencing.get(),
                    });
                    holder_fields(&r, now_ms(), &mut v);
                    v
                });
            } else {
                println!(
                    "{what}: {key} (owner {}, held by {}, fencing {})",
                    r.owner,
                    holder_text(&r),
                    r.fencing.get()
                );
            }
            Exit::Ok
        }
        Err(e) if e.is_lease_lost() => fail(
            Exit::NotFound,
            format!("{key} changed meanwhile (completed, released or taken over): nothing done"),
        ),
        Err(e) => store_failed(&e),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_printed_url_carries_no_password() {
        use super::redact;
        for (url, shown) in [
            ("redis://:pw-1@127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            ("redis://user:pw-1@h:1", "redis://user@h:1"),
            (
                "postgres://postgres:pw-1@127.0.0.1/test?sslmode=disable&password=pw-1",
                "postgres://postgres@127.0.0.1/test?sslmode=disable",
            ),
            ("postgres://h/db?PASSWORD=pw-1", "postgres://h/db"),
            (
                "redis+cluster://:pw-1@a:1,:pw-1@b:2",
                "redis+cluster://a:1,b:2",
            ),
            ("rediss://h:1", "rediss://h:1"),
            (
                "nonsense://:pw-1@[bad",
                "nonsense://… (unparsable URL, not shown)",
            ),
        ] {
            assert_eq!(redact(url), shown, "{url}");
            assert!(!redact(url).contains("pw-1"));
        }
    }

    use std::time::Duration;

    use idemkit_core::{
        BeginRequest, Claim, CompleteRequest, Key, Operation, OwnerToken, ResultKind, Store,
    };
    use idemkit_redis::RedisStore;

    use super::*;

    /// Issue 20, item 12: `release --force` of a completed record that, between its reading
    /// and its removal, expired and was reserved anew by a live owner.
    ///
    /// Before: the removal was `RawStore::purge` (delete whatever is there), so the live
    /// owner's reservation was deleted and the next delivery ran its effect beside it.
    #[tokio::test]
    async fn a_forced_release_never_removes_a_reservation_made_after_its_read() {
        let url = std::env::var("IDEMKIT_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string());
        let store = RedisStore::builder()
            .prefix(format!("idemkit-cli-test-{:x}", fastrand::u64(..)))
            .connect(&url)
            .await;
        if !idemkit_test::require_service(&format!("redis at {url}"), store.is_ok()) {
            return;
        }
        let store = store.unwrap();
        let key = StorageKey::new(
            &Operation::new("mail.invoice").unwrap(),
            None,
            &Key::new("order-9.invoice").unwrap(),
        );
        let reserve = || async {
            let req = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(30));
            match store.begin(&req).await.unwrap() {
                Claim::Reserved { ownership, .. } => ownership,
                other => panic!("{other:?}"),
            }
        };
        let first = reserve().await;
        let done = CompleteRequest::new(ResultKind::Value, "\"em_1\"", Duration::from_millis(300));
        store.complete(&key, &first, &done).await.unwrap();
        let target = Target::Redis(store.clone());
        let read = read(&target, &key).await.unwrap();
        // The completed record expires and a new owner reserves the key.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let live = reserve().await;
        let outcome = apply_release(&target, &key, &read, true).await;
        assert!(
            matches!(outcome, Err(Exit::Changed)),
            "expected 'changed meanwhile', got {:?}",
            outcome.map(|r| r.map_err(|e| e.to_string()))
        );
        let now = store
            .get(&key)
            .await
            .unwrap()
            .expect("the live reservation is still there");
        assert_eq!((now.owner, now.fencing), (live.owner, live.fencing));
    }
}
