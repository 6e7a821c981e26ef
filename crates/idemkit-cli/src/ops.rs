//! The operator's commands: `inspect` one record, `release` a stuck reservation. Part of
//! the binary: they print.
//!
//! Both take the store's URL (`redis://` with `--prefix`, `postgres://` with `--schema` and
//! `--table`), print one line per fact (or JSON with `--json`), and exit with a code a script
//! can rely on ([`Exit`]). Neither ever touches a key outside idemkit's prefix or table: the
//! record is addressed by its operation, scope and key.

use std::fmt::Write as _;
use std::process::ExitCode;

use idemkit_core::{
    DynStore, Key, KeyError, Operation, Ownership, RawStore, Record, RecordState, ResultKind,
    Scope, StorageKey, Store, StoreError, StoreErrorKind,
};

/// The exit codes of `inspect` and `release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Exit {
    /// Done: the record was shown, or the reservation released.
    Ok = 0,
    /// Bad arguments: an invalid operation, scope or key, an unknown store URL.
    Usage = 2,
    /// No live record under the key.
    NotFound = 3,
    /// The store is down or unreachable.
    Unavailable = 4,
    /// The bytes under the key are not a record of ours (written by something else).
    Foreign = 5,
    /// `release` refused: the record is completed (use `--force` to remove it).
    Refused = 6,
    /// Any other store error.
    Store = 7,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

/// Where the records are: the store's URL and its naming options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StoreArgs {
    /// The store: a `redis://` or `postgres://` URL.
    #[arg(long)]
    pub(crate) store: String,
    /// Redis: the key prefix the services use (`RedisStoreBuilder::prefix`).
    #[arg(long, default_value = "idemkit")]
    pub(crate) prefix: String,
    /// PostgreSQL: the schema of the records table.
    #[arg(long, default_value = "public")]
    pub(crate) schema: String,
    /// PostgreSQL: the records table.
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
}

fn fail(code: Exit, message: impl std::fmt::Display) -> Exit {
    eprintln!("idemkit: {message}");
    code
}

fn storage_key(r: &RecordArgs) -> Result<StorageKey, KeyError> {
    let op = Operation::new(r.operation.as_str())?;
    let key = Key::new(r.key.as_str())?;
    let scope = r.scope.as_deref().map(Scope::new).transpose()?;
    Ok(StorageKey::new(&op, scope.as_ref(), &key))
}

async fn connect(s: &StoreArgs) -> Result<DynStore, Exit> {
    if s.store.starts_with("redis://") || s.store.starts_with("rediss://") {
        let store = idemkit_redis::RedisStore::builder()
            .prefix(s.prefix.as_str())
            .connect(&s.store)
            .await
            .map_err(|e| store_failed(&e))?;
        Ok(DynStore::with_raw(store))
    } else if s.store.starts_with("postgres://") || s.store.starts_with("postgresql://") {
        let builder = idemkit_postgres::PgStore::builder()
            .schema(&s.schema)
            .and_then(|b| b.table(&s.table))
            .map_err(|e| fail(Exit::Usage, e))?;
        let store = builder
            .connect(&s.store, 2)
            .await
            .map_err(|e| store_failed(&e))?;
        Ok(DynStore::with_raw(store))
    } else {
        Err(fail(
            Exit::Usage,
            format!("unknown store {:?}: a redis:// or postgres:// URL", s.store),
        ))
    }
}

fn store_failed(e: &StoreError) -> Exit {
    let code = match e.kind() {
        StoreErrorKind::Unavailable => Exit::Unavailable,
        StoreErrorKind::Corrupt => Exit::Foreign,
        _ => Exit::Store,
    };
    fail(code, e)
}

/// Reads the record, or the exit code that explains why there is none.
async fn read(store: &DynStore, key: &StorageKey) -> Result<Record, Exit> {
    match store.get(key).await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(fail(Exit::NotFound, format!("no live record under {key}"))),
        Err(e) => Err(store_failed(&e)),
    }
}

fn describe(key: &StorageKey, r: &Record, now_ms: u64, json: bool) -> String {
    let (state, kind, bytes) = match &r.state {
        RecordState::Reserved => ("reserved", None, None),
        RecordState::Completed(res) => {
            let state = match res.kind() {
                ResultKind::Value => "completed",
                ResultKind::PermanentError => "permanent error",
                ResultKind::Unavailable => "result unavailable",
                _ => "completed (unknown kind)",
            };
            (state, Some(res.kind()), Some(res.bytes().clone()))
        }
        _ => ("unknown state", None, None),
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
        serde_json::json!({
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
        })
        .to_string()
    } else {
        let mut out = format!(
            "key          {key}\nstate        {state}\nowner        {}\nfencing      {}\nage          {:.3} s\nexpires in   {:.3} s\n",
            r.owner,
            r.fencing.get(),
            age_ms as f64 / 1000.0,
            left_ms as f64 / 1000.0
        );
        if let Some(f) = r.fingerprint {
            let _ = writeln!(out, "fingerprint  {f}");
        }
        if let (Some(b), Some(p)) = (&bytes, &preview) {
            let _ = writeln!(out, "result       {} bytes: {p}", b.len());
        }
        out
    }
}

fn now_ms() -> u64 {
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
    let result = match (&r.state, force) {
        (RecordState::Reserved, _) => store
            .release(&key, &Ownership::new(r.owner, r.fencing))
            .await
            .map(|()| "released the reservation"),
        (RecordState::Completed(_), true) => store
            .purge(&key)
            .await
            .map(|_| "removed the completed record"),
        (RecordState::Completed(_), false) => {
            return fail(
                Exit::Refused,
                format!(
                    "{key} is completed: its result is replayed to every retry; --force removes it (the effect may then run again)"
                ),
            );
        }
        _ => {
            return fail(
                Exit::Foreign,
                format!("{key} is in a state this version does not know"),
            );
        }
    };
    match result {
        Ok(what) => {
            eprintln!(
                "idemkit: {what} {key} (owner {}, fencing {})",
                r.owner,
                r.fencing.get()
            );
            if record.json {
                println!(
                    "{}",
                    serde_json::json!({"key": key.to_string(), "done": what, "fencing": r.fencing.get()})
                );
            } else {
                println!("{what}: {key}");
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
