//! `idemkit serve`: one server-rendered status page (no JavaScript; its HTML from the maud
//! templates of `templates.rs`) and `/metrics`.
//!
//! The page shows the in-flight reservations, oldest first, with their owner, age and lease
//! left, and the records per operation and state. It is read-only unless the server was
//! started with `--allow-writes`; then each reservation has a release action and each
//! operation a purge action, each behind a confirmation page, and each write is checked
//! against a token of this process (a page of another origin cannot post one) and logged.
//! It listens on loopback unless `--allow-remote`: it has no authentication of its own.
//!
//! Against a hostile browser: a request whose `Host` is not the listen address, `localhost`
//! or a name given with `--allow-host` is refused before anything is read (DNS rebinding: a
//! page of `attacker.example` whose name now resolves to 127.0.0.1 is same-origin with
//! itself, and would otherwise read the token and post); a write needs the token and a
//! same-origin proof (`Origin` equal to the served host, or `Sec-Fetch-Site: same-origin`);
//! every answer forbids framing and type sniffing.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use idemkit_core::{FencingToken, Operation, OwnerToken, Ownership, StorageKey};
use serde::Deserialize;

use crate::listing::{
    Checked, OpStats, StateFilter, count_matching, parse_duration, purge_matching, store_facts,
    survey,
};
use crate::ops::{Exit, StoreArgs, Target, connect, fail, redact};
use crate::templates::{self, Status};

/// The server's options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ServeArgs {
    /// The address to listen on (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:9464")]
    listen: SocketAddr,
    /// Offer release and purge on the page, each behind a confirmation.
    #[arg(long)]
    allow_writes: bool,
    /// Allow a non-loopback address. The page has no authentication: put it behind your
    /// own proxy.
    #[arg(long)]
    allow_remote: bool,
    /// A host name the page may be reached by, besides the listen address and `localhost`
    /// (repeatable): the name a proxy or a remote browser uses. Any other `Host` is refused.
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_hosts: Vec<String>,
    /// "Expiring soon" means within this.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    soon: Duration,
}

struct App {
    target: Target,
    /// The store, as shown on the page (the URL without a password).
    store: String,
    writes: bool,
    /// Every form carries it; a post without it is refused.
    token: String,
    /// The host names a request may name (lowercase, without port).
    hosts: Vec<String>,
    soon: Duration,
    /// What the page's last writes did, by number: the page shows `?done=<n>` only if this
    /// server wrote note `n` (review L10: a text in the query was shown as it came, so a
    /// link could put any sentence on the operator's trusted page).
    notes: std::sync::Mutex<Notes>,
}

/// The last [`Notes::KEPT`] notes of the page's writes, numbered.
#[derive(Default)]
struct Notes {
    next: u64,
    kept: std::collections::VecDeque<(u64, String)>,
}

impl Notes {
    const KEPT: usize = 32;

    fn add(&mut self, text: String) -> u64 {
        self.next += 1;
        if self.kept.len() == Self::KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back((self.next, text));
        self.next
    }

    fn get(&self, n: u64) -> Option<&str> {
        self.kept
            .iter()
            .find(|(at, _)| *at == n)
            .map(|(_, t)| t.as_str())
    }
}

impl App {
    /// Keeps `text` as a note and redirects to the page showing it.
    fn done(&self, text: String) -> Response {
        let n = self
            .notes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .add(text);
        Redirect::to(&format!("/?done={n}")).into_response()
    }
}

/// The most reservations the page lists (the oldest ones).
const SHOWN: usize = 200;

pub(crate) async fn serve(store: &StoreArgs, args: &ServeArgs) -> Exit {
    if !args.listen.ip().is_loopback() && !args.allow_remote {
        return fail(
            Exit::Usage,
            format!(
                "{} is not a loopback address: the page has no authentication; pass --allow-remote to serve it anyway",
                args.listen
            ),
        );
    }
    let target = match connect(store).await {
        Ok(t) => t,
        Err(code) => return code,
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            return fail(
                Exit::Usage,
                format!("cannot listen on {}: {e}", args.listen),
            );
        }
    };
    let addr = listener.local_addr().map_or(args.listen, |a| a);
    let app = Arc::new(App {
        store: match &target {
            Target::Redis(_) => {
                format!("{} prefix {}", redact(&store.store), store.prefix)
            }
            Target::Postgres(_) => format!(
                "{} table {}.{}",
                redact(&store.store),
                store.schema,
                store.table
            ),
            Target::MySql(_) => format!("{} table {}", redact(&store.store), store.table),
        },
        target,
        writes: args.allow_writes,
        token: match write_token() {
            Ok(t) => t,
            Err(e) => return fail(Exit::Store, format!("no random token: {e}")),
        },
        hosts: allowed_hosts(addr, &args.allow_hosts),
        soon: args.soon,
        notes: std::sync::Mutex::default(),
    });
    let router = axum::Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics))
        .route("/confirm/release", get(confirm_release))
        .route("/confirm/purge", get(confirm_purge))
        .route("/release", post(release))
        .route("/purge", post(purge))
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app);
    println!(
        "listening on http://{addr}/ ({})",
        if args.allow_writes {
            "writes allowed"
        } else {
            "read-only"
        }
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
    {
        Ok(()) => Exit::Ok,
        Err(e) => fail(Exit::Store, format!("the server stopped: {e}")),
    }
}

