//! `idemkit serve` against a browser that is not on our side: DNS rebinding (a page of
//! `rebind.attacker.example` whose name now resolves to 127.0.0.1 is same-origin with
//! itself, so a same-origin check alone lets it read the page's token and post), framing,
//! and writes without a proof of coming from the page itself.

mod support;

use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{CompleteRequest, Key, Operation, ResultKind, StorageKey, Store};
use idemkit_redis::RedisStore;
use support::Server;

/// A store with one completed record (what a purge of completed records would remove).
async fn store() -> Option<(RedisStore, String, String, StorageKey)> {
    let url = url_of_env();
    let prefix = format!("idemkit-sec-{:x}", fastrand::u64(..));
    let store = RedisStore::builder()
        .prefix(prefix.as_str())
        .connect(&url)
        .await;
    if !idemkit_test::require_service("redis", store.is_ok()) {
        return None;
    }
    let store = store.unwrap();
    let key = StorageKey::new(
        &Operation::new("mail.invoice").unwrap(),
        None,
        &Key::new("order-1.invoice").unwrap(),
    );
    let lease = idemkit_test::reserve(&store, &key, Duration::from_secs(60)).await;
    let done = CompleteRequest::new(
        ResultKind::Value,
        Bytes::from_static(b"\"em_1\""),
        Duration::from_secs(3600),
    );
    store.complete(&key, &lease, &done).await.unwrap();
    Some((store, url, prefix, key))
}

