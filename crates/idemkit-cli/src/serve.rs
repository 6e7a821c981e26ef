//! `idemkit serve`: one server-rendered status page (no JavaScript) and `/metrics`.
//!
//! The page shows the in-flight reservations, oldest first, with their owner, age and lease
//! left, and the records per operation and state. It is read-only unless the server was
//! started with `--allow-writes`; then each reservation has a release action and each
//! operation a purge action, each behind a confirmation page, and each write is checked
//! against a token of this process (a page of another origin cannot post one) and logged.
//! It listens on loopback unless `--allow-remote`: it has no authentication of its own.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use idemkit_core::{FencingToken, Operation, OwnerToken, Ownership, StorageKey};
use serde::Deserialize;

use crate::listing::{
    Checked, OpStats, StateFilter, StoreFacts, count_matching, human, parse_duration,
    purge_matching, store_facts, survey,
};
use crate::ops::{Exit, StoreArgs, Target, connect, fail};

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
    soon: Duration,
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
                format!("{} prefix {}", without_password(&store.store), store.prefix)
            }
            Target::Postgres(_) => format!(
                "{} table {}.{}",
                without_password(&store.store),
                store.schema,
                store.table
            ),
        },
        target,
        writes: args.allow_writes,
        token: format!("{:032x}", OwnerToken::random().as_u128()),
        soon: args.soon,
    });
    let router = axum::Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics))
        .route("/confirm/release", get(confirm_release))
        .route("/confirm/purge", get(confirm_purge))
        .route("/release", post(release))
        .route("/purge", post(purge))
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

