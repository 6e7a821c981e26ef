//! Rotation, tampering and hashed names: a record sealed under an old key still replays, a
//! changed byte or a record moved under another key is a typed error and nothing runs twice,
//! and the inner store never sees the key's text.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{
    Coordinator, Error, Key, MemoryStore, Operation, RawStore, RecordState, StorageKey, Store,
    StoreErrorKind,
};
use idemkit_seal::{KeySecret, Keyring, SealError, Sealed};

const OLD: [u8; 32] = [0x11; 32];
const NEW: [u8; 32] = [0x22; 32];

fn op() -> Operation {
    Operation::new("mail.welcome").unwrap()
}

fn sk(key: &str) -> StorageKey {
    StorageKey::new(&op(), None, &Key::new(key).unwrap())
}

/// Runs the call for `key`: the action counts its runs and answers `value`.
async fn call<S: Store>(
    store: S,
    key: &str,
    value: &str,
    runs: &AtomicUsize,
) -> Result<String, Error<std::io::Error>> {
    let value = value.to_string();
    Coordinator::new(store)
        .call(&op(), &Key::new(key).unwrap())
        .run(|_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(value)
        })
        .await
        .map(|r| r.into_value())
}

fn seal_error(e: &Error<std::io::Error>) -> Option<SealError> {
    match e {
        Error::Store { source, .. } if source.kind() == StoreErrorKind::Corrupt => {
            std::error::Error::source(source)?
                .downcast_ref::<SealError>()
                .cloned()
        }
        _ => None,
    }
}

