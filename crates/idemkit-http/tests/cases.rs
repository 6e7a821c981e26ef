//! The table of final responses both HTTP layers are checked against (`cases/streaming.json`;
//! the Python ASGI middleware runs the same file in `pytests/test_asgi.py`): what is stored
//! of a response, within `max_result_bytes` with the kept headers counted, and that its last
//! frame reaches the client only once it is stored, so a retry right after the whole body is
//! its replay (issue 50 item 3: one set of streaming decisions, `binding::Capture`).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt as _;
use idemkit_core::{Coordinator, MemoryStore, Operation, Policy};
use idemkit_http::IdempotencyLayer;
use serde_json::Value;
use tower::{Layer as _, ServiceExt as _};

/// A body of the given frames, each after one `Pending` (a stream: never whole at once).
struct Frames {
    frames: std::vec::IntoIter<Bytes>,
    announced: Option<u64>,
    ready: bool,
}

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if !self.ready {
            self.ready = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.ready = false;
        Poll::Ready(self.frames.next().map(|f| Ok(Frame::data(f))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.announced {
            Some(n) => http_body::SizeHint::with_exact(n - self.sent()),
            None => http_body::SizeHint::default(),
        }
    }
}

impl Frames {
    fn sent(&self) -> u64 {
        let left: usize = self.frames.as_slice().iter().map(Bytes::len).sum();
        self.announced.unwrap_or(0) - left as u64
    }
}

/// A Content-Type of exactly `n` bytes.
fn content_type(n: usize) -> String {
    let head = "text/plain;p=";
    format!("{head}{}", "a".repeat(n.saturating_sub(head.len())))
}

#[tokio::test]
async fn both_layers_table_of_final_responses() {
    let table: Value =
        serde_json::from_str(include_str!("cases/streaming.json")).expect("the table");
    let cases = table["cases"].as_array().expect("cases");
    assert!(cases.len() >= 8, "the table lost cases");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let max = case["max_result_bytes"].as_u64().unwrap() as usize;
        let sizes: Vec<usize> = case["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap() as usize)
            .collect();
        let ctype = content_type(case["content_type_bytes"].as_u64().unwrap() as usize);
        let announce = case["content_length"].as_bool().unwrap();
        let stored = case["stored"].as_bool().unwrap();
        let total: usize = sizes.iter().sum();
        // Each frame its own bytes, so a replay of the wrong bytes shows.
        let frames: Vec<Bytes> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Bytes::from(vec![b'a' + (i % 26) as u8; n]))
            .collect();
        let whole: Vec<u8> = frames.iter().flat_map(|f| f.to_vec()).collect();

        let layer = IdempotencyLayer::builder(
            Coordinator::builder(MemoryStore::new())
                .policy(Policy::new().max_result_bytes(max))
                .build(),
            Operation::new("http.cases").unwrap(),
        )
        .global_scope("global")
        .unwrap()
        .build()
        .unwrap();
        let svc = layer.layer(tower::service_fn(move |_req: Request<axum::body::Body>| {
            let frames = frames.clone();
            let ctype = ctype.clone();
            async move {
                let mut resp = Response::builder()
                    .status(StatusCode::CREATED)
                    .header(http::header::CONTENT_TYPE, ctype);
                if announce {
                    resp = resp.header(http::header::CONTENT_LENGTH, total);
                }
                let body = Frames {
                    frames: frames.into_iter(),
                    announced: announce.then_some(total as u64),
                    ready: false,
                };
                Ok::<_, Infallible>(resp.body(body).unwrap())
            }
        }));
        let request = || {
            Request::post("/cases")
                .header("idempotency-key", "\"case\"")
                .body(axum::body::Body::from("{}"))
                .unwrap()
        };
        let first = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED, "{name}");
        let body = first.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), total, "{name}: the first client's body");
        assert_eq!(&body[..], &whole[..], "{name}");
        // At once: the last frame came only once the result was stored.
        let again = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(again.status(), StatusCode::CREATED, "{name}: the retry");
        let replayed = again.headers().get("idempotent-replayed").cloned();
        let again_body = again.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            replayed.as_ref().map(|v| v.as_bytes()),
            Some(&b"true"[..]),
            "{name}"
        );
        if stored {
            assert_eq!(&again_body[..], &whole[..], "{name}: the replay");
        } else {
            let problem: Value = serde_json::from_slice(&again_body).expect("a problem");
            assert!(
                problem["type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("ResultUnavailable")),
                "{name}: {problem}"
            );
            let detail = problem["detail"].as_str().unwrap_or_default();
            assert!(
                detail.contains(&format!("{total} bytes")),
                "{name}: {detail}"
            );
        }
    }
}