/// 256 bits from the operating system's generator, as hex.
fn write_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    }))
}

/// The names a request's `Host` may carry: the listen address (unless unspecified),
/// loopback's names, and the allow-list.
fn allowed_hosts(addr: SocketAddr, extra: &[String]) -> Vec<String> {
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "[::1]".to_string(),
    ];
    if !addr.ip().is_unspecified() {
        hosts.push(match addr {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        });
    }
    hosts.extend(extra.iter().map(|h| h.to_ascii_lowercase()));
    hosts
}

/// A `Host` value's name: lowercase, without its port.
fn host_name(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    if host.starts_with('[') {
        // [v6]:port
        return host
            .split_inclusive(']')
            .next()
            .unwrap_or_default()
            .to_string();
    }
    host.rsplit_once(':')
        .map_or(host.clone(), |(name, _)| name.to_string())
}

/// Every request: a `Host` this server answers to, or 403 before any handler reads the
/// store; every answer: no framing, no sniffing.
async fn guard(
    State(app): State<Arc<App>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(host_name);
    let mut response = match host {
        Some(h) if app.hosts.contains(&h) => next.run(request).await,
        _ => (
            StatusCode::FORBIDDEN,
            "this host name is not served here (idemkit serve --allow-host NAME to allow it)",
        )
            .into_response(),
    };
    let h = response.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("frame-ancestors 'none'"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

fn unavailable(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Html(templates::unavailable(&e.to_string()).into_string()),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct Done {
    done: Option<String>,
}

async fn page(State(app): State<Arc<App>>, Query(done): Query<Done>) -> Response {
    // One walk of the store for both tables.
    let survey = match survey(&app.target, app.soon, SHOWN).await {
        Ok(s) => s,
        Err(e) => return unavailable(e),
    };
    let (reservations, total, now, stats) = (
        &survey.oldest,
        survey.reserved(),
        survey.now_ms,
        &survey.by_op,
    );
    let facts = store_facts(&app.target).await;
    let note = done.done.and_then(|n| n.parse::<u64>().ok()).and_then(|n| {
        app.notes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(n)
            .map(str::to_owned)
    });
    let page = templates::status(&Status {
        store: &app.store,
        writes: app.writes,
        now,
        done: note.as_deref(),
        total,
        shown: SHOWN,
        reservations,
        soon_ms: app.soon.as_millis() as u64,
        stats,
        facts: &facts,
    });
    Html(page.into_string()).into_response()
}

/// A gauge of `/metrics`: name, help, and its value from one operation's numbers.
type Gauge = (&'static str, &'static str, fn(&OpStats) -> f64);

/// A Prometheus label value.
fn label(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut out = String::new();
    let stats = survey(&app.target, app.soon, 0).await.map(|s| s.by_op);
    let _ = writeln!(
        out,
        "# HELP idemkit_store_up Whether the last scan of the store succeeded.\n# TYPE idemkit_store_up gauge\nidemkit_store_up {}",
        u8::from(stats.is_ok())
    );
    if let Ok(stats) = stats {
        out.push_str("# HELP idemkit_store_records Records in the store, by operation and state.\n# TYPE idemkit_store_records gauge\n");
        for (op, s) in &stats {
            for (state, n) in [
                ("reserved", s.reserved),
                ("completed", s.completed),
                ("permanent_error", s.permanent_errors),
                ("result_unavailable", s.results_unavailable),
                ("expired", s.expired),
                ("unreadable", s.unreadable),
            ] {
                let _ = writeln!(
                    out,
                    "idemkit_store_records{{operation=\"{}\",state=\"{state}\"}} {n}",
                    label(op)
                );
            }
        }
        let gauges: [Gauge; 3] = [
            ("idemkit_store_bytes", "Bytes stored, by operation.", |s| {
                s.bytes as f64
            }),
            (
                "idemkit_store_expiring_soon",
                "Completed records whose retention ends within the --soon window.",
                |s| s.expiring_soon as f64,
            ),
            (
                "idemkit_store_oldest_reservation_seconds",
                "Age of the oldest live reservation (0 when none): a stuck key grows here.",
                |s| s.oldest_reservation_ms as f64 / 1000.0,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (op, s) in &stats {
                let _ = writeln!(out, "{name}{{operation=\"{}\"}} {}", label(op), value(s));
            }
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

fn read_only() -> Response {
    (
        StatusCode::FORBIDDEN,
        Html(templates::read_only().into_string()),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct ReleaseQuery {
    key: String,
    owner: String,
    fencing: u64,
}

async fn confirm_release(State(app): State<Arc<App>>, Query(q): Query<ReleaseQuery>) -> Response {
    if !app.writes {
        return read_only();
    }
    let page = templates::confirm_release(&q.key, &q.owner, q.fencing, &app.token);
    Html(page.into_string()).into_response()
}

#[derive(Debug, Deserialize)]
struct PurgeQuery {
    operation: String,
    state: String,
}

fn purge_state(state: &str) -> Option<StateFilter> {
    match state {
        "completed" => Some(StateFilter::Completed),
        "expired" => Some(StateFilter::Expired),
        _ => None,
    }
}

async fn confirm_purge(State(app): State<Arc<App>>, Query(q): Query<PurgeQuery>) -> Response {
    if !app.writes {
        return read_only();
    }
    let (Ok(op), Some(state)) = (Operation::new(q.operation.as_str()), purge_state(&q.state))
    else {
        return (StatusCode::BAD_REQUEST, "bad operation or state").into_response();
    };
    let filter = Checked::of(Some(op), Some(state));
    let (n, _) = match count_matching(&app.target, &filter).await {
        Ok(n) => n,
        Err(e) => return unavailable(e),
    };
    let page = templates::confirm_purge(n, &q.operation, &q.state, &app.token);
    Html(page.into_string()).into_response()
}

/// A write's checks: writes allowed, this process's token, and no foreign origin.
fn may_write(app: &App, headers: &HeaderMap, token: &str) -> Option<Response> {
    if !app.writes {
        return Some(read_only());
    }
    // A same-origin proof: the page's own Origin, or the browser's word for it. No Origin
    // at all (a client that is not a browser, or an old one) is not a proof.
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
    let same_origin = match (origin, host) {
        (Some(origin), Some(host)) => {
            origin.strip_prefix("http://") == Some(host)
                || origin.strip_prefix("https://") == Some(host)
        }
        (Some(_), None) => false,
        (None, _) => headers
            .get("sec-fetch-site")
            .is_some_and(|s| s.as_bytes() == b"same-origin"),
    };
    if !same_secret(token.as_bytes(), app.token.as_bytes()) || !same_origin {
        return Some((StatusCode::FORBIDDEN, "a write from outside this page").into_response());
    }
    None
}

/// Compares a posted token with the page's in time that depends on its length only, not on
/// where the first difference is (review L10: `!=` stops at the first differing byte).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Debug, Deserialize)]
struct ReleaseForm {
    key: String,
    owner: String,
    fencing: u64,
    token: String,
}

async fn release(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Form(f): Form<ReleaseForm>,
) -> Response {
    if let Some(refused) = may_write(&app, &headers, &f.token) {
        return refused;
    }
    let (Some((op, scope, key)), Ok(owner)) = (
        StorageKey::parse(&f.key),
        u128::from_str_radix(&f.owner, 16),
    ) else {
        return (StatusCode::BAD_REQUEST, "bad key or owner").into_response();
    };
    let key = StorageKey::new(&op, scope.as_ref(), &key);
    let lease = Ownership::new(OwnerToken::from_u128(owner), FencingToken::new(f.fencing));
    let done = match app.target.release(&key, &lease).await {
        Ok(()) => {
            eprintln!(
                "idemkit serve: released {key} (owner {}, fencing {})",
                f.owner, f.fencing
            );
            format!("Released {key}.")
        }
        Err(e) if e.is_lease_lost() => {
            format!("{key} changed meanwhile (completed, released or taken over): nothing done.")
        }
        Err(e) => return unavailable(e),
    };
    app.done(done)
}

#[derive(Debug, Deserialize)]
struct PurgeForm {
    operation: String,
    state: String,
    token: String,
}

async fn purge(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Form(f): Form<PurgeForm>,
) -> Response {
    if let Some(refused) = may_write(&app, &headers, &f.token) {
        return refused;
    }
    let (Ok(op), Some(state)) = (Operation::new(f.operation.as_str()), purge_state(&f.state))
    else {
        return (StatusCode::BAD_REQUEST, "bad operation or state").into_response();
    };
    let filter = Checked::of(Some(op), Some(state));
    match purge_matching(&app.target, &filter, 100, |_| {}).await {
        Ok(done) => {
            eprintln!(
                "idemkit serve: purged {} {} records of {}",
                done.purged, f.state, f.operation
            );
            let text = format!(
                "Purged {} {} records of {} ({} changed meanwhile and were left).",
                done.purged, f.state, f.operation, done.changed
            );
            app.done(text)
        }
        Err(e) => unavailable(e),
    }
}
