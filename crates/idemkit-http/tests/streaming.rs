//! Streamed responses through the layer (issue 24): a response reaches its client as the
//! handler produces it, the layer holds only a few frames of it at a time, and a body that
//! breaks off is an error for the client and releases the key, never a short response
//! stored and replayed.

mod support;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt as _;
use idemkit_core::{Coordinator, MemoryStore, Operation, Policy};
use idemkit_http::IdempotencyLayer;
use tokio::sync::mpsc;
use tower::{Layer as _, ServiceExt as _};

/// A body the test feeds chunk by chunk: `Err` breaks it off, a closed channel ends it.
struct Fed(mpsc::UnboundedReceiver<Result<Bytes, std::io::Error>>);

impl http_body::Body for Fed {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx).map(|c| c.map(|c| c.map(Frame::data)))
    }
}

/// A fed body that announces its length (a download with `Content-Length`): it knows
/// its end when the last byte is out.
struct Sized(Fed, u64);

impl http_body::Body for Sized {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let polled = Pin::new(&mut self.0).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            self.1 -= frame.data_ref().map_or(0, |d| d.len() as u64);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.1 == 0
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.1)
    }
}

/// A body that gives `first ` at once and `second` a moment later, then ends.
fn later() -> Fed {
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(Ok(Bytes::from_static(b"first "))).unwrap();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        tx.send(Ok(Bytes::from_static(b"second"))).unwrap();
    });
    Fed(rx)
}

type Feeds = Arc<Mutex<Vec<mpsc::UnboundedSender<Result<Bytes, std::io::Error>>>>>;

/// A route whose every run answers `200` with a body the test feeds (each run's feed is
/// pushed to `feeds`), its first chunk, `first `, sent at once.
fn fed_app(layer: IdempotencyLayer<MemoryStore>, runs: Arc<AtomicUsize>, feeds: Feeds) -> Router {
    Router::new()
        .route(
            "/export",
            post(move || {
                let (runs, feeds) = (runs.clone(), feeds.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let (tx, rx) = mpsc::unbounded_channel();
                    tx.send(Ok(Bytes::from_static(b"first "))).unwrap();
                    feeds.lock().unwrap().push(tx);
                    Response::new(Body::new(Fed(rx)))
                }
            }),
        )
        .layer(layer)
}

fn layer(policy: Policy) -> IdempotencyLayer<MemoryStore> {
    IdempotencyLayer::builder(
        Coordinator::builder(MemoryStore::new())
            .policy(policy)
            .build(),
        Operation::new("http.stream").unwrap(),
    )
    .global_scope("global")
    .unwrap()
    .build()
    .unwrap()
}

/// The app's `/export` URL.
async fn serve(app: Router) -> String {
    format!("{}/export", support::serve(app).await)
}

async fn send(url: &str, key: &str) -> reqwest::Response {
    // A layer that buffers the whole body answers only once it ends, which these tests
    // end only after the first chunk arrived: without a bound they would hang.
    tokio::time::timeout(
        Duration::from_secs(20),
        reqwest::Client::new()
            .post(url)
            .header("idempotency-key", key)
            .send(),
    )
    .await
    .expect("the head arrives while the body is still being produced")
    .unwrap()
}

async fn first_chunk(resp: &mut reqwest::Response) -> Bytes {
    tokio::time::timeout(Duration::from_secs(20), resp.chunk())
        .await
        .expect("the first chunk arrives before the handler ends its body")
        .unwrap()
        .expect("a first chunk")
}

fn feed(feeds: &Feeds, run: usize) -> mpsc::UnboundedSender<Result<Bytes, std::io::Error>> {
    feeds.lock().unwrap()[run].clone()
}

/// Gives the first run's body its last chunk, `second`, and ends it.
fn finish(feeds: &Feeds) {
    let all = std::mem::take(&mut *feeds.lock().unwrap());
    all[0].send(Ok(Bytes::from_static(b"second"))).unwrap();
}

