//! `idemkit serve`, loaded in a real headless browser (Debian's Chromium): the page shows
//! the in-flight reservations oldest first and the records per operation, read-only by
//! default; with `--allow-writes` a release goes through its confirmation and frees the key.
//! Also `/metrics`, and writes refused without the page's token or from another origin.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{CompleteRequest, Key, Operation, ResultKind, StorageKey, Store};
use idemkit_redis::RedisStore;

use support::Server;

const CHROMIUM: &str = "/usr/bin/chromium";

/// Chromium as this machine runs it headless: no sandbox (root), no background network.
fn chromium(args: &[String]) -> std::process::Output {
    let profile = std::env::temp_dir().join(format!("idemkit-chromium-{:x}", fastrand::u64(..)));
    let out = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(profile);
    out
}

/// The page's DOM after the browser rendered it.
fn dom(url: &str) -> String {
    let out = chromium(&["--dump-dom".into(), url.into()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn screenshot(url: &str, path: &Path) {
    let out = chromium(&[
        format!("--screenshot={}", path.display()),
        "--window-size=1280,760".into(),
        url.into(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `<tr>` rows of the table with `id`, as text.
fn rows(dom: &str, id: &str) -> Vec<String> {
    let start = dom
        .find(&format!("<table id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no table {id}"));
    let table = &dom[start..start + dom[start..].find("</table>").unwrap()];
    table
        .split("<tr")
        .skip(2) // the text before the first row, and the header
        .map(str::to_string)
        .collect()
}

async fn text(http: &reqwest::Client, url: String) -> String {
    http.get(url).send().await.unwrap().text().await.unwrap()
}

async fn reserve<S: Store>(store: &S, key: &StorageKey) -> idemkit_core::Ownership {
    idemkit_test::reserve(store, key, Duration::from_secs(3600)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_in_a_headless_browser() {
    let url =
        std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("idemkit-page-{:x}", fastrand::u64(..));
    let store = RedisStore::builder()
        .prefix(prefix.as_str())
        .connect(&url)
        .await;
    let have_browser = Path::new(CHROMIUM).exists();
    if !idemkit_test::require_service("redis", store.is_ok())
        || !idemkit_test::require_service("chromium (apt-get install chromium)", have_browser)
    {
        return;
    }
    let store = store.unwrap();
    let invoice = Operation::new("mail.invoice").unwrap();
    let charge = Operation::new("charge.card").unwrap();
    let sk = |op: &Operation, k: &str| StorageKey::new(op, None, &Key::new(k).unwrap());
    // Two stuck reservations, the older first; completed records of two operations.
    let older = reserve(&store, &sk(&invoice, "order-7.invoice")).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    reserve(&store, &sk(&invoice, "order-9.invoice")).await;
    let done = CompleteRequest::new(
        ResultKind::Value,
        Bytes::from_static(b"\"em_1\""),
        Duration::from_secs(3600),
    );
    for (op, k) in [
        (&invoice, "order-1.invoice"),
        (&invoice, "order-2.invoice"),
        (&invoice, "order-3.invoice"),
        (&charge, "order-1.charge"),
    ] {
        let key = sk(op, k);
        let lease = reserve(&store, &key).await;
        store.complete(&key, &lease, &done).await.unwrap();
    }

    let (page, shot) = tokio::task::spawn_blocking({
        let (url, prefix) = (url.clone(), prefix.clone());
        move || {
            let server = Server::start(&["--store", &url, "--prefix", &prefix], &[]);
            let page = dom(&format!("{}/", server.base));
            let shot = std::env::var_os("IDEMKIT_SCREENSHOT")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    std::env::temp_dir().join(format!("idemkit-page-{:x}.png", fastrand::u64(..)))
                });
            screenshot(&format!("{}/", server.base), &shot);
            (page, shot)
        }
    })
    .await
    .unwrap();

    // What the page shows: the reservations oldest first, with owner and fencing token.
    assert!(page.contains("idemkit status"), "{page}");
    assert!(page.contains("In-flight reservations: 2"), "{page}");
    // The store's time as a date, not Unix milliseconds (before: "read at 1764...").
    let at = page
        .split_once("read at ")
        .map(|(_, rest)| rest.chars().take(23).collect::<String>())
        .unwrap_or_default();
    let shape: String = at
        .chars()
        .map(|c| if c.is_ascii_digit() { '9' } else { c })
        .collect();
    assert_eq!(shape, "9999-99-99 99:99:99 UTC", "{page}");
    let in_flight = rows(&page, "in-flight");
    assert_eq!(in_flight.len(), 2, "{in_flight:?}");
    assert!(
        in_flight[0].contains("order-7.invoice"),
        "oldest first: {in_flight:?}"
    );
    assert!(in_flight[1].contains("order-9.invoice"), "{in_flight:?}");
    assert!(in_flight[0].contains(&older.owner.to_string()));
    assert!(in_flight[0].contains(&older.fencing.get().to_string()));
    // Records per operation.
    let stats = rows(&page, "stats");
    let invoice_row = stats
        .iter()
        .find(|r| r.contains("data-operation=\"mail.invoice\""))
        .expect("mail.invoice row");
    let cells: Vec<&str> = invoice_row
        .split("<td class=\"n\">")
        .skip(1)
        .map(|c| c.split('<').next().unwrap())
        .collect();
    assert_eq!(
        &cells[..2],
        ["2", "3"],
        "reserved, completed: {invoice_row}"
    );
    assert!(
        stats
            .iter()
            .any(|r| r.contains("data-operation=\"charge.card\""))
    );
    assert!(page.contains("Redis eviction policy: noeviction"), "{page}");
    // Read-only: no actions.
    assert!(page.contains("id=\"mode\">read-only"), "{page}");
    assert!(
        !page.contains("Release…") && !page.contains("Purge"),
        "{page}"
    );
    // The screenshot is a real PNG of a rendered page.
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(png.len() > 10_000, "a {} byte screenshot", png.len());

    // Writes: refused by the read-only server, allowed behind a confirmation by the other.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let form = |token: &str| {
        format!(
            "key={}&owner={}&fencing={}&token={token}",
            sk(&invoice, "order-7.invoice").as_str().replace(':', "%3A"),
            older.owner,
            older.fencing.get()
        )
    };
    let post = |base: String, body: String, origin: Option<&'static str>| {
        let http = http.clone();
        async move {
            let mut req = http
                .post(format!("{base}/release"))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(body);
            if let Some(origin) = origin {
                req = req.header("origin", origin);
            }
            req.send().await.unwrap().status().as_u16()
        }
    };
    let read_only = tokio::task::spawn_blocking({
        let (url, prefix) = (url.clone(), prefix.clone());
        move || Server::start(&["--store", &url, "--prefix", &prefix], &[])
    })
    .await
    .unwrap();
    assert_eq!(post(read_only.base.clone(), form("x"), None).await, 403);
    let metrics = text(&http, format!("{}/metrics", read_only.base)).await;
    assert!(metrics.contains("idemkit_store_up 1"), "{metrics}");
    assert!(
        metrics.contains("idemkit_store_records{operation=\"mail.invoice\",state=\"reserved\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("idemkit_store_records{operation=\"charge.card\",state=\"completed\"} 1"),
        "{metrics}"
    );
    drop(read_only);

    let writable = tokio::task::spawn_blocking({
        let (url, prefix) = (url.clone(), prefix.clone());
        move || Server::start(&["--store", &url, "--prefix", &prefix], &["--allow-writes"])
    })
    .await
    .unwrap();
    let base = writable.base.clone();
    let page = tokio::task::spawn_blocking(move || dom(&format!("{base}/")))
        .await
        .unwrap();
    assert!(
        page.contains("Release…") && page.contains("Purge expired…"),
        "{page}"
    );
    // The confirmation page carries the token a release needs.
    let confirm = text(
        &http,
        format!(
            "{}/confirm/release?key={}&owner={}&fencing={}",
            writable.base,
            sk(&invoice, "order-7.invoice").as_str().replace(':', "%3A"),
            older.owner,
            older.fencing.get()
        ),
    )
    .await;
    let token = confirm
        .split("name=\"token\" value=\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .expect("a token in the confirmation form")
        .to_string();
    assert_eq!(
        post(writable.base.clone(), form("wrong"), None).await,
        403,
        "no token"
    );
    assert_eq!(
        post(
            writable.base.clone(),
            form(&token),
            Some("http://evil.example")
        )
        .await,
        403,
        "another origin"
    );
    assert!(
        store
            .get(&sk(&invoice, "order-7.invoice"))
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        post(writable.base.clone(), form(&token), None).await,
        403,
        "no proof of a same-origin page (neither Origin nor Sec-Fetch-Site)"
    );
    let own = writable.base.clone().leak() as &'static str;
    assert_eq!(
        post(writable.base.clone(), form(&token), Some(own)).await,
        303
    );
    assert_eq!(
        store.get(&sk(&invoice, "order-7.invoice")).await.unwrap(),
        None,
        "released"
    );
    assert!(
        store
            .get(&sk(&invoice, "order-9.invoice"))
            .await
            .unwrap()
            .is_some(),
        "only that one"
    );
    drop(writable);
}

/// The page and `/metrics` read the same way from PostgreSQL and from a Redis Cluster (the
/// browser's view of the page is the test above; here its HTML over HTTP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_and_metrics_on_postgres_and_on_a_cluster() {
    let pg_url = std::env::var("IDEMKIT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let (schema, table) = (
        "idemkit_cli_serve",
        format!("records_{:x}", fastrand::u32(..)),
    );
    let pg = idemkit_postgres::PgStore::builder()
        .schema(schema)
        .table(&table)
        .max_connections(2)
        .connect(&pg_url)
        .await;
    if !idemkit_test::require_service("postgres", pg.is_ok()) {
        return;
    }
    let pg = pg.unwrap();
    pg.migrate().await.unwrap();
    let cluster = idemkit_test::redis_server::Cluster::start();
    let prefix = format!("idemkit-page-{:x}", fastrand::u64(..));
    let on_cluster = RedisStore::builder()
        .prefix(prefix.as_str())
        .connect_cluster(cluster.urls())
        .await
        .unwrap();
    let op = Operation::new("mail.invoice").unwrap();
    let key = StorageKey::new(&op, None, &Key::new("order-3.invoice").unwrap());
    let pg_lease = reserve(&pg, &key).await;
    let cluster_lease = reserve(&on_cluster, &key).await;

    let cluster_url = format!("redis+cluster://127.0.0.1:{}", cluster.nodes[0].port);
    let targets: [(Vec<String>, u64); 2] = [
        (
            vec![
                "--store".into(),
                pg_url,
                "--schema".into(),
                schema.into(),
                "--table".into(),
                table,
            ],
            pg_lease.fencing.get(),
        ),
        (
            vec!["--store".into(), cluster_url, "--prefix".into(), prefix],
            cluster_lease.fencing.get(),
        ),
    ];
    let http = reqwest::Client::new();
    for (store, fencing) in targets {
        let server = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = store.iter().map(String::as_str).collect();
            Server::start(&args, &[])
        })
        .await
        .unwrap();
        let page = text(&http, format!("{}/", server.base)).await;
        assert!(page.contains("In-flight reservations: 1"), "{page}");
        let in_flight = rows(&page, "in-flight");
        assert_eq!(in_flight.len(), 1, "{page}");
        assert!(in_flight[0].contains("order-3.invoice"), "{page}");
        assert!(in_flight[0].contains(&fencing.to_string()), "{page}");
        let metrics = text(&http, format!("{}/metrics", server.base)).await;
        assert!(metrics.contains("idemkit_store_up 1"), "{metrics}");
        assert!(
            metrics
                .contains("idemkit_store_records{operation=\"mail.invoice\",state=\"reserved\"} 1"),
            "{metrics}"
        );
    }
    drop(cluster);
}
