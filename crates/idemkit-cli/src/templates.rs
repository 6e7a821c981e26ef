//! The status page's HTML, from maud templates: every value is escaped by construction (a
//! key, a scope, an operation or a store error can hold `<`, `"` or `&`), and only the
//! style sheet is inserted as it is.

use std::collections::BTreeMap;

use idemkit_core::StorageKey;
use idemkit_core::scan::Listed;
use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::listing::{OpStats, StoreFacts, human};

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 10px;text-align:left}\
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.warn{color:#a00;font-weight:bold}.ok{color:#070}.muted{color:#777}code{font-size:90%}\
a.action,button{color:#fff;background:#a33;border:0;padding:3px 8px;border-radius:3px;text-decoration:none}";

/// A whole page around `body`.
pub(crate) fn document(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) }
                style { (PreEscaped(STYLE)) }
            }
            body { (body) }
        }
    }
}

/// The store could not be read.
pub(crate) fn unavailable(error: &str) -> Markup {
    document(
        "idemkit: store unavailable",
        html! {
            h1 { "Store unavailable" }
            p.warn { (error) }
        },
    )
}

/// A write was asked of a read-only server.
pub(crate) fn read_only() -> Markup {
    document(
        "idemkit: read-only",
        html! {
            h1 { "Read-only" }
            p { "This server was started without " code { "--allow-writes" } "." }
        },
    )
}

/// What the status page shows.
pub(crate) struct Status<'a> {
    /// The store, as shown (without a password).
    pub(crate) store: &'a str,
    pub(crate) writes: bool,
    /// The store's clock when it was read, Unix ms.
    pub(crate) now: u64,
    /// The result of the last write, after its redirect.
    pub(crate) done: Option<&'a str>,
    pub(crate) total: u64,
    pub(crate) shown: usize,
    pub(crate) reservations: &'a [Listed],
    pub(crate) soon_ms: u64,
    pub(crate) stats: &'a BTreeMap<String, OpStats>,
    pub(crate) facts: &'a StoreFacts,
}

/// The status page: the in-flight reservations, the records per operation, the store's facts.
pub(crate) fn status(s: &Status<'_>) -> Markup {
    let now = s.now;
    document(
        "idemkit status",
        html! {
            h1 { "idemkit status" }
            p {
                "Store " code { (s.store) } " · "
                @if s.writes { span.warn { "writes allowed" } } @else { span #mode { "read-only" } }
                " · " span.muted { "read at " (crate::listing::utc(now)) " (the store's clock)" }
            }
            @if let Some(done) = s.done { p #done .ok { (done) } }
            h2 { "In-flight reservations: " (s.total) }
            p.muted {
                "Oldest first (at most " (s.shown) "). A reservation marked STALE has not been \
                 renewed for over half its lease: its holder (host and process) is gone, \
                 stopped or stuck, and the next delivery waits until the lease ends \
                 (or until it is released)."
            }
            table #in-flight {
                tr {
                    th { "Operation" } th { "Scope" } th { "Key" } th { "Owner" }
                    th { "Fencing" } th { "Age" } th { "Lease left" } th { "Held by" }
                    th { "Renewed" }
                    @if s.writes { th {} }
                }
                @for e in s.reservations {
                    @if let (Some(r), Some((op, scope, key))) = (&e.record, StorageKey::parse(e.key.as_str())) {
                        tr data-key=(e.key.as_str()) {
                            td { (op.as_str()) }
                            td { (scope.as_ref().map_or("-", |s| s.as_str())) }
                            td { (key.as_str()) }
                            td { code { (r.owner) } }
                            td.n { (r.fencing.get()) }
                            td.n { (human(now.saturating_sub(r.created_at_ms))) }
                            td.n { (human(r.expires_at_ms.saturating_sub(now))) }
                            td { (crate::ops::holder_text(r)) }
                            @if r.is_stale(now) {
                                td.warn.stale {
                                    "STALE: " (r.renewed_at_ms().map_or("-".into(), |at| human(now.saturating_sub(at)))) " ago"
                                }
                            } @else {
                                td.n { (r.renewed_at_ms().map_or("-".into(), |at| human(now.saturating_sub(at)) + " ago")) }
                            }
                            @if s.writes {
                                td {
                                    a.action href=(format!(
                                        "/confirm/release?key={}&owner={}&fencing={}",
                                        query_escape(e.key.as_str()), r.owner, r.fencing.get()
                                    )) { "Release…" }
                                }
                            }
                        }
                    }
                }
            }
            (stats_table(s))
            (facts(s.facts))
        },
    )
}

fn stats_table(s: &Status<'_>) -> Markup {
    html! {
        h2 { "Records per operation" }
        table #stats {
            tr {
                th { "Operation" } th { "Reserved" } th { "Completed" } th { "Errors" }
                th { "Expired" } th { "Unreadable" } th { "Bytes" }
                th { "Expiring within " (human(s.soon_ms)) } th { "Oldest reservation" }
                @if s.writes { th {} }
            }
            @for (op, stats) in s.stats {
                tr data-operation=(op) {
                    td { (op) }
                    @for cell in stats.cells() { td.n { (cell) } }
                    @if s.writes {
                        td {
                            a.action href=(format!("/confirm/purge?operation={}&state=completed", query_escape(op))) { "Purge completed…" }
                            " "
                            a.action href=(format!("/confirm/purge?operation={}&state=expired", query_escape(op))) { "Purge expired…" }
                        }
                    }
                }
            }
        }
    }
}

