//! The layer in front of a real axum server on a loopback port, called with a real HTTP
//! client (reqwest), and as a tower service with a tower-test mock inside.

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use http::{Request, StatusCode};
use idemkit_core::{Coordinator, InFlight, MemoryStore, Operation, Scope, Store};
use idemkit_http::{IdempotencyInfo, IdempotencyLayer, REPLAYED};
use idemkit_test::{Fault, Probe};
use tower::{Layer as _, ServiceExt as _};

#[derive(Clone, Default)]
struct App {
    runs: Arc<AtomicUsize>,
}

/// `POST /payments`: counts its runs, takes 300 ms, answers 201 with a binary body that
/// depends on the request body. `POST /flaky`: 503 on its first run, then 201.
/// `POST /info`: echoes the extractor.
fn router<S: Store>(layer: IdempotencyLayer<S>, app: App) -> Router {
    Router::new()
        .route(
            "/payments",
            post(
                |State(app): State<App>, body: axum::body::Bytes| async move {
                    let n = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let mut out = vec![0u8, 0xff, 0xfe];
                    out.extend_from_slice(&body);
                    out.extend_from_slice(format!("#{n}").as_bytes());
                    (
                        StatusCode::CREATED,
                        [
                            ("content-type", "application/octet-stream"),
                            ("x-run", "yes"),
                        ],
                        out,
                    )
                },
            ),
        )
        .route(
            "/flaky",
            post(|State(app): State<App>| async move {
                let n = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
                if n == 1 {
                    (StatusCode::SERVICE_UNAVAILABLE, "try again")
                } else {
                    (StatusCode::CREATED, "done")
                }
            }),
        )
        .route(
            "/panics",
            post(|State(app): State<App>| async move {
                let n = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
                if n == 1 {
                    panic!("the handler failed half-way");
                }
                (StatusCode::CREATED, "done")
            }),
        )
        .route(
            "/slow",
            post(|State(app): State<App>| async move {
                app.runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(2)).await;
                (StatusCode::CREATED, "slow")
            }),
        )
        .route(
            "/info",
            post(|info: IdempotencyInfo| async move {
                format!("{}|{}|{}", info.key, info.scope, info.fencing.is_some())
            }),
        )
        .layer(layer)
        .with_state(app)
}

/// A builder for the tests' operation.
fn builder<S: Store>(store: S) -> idemkit_http::IdempotencyLayerBuilder<S> {
    IdempotencyLayer::builder(
        Coordinator::new(store),
        Operation::new("http.test").unwrap(),
    )
}

/// A builder with one global scope.
fn global<S: Store>(store: S) -> idemkit_http::IdempotencyLayerBuilder<S> {
    builder(store).global_scope("global").unwrap()
}

fn tenant_layer<S: Store>(store: S, mode: InFlight) -> IdempotencyLayer<S> {
    builder(store)
        .scope_by(|req: &http::request::Parts| {
            Scope::new(req.headers.get("x-tenant")?.to_str().ok()?).ok()
        })
        .in_flight(mode)
        .build()
        .unwrap()
}

fn key() -> String {
    format!("k-{:016x}", fastrand::u64(..))
}

async fn post_to(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    tenant: Option<&str>,
    body: &'static [u8],
) -> reqwest::Response {
    let mut req = client.post(url).body(body);
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    if let Some(t) = tenant {
        req = req.header("x-tenant", t);
    }
    req.send().await.expect("a response")
}

/// The answer is `problem`, as `application/problem+json` with its published `type`.
async fn assert_problem(resp: reqwest::Response, problem: idemkit_http::Problem) {
    assert_eq!(
        resp.headers()["content-type"],
        "application/problem+json",
        "errors are problem+json"
    );
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(
        v["type"],
        problem.type_uri(Some(idemkit_http::PROBLEM_DOCS))
    );
}