/// The retry's answer is the whole stored response, replayed, and the handler ran once.
async fn assert_replayed_whole(again: reqwest::Response, runs: &AtomicUsize) {
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.bytes().await.unwrap(), "first second");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Before: the layer collected the whole body before it answered, so the head of a streamed
/// response came only after its end (here: never, the test ends it only after the first
/// chunk). Now the first chunk arrives while the handler still produces the rest, the whole
/// is stored as it passes, and a retry replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_reaches_the_client_as_it_is_produced() {
    let (runs, feeds) = (Arc::new(AtomicUsize::new(0)), Feeds::default());
    let url = serve(fed_app(layer(Policy::new()), runs.clone(), feeds.clone())).await;
    let mut resp = send(&url, "\"k-1\"").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(first_chunk(&mut resp).await, "first ");
    finish(&feeds);
    let rest = resp.bytes().await.unwrap();
    assert_eq!(rest, "second");
    assert_replayed_whole(send(&url, "\"k-1\"").await, &runs).await;
}

/// A client that reads the first chunk and hangs up: the handler's body is still read to
/// its end and stored (the call runs to its end whatever the client does), so the retry,
/// which waits for it, gets the whole response and the handler ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_retries_into_the_whole_response() {
    let (runs, feeds) = (Arc::new(AtomicUsize::new(0)), Feeds::default());
    let url = serve(fed_app(layer(Policy::new()), runs.clone(), feeds.clone())).await;
    let mut resp = send(&url, "\"k-2\"").await;
    assert_eq!(first_chunk(&mut resp).await, "first ");
    drop(resp);
    let retry = tokio::spawn({
        let url = url.clone();
        async move { send(&url, "\"k-2\"").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    finish(&feeds);
    assert_replayed_whole(retry.await.unwrap(), &runs).await;
}

/// A body that fails after its head was sent: the client's read fails (a short body never
/// looks whole), nothing is stored, and the key is released, so the retry runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_breaks_off_is_an_error_and_releases_the_key() {
    let (runs, feeds) = (Arc::new(AtomicUsize::new(0)), Feeds::default());
    let url = serve(fed_app(layer(Policy::new()), runs.clone(), feeds.clone())).await;
    let mut resp = send(&url, "\"k-3\"").await;
    assert_eq!(resp.status(), StatusCode::OK, "the head was sent");
    assert_eq!(first_chunk(&mut resp).await, "first ");
    feed(&feeds, 0)
        .send(Err(std::io::Error::other("disk gone")))
        .unwrap();
    assert!(resp.bytes().await.is_err(), "a broken body is an error");
    let mut again = send(&url, "\"k-3\"").await;
    assert!(again.headers().get("idempotent-replayed").is_none());
    assert_eq!(first_chunk(&mut again).await, "first ");
    drop(feed(&feeds, 1));
    feeds.lock().unwrap().clear();
    assert_eq!(again.bytes().await.unwrap(), "");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "released: the retry ran");
}

