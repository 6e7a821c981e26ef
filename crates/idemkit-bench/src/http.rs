//! The HTTP case: requests per second through an axum app with the idempotency layer (keys
//! on Redis), hit and miss, beside the same app without the layer, in one run.
//!
//! The app and the client (reqwest, HTTP/1.1, keep-alive) share the process and its runtime;
//! 64 requests are in flight at a time. *miss*: a fresh `Idempotency-Key` per request (the
//! handler runs, its response is stored); *hit*: one key, completed once (the stored response
//! is replayed). Cases run `rounds` times, interleaved; each row is the median round.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::post;
use idemkit_core::{Coordinator, Operation};
use idemkit_http::IdempotencyLayer;
use idemkit_redis::RedisStore;
use tokio::time::Instant;

const CONCURRENCY: usize = 64;

#[derive(Clone, Copy, PartialEq)]
enum Case {
    NoLayer,
    Miss,
    Hit,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::NoLayer => "app without the layer",
            Case::Miss => "app + layer (Redis), miss",
            Case::Hit => "app + layer (Redis), hit",
        }
    }
}

async fn serve(app: Router) -> Result<String, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}/payments"))
}

/// Runs the HTTP case and returns its report.
pub(crate) async fn run(redis_url: &str, requests: usize, rounds: usize) -> Result<String, String> {
    let handler = post(|| async { (http::StatusCode::CREATED, "{\"id\":\"ch_1\"}") });
    let plain = serve(Router::new().route("/payments", handler.clone())).await?;
    let store = RedisStore::builder()
        .prefix(format!("idemkit-bench-http-{:x}", fastrand::u64(..)))
        .connect(redis_url)
        .await
        .map_err(|e| e.to_string())?;
    let layer = IdempotencyLayer::builder(
        Coordinator::new(store),
        Operation::new("bench.http").expect("valid"),
    )
    .global_scope("bench")
    .map_err(|e| e.to_string())?
    .build()
    .map_err(|e| e.to_string())?;
    let layered = serve(Router::new().route("/payments", handler).layer(layer)).await?;
    drive(&plain, &layered, requests, rounds, &format!(
        "HTTP: {requests} requests per case, {CONCURRENCY} in flight, axum + reqwest on loopback, store {redis_url}; median of {rounds} interleaved rounds"
    ))
    .await
}

/// The ASGI case: the same requests through a FastAPI app on uvicorn, without and with
/// idemkit's Python middleware (keys on Redis), each served by its own process
/// (`python/asgi_app.py` run by `python`, which has idemkit, FastAPI and uvicorn).
pub(crate) async fn run_asgi(
    python: &str,
    redis_url: &str,
    requests: usize,
    rounds: usize,
) -> Result<String, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/asgi_app.py");
    let mut servers = Vec::new();
    let mut urls = Vec::new();
    for kind in ["plain", "protected"] {
        let mut child = tokio::process::Command::new(python)
            .args([script, kind, redis_url])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{python} {script}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
        let port = lines
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{script} {kind} printed no port"))?;
        urls.push(format!("http://127.0.0.1:{}/payments", port.trim()));
        servers.push(child);
    }
    // uvicorn prints nothing once ready: wait until each answers.
    let client = reqwest::Client::new();
    for url in &urls {
        let mut tries = 0;
        while client.post(url).body("{}").send().await.is_err() {
            tries += 1;
            if tries > 200 {
                return Err(format!("{url} never answered"));
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let report = drive(&urls[0], &urls[1], requests, rounds, &format!(
        "ASGI: {requests} requests per case, {CONCURRENCY} in flight, FastAPI on uvicorn (one process each, Python) + reqwest on loopback, store {redis_url}; median of {rounds} interleaved rounds"
    ))
    .await;
    drop(servers);
    report
}

async fn drive(
    plain: &str,
    layered: &str,
    requests: usize,
    rounds: usize,
    title: &str,
) -> Result<String, String> {
    let client = reqwest::Client::new();
    let cases = [Case::NoLayer, Case::Miss, Case::Hit];
    let mut results: Vec<Vec<f64>> = cases.iter().map(|_| Vec::new()).collect();
    let run_id = fastrand::u64(..);
    for round in 0..rounds {
        for (i, case) in cases.iter().enumerate() {
            eprintln!("http: round {}/{rounds}: {}", round + 1, case.name());
            let url = if *case == Case::NoLayer {
                plain.to_owned()
            } else {
                layered.to_owned()
            };
            let hit_key = format!("hit-{run_id:x}");
            if *case == Case::Hit {
                send(&client, &url, Some(&hit_key)).await?;
            }
            let next = Arc::new(AtomicUsize::new(0));
            let started = Instant::now();
            let workers: Vec<_> = (0..CONCURRENCY)
                .map(|_| {
                    let (client, url, next, hit_key) =
                        (client.clone(), url.clone(), next.clone(), hit_key.clone());
                    let case = *case;
                    tokio::spawn(async move {
                        loop {
                            let n = next.fetch_add(1, Ordering::Relaxed);
                            if n >= requests {
                                return Ok::<_, String>(());
                            }
                            let key = match case {
                                Case::NoLayer => None,
                                Case::Miss => Some(format!("miss-{run_id:x}-{round}-{n}")),
                                Case::Hit => Some(hit_key.clone()),
                            };
                            send(&client, &url, key.as_deref()).await?;
                        }
                    })
                })
                .collect();
            for w in workers {
                w.await.map_err(|e| e.to_string())??;
            }
            results[i].push(requests as f64 / started.elapsed().as_secs_f64());
        }
    }
    let medians: Vec<f64> = results
        .iter_mut()
        .map(|r| {
            r.sort_by(f64::total_cmp);
            r[r.len() / 2]
        })
        .collect();
    let mut out =
        format!("{title}\n\n| case | requests/s | vs the app without the layer |\n|---|---|---|\n");
    for (case, m) in cases.iter().zip(&medians) {
        out.push_str(&format!(
            "| {} | {m:.0} | {:.2}× |\n",
            case.name(),
            m / medians[0]
        ));
    }
    Ok(out)
}

async fn send(client: &reqwest::Client, url: &str, key: Option<&str>) -> Result<(), String> {
    let mut req = client.post(url).body("{\"amount\":10}");
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    if resp.status() != http::StatusCode::CREATED {
        return Err(format!("unexpected status {}", resp.status()));
    }
    resp.bytes().await.map_err(|e| e.to_string())?;
    Ok(())
}