/// `idemkit serve` with `extra` over [`store`]'s store; the store and its record's key.
async fn served(extra: &'static [&'static str]) -> Option<(Server, RedisStore, StorageKey)> {
    let (store, url, prefix, key) = store().await?;
    let server = tokio::task::spawn_blocking(move || {
        Server::start(&["--store", &url, "--prefix", &prefix], extra)
    })
    .await
    .unwrap();
    Some((server, store, key))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The write token the confirmation page gives a page of the served host.
async fn token(http: &reqwest::Client, base: &str) -> String {
    let confirm = http
        .get(format!(
            "{base}/confirm/purge?operation=mail.invoice&state=completed"
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    confirm
        .split("name=\"token\" value=\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .expect("the page's own host gets a token")
        .to_string()
}

/// The port of `http://127.0.0.1:PORT`.
fn port(base: &str) -> &str {
    base.rsplit(':').next().unwrap()
}

/// Before: `/confirm/purge` answered the rebinding page 200 with the token, and its POST to
/// `/purge` (Origin equal to its own Host) answered `303 … Purged 1 completed records`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_page_can_neither_read_nor_write() {
    let Some((server, store, key)) = served(&["--allow-writes"]).await else {
        return;
    };
    let http = client();
    let evil = format!("rebind.attacker.example:{}", port(&server.base));
    for path in [
        "/",
        "/metrics",
        "/confirm/purge?operation=mail.invoice&state=completed",
    ] {
        let r = http
            .get(format!("{}{path}", server.base))
            .header("host", &evil)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 403, "GET {path} with Host {evil}");
        let body = r.text().await.unwrap();
        assert!(!body.contains("token"), "{body}");
    }
    // Even with the token (read by a page of the right host), the post is refused.
    let token = token(&http, &server.base).await;
    let purge = http
        .post(format!("{}/purge", server.base))
        .header("host", &evil)
        .header("origin", format!("http://{evil}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "operation=mail.invoice&state=completed&token={token}"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(purge.status().as_u16(), 403);
    assert!(
        store.get(&key).await.unwrap().is_some(),
        "the record was purged by the rebinding page"
    );
}

fn url_of_env() -> String {
    std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A name on the allow-list is served; `localhost` and the listen address always are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listen_address_localhost_and_allowed_hosts_are_served() {
    let Some((server, _, _)) = served(&["--allow-host", "status.internal"]).await else {
        return;
    };
    let http = client();
    let p = port(&server.base).to_string();
    for host in [
        format!("127.0.0.1:{p}"),
        format!("localhost:{p}"),
        format!("status.internal:{p}"),
        "status.internal".to_string(),
    ] {
        let r = http
            .get(format!("{}/metrics", server.base))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "Host {host}");
    }
    for host in [format!("status.internal.evil:{p}"), format!("evil:{p}")] {
        let r = http
            .get(format!("{}/", server.base))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 403, "Host {host}");
    }
}

/// Every answer forbids framing (a page of another site cannot put the confirmation under
/// a decoy button), refused ones included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_page_can_be_framed() {
    let Some((server, _, _)) = served(&["--allow-writes"]).await else {
        return;
    };
    let http = client();
    for (path, host) in [
        ("/", None),
        (
            "/confirm/purge?operation=mail.invoice&state=completed",
            None,
        ),
        ("/metrics", None),
        ("/", Some("evil.example")),
    ] {
        let mut req = http.get(format!("{}{path}", server.base));
        if let Some(h) = host {
            req = req.header("host", h);
        }
        let r = req.send().await.unwrap();
        let h = r.headers();
        assert_eq!(
            h.get("x-frame-options").map(|v| v.to_str().unwrap()),
            Some("DENY"),
            "{path} {host:?}"
        );
        let csp = h
            .get("content-security-policy")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp:?}");
        assert_eq!(
            h.get("x-content-type-options").map(|v| v.to_str().unwrap()),
            Some("nosniff")
        );
    }
}

/// A write needs the page's token and a proof that the page itself posted it: an `Origin`
/// equal to the served host, or `Sec-Fetch-Site: same-origin`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_needs_a_same_origin_proof() {
    let Some((server, _, _)) = served(&["--allow-writes"]).await else {
        return;
    };
    let http = client();
    let token = token(&http, &server.base).await;
    assert_eq!(token.len(), 64, "a 256-bit token: {token}");
    let post = |headers: Vec<(&'static str, String)>| {
        let (http, base, token) = (http.clone(), server.base.clone(), token.clone());
        async move {
            let mut req = http
                .post(format!("{base}/purge"))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(format!(
                    "operation=mail.invoice&state=completed&token={token}"
                ));
            for (k, v) in headers {
                req = req.header(k, v);
            }
            req.send().await.unwrap().status().as_u16()
        }
    };
    assert_eq!(post(vec![]).await, 403, "no Origin, no Sec-Fetch-Site");
    assert_eq!(
        post(vec![("sec-fetch-site", "cross-site".into())]).await,
        403
    );
    assert_eq!(
        post(vec![("origin", "null".into())]).await,
        403,
        "an opaque origin"
    );
    assert_eq!(
        post(vec![("sec-fetch-site", "same-origin".into())]).await,
        303
    );
    assert_eq!(post(vec![("origin", server.base.clone())]).await, 303);
}

/// Review L10: the page shows what its own writes did, never a text a link brings: a
/// `?done=` that the server did not write shows nothing (before: it was shown as it came,
/// so a crafted link put any sentence on the operator's trusted page).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_only_what_its_own_writes_did() {
    let Some((server, _, _)) = served(&["--allow-writes"]).await else {
        return;
    };
    let http = client();
    let page = |path: String| {
        let (http, base) = (http.clone(), server.base.clone());
        async move {
            http.get(format!("{base}{path}"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    let spoofed = page("/?done=Your%20store%20was%20breached%3A%20run%20this".into()).await;
    assert!(!spoofed.contains("breached"), "a link's text on the page");
    let token = token(&http, &server.base).await;
    let purged = http
        .post(format!("{}/purge", server.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("origin", server.base.clone())
        .body(format!(
            "operation=mail.invoice&state=completed&token={token}"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(purged.status().as_u16(), 303);
    let location = purged.headers()["location"].to_str().unwrap().to_string();
    let shown = page(location).await;
    assert!(
        shown.contains("Purged 1 completed records of mail.invoice"),
        "the purge's own note is shown"
    );
}