/// A body whose producer panics mid-stream: the same as an error, not a clean end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_panics_mid_stream_is_an_error_and_releases_the_key() {
    struct Panics(usize);
    impl http_body::Body for Panics {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            self.0 += 1;
            assert!(self.0 < 2, "the producer panics on its second frame");
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"first ")))))
        }
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let app = Router::new()
        .route(
            "/export",
            post(move || {
                r.fetch_add(1, Ordering::SeqCst);
                async move { Response::new(Body::new(Panics(0))) }
            }),
        )
        .layer(layer(Policy::new()));
    let url = serve(app).await;
    for _ in 0..2 {
        let sent = reqwest::Client::new()
            .post(&url)
            .header("idempotency-key", "\"k-4\"")
            .send()
            .await;
        // Depending on when the panic comes, hyper resets the connection before or after
        // the head went out, or the head was not handed over yet (a 500): never a whole
        // response.
        match sent {
            Ok(resp) if resp.status() == StatusCode::OK => {
                assert!(resp.bytes().await.is_err(), "a broken body is an error");
            }
            Ok(resp) => assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR),
            Err(e) => assert!(!e.is_timeout(), "{e}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "released: the retry ran");
}

/// A body far larger than may be stored, produced on demand: the layer holds only a few of
/// its frames at a time (its client reads one frame, the producer is at most a few ahead),
/// and its replay is the `result-unavailable` problem with the original status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_holds_a_few_frames_of_a_large_body_not_the_body() {
    const FRAMES: usize = 2_000;
    static CHUNK: [u8; 16 * 1024] = [7; 16 * 1024];
    struct OnDemand(Arc<AtomicUsize>);
    impl http_body::Body for OnDemand {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            Poll::Ready((n < FRAMES).then(|| Ok(Frame::data(Bytes::from_static(&CHUNK)))))
        }
    }
    let produced = Arc::new(AtomicUsize::new(0));
    let p = produced.clone();
    let svc = layer(Policy::new().max_result_bytes(64 * 1024)).layer(tower::service_fn(
        move |_: Request<Body>| {
            p.store(0, Ordering::SeqCst);
            let body = Body::new(OnDemand(p.clone()));
            async move { Ok::<_, Infallible>(Response::new(body)) }
        },
    ));
    let req = || {
        Request::post("/export")
            .header("idempotency-key", "\"k-5\"")
            .body(Body::empty())
            .unwrap()
    };
    let resp = svc.clone().oneshot(req()).await.unwrap();
    let mut body = resp.into_body();
    let (mut consumed, mut ahead) = (0, 0);
    while let Some(frame) = body.frame().await {
        assert_eq!(frame.unwrap().into_data().unwrap().len(), CHUNK.len());
        consumed += 1;
        ahead = produced
            .load(Ordering::SeqCst)
            .saturating_sub(consumed)
            .max(ahead);
    }
    assert_eq!(consumed, FRAMES);
    assert!(
        ahead <= 16,
        "the producer ran {ahead} frames ahead of the client: the layer buffered them"
    );
    let again = svc.oneshot(req()).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    let problem: serde_json::Value =
        serde_json::from_slice(&again.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        problem["type"],
        idemkit_http::Problem::ResultUnavailable.type_uri(Some(idemkit_http::PROBLEM_DOCS))
    );
    assert_eq!(
        problem["detail"]
            .as_str()
            .map(|d| d.contains("32768000 bytes")),
        Some(true)
    );
}

/// With `cancel_with_client(true)`, a client that leaves mid-stream takes the call with it:
/// the handler's body is dropped, and (the coordinator's default `OnCancel::KeepLease`) the
/// key stays reserved, so the retry is told 409 rather than run beside a cancelled effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_with_the_client_drops_a_streamed_body_too() {
    let (runs, feeds) = (Arc::new(AtomicUsize::new(0)), Feeds::default());
    let layer = IdempotencyLayer::builder(
        Coordinator::new(MemoryStore::new()),
        Operation::new("http.stream").unwrap(),
    )
    .global_scope("global")
    .unwrap()
    .in_flight(idemkit_core::InFlight::Reject)
    .cancel_with_client(true)
    .build()
    .unwrap();
    let url = serve(fed_app(layer, runs.clone(), feeds.clone())).await;
    let mut resp = send(&url, "\"k-6\"").await;
    assert_eq!(first_chunk(&mut resp).await, "first ");
    drop(resp);
    let tx = feed(&feeds, 0);
    tokio::time::timeout(Duration::from_secs(20), tx.closed())
        .await
        .expect("the handler's body is dropped with its client");
    let again = send(&url, "\"k-6\"").await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The end of a streamed body reaches the client only once the result is stored: a client
