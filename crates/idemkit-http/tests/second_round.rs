//! Issue 24 over real HTTP (an axum server on a loopback port, reqwest): which responses are
//! final, and the header's structured-field syntax.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use idemkit_core::{Coordinator, MemoryStore, Operation};
use idemkit_http::{Finality, IdempotencyLayer};

fn layer() -> IdempotencyLayer<MemoryStore> {
    IdempotencyLayer::builder(
        Coordinator::new(MemoryStore::new()),
        Operation::new("http.second").unwrap(),
    )
    .global_scope("global")
    .unwrap()
    .build()
    .unwrap()
}

fn key() -> String {
    format!("k-{:016x}", fastrand::u64(..))
}

async fn send(url: &str, key: &str, body: &'static str) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

/// Before: `{bad json` got axum's 400, which was stored; the corrected body with the same
/// key was then `422 key-reused`. Stripe saves a result only once the endpoint executed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_failure_releases_the_key_so_the_corrected_request_runs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let app = Router::new()
        .route(
            "/json",
            post(move |axum::Json(v): axum::Json<serde_json::Value>| {
                let r = r.clone();
                async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::CREATED, v.to_string())
                }
            }),
        )
        .layer(layer());
    let url = format!("{}/json", support::serve(app).await);
    let k = key();
    let bad = send(&url, &k, "{bad json").await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let fixed = send(&url, &k, r#"{"amount":5}"#).await;
    assert_eq!(
        fixed.status(),
        StatusCode::CREATED,
        "the corrected request runs"
    );
    let replay = send(&url, &k, r#"{"amount":5}"#).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The default rule, status by status: what reports an outcome is stored, what reports
/// a refusal before executing is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_are_stored_and_refusals_release_the_key() {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let app = Router::new()
        .route(
            "/status/{code}",
            post(move |axum::extract::Path(code): axum::extract::Path<u16>| {
                let r = r.clone();
                async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    StatusCode::from_u16(code).unwrap()
                }
            }),
        )
        .layer(layer());
    let base = support::serve(app).await;
    for (code, stored) in [
        (200, true),
        (201, true),
        (402, true),
        (404, true),
        (410, true),
        (400, false),
        (401, false),
        (403, false),
        (408, false),
        (409, false),
        (412, false),
        (413, false),
        (415, false),
        (422, false),
        (428, false),
        (429, false),
        (500, false),
        (503, false),
    ] {
        let url = format!("{base}/status/{code}");
        let k = key();
        let before = runs.load(Ordering::SeqCst);
        assert_eq!(send(&url, &k, "{}").await.status().as_u16(), code);
        let again = send(&url, &k, "{}").await;
        assert_eq!(again.status().as_u16(), code);
        let ran_again = runs.load(Ordering::SeqCst) - before == 2;
        assert_eq!(!ran_again, stored, "{code}: stored {stored}");
        assert_eq!(
            again.headers().contains_key("idempotent-replayed"),
            stored,
            "{code}"
        );
    }
}

/// The handler decides explicitly with a response extension: a 400 that reports an
/// outcome is kept; a 201 that must not be replayed releases the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_can_mark_a_response_final_or_not() {
    let runs = Arc::new(AtomicUsize::new(0));
    let (r1, r2) = (runs.clone(), runs.clone());
    let app = Router::new()
        .route(
            "/final-400",
            post(move || {
                let r = r1.clone();
                async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    let mut resp = axum::response::IntoResponse::into_response((
                        StatusCode::BAD_REQUEST,
                        "card declined: an outcome",
                    ));
                    resp.extensions_mut().insert(Finality::Final);
                    resp
                }
            }),
        )
        .route(
            "/not-final-201",
            post(move || {
                let r = r2.clone();
                async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    let mut resp =
                        axum::response::IntoResponse::into_response((StatusCode::CREATED, "x"));
                    resp.extensions_mut().insert(Finality::NotFinal);
                    resp
                }
            }),
        )
        .layer(layer());
    let base = support::serve(app).await;
    let k = key();
    send(&format!("{base}/final-400"), &k, "{}").await;
    let again = send(&format!("{base}/final-400"), &k, "{}").await;
    assert_eq!(again.status(), StatusCode::BAD_REQUEST);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let k = key();
    send(&format!("{base}/not-final-201"), &k, "{}").await;
    let again = send(&format!("{base}/not-final-201"), &k, "{}").await;
    assert!(!again.headers().contains_key("idempotent-replayed"));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// The header is an RFC 8941 Item: an sf-string or an sf-token, parameters ignored.