/// The stored bytes of `key`'s result, as the inner store holds them.
async fn stored(inner: &MemoryStore, key: &StorageKey) -> Bytes {
    match inner.get(key).await.unwrap().unwrap().state {
        RecordState::Completed(r) => r.bytes().clone(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn keys_rotate_old_results_replay_and_new_ones_use_the_new_key() {
    let inner = MemoryStore::new();
    let runs = AtomicUsize::new(0);
    let v1 = Sealed::new(inner.clone()).encrypt(Keyring::new(1, OLD));
    assert_eq!(call(v1, "a", "em_a", &runs).await.unwrap(), "em_a");
    let sealed = stored(&inner, &sk("a")).await;
    assert_eq!(&sealed[..5], b"IKS\x01\x01", "magic, version, key id 1");
    assert!(
        !sealed.windows(4).any(|w| w == b"em_a"),
        "plaintext at rest"
    );

    // Rotated: key 2 seals, key 1 still opens.
    let v2 = Sealed::new(inner.clone()).encrypt(Keyring::new(2, NEW).decrypt_also(1, OLD));
    assert_eq!(call(v2.clone(), "a", "other", &runs).await.unwrap(), "em_a");
    assert_eq!(call(v2, "b", "em_b", &runs).await.unwrap(), "em_b");
    assert_eq!(
        stored(&inner, &sk("b")).await[4],
        2,
        "new results under key 2"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a replayed, b ran");

    // Key 1 retired too early: a typed error, and the action does not run again.
    let v3 = Sealed::new(inner.clone()).encrypt(Keyring::new(2, NEW));
    let e = call(v3.clone(), "a", "again", &runs).await.unwrap_err();
    assert_eq!(seal_error(&e), Some(SealError::UnknownKey(1)), "{e:?}");
    // A wrong key under a known id: does not authenticate.
    let wrong = Sealed::new(inner.clone()).encrypt(Keyring::new(2, OLD));
    let e = call(wrong, "b", "again", &runs).await.unwrap_err();
    assert_eq!(seal_error(&e), Some(SealError::Tampered), "{e:?}");
    // Nothing ran again through those errors; key 2 still opens b.
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(call(v3, "b", "again", &runs).await.unwrap(), "em_b");
}

#[tokio::test]
async fn a_flipped_byte_or_a_moved_record_is_a_typed_error_and_nothing_runs_twice() {
    let inner = MemoryStore::new();
    let store = Sealed::new(inner.clone()).encrypt(Keyring::new(1, OLD));
    let runs = AtomicUsize::new(0);
    call(store.clone(), "a", "em_a", &runs).await.unwrap();
    call(store.clone(), "b", "em_b", &runs).await.unwrap();
    let record = inner.get(&sk("a")).await.unwrap().unwrap();
    let RecordState::Completed(result) = &record.state else {
        panic!()
    };
    // Every byte of the sealed result, flipped in turn: none opens.
    for i in 0..result.bytes().len() {
        let mut bytes = result.bytes().to_vec();
        bytes[i] ^= 0x01;
        let mut changed = record.clone();
        changed.state =
            RecordState::Completed(idemkit_core::StoredResult::new(result.kind(), bytes));
        inner
            .put_raw(&sk("a"), changed.encode().into(), Duration::from_secs(60))
            .await
            .unwrap();
        let e = call(store.clone(), "a", "again", &runs).await.unwrap_err();
        assert!(seal_error(&e).is_some(), "byte {i}: {e:?}");
    }
    // a's (intact) record copied under b's key: bound to a's key, it does not open as b's.
    inner
        .put_raw(&sk("b"), record.encode().into(), Duration::from_secs(60))
        .await
        .unwrap();
    let e = call(store, "b", "again", &runs).await.unwrap_err();
    assert_eq!(seal_error(&e), Some(SealError::Tampered));
    assert_eq!(runs.load(Ordering::SeqCst), 2, "nothing ran twice");
}

#[tokio::test]
async fn plaintext_is_refused_unless_accepted_while_migrating() {
    let inner = MemoryStore::new();
    let runs = AtomicUsize::new(0);
    call(inner.clone(), "a", "em_a", &runs).await.unwrap();
    let sealed = Sealed::new(inner.clone()).encrypt(Keyring::new(1, OLD));
    let e = call(sealed.clone(), "a", "again", &runs).await.unwrap_err();
    assert_eq!(seal_error(&e), Some(SealError::NotSealed));
    let migrating = sealed.accept_plaintext(true);
    assert_eq!(call(migrating, "a", "again", &runs).await.unwrap(), "em_a");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn hashed_keys_leave_no_key_text_in_redis() {
    let url =
        std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("idemkit-seal-names-{:x}", fastrand::u64(..));
    let Ok(redis) = idemkit_redis::RedisStore::builder()
        .prefix(prefix.as_str())
        .connect(&url)
        .await
    else {
        idemkit_test::require_service("redis", false);
        return;
    };
    let secret = KeySecret::new(*b"a secret to hash key names with!").unwrap();
    let store = Sealed::new(redis.clone())
        .encrypt(Keyring::new(1, OLD))
        .hash_keys(secret.clone());
    let runs = AtomicUsize::new(0);
    call(
        store.clone(),
        "user-42.email",
        "sent to alice@example.com",
        &runs,
    )
    .await
    .unwrap();
    // What Redis holds: names and values, none with the key's or the result's text.
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    // SCAN, not KEYS: on a shared server holding many keys one KEYS outlasts the client's
    // response timeout (a fresh-clone run met a million benchmark keys there).
    let mut names: Vec<String> = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await
            .unwrap();
        names.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    assert!(!names.is_empty());
    for name in &names {
        assert!(!name.contains("user-42"), "{name}");
        let value: Vec<u8> = redis::cmd("GET")
            .arg(name)
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(!value.windows(5).any(|w| w == b"alice"), "{name}");
    }
    // The stored name is the one `stored_key` gives (what the operator tool computes).
    let named = store.stored_key(&sk("user-42.email"));
    assert!(redis.get(&named).await.unwrap().is_some());
    assert!(redis.get(&sk("user-42.email")).await.unwrap().is_none());
    // The same key and secret find the record again; another secret does not.
    assert_eq!(
        call(store, "user-42.email", "again", &runs).await.unwrap(),
        "sent to alice@example.com"
    );
    let other = Sealed::new(redis)
        .encrypt(Keyring::new(1, OLD))
        .hash_keys(KeySecret::new(*b"another secret, other names.....").unwrap());
    assert_ne!(other.stored_key(&sk("user-42.email")), named);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(KeySecret::new(*b"short").is_err());
}
