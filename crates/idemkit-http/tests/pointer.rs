//! Issue 52: a concurrent duplicate refused with `409` is told where the original request
//! is, over a real server on a loopback port and a real HTTP client.

mod support;

use std::sync::Arc;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use idemkit_core::{Coordinator, InFlight, MemoryStore, Operation};
use idemkit_http::{IdempotencyInfo, IdempotencyLayer};
use tokio::sync::{Notify, mpsc};

/// Issue 52: a `409` points to the original request: its attempt (the fencing token its
/// handler runs under), the time left on its lease, and, only when the layer is told to show
/// it, the process running it (its holder name); never the duplicate's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_409_points_to_the_original_request() {
    for show in [false, true] {
        let store = MemoryStore::new();
        let coordinator = Coordinator::builder(store)
            .holder_name("orders-api-1")
            .build();
        let layer = IdempotencyLayer::builder(coordinator, Operation::new("http.test").unwrap())
            .global_scope("global")
            .unwrap()
            .in_flight(InFlight::Reject)
            .in_progress_holder(show)
            .build()
            .unwrap();
        let (started, mut running) = mpsc::unbounded_channel();
        let release = Arc::new(Notify::new());
        let gate = release.clone();
        let app = Router::new()
            .route(
                "/slow",
                post(move |info: IdempotencyInfo| {
                    let (started, gate) = (started.clone(), gate.clone());
                    async move {
                        let _ = started.send(info.fencing);
                        gate.notified().await;
                        (StatusCode::CREATED, "done")
                    }
                }),
            )
            .layer(layer);
        let url = support::serve(app).await;
        let client = reqwest::Client::new();
        let k = format!("k-{:016x}", fastrand::u64(..));
        let post = |client: &reqwest::Client| {
            client
                .post(format!("{url}/slow"))
                .header("idempotency-key", k.as_str())
                .body("x")
                .send()
        };
        let first = tokio::spawn(post(&client));
        let fencing = running.recv().await.unwrap().expect("a protected run");
        let dup = post(&client).await.unwrap();
        assert_eq!(dup.status(), StatusCode::CONFLICT);
        assert!(
            dup.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
                >= 1
        );
        let body: serde_json::Value = serde_json::from_slice(&dup.bytes().await.unwrap()).unwrap();
        assert_eq!(body["attempt"], fencing.get().to_string(), "{body}");
        let left = body["lease_left_ms"].as_u64().expect("lease_left_ms");
        assert!(left > 0 && left <= 15_000, "{body}");
        if show {
            assert_eq!(body["holder"]["name"], "orders-api-1", "{body}");
            assert_eq!(body["holder"]["pid"], std::process::id(), "{body}");
        } else {
            assert!(body.get("holder").is_none(), "{body}");
        }
        release.notify_one();
        assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    }
}