/// that has read the whole response and retries at once gets the replay, never `409` (here
/// the store holds `complete` for a moment; were the end sent first, the retry would come
/// while the key is still reserved). For a streamed body of known length (`Content-Length`),
/// whose last byte is its end, the last frame waits for the store; a body whole at once goes
/// out with its head once stored. A stream whose handler announced its length in a
/// `Content-Length` header of its own is held back at its last announced byte too (review L2:
/// before, only a body that said `is_end_stream` was, and this retry got `409`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_has_the_whole_response_retries_into_the_replay() {
    let store = idemkit_test::Probe::new(MemoryStore::new());
    let layer = IdempotencyLayer::builder(
        Coordinator::new(store.clone()),
        Operation::new("http.stream").unwrap(),
    )
    .global_scope("global")
    .unwrap()
    .in_flight(idemkit_core::InFlight::Reject)
    .build()
    .unwrap();
    let app = Router::new()
        // Of unknown length: chunked on the wire.
        .route(
            "/export",
            post(|| async { Response::new(Body::new(later())) }),
        )
        .route(
            "/download",
            post(|| async { Response::new(Body::new(Sized(later(), 12))) }),
        )
        .route("/plain", post(|| async { "first second" }))
        // A stream of unknown length whose handler set `Content-Length` itself (hyper
        // honours it): its client has the whole response when the announced bytes are in.
        .route(
            "/announced",
            post(|| async {
                let mut resp = Response::new(Body::new(later()));
                resp.headers_mut().insert(
                    http::header::CONTENT_LENGTH,
                    http::HeaderValue::from_static("12"),
                );
                resp
            }),
        )
        .layer(layer);
    let base = serve(app).await;
    let base = base.trim_end_matches("/export");
    for (path, key) in [
        ("/export", "\"k-7\""),
        ("/download", "\"k-8\""),
        ("/plain", "\"k-9\""),
        ("/announced", "\"k-10\""),
    ] {
        let url = format!("{base}{path}");
        store.hold_complete();
        let opener = tokio::spawn({
            let store = store.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                store.open_complete();
            }
        });
        let resp = send(&url, key).await;
        assert_eq!(resp.bytes().await.unwrap(), "first second");
        let again = send(&url, key).await;
        assert_eq!(
            again.status(),
            StatusCode::OK,
            "{path}: not 409, the result was stored"
        );
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.bytes().await.unwrap(), "first second");
        opener.await.unwrap();
    }
}

/// A body of `n` chunks of 64 KiB, all ready at once (a large download).
struct Big(usize);

impl http_body::Body for Big {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.0 == 0 {
            return Poll::Ready(None);
        }
        self.0 -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; 64 * 1024])))))
    }
}

/// Review M3: a client that sends its request and never reads the answer (a vanished mobile
/// client, or one that stalls on purpose) must not hold the call: the response (32 MiB, more
/// than loopback's socket buffers hold) is read and stored at the handler's pace, the
/// stalled client's copy is cut off, and a retry replays. Lease 300 ms, `max_hold` 2 s.
///
/// Before: storing waited for the client to read, the renewals stopped at `max_hold`, the
/// lease ran out, and the retry at 3 s took the key over: the handler ran twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_does_not_hold_the_call() {
    use tokio::io::AsyncWriteExt as _;

    let runs = Arc::new(AtomicUsize::new(0));
    let policy = Policy::new()
        .lease(Duration::from_millis(300))
        .max_hold(Duration::from_secs(2));
    let app = Router::new()
        .route(
            "/export",
            post({
                let runs = runs.clone();
                move || {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async move { Response::new(Body::new(Big(512))) }
                }
            }),
        )
        .layer(layer(policy));
    let url = serve(app).await;
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/export")
        .to_string();
    let mut stalled = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stalled
        .write_all(
            b"POST /export HTTP/1.1\r\nhost: test\r\nidempotency-key: \"k-stall\"\r\ncontent-length: 0\r\n\r\n",
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = send(&url, "\"k-stall\"").await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler ran again while a client stalled its first run"
    );
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    drop(stalled);
}

/// Review L1: a streamed response whose result the store could not keep (every completion
/// fails, until the completion gives up) ends with an error, not a clean end: its client
/// must not take as final a response that a retry runs again.
///
/// Before: the task sent the held frame and a clean end whatever the receipt said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_that_was_not_stored_ends_with_an_error() {
    let store = idemkit_test::Probe::new(MemoryStore::new());
    store.fail(idemkit_test::Fault::Complete, true);
    let layer = IdempotencyLayer::builder(
        Coordinator::builder(store)
            .policy(Policy::new().lease(Duration::from_millis(300)))
            .build(),
        Operation::new("http.stream").unwrap(),
    )
    .global_scope("global")
    .unwrap()
    .build()
    .unwrap();
    let app = Router::new()
        .route(
            "/export",
            post(|| async { Response::new(Body::new(later())) }),
        )
        .layer(layer);
    let url = serve(app).await;
    let resp = send(&url, "\"k-unstored\"").await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body = tokio::time::timeout(Duration::from_secs(20), resp.bytes())
        .await
        .expect("the body ends");
    assert!(
        body.is_err(),
        "a response that was not stored ended cleanly: {body:?}"
    );
}