/// Before: `"k";v=1` was 400; `(x)` and `1abc`, neither an Item, were accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_is_a_structured_field_item() {
    let app = Router::new()
        .route(
            "/echo",
            post(|info: idemkit_http::IdempotencyInfo| async move {
                (StatusCode::CREATED, info.key.to_string())
            }),
        )
        .layer(layer());
    let url = format!("{}/echo", support::serve(app).await);
    for (header, key) in [
        (r#""k-1";v=1"#, Some("k-1")),
        (r#""k 2""#, Some("k 2")),
        ("tok:en/3;a;b=?0", Some("tok:en/3")),
        ("*star", Some("*star")),
        ("(x)", None),
        ("1abc", None),
        (r#""open"#, None),
        ("a b", None),
        (r#""k";"#, None),
    ] {
        let resp = send(&url, header, "{}").await;
        match key {
            Some(k) => {
                assert_eq!(resp.status(), StatusCode::CREATED, "{header}");
                assert_eq!(resp.text().await.unwrap(), k, "{header}");
            }
            None => assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{header}"),
        }
    }
}

/// JSON is compared by value by default (for `application/json` bodies): key order,
/// whitespace, escapes and number spelling do not make another request. Before: byte for
/// byte unless `canonical_json(true)`, which relied on serde_json's map order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_is_compared_by_value_by_default() {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let handler = move || {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            StatusCode::CREATED
        }
    };
    let opted_out = IdempotencyLayer::builder(
        Coordinator::new(MemoryStore::new()),
        Operation::new("http.second").unwrap(),
    )
    .global_scope("global")
    .unwrap()
    .canonical_json(false)
    .build()
    .unwrap();
    let base = support::serve(
        Router::new()
            .route("/pay", post(handler.clone()))
            .layer(layer())
            .merge(
                Router::new()
                    .route("/bytes", post(handler))
                    .layer(opted_out),
            ),
    )
    .await;
    let pay = format!("{base}/pay");
    for (first, again) in [
        (
            r#"{"amount": 10, "to": "acme", "meta": {"b": 1, "a": [1, 2.5]}}"#,
            r#"{"to":"acme","meta":{"a":[1,2.5],"b":1},"amount":10}"#,
        ),
        (r#"{"name": "caf\u00e9"}"#, r#"{"name":"café"}"#),
        (r#"{"n": 1.0}"#, r#"{"n":1}"#),
        (r#"{"n": 100}"#, r#"{"n":1e2}"#),
        (r#"{"n": 1.50}"#, r#"{"n":1.5}"#),
        (r#"{"s": "\/"}"#, r#"{"s":"/"}"#),
    ] {
        let k = key();
        assert_eq!(send(&pay, &k, first).await.status(), StatusCode::CREATED);
        let replay = send(&pay, &k, again).await;
        assert_eq!(replay.status(), StatusCode::CREATED, "{first} vs {again}");
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
    }
    // Another value is another request.
    for (first, other) in [
        (r#"{"n": 1}"#, r#"{"n": 2}"#),
        (r#"{"a": [1, 2]}"#, r#"{"a": [2, 1]}"#),
        (r#"{"a": {"b": 1}}"#, r#"{"a": {"b": "1"}}"#),
    ] {
        let k = key();
        send(&pay, &k, first).await;
        let refused = send(&pay, &k, other).await;
        assert_eq!(
            refused.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{other}"
        );
    }
    // Opted out: bytes.
    let k = key();
    let bytes = format!("{base}/bytes");
    send(&bytes, &k, r#"{"a": 1, "b": 2}"#).await;
    let other = send(&bytes, &k, r#"{"b":2,"a":1}"#).await;
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

/// A route whose handler takes 1.2 s, in reject mode; `hint` sets the layer's retry hint.
async fn slow(hint: Option<std::time::Duration>) -> String {
    let mut b = IdempotencyLayer::builder(
        Coordinator::new(MemoryStore::new()),
        Operation::new("http.slow").unwrap(),
    )
    .global_scope("global")
    .unwrap()
    .in_flight(idemkit_core::InFlight::Reject);
    if let Some(h) = hint {
        b = b.retry_hint(h);
    }
    let app = Router::new()
        .route(
            "/charge",
            post(|| async {
                tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
                StatusCode::CREATED
            }),
        )
        .layer(b.build().unwrap());
    format!("{}/charge", support::serve(app).await)
}

/// A concurrent retry 0.3 s into the first request's run; its `Retry-After` in seconds.
async fn retry_after_mid_flight(url: &str) -> u64 {
    let k = key();
    let first = tokio::spawn({
        let (url, k) = (url.to_string(), k.clone());
        async move { send(&url, &k, "{}").await.status() }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let retry = send(url, &k, "{}").await;
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    let secs = retry.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(first.await.unwrap(), StatusCode::CREATED);
    secs
}

/// Before: `Retry-After` on the 409 was the whole remaining lease (15 s for a 1.2 s
/// charge), and the builder could not set a hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_what_is_left_of_a_typical_run() {
    // A hint: 1.5 s typical, 0.3 s spent: 2 s (rounded up), not the lease.
    let hinted = slow(Some(std::time::Duration::from_millis(1500))).await;
    assert_eq!(retry_after_mid_flight(&hinted).await, 2);
    // No hint: learned from the route's recent runs (1.2 s each): 1 s at least, never 15.
    let learned = slow(None).await;
    let first_guess = retry_after_mid_flight(&learned).await;
    assert!(first_guess <= 15, "{first_guess}");
    let after_history = retry_after_mid_flight(&learned).await;
    assert!((1..=2).contains(&after_history), "{after_history}");
}

/// Before: problem types were `urn:idemkit:problem:…` with no way to point at the API's
/// own documentation, and by default no link at all; the draft's examples link it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn problems_can_link_the_apis_own_documentation() {
    let documented = IdempotencyLayer::builder(
        Coordinator::new(MemoryStore::new()),
        Operation::new("http.docs").unwrap(),
    )
    .global_scope("global")
    .unwrap()
    .required(true)
    .problem_docs("https://docs.example.com/errors/")
    .build()
    .unwrap();
    let app = Router::new()
        .route("/pay", post(|| async { StatusCode::CREATED }))
        .layer(documented);
    let url = format!("{}/pay", support::serve(app).await);
    let missing = reqwest::Client::new().post(&url).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.headers()["link"],
        r#"<https://docs.example.com/errors/missing-key>; rel="describedby"; type="text/html""#
    );
    let problem: serde_json::Value =
        serde_json::from_slice(&missing.bytes().await.unwrap()).unwrap();
    assert_eq!(
        problem["type"],
        "https://docs.example.com/errors/missing-key"
    );
    // Without the option: the problem's entry in the crate's published documentation,
    // linked (before: a URN and no link, against the draft's §2.7).
    let url = format!(
        "{}/pay",
        support::serve(
            Router::new()
                .route("/pay", post(|| async { StatusCode::CREATED }))
                .layer(layer())
        )
        .await
    );
    let malformed = send(&url, "(x)", "{}").await;
    let published = format!("{}#variant.MalformedKey", idemkit_http::PROBLEM_DOCS);
    assert_eq!(
        malformed.headers()["link"],
        format!(r#"<{published}>; rel="describedby"; type="text/html""#).as_str()
    );
    let problem: serde_json::Value =
        serde_json::from_slice(&malformed.bytes().await.unwrap()).unwrap();
    assert_eq!(problem["type"], published.as_str());
    // With `problem_urns`: the stable URN, no link.
    let urns = IdempotencyLayer::builder(
        Coordinator::new(MemoryStore::new()),
        Operation::new("http.docs").unwrap(),
    )
    .global_scope("global")
    .unwrap()
    .problem_urns()
    .build()
    .unwrap();
    let url = format!(
        "{}/pay",
        support::serve(
            Router::new()
                .route("/pay", post(|| async { StatusCode::CREATED }))
                .layer(urns)
        )
        .await
    );
    let malformed = send(&url, "(x)", "{}").await;
    assert!(!malformed.headers().contains_key("link"));
    let problem: serde_json::Value =
        serde_json::from_slice(&malformed.bytes().await.unwrap()).unwrap();
    assert_eq!(problem["type"], "urn:idemkit:problem:malformed-key");
}

/// The layer over MemoryStore, storing responses of at most `max_result_bytes`.
fn keeping_at_most(max_result_bytes: usize) -> IdempotencyLayer<MemoryStore> {
    IdempotencyLayer::builder(
        Coordinator::builder(MemoryStore::new())
            .policy(idemkit_core::Policy::new().max_result_bytes(max_result_bytes))
            .build(),
        Operation::new("http.large").unwrap(),
    )
    .global_scope("global")
    .unwrap()
    .build()
    .unwrap()
}

/// Before: a response over what may be stored (`max_result_bytes`) made every retry a
/// `500 internal` until the key expired, though the effect had succeeded. Now the first
/// client gets the whole response, and a retry gets the original status with a stable
/// `result-unavailable` problem: done, not shown again; the handler does not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_too_large_to_store_replays_as_done_with_a_stable_problem() {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let layer = keeping_at_most(1024);
    let app = Router::new()
        .route(
            "/report",
            post(move || {
                let r = r.clone();
                async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::CREATED, "x".repeat(4096))
                }
            }),
        )
        .layer(layer);
    let url = format!("{}/report", support::serve(app).await);
    let k = key();
    let first = send(&url, &k, "{}").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(
        first.bytes().await.unwrap().len(),
        4096,
        "the first client gets it all"
    );
    let again = send(&url, &k, "{}").await;
    assert_eq!(
        again.status(),
        StatusCode::CREATED,
        "the original status: done"
    );
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["content-type"], "application/problem+json");
    let problem: serde_json::Value = serde_json::from_slice(&again.bytes().await.unwrap()).unwrap();
    assert_eq!(
        problem["type"],
        idemkit_http::Problem::ResultUnavailable.type_uri(Some(idemkit_http::PROBLEM_DOCS))
    );
    assert_eq!(problem["status"], 201);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Review L10: a response whose body fits but whose kept headers push the stored copy over
/// `max_result_bytes` (a `Location` of 7 KB) replays as `result-unavailable` under its
/// original status, as a too-large body does.
///
/// Before: the body alone was measured against the room left for it, the stored copy went
/// over the limit, the coordinator kept the key as "result unavailable" without the layer's
/// copy, and every retry was a `500 internal`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_whose_headers_make_it_too_large_replays_as_done() {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let layer = keeping_at_most(8 * 1024);
    let app = Router::new()
        .route(
            "/report",
            post(move || {
                let r = r.clone();
                async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    let location = format!("/reports/{}", "r".repeat(7 * 1024));
                    (
                        StatusCode::CREATED,
                        [(http::header::LOCATION, location)],
                        "x".repeat(2048),
                    )
                }
            }),
        )
        .layer(layer);
    let url = format!("{}/report", support::serve(app).await);
    let k = key();
    let first = send(&url, &k, "{}").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let again = send(&url, &k, "{}").await;
    assert_eq!(again.status(), StatusCode::CREATED, "not a 500: done");
    let problem: serde_json::Value = serde_json::from_slice(&again.bytes().await.unwrap()).unwrap();
    assert_eq!(
        problem["type"],
        idemkit_http::Problem::ResultUnavailable.type_uri(Some(idemkit_http::PROBLEM_DOCS))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
