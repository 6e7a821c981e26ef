//! An axum `POST /payments` behind the idempotency layer, keys on Redis, scoped by tenant.
//!
//! ```text
//! # Redis on 127.0.0.1:6379
//! cargo run -p idemkit-http --example payments          # listens on 127.0.0.1:3000
//! K=$(date +%s%N)
//! curl -si -X POST localhost:3000/payments -H "x-tenant: acme" -H "idempotency-key: \"$K\"" -d 'amount=10'   # 201, first run (takes 2 s)
//! curl -si -X POST localhost:3000/payments -H "x-tenant: acme" -H "idempotency-key: \"$K\"" -d 'amount=10'   # 201, Idempotent-Replayed: true
//! curl -si -X POST localhost:3000/payments -H "x-tenant: acme" -H "idempotency-key: \"$K\"" -d 'amount=99'   # 422 key-reused
//! K2=$(date +%s%N)
//! curl -s -X POST localhost:3000/payments -H "x-tenant: acme" -H "idempotency-key: \"$K2\"" -d 'amount=5' &    # a first run...
//! sleep 0.5; curl -si -X POST localhost:3000/payments -H "x-tenant: acme" -H "idempotency-key: \"$K2\"" -d 'amount=5'   # 409, Retry-After
//! ```
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use idemkit::http::{IdempotencyInfo, IdempotencyLayer};
use idemkit::redis::RedisStore;
use idemkit::{Coordinator, InFlight, Operation, Scope};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let store = RedisStore::builder()
        .prefix("idemkit-example-http")
        .connect(&redis)
        .await?;
    let idempotency =
        IdempotencyLayer::builder(Coordinator::new(store), Operation::new("http.payments")?)
            // In a real service: the authenticated tenant from an auth layer's extension.
            .scope_by(|req: &http::request::Parts| {
                Scope::new(req.headers.get("x-tenant")?.to_str().ok()?).ok()
            })
            .required(true)
            .in_flight(InFlight::Reject)
            .build()?;
    let charges = Arc::new(AtomicU64::new(0));
    let app = Router::new()
        .route(
            "/payments",
            post(move |info: IdempotencyInfo, body: String| {
                let charges = charges.clone();
                async move {
                    // The charge at the provider: slow, and must happen once.
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
                    println!(
                        "charged ({body}) for key {} of {}: ch_{n}",
                        info.key, info.scope
                    );
                    (StatusCode::CREATED, format!("ch_{n}\n"))
                }
            }),
        )
        .layer(idempotency);
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on http://{listen}");
    axum::serve(listener, app).await?;
    Ok(())
}