fn facts(facts: &StoreFacts) -> Markup {
    html! {
        @if let Some(policy) = &facts.eviction_policy {
            @if policy == "noeviction" {
                p #eviction .ok { "Redis eviction policy: " (policy) }
            } @else {
                p #eviction .warn {
                    "Redis eviction policy: " (policy) ". A full server evicts reservations and \
                     records, and actions run again: set maxmemory-policy noeviction."
                }
            }
        }
        @if let Some(bytes) = facts.table_bytes {
            p #table-size { "Table size: " (bytes) " bytes" }
        }
    }
}

/// The confirmation of a release.
pub(crate) fn confirm_release(key: &str, owner: &str, fencing: u64, token: &str) -> Markup {
    document(
        "idemkit: release",
        html! {
            h1 { "Release this reservation?" }
            p { code { (key) } ", owner " code { (owner) } ", fencing token " (fencing) "." }
            p {
                "Release it only if its owner is gone: the next delivery then runs the action \
                 at once. If the owner is alive, its completion will be refused and the effect \
                 may happen twice."
            }
            form method="post" action="/release" {
                input type="hidden" name="key" value=(key);
                input type="hidden" name="owner" value=(owner);
                input type="hidden" name="fencing" value=(fencing);
                input type="hidden" name="token" value=(token);
                button #confirm type="submit" { "Release" }
                " "
                a href="/" { "Cancel" }
            }
        },
    )
}

/// The confirmation of a purge of `n` records.
pub(crate) fn confirm_purge(n: u64, operation: &str, state: &str, token: &str) -> Markup {
    document(
        "idemkit: purge",
        html! {
            h1 { "Purge " (n) " " (state) " records of " (operation) "?" }
            p { "Purged completed records are not replayed: a retry runs the action again." }
            form method="post" action="/purge" {
                input type="hidden" name="operation" value=(operation);
                input type="hidden" name="state" value=(state);
                input type="hidden" name="token" value=(token);
                button #confirm type="submit" { "Purge" }
                " "
                a href="/" { "Cancel" }
            }
        },
    )
}

/// Text for a query string (the links' parameters); maud escapes the `&` between them.
pub(crate) fn query_escape(text: &str) -> String {
    use std::fmt::Write as _;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_by_construction() {
        let page = confirm_release("op\0-\0<script>\"&", "o'wner", 7, "t").into_string();
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;&quot;&amp;"), "{page}");
        let page = unavailable("<b>down</b>").into_string();
        assert!(page.contains("&lt;b&gt;down&lt;/b&gt;"), "{page}");
    }
}