fn without_password(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// Text for HTML.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Text for a query string.
fn query_escape(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 10px;text-align:left}\
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.warn{color:#a00;font-weight:bold}.ok{color:#070}.muted{color:#777}code{font-size:90%}\
a.action,button{color:#fff;background:#a33;border:0;padding:3px 8px;border-radius:3px;text-decoration:none}";

fn document(title: &str, body: &str) -> Html<String> {
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body>{body}</body></html>",
        esc(title)
    ))
}

fn unavailable(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        document(
            "idemkit: store unavailable",
            &format!(
                "<h1>Store unavailable</h1><p class=\"warn\">{}</p>",
                esc(&e.to_string())
            ),
        ),
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
    let mut b = String::new();
    let _ = write!(
        b,
        "<h1>idemkit status</h1><p>Store <code>{}</code> · {} · <span class=\"muted\">read at {} (store clock, Unix ms)</span></p>",
        esc(&app.store),
        if app.writes {
            "<span class=\"warn\">writes allowed</span>"
        } else {
            "<span id=\"mode\">read-only</span>"
        },
        now
    );
    if let Some(done) = &done.done {
        let _ = write!(b, "<p id=\"done\" class=\"ok\">{}</p>", esc(done));
    }
    let _ = write!(
        b,
        "<h2>In-flight reservations: {total}</h2><p class=\"muted\">Oldest first (at most {SHOWN}). A reservation far older than its operation's actions take is likely stuck: its owner died, and the next delivery waits until its lease ends.</p>"
    );
    b.push_str("<table id=\"in-flight\"><tr><th>Operation</th><th>Scope</th><th>Key</th><th>Owner</th><th>Fencing</th><th>Age</th><th>Lease left</th>");
    if app.writes {
        b.push_str("<th></th>");
    }
    b.push_str("</tr>");
    for e in reservations {
        let Some(r) = &e.record else { continue };
        let Some((op, scope, key)) = StorageKey::parse(e.key.as_str()) else {
            continue;
        };
        let _ = write!(
            b,
            "<tr data-key=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>",
            esc(e.key.as_str()),
            esc(op.as_str()),
            esc(scope.as_ref().map_or("-", |s| s.as_str())),
            esc(key.as_str()),
            r.owner,
            r.fencing.get(),
            human(now.saturating_sub(r.created_at_ms)),
            human(r.expires_at_ms.saturating_sub(now)),
        );
        if app.writes {
            let _ = write!(
                b,
                "<td><a class=\"action\" href=\"/confirm/release?key={}&amp;owner={}&amp;fencing={}\">Release…</a></td>",
                query_escape(e.key.as_str()),
                r.owner,
                r.fencing.get()
            );
        }
        b.push_str("</tr>");
    }
    b.push_str("</table>");
    stats_table(&mut b, &app, stats);
    facts_lines(&mut b, &facts);
    document("idemkit status", &b).into_response()
}

fn stats_table(b: &mut String, app: &App, stats: &BTreeMap<String, OpStats>) {
    let _ = write!(
        b,
        "<h2>Records per operation</h2><table id=\"stats\"><tr><th>Operation</th><th>Reserved</th><th>Completed</th><th>Errors</th><th>Expired</th><th>Unreadable</th><th>Bytes</th><th>Expiring within {}</th><th>Oldest reservation</th>{}</tr>",
        human(app.soon.as_millis() as u64),
        if app.writes { "<th></th>" } else { "" }
    );
    for (op, s) in stats {
        let c = s.cells();
        let _ = write!(
            b,
            "<tr data-operation=\"{0}\"><td>{0}</td><td class=\"n\">{1}</td><td class=\"n\">{2}</td><td class=\"n\">{3}</td><td class=\"n\">{4}</td><td class=\"n\">{5}</td><td class=\"n\">{6}</td><td class=\"n\">{7}</td><td class=\"n\">{8}</td>",
            esc(op),
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            c[6],
            c[7]
        );
        if app.writes {
            let _ = write!(
                b,
                "<td><a class=\"action\" href=\"/confirm/purge?operation={0}&amp;state=completed\">Purge completed…</a> <a class=\"action\" href=\"/confirm/purge?operation={0}&amp;state=expired\">Purge expired…</a></td>",
                query_escape(op)
            );
        }
        b.push_str("</tr>");
    }
    b.push_str("</table>");
}

fn facts_lines(b: &mut String, facts: &StoreFacts) {
    if let Some(policy) = &facts.eviction_policy {
        if policy == "noeviction" {
            let _ = write!(
                b,
                "<p id=\"eviction\" class=\"ok\">Redis eviction policy: {}</p>",
                esc(policy)
            );
        } else {
            let _ = write!(
                b,
                "<p id=\"eviction\" class=\"warn\">Redis eviction policy: {}. A full server evicts reservations and records, and actions run again: set maxmemory-policy noeviction.</p>",
                esc(policy)
            );
        }
    }
    if let Some(bytes) = facts.table_bytes {
        let _ = write!(b, "<p id=\"table-size\">Table size: {bytes} bytes</p>");
    }
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
        document(
            "idemkit: read-only",
            "<h1>Read-only</h1><p>This server was started without <code>--allow-writes</code>.</p>",
        ),
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
    let body = format!(
        "<h1>Release this reservation?</h1><p><code>{}</code>, owner <code>{}</code>, fencing token {}.</p>\
         <p>Release it only if its owner is gone: the next delivery then runs the action at once. If the owner is alive, its completion will be refused and the effect may happen twice.</p>\
         <form method=\"post\" action=\"/release\"><input type=\"hidden\" name=\"key\" value=\"{}\"><input type=\"hidden\" name=\"owner\" value=\"{}\"><input type=\"hidden\" name=\"fencing\" value=\"{}\"><input type=\"hidden\" name=\"token\" value=\"{}\">\
         <button id=\"confirm\" type=\"submit\">Release</button> <a href=\"/\">Cancel</a></form>",
        esc(&q.key),
        esc(&q.owner),
        q.fencing,
        esc(&q.key),
        esc(&q.owner),
        q.fencing,
        app.token
    );
    document("idemkit: release", &body).into_response()
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
    let body = format!(
        "<h1>Purge {n} {} records of {}?</h1><p>Purged completed records are not replayed: a retry runs the action again.</p>\
         <form method=\"post\" action=\"/purge\"><input type=\"hidden\" name=\"operation\" value=\"{}\"><input type=\"hidden\" name=\"state\" value=\"{}\"><input type=\"hidden\" name=\"token\" value=\"{}\">\
         <button id=\"confirm\" type=\"submit\">Purge</button> <a href=\"/\">Cancel</a></form>",
        esc(&q.state),
        esc(&q.operation),
        esc(&q.operation),
        esc(&q.state),
        app.token
    );
    document("idemkit: purge", &body).into_response()
}

/// A write's checks: writes allowed, this process's token, and no foreign origin.
fn may_write(app: &App, headers: &HeaderMap, token: &str) -> Option<Response> {
    if !app.writes {
        return Some(read_only());
    }
    let origin_ok = match (headers.get(header::ORIGIN), headers.get(header::HOST)) {
        (None, _) => true,
        (Some(origin), Some(host)) => {
            let origin = origin.to_str().unwrap_or_default();
            let host = host.to_str().unwrap_or_default();
            origin.strip_prefix("http://") == Some(host)
                || origin.strip_prefix("https://") == Some(host)
        }
        (Some(_), None) => false,
    };
    if token != app.token || !origin_ok {
        return Some((StatusCode::FORBIDDEN, "a write from outside this page").into_response());
    }
    None
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
    Redirect::to(&format!("/?done={}", query_escape(&done))).into_response()
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
            Redirect::to(&format!("/?done={}", query_escape(&text))).into_response()
        }
        Err(e) => unavailable(e),
    }
}
