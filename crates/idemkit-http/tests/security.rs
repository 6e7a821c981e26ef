//! What one caller's request may learn about another's, and about the server: a 500 carries
//! no internal text (an id its log line carries instead), another credential's response is
//! not replayed, and per-caller response headers are never stored.

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HeaderName, SET_COOKIE};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use idemkit_core::{Coordinator, Key, MemoryStore, Operation, RawStore, Scope, StorageKey, Store};
use idemkit_http::{BuildError, IdempotencyLayer, IdempotencyLayerBuilder};
use tower::ServiceExt as _;

fn builder(store: MemoryStore) -> IdempotencyLayerBuilder<MemoryStore> {
    IdempotencyLayer::builder(
        Coordinator::new(store),
        Operation::new("http.payments").unwrap(),
    )
    .global_scope("tenant-1")
    .unwrap()
}

/// `POST /pay`: answers who asked (its Authorization) and a cookie for them.
fn app(layer: IdempotencyLayer<MemoryStore>) -> Router {
    Router::new()
        .route(
            "/pay",
            post(|req: Request<Body>| async move {
                let who = req
                    .headers()
                    .get(AUTHORIZATION)
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default();
                (
                    StatusCode::CREATED,
                    [("set-cookie", format!("session={who}"))],
                    format!("receipt for {who}"),
                )
            }),
        )
        .layer(layer)
}

fn request(key: &str, auth: &str) -> Request<Body> {
    Request::post("/pay")
        .header("idempotency-key", key)
        .header(AUTHORIZATION, auth)
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"amount":5}"#))
        .unwrap()
}

async fn body(resp: Response<Body>) -> String {
    String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap()
}

/// Before: bob, in alice's tenant, sending alice's key and body got alice's stored response
/// (`receipt for Bearer alice`, and her cookie).
#[tokio::test]
async fn another_credential_does_not_get_the_stored_response() {
    let app = app(builder(MemoryStore::new()).build().unwrap());
    let alice = app
        .clone()
        .oneshot(request("k-1", "Bearer alice"))
        .await
        .unwrap();
    assert_eq!(alice.status(), StatusCode::CREATED);
    let bob = app
        .clone()
        .oneshot(request("k-1", "Bearer bob"))
        .await
        .unwrap();
    assert_eq!(bob.status(), StatusCode::UNPROCESSABLE_ENTITY, "key reused");
    let text = body(bob).await;
    assert!(!text.contains("alice"), "{text}");
    // Alice's own retry replays.
    let again = app.oneshot(request("k-1", "Bearer alice")).await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(body(again).await, "receipt for Bearer alice");
}

/// The documented opt-out: credentials that change between retries (a refreshed token)
/// replay, for apps that scope per principal instead.
#[tokio::test]
async fn the_credential_can_be_left_out_of_the_fingerprint() {
    let layer = builder(MemoryStore::new())
        .fingerprint_authorization(false)
        .build()
        .unwrap();
    let app = app(layer);
    let first = app
        .clone()
        .oneshot(request("k-2", "Bearer token-1"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let refreshed = app.oneshot(request("k-2", "Bearer token-2")).await.unwrap();
    assert_eq!(refreshed.status(), StatusCode::CREATED);
    assert_eq!(body(refreshed).await, "receipt for Bearer token-1");
}

/// `Set-Cookie` (and the other per-caller headers) cannot be kept: it would hand one
/// caller's session to whoever replays.
#[test]
fn per_caller_headers_cannot_be_kept() {
    for name in [
        SET_COOKIE,
        AUTHORIZATION,
        HeaderName::from_static("proxy-authorization"),
        HeaderName::from_static("cookie"),
        HeaderName::from_static("authentication-info"),
    ] {
        let built = builder(MemoryStore::new())
            .keep_headers([CONTENT_TYPE, name.clone()])
            .build();
        assert!(
            matches!(&built, Err(BuildError::PerCallerHeader(n)) if *n == name),
            "{name}: {:?}",
            built.as_ref().err()
        );
    }
    // And the default set stores none of them: the replay has no cookie.
    assert!(builder(MemoryStore::new()).build().is_ok());
}

/// A writer the test reads back: the layer's log lines.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Before: the 500's `detail` was the store's error text (here the record decoder's, for a
/// PostgreSQL store its SQL), for any client to read.
#[tokio::test]
async fn an_internal_error_answers_an_id_and_logs_the_text() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let store = MemoryStore::new();
    let key = StorageKey::new(
        &Operation::new("http.payments").unwrap(),
        Some(&Scope::new("tenant-1").unwrap()),
        &Key::new("k-3").unwrap(),
    );
    // Bytes that are not a record, under the key: the store reports them corrupt.
    store
        .put_raw(
            &key,
            Bytes::from_static(b"IDK\x01\x09 garbage"),
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap();
    let resp = app(builder(store).build().unwrap())
        .oneshot(request("k-3", "Bearer alice"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let problem: serde_json::Value = serde_json::from_str(&body(resp).await).unwrap();
    assert_eq!(
        problem["type"],
        idemkit_http::Problem::Internal.type_uri(Some(idemkit_http::PROBLEM_DOCS))
    );
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        !detail.contains("corrupt") && !detail.contains("record") && !detail.contains("garbage"),
        "internal text in the answer: {detail}"
    );
    let id = problem["instance"]
        .as_str()
        .and_then(|i| i.strip_prefix("urn:idemkit:incident:"))
        .expect("an incident id in `instance`")
        .to_string();
    assert!(id.len() >= 16, "{id}");
    let log = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains(&id))
        .unwrap_or_else(|| panic!("no log line carries {id}: {log}"));
    assert!(
        line.contains("corrupt") || line.contains("record"),
        "{line}"
    );
}

/// The layer over a sealed store (encrypted results, hashed key names): a replay is byte for
/// byte the first response, and the store holds neither the body nor the key's text.
#[tokio::test]
async fn over_a_sealed_store_responses_replay_and_rest_encrypted() {
    use idemkit_seal::{KeySecret, Keyring, Sealed};
    let inner = MemoryStore::new();
    let store = Sealed::new(inner.clone())
        .encrypt(Keyring::new(1, [9; 32]))
        .hash_keys(KeySecret::new(*b"the http layer's hashing secret!").unwrap());
    let layer = IdempotencyLayer::builder(
        Coordinator::new(store.clone()),
        Operation::new("http.payments").unwrap(),
    )
    .global_scope("tenant-1")
    .unwrap()
    .build()
    .unwrap();
    let app = Router::new()
        .route(
            "/pay",
            post(|| async { (StatusCode::CREATED, "receipt for alice@example.com") }),
        )
        .layer(layer);
    let first = app
        .clone()
        .oneshot(request("k-9", "Bearer alice"))
        .await
        .unwrap();
    assert_eq!(body(first).await, "receipt for alice@example.com");
    let again = app.oneshot(request("k-9", "Bearer alice")).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(body(again).await, "receipt for alice@example.com");
    let plain = StorageKey::new(
        &Operation::new("http.payments").unwrap(),
        Some(&Scope::new("tenant-1").unwrap()),
        &Key::new("k-9").unwrap(),
    );
    assert!(
        inner.get(&plain).await.unwrap().is_none(),
        "the key's own name"
    );
    let record = inner
        .get(&store.stored_key(&plain))
        .await
        .unwrap()
        .expect("under its hashed name");
    let idemkit_core::RecordState::Completed(result) = record.state else {
        panic!("{record:?}")
    };
    assert!(
        !result.bytes().windows(5).any(|w| w == b"alice"),
        "plaintext at rest"
    );
}
