//! The layer on a plain tower service whose bodies are not axum's: generic over the request
//! body (`http_body::Body + From<Bytes>`) and the response body (`http_body::Body`, which
//! the layer's own `ResponseBody` wraps), as tower-http's layers are.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use idemkit_core::{Coordinator, MemoryStore, Operation};
use idemkit_http::{IDEMPOTENCY_KEY, Idempotency, IdempotencyLayer, REPLAYED, ResponseBody};
use tower::{Layer as _, Service, ServiceExt as _};

fn request(key: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post("/charges")
        .header(IDEMPOTENCY_KEY, key)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

/// One request through `svc`, once it is ready.
async fn send<Svc>(svc: &mut Svc, req: Request<Full<Bytes>>) -> Response<Body>
where
    Svc: Service<Request<Full<Bytes>>, Response = Response<Body>, Error = Infallible>,
{
    svc.ready().await.unwrap().call(req).await.unwrap()
}

/// What the layer answers over an inner service of `Full<Bytes>` responses.
type Body = ResponseBody<Full<Bytes>>;

async fn text<B: http_body::Body>(resp: Response<B>) -> String
where
    B::Error: std::fmt::Debug,
{
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

#[tokio::test]
async fn a_full_bytes_service_runs_once_per_key_and_gives_back_its_inner_service() {
    let runs = Arc::new(AtomicU32::new(0));
    let counted = runs.clone();
    let inner = tower::service_fn(move |req: Request<Full<Bytes>>| {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let text = format!("charge {n} for {}", String::from_utf8_lossy(&body));
            let mut resp = Response::new(Full::new(Bytes::from(text)));
            *resp.status_mut() = StatusCode::CREATED;
            Ok::<_, Infallible>(resp)
        }
    });
    let layer = IdempotencyLayer::builder(
        Coordinator::new(MemoryStore::new()),
        Operation::new("http.bodies").unwrap(),
    )
    .global_scope("test")
    .unwrap()
    .build()
    .unwrap();
    let mut svc: Idempotency<_, MemoryStore> = layer.layer(inner);

    let first = send(&mut svc, request("k-1", "10")).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(text(first).await, "charge 1 for 10");
    let again = send(&mut svc, request("k-1", "10")).await;
    assert_eq!(again.headers().get(REPLAYED).unwrap(), "true");
    assert_eq!(
        text(again).await,
        "charge 1 for 10",
        "replayed, not run again"
    );
    let reused = send(&mut svc, request("k-1", "99")).await;
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // tower's accessors: the inner service, as it was given.
    let _: &_ = svc.get_ref();
    let _: &mut _ = svc.get_mut();
    let mut inner = svc.into_inner();
    let direct = inner.call(request("k-1", "10")).await.unwrap();
    assert_eq!(text(direct).await, "charge 2 for 10");
}