async fn fifty_concurrent_identical_posts<S: Store>(store: S) {
    let app = App::default();
    let url = support::serve(router(tenant_layer(store, InFlight::Wait), app.clone())).await;
    let client = reqwest::Client::new();
    let k = key();
    let calls = (0..50).map(|_| {
        let (client, url, k) = (client.clone(), url.clone(), k.clone());
        tokio::spawn(async move {
            let r = post_to(
                &client,
                &format!("{url}/payments"),
                Some(&k),
                Some("t1"),
                b"pay 10",
            )
            .await;
            (r.status(), r.bytes().await.unwrap())
        })
    });
    // Spawned all at once (an iterator would start each only when the previous ended).
    let calls: Vec<_> = calls.collect();
    let mut out = Vec::new();
    for c in calls {
        out.push(c.await.unwrap());
    }
    assert_eq!(app.runs.load(Ordering::SeqCst), 1, "the handler ran once");
    let first = &out[0];
    assert_eq!(first.0, StatusCode::CREATED);
    assert!(
        out.iter().all(|o| o == first),
        "every caller got the same status and bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_identical_posts_run_once_and_all_get_the_same_response() {
    fifty_concurrent_identical_posts(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_identical_posts_on_redis_run_once() {
    let url =
        std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let store = idemkit_redis::RedisStore::builder()
        .prefix(format!("idemkit-http-test-{:x}", fastrand::u64(..)))
        .connect(&url)
        .await;
    if !idemkit_test::require_service(&format!("redis at {url}"), store.is_ok()) {
        return;
    }
    fifty_concurrent_identical_posts(store.unwrap()).await;
}

/// The same on PostgreSQL (issue 24: the layer on every store).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_identical_posts_on_postgres_run_once() {
    let url = std::env::var("IDEMKIT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let store = idemkit_postgres::PgStore::builder()
        .schema("idemkit_http_test")
        .max_connections(8)
        .connect(&url)
        .await;
    if !idemkit_test::require_service(&format!("postgres at {url}"), store.is_ok()) {
        return;
    }
    let store = store.unwrap();
    store.migrate().await.unwrap();
    fifty_concurrent_identical_posts(store).await;
}

/// Over HTTP/2 (prior knowledge, one connection multiplexing all requests): one run, the
/// same response for all, the replay marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_http2_concurrent_identical_posts_run_once() {
    let app = App::default();
    let url = support::serve(router(
        tenant_layer(MemoryStore::new(), InFlight::Wait),
        app.clone(),
    ))
    .await;
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let k = key();
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let (client, url, k) = (client.clone(), format!("{url}/payments"), k.clone());
            tokio::spawn(async move {
                let r = post_to(&client, &url, Some(&k), Some("acme"), b"amount=10").await;
                assert_eq!(r.version(), reqwest::Version::HTTP_2);
                (r.status(), r.bytes().await.unwrap())
            })
        })
        .collect();
    let mut bodies = Vec::new();
    for c in calls {
        let (status, body) = c.await.unwrap();
        assert_eq!(status, StatusCode::CREATED);
        bodies.push(body);
    }
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    assert!(bodies.windows(2).all(|w| w[0] == w[1]));
    let again = post_to(
        &client,
        &format!("{url}/payments"),
        Some(&k),
        Some("acme"),
        b"amount=10",
    )
    .await;
    assert_eq!(again.headers()[REPLAYED.as_str()], "true");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_reject_mode_one_succeeds_and_the_others_get_409_with_retry_after() {
    let app = App::default();
    let url = support::serve(router(
        tenant_layer(MemoryStore::new(), InFlight::Reject),
        app.clone(),
    ))
    .await;
    let client = reqwest::Client::new();
    let k = key();
    let calls = (0..50).map(|_| {
        let (client, url, k) = (client.clone(), url.clone(), k.clone());
        tokio::spawn(async move {
            let r = post_to(
                &client,
                &format!("{url}/payments"),
                Some(&k),
                Some("t1"),
                b"pay 10",
            )
            .await;
            let retry = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string());
            (r.status(), retry)
        })
    });
    let calls: Vec<_> = calls.collect();
    let mut ok = 0;
    let mut conflicts = 0;
    for c in calls {
        match c.await.unwrap() {
            (StatusCode::CREATED, _) => ok += 1,
            (StatusCode::CONFLICT, Some(retry)) => {
                assert!(retry.parse::<u64>().unwrap() >= 1);
                conflicts += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    assert_eq!(ok + conflicts, 50);
    assert!(ok >= 1 && conflicts >= 1, "ok {ok}, 409s {conflicts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_is_marked_and_byte_for_byte_and_a_reused_key_is_422_also_mid_flight() {
    let app = App::default();
    let url = support::serve(router(
        tenant_layer(MemoryStore::new(), InFlight::Wait),
        app.clone(),
    ))
    .await;
    let client = reqwest::Client::new();
    let k = key();
    let pay = format!("{url}/payments");
    // Mid-flight: the first request runs for 300 ms; another body with its key meanwhile.
    let first = {
        let (client, pay, k) = (client.clone(), pay.clone(), k.clone());
        tokio::spawn(async move { post_to(&client, &pay, Some(&k), Some("t1"), b"pay 10").await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let reused = post_to(&client, &pay, Some(&k), Some("t1"), b"pay 99").await;
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_problem(reused, idemkit_http::Problem::KeyReused).await;
    let first = first.await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get(REPLAYED).is_none());
    assert_eq!(first.headers()["x-run"], "yes");
    let first_body = first.bytes().await.unwrap();

    let again = post_to(&client, &pay, Some(&k), Some("t1"), b"pay 10").await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()[REPLAYED.as_str()], "true");
    assert_eq!(again.headers()["content-type"], "application/octet-stream");
    assert!(
        again.headers().get("x-run").is_none(),
        "only allowlisted headers are stored"
    );
    assert_eq!(
        again.bytes().await.unwrap(),
        first_body,
        "identical bytes, binary included"
    );
    // After completion, too.
    let reused = post_to(&client, &pay, Some(&k), Some("t1"), b"pay 99").await;
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_are_scoped_and_an_unscoped_request_is_refused() {
    let app = App::default();
    let url = support::serve(router(
        tenant_layer(MemoryStore::new(), InFlight::Wait),
        app.clone(),
    ))
    .await;
    let client = reqwest::Client::new();
    let (k, pay) = (key(), format!("{url}/payments"));
    let a = post_to(&client, &pay, Some(&k), Some("tenant-a"), b"pay 10").await;
    let b = post_to(&client, &pay, Some(&k), Some("tenant-b"), b"pay 10").await;
    assert_eq!(
        (a.status(), b.status()),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(
        b.headers().get(REPLAYED).is_none(),
        "tenant b's request is not a's replay"
    );
    assert_eq!(
        app.runs.load(Ordering::SeqCst),
        2,
        "two tenants, two executions"
    );
    let unscoped = post_to(&client, &pay, Some(&k), None, b"pay 10").await;
    assert_eq!(unscoped.status(), StatusCode::FORBIDDEN);
    assert_problem(unscoped, idemkit_http::Problem::UnscopedRequest).await;
    assert_eq!(app.runs.load(Ordering::SeqCst), 2);
    // The extractor sees the key and the scope.
    let info = post_to(
        &client,
        &format!("{url}/info"),
        Some("\"quoted-key\""),
        Some("t9"),
        b"",
    )
    .await;
    assert_eq!(info.text().await.unwrap(), "quoted-key|t9|true");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_required_key_or_a_malformed_one_is_400_and_a_large_body_413() {
    let layer = global(MemoryStore::new())
        .required(true)
        .max_body_bytes(16)
        .build()
        .unwrap();
    let app = App::default();
    let url = support::serve(router(layer, app.clone())).await;
    let client = reqwest::Client::new();
    let pay = format!("{url}/payments");
    let missing = post_to(&client, &pay, None, None, b"x").await;
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert_problem(missing, idemkit_http::Problem::MissingKey).await;
    for bad in ["two words", "\"unterminated", &"x".repeat(256)] {
        let r = post_to(&client, &pay, Some(bad), None, b"x").await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert_problem(r, idemkit_http::Problem::MalformedKey).await;
    }
    let big = post_to(
        &client,
        &pay,
        Some(&key()),
        None,
        b"a body over sixteen bytes",
    )
    .await;
    assert_eq!(big.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(app.runs.load(Ordering::SeqCst), 0, "no handler ran");
    // A build without a scope rule is refused.
    let unscoped = builder(MemoryStore::new()).build();
    assert!(unscoped.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_5xx_releases_the_key_so_the_retry_runs_again() {
    let app = App::default();
    let url = support::serve(router(
        tenant_layer(MemoryStore::new(), InFlight::Wait),
        app.clone(),
    ))
    .await;
    let client = reqwest::Client::new();
    let (k, flaky) = (key(), format!("{url}/flaky"));
    let first = post_to(&client, &flaky, Some(&k), Some("t1"), b"").await;
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    let retry = post_to(&client, &flaky, Some(&k), Some("t1"), b"").await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().get(REPLAYED).is_none());
    let again = post_to(&client, &flaky, Some(&k), Some("t1"), b"").await;
    assert_eq!(again.headers()[REPLAYED.as_str()], "true");
    assert_eq!(app.runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_store_down_the_answer_is_503_and_nothing_runs() {
    let store = Probe::new(MemoryStore::new());
    store.fail(Fault::Begin, true);
    let app = App::default();
    let url = support::serve(router(
        tenant_layer(store.clone(), InFlight::Wait),
        app.clone(),
    ))
    .await;
    let client = reqwest::Client::new();
    let r = post_to(
        &client,
        &format!("{url}/payments"),
        Some(&key()),
        Some("t1"),
        b"x",
    )
    .await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The client may come back: a short, fixed wait (the outage's end is unknown).
    assert_eq!(
        r.headers()
            .get(http::header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    assert_problem(r, idemkit_http::Problem::StoreUnavailable).await;
    assert_eq!(app.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn with_a_tower_test_mock_the_inner_service_runs_once_per_key() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, http::Response<Body>>();
    handle.allow(10);
    let inner = mock.map_err(|e| -> Infallible { panic!("the mock failed: {e}") });
    let svc = tenant_layer(MemoryStore::new(), InFlight::Wait).layer(inner);
    let req = |k: &str| {
        Request::post("/payments")
            .header("idempotency-key", k)
            .header("x-tenant", "t1")
            .body(Body::from("pay 10"))
            .unwrap()
    };
    let first = tokio::spawn(svc.clone().oneshot(req("k1")));
    let (got, reply) = handle
        .next_request()
        .await
        .expect("the first request reaches it");
    assert_eq!(got.uri(), "/payments");
    reply.send_response(
        http::Response::builder()
            .status(201)
            .body(Body::from("ch_1"))
            .unwrap(),
    );
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), 201);
    // The same key: answered from the store, the mock never asked (it would wait forever).
    let again = tokio::time::timeout(Duration::from_secs(5), svc.clone().oneshot(req("k1")))
        .await
        .expect("replayed without the inner service")
        .unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()[REPLAYED.as_str()], "true");
    let body = axum::body::to_bytes(Body::new(again.into_body()), 1024)
        .await
        .unwrap();
    assert_eq!(&body[..], b"ch_1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_json_body_can_be_fingerprinted_by_its_value() {
    let layer = |canonical| {
        global(MemoryStore::new())
            .canonical_json(canonical)
            .fingerprint_headers([http::header::HeaderName::from_static("x-currency")])
            .build()
            .unwrap()
    };
    for canonical in [true, false] {
        let app = App::default();
        let url = support::serve(router(layer(canonical), app.clone())).await;
        let client = reqwest::Client::new();
        let (k, pay) = (key(), format!("{url}/payments"));
        let send = |body: &'static str, currency: &'static str| {
            client
                .post(&pay)
                .header("idempotency-key", &k)
                .header("x-currency", currency)
                .body(body)
                .send()
        };
        let first = send(r#"{"amount": 10, "to": "acme"}"#, "EUR")
            .await
            .unwrap();
        assert_eq!(first.status(), StatusCode::CREATED);
        // The same request, re-serialised by the client: other key order and whitespace.
        let again = send(r#"{"to":"acme","amount":10}"#, "EUR").await.unwrap();
        if canonical {
            assert_eq!(again.status(), StatusCode::CREATED, "the same JSON value");
            assert_eq!(again.headers()[REPLAYED.as_str()], "true");
        } else {
            assert_eq!(
                again.status(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "other bytes"
            );
        }
        // Another value, or another fingerprinted header: a different request.
        let other = send(r#"{"to":"acme","amount":11}"#, "EUR").await.unwrap();
        assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let other = send(r#"{"amount": 10, "to": "acme"}"#, "USD")
            .await
            .unwrap();
        assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_that_panicked_stores_nothing_and_its_retry_runs() {
    let app = App::default();
    let url = support::serve(router(
        tenant_layer(MemoryStore::new(), InFlight::Reject),
        app.clone(),
    ))
    .await;
    let client = reqwest::Client::new();
    let (k, panics) = (key(), format!("{url}/panics"));
    let first = client
        .post(&panics)
        .header("idempotency-key", &k)
        .header("x-tenant", "t1")
        .send()
        .await;
    // The connection's task died with the handler: no response, or a 500 from the stack.
    assert!(first.is_err() || first.unwrap().status().is_server_error());
    // The key was released as the call unwound (reject mode would answer 409 otherwise).
    let mut retry = None;
    for _ in 0..100 {
        let r = post_to(&client, &panics, Some(&k), Some("t1"), b"").await;
        if r.status() != StatusCode::CONFLICT {
            retry = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let retry = retry.expect("the key was released");
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(
        retry.headers().get(REPLAYED).is_none(),
        "nothing was stored for the panic"
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 2);
}

/// A client that times out (300 ms into a 2 s handler) and sends the same request again.
/// Returns (the retry's status and whether it was a replay, the handler's runs).
async fn a_client_that_times_out_then_retries<S: Store>(
    store: S,
    mode: InFlight,
) -> (StatusCode, bool, usize) {
    let app = App::default();
    let url = support::serve(router(tenant_layer(store, mode), app.clone())).await;
    let (k, slow) = (key(), format!("{url}/slow"));
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let gave_up = post_to_result(&impatient, &slow, &k).await;
    assert!(gave_up.is_err(), "the client timed out");
    drop(impatient);
    // The retry: waits for the first run's response (wait mode), or is told 409 until it
    // is stored (reject mode).
    let client = reqwest::Client::new();
    let mut last = None;
    for _ in 0..100 {
        let r = post_to(&client, &slow, Some(&k), Some("t1"), b"").await;
        if r.status() != StatusCode::CONFLICT {
            last = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last = last.expect("the retry got an answer other than 409 within 5 s");
    let replayed = last.headers().get(REPLAYED).is_some();
    (last.status(), replayed, app.runs.load(Ordering::SeqCst))
}

/// Issue 20, item 3: the draft's motivating case. The first client times out and
/// disconnects mid-handler; its handler runs on to its end (detached from the connection),
/// its response is stored, and the retry gets it, replayed: one run.
///
/// Before: the disconnect dropped the call, cancelled the handler half-way and released
/// the key; the retry ran the handler again (two runs), on both stores, in both modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_times_out_does_not_cancel_its_handler_and_its_retry_replays() {
    for mode in [InFlight::Wait, InFlight::Reject] {
        let (status, replayed, runs) =
            a_client_that_times_out_then_retries(MemoryStore::new(), mode).await;
        assert_eq!(
            (status, replayed, runs),
            (StatusCode::CREATED, true, 1),
            "memory, {mode:?}"
        );
        let Some(redis) = redis_store().await else {
            return;
        };
        let (status, replayed, runs) = a_client_that_times_out_then_retries(redis, mode).await;
        assert_eq!(
            (status, replayed, runs),
            (StatusCode::CREATED, true, 1),
            "redis, {mode:?}"
        );
    }
}

/// With `cancel_with_client(true)` the handler is dropped with the connection, and (the
/// coordinator's default `OnCancel::KeepLease`) its key stays reserved: the retry is told
/// 409, never runs the handler beside a cancelled one that may still be taking effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_with_the_client_is_an_explicit_option() {
    let app = App::default();
    let layer = builder(MemoryStore::new())
        .scope_by(|req: &http::request::Parts| {
            Scope::new(req.headers.get("x-tenant")?.to_str().ok()?).ok()
        })
        .in_flight(InFlight::Reject)
        .cancel_with_client(true)
        .build()
        .unwrap();
    let url = support::serve(router(layer, app.clone())).await;
    let (k, slow) = (key(), format!("{url}/slow"));
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(post_to_result(&impatient, &slow, &k).await.is_err());
    drop(impatient);
    // Past the 2 s the handler would have taken: it was cancelled, so nothing is stored.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let retry = post_to(&reqwest::Client::new(), &slow, Some(&k), Some("t1"), b"").await;
    assert_eq!(
        retry.status(),
        StatusCode::CONFLICT,
        "the key waits out its lease"
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

async fn redis_store() -> Option<idemkit_redis::RedisStore> {
    let url =
        std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let store = idemkit_redis::RedisStore::builder()
        .prefix(format!("idemkit-http-test-{:x}", fastrand::u64(..)))
        .connect(&url)
        .await;
    idemkit_test::require_service(&format!("redis at {url}"), store.is_ok())
        .then(|| store.expect("checked"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failing_open_with_the_store_down_runs_the_handler_unprotected() {
    let store = Probe::new(MemoryStore::new());
    store.fail(Fault::Begin, true);
    let layer = global(store)
        .on_store_error(idemkit_core::OnStoreError::FailOpen)
        .build()
        .unwrap();
    let app = App::default();
    let url = support::serve(router(layer, app.clone())).await;
    let client = reqwest::Client::new();
    let k = key();
    let info = post_to(&client, &format!("{url}/info"), Some(&k), None, b"").await;
    assert_eq!(info.status(), StatusCode::OK);
    assert!(
        info.text().await.unwrap().ends_with("|false"),
        "no fencing token: unprotected"
    );
    for _ in 0..2 {
        let r = post_to(&client, &format!("{url}/payments"), Some(&k), None, b"x").await;
        assert_eq!(r.status(), StatusCode::CREATED);
        assert!(r.headers().get(REPLAYED).is_none());
    }
    assert_eq!(
        app.runs.load(Ordering::SeqCst),
        2,
        "unprotected: nothing stored, both ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_client_that_disconnects_leaves_no_subscription_on_redis() {
    let url =
        std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let store = idemkit_redis::RedisStore::builder()
        .prefix(format!("idemkit-http-test-{:x}", fastrand::u64(..)))
        .connect(&url)
        .await;
    if !idemkit_test::require_service(&format!("redis at {url}"), store.is_ok()) {
        return;
    }
    let store = store.unwrap();
    let app = App::default();
    let base = support::serve(router(
        tenant_layer(store.clone(), InFlight::Wait),
        app.clone(),
    ))
    .await;
    let (k, slow) = (key(), format!("{base}/slow"));
    let first = {
        let (slow, k) = (slow.clone(), k.clone());
        tokio::spawn(async move {
            post_to(&reqwest::Client::new(), &slow, Some(&k), Some("t1"), b"")
                .await
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A retry waits for the first response (subscribed to the key's wake-up channel), then
    // gives up after 300 ms and closes its connection.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let waiting = post_to_result(&impatient, &slow, &k).await;
    assert!(waiting.is_err(), "the retry timed out while waiting");
    drop(impatient);
    let unsubscribed = idemkit_test::eventually(Duration::from_secs(1), || async {
        store.waiting_channels() == 0
    })
    .await;
    // Checked while the first request still runs: not a wake-up that cleaned up.
    assert!(!first.is_finished(), "the first request still runs");
    assert!(unsubscribed, "the dropped waiter's subscription is gone");
    assert_eq!(first.await.unwrap(), StatusCode::CREATED);
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

async fn post_to_result(
    client: &reqwest::Client,
    url: &str,
    key: &str,
) -> Result<reqwest::Response, reqwest::Error> {
    client
        .post(url)
        .header("idempotency-key", key)
        .header("x-tenant", "t1")
        .send()
        .await
}
