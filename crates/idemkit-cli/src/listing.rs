//! The operator's commands over many records: `list`, `purge` and `stats`. Each walks the
//! store with its cursor-based scan ([`idemkit_core::scan`]) in bounded pages, so they are
//! safe on a large production store: never `KEYS`, never an unbounded query.

use std::collections::BTreeMap;
use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::time::Duration;

use idemkit_core::scan::{Listed, ScanCursor};
use idemkit_core::{Operation, RecordState, StoreError};

use crate::ops::{Exit, StoreArgs, Target, connect, fail, redact, state_of, store_failed};

/// The states `--state` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum StateFilter {
    /// Reservations still within their lease (an owner is running, or died and its lease
    /// has not ended yet).
    Reserved,
    /// Completed records within their retention: results, permanent errors, results too
    /// large to keep.
    Completed,
    /// Past their lease or retention, not yet swept (PostgreSQL until its purger runs);
    /// Redis removes these itself.
    Expired,
    /// Bytes under a key of ours that are not a record (written by something else).
    /// Listed, never purged.
    Unreadable,
}

/// Which records a command looks at.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct Filter {
    /// Only this operation's records.
    #[arg(long)]
    pub(crate) operation: Option<String>,
    /// Only records in this state.
    #[arg(long, value_enum)]
    pub(crate) state: Option<StateFilter>,
    /// Only records created longer ago than this: `500ms`, `90s`, `15m`, `2h`, `7d`.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) older_than: Option<Duration>,
}

/// A duration as operators type it: a whole number and a unit (`ms`, `s`, `m`, `h`, `d`).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (n, unit) = text.split_at(digits);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{text:?}: expected a number and a unit, like 90s or 15m"))?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => return Err(format!("{text:?}: the unit is one of ms, s, m, h, d")),
    };
    ms.map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// `1.250s`, `5m03s`, `2h10m`, `3d04h`: short and exact enough for a table.
pub(crate) fn human(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{}.{:03}s", s, ms % 1000),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// A store-clock time (Unix milliseconds) as a UTC date and time, to the second:
/// `2026-11-29 23:32:03 UTC`. (Howard Hinnant's `civil_from_days`: no date crate for one
/// line of the status page.)
pub(crate) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 0000-03-01, in 400-year eras of 146,097 days.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The filter, checked: the operation is a valid one.
pub(crate) struct Checked {
    operation: Option<Operation>,
    state: Option<StateFilter>,
    older_than_ms: Option<u64>,
}

impl Filter {
    pub(crate) fn check(&self) -> Result<Checked, Exit> {
        let operation = self
            .operation
            .as_deref()
            .map(Operation::new)
            .transpose()
            .map_err(|e| fail(Exit::Usage, e))?;
        Ok(Checked {
            operation,
            state: self.state,
            older_than_ms: self.older_than.map(|d| d.as_millis() as u64),
        })
    }
}

impl Checked {
    pub(crate) fn everything() -> Self {
        Checked {
            operation: None,
            state: None,
            older_than_ms: None,
        }
    }

    pub(crate) fn of(operation: Option<Operation>, state: Option<StateFilter>) -> Self {
        Checked {
            operation,
            state,
            older_than_ms: None,
        }
    }

    pub(crate) fn operation(&self) -> Option<&Operation> {
        self.operation.as_ref()
    }

    pub(crate) fn matches(&self, entry: &Listed, now_ms: u64) -> bool {
        let Some(r) = &entry.record else {
            return matches!(self.state, None | Some(StateFilter::Unreadable))
                && self.older_than_ms.is_none();
        };
        let state = match state_of(r, now_ms) {
            "expired" => StateFilter::Expired,
            "reserved" => StateFilter::Reserved,
            _ => StateFilter::Completed,
        };
        self.state.is_none_or(|s| s == state)
            && self
                .older_than_ms
                .is_none_or(|d| now_ms.saturating_sub(r.created_at_ms) >= d)
    }
}

/// Pages of about this many entries: one `SCAN ... COUNT` or one keyset query each.
const PAGE: usize = 500;

/// A walk over every page of the filter's operation, yielding each page's matching entries
/// and the store's clock.
pub(crate) struct Walk<'a> {
    target: &'a Target,
    filter: &'a Checked,
    cursor: Option<ScanCursor>,
    over: bool,
}

impl<'a> Walk<'a> {
    pub(crate) fn new(target: &'a Target, filter: &'a Checked) -> Self {
        Walk {
            target,
            filter,
            cursor: None,
            over: false,
        }
    }

    /// The next page's matching entries (possibly none) and the store's clock; `None` when
    /// the walk is over.
    pub(crate) async fn next(&mut self) -> Result<Option<(Vec<Listed>, u64)>, StoreError> {
        if self.over {
            return Ok(None);
        }
        let page = self
            .target
            .scan(self.filter.operation.as_ref(), self.cursor.as_ref(), PAGE)
            .await?;
        let now = page.now_ms;
        let matching = page
            .entries
            .into_iter()
            .filter(|e| self.filter.matches(e, now))
            .collect();
        match page.next {
            Some(next) => self.cursor = Some(next),
            None => self.over = true,
        }
        Ok(Some((matching, now)))
    }
}

fn row_json(e: &Listed, now_ms: u64) -> serde_json::Value {
    let text = e.key.as_str();
    let (op, scope, key) =
        idemkit_core::StorageKey::parse(text).expect("listed keys are storage keys");
    let mut row = serde_json::json!({
        "operation": op.as_str(),
        "scope": scope.as_ref().map(|s| s.as_str()),
        "key": key.as_str(),
        "size": e.size,
    });
    match &e.record {
        Some(r) => {
            row["state"] = state_of(r, now_ms).into();
            row["owner"] = r.owner.to_string().into();
            row["fencing"] = r.fencing.get().into();
            row["age_ms"] = now_ms.saturating_sub(r.created_at_ms).into();
            row["expires_in_ms"] = r.expires_at_ms.saturating_sub(now_ms).into();
            crate::ops::holder_fields(r, now_ms, &mut row);
        }
        None => row["state"] = "unreadable".into(),
    }
    row
}

fn row_text(e: &Listed, now_ms: u64) -> String {
    let (op, scope, key) =
        idemkit_core::StorageKey::parse(e.key.as_str()).expect("listed keys are storage keys");
    let scope = scope.as_ref().map_or("-", |s| s.as_str()).to_string();
    match &e.record {
        Some(r) => format!(
            "{:<18} {:>9} {:>9} {:>18} {:>7}  {}  {}  {}  {}",
            crate::ops::state_text(r, now_ms),
            human(now_ms.saturating_sub(r.created_at_ms)),
            human(r.expires_at_ms.saturating_sub(now_ms)),
            r.fencing.get(),
            e.size,
            op.as_str(),
            scope,
            key.as_str(),
            crate::ops::holder_text(r)
        ),
        None => format!(
            "{:<18} {:>9} {:>9} {:>18} {:>7}  {}  {}  {}  -",
            "unreadable",
            "-",
            "-",
            "-",
            e.size,
            op.as_str(),
            scope,
            key.as_str()
        ),
    }
}

const HEADER: &str = "STATE                    AGE      LEFT            FENCING    SIZE  OPERATION  SCOPE  KEY  HELD BY";

/// The filter checked, then the store connected: bad arguments fail before any connection.
async fn open(store: &StoreArgs, filter: &Filter) -> Result<(Checked, Target), Exit> {
    let filter = filter.check()?;
    Ok((filter, connect(store).await?))
}

/// `idemkit list`: at most `limit` matching records, in the store's order.
pub(crate) async fn list(store: &StoreArgs, filter: &Filter, limit: usize, json: bool) -> Exit {
    let (filter, target) = match open(store, filter).await {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    let mut rows = Vec::new();
    let mut shown = 0usize;
    if !json {
        println!("{HEADER}");
    }
    let mut walk = Walk::new(&target, &filter);
    'pages: loop {
        let (entries, now) = match walk.next().await {
            Ok(Some(page)) => page,
            Ok(None) => break,
            Err(e) => return store_failed(&e),
        };
        for e in entries {
            if shown == limit {
                break 'pages;
            }
            shown += 1;
            if json {
                rows.push(row_json(&e, now));
            } else {
                println!("{}", row_text(&e, now));
            }
        }
    }
    if json {
        println!("{}", serde_json::Value::Array(rows));
    }
    if shown == limit {
        eprintln!("idemkit: {shown} records shown: the limit; more may match (--limit N)");
    } else {
        eprintln!("idemkit: {shown} records");
    }
    if shown == 0 {
        eprintln!("{}", where_we_looked(store, &target));
    }
    Exit::Ok
}

/// A hint for an empty listing: where the records were looked for, and how to look
/// elsewhere. The usual cause is a prefix or table other than the services' own.
fn where_we_looked(store: &StoreArgs, target: &Target) -> String {
    match target {
        Target::Redis(_) => format!(
            "idemkit: hint: nothing under the key prefix {:?} on this server; if the services set another (RedisStoreBuilder::prefix), pass the same --prefix",
            store.prefix
        ),
        Target::Postgres(_) => format!(
            "idemkit: hint: nothing in the table {}.{}; if the services use another (PgStoreBuilder::schema / table), pass the same --schema and --table",
            store.schema, store.table
        ),
        Target::MySql(_) => format!(
            "idemkit: hint: nothing in the table {} of the URL's database; if the services use another (MySqlStoreBuilder::table), pass the same --table",
            store.table
        ),
    }
}

/// What `purge` is asked to do.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PurgeArgs {
    #[command(flatten)]
    pub(crate) filter: Filter,
    /// Only records past their lease or retention (the same as `--state expired`).
    #[arg(long, conflicts_with = "state")]
    pub(crate) expired: bool,
    /// Count what would be purged; change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub(crate) yes: bool,
    /// Records removed concurrently per step.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) batch: u16,
    /// Print JSON instead of lines.
    #[arg(long)]
    pub(crate) json: bool,
    /// Remove live reservations too. A purge that matches live reservations (no `--state`,
    /// or `--state reserved`) is refused without it or `--older-than`: removing one lets
    /// its effect run again while its owner may still be running it.
    #[arg(long)]
    pub(crate) force: bool,
}

/// How a purge went.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Purged {
    pub(crate) purged: u64,
    /// Listed, but reserved again, completed or removed by someone else before its turn:
    /// left as it is (the removal is fenced).
    pub(crate) changed: u64,
}

/// Removes every record `filter` matches, `batch` at a time, each only under the fencing
/// token it was listed with; `progress` sees the running count. Unreadable entries are
/// never removed.
pub(crate) async fn purge_matching(
    target: &Target,
    filter: &Checked,
    batch: usize,
    mut progress: impl FnMut(Purged),
) -> Result<Purged, StoreError> {
    let mut done = Purged::default();
    let mut walk = Walk::new(target, filter);
    while let Some((entries, _)) = walk.next().await? {
        let fenced: Vec<_> = entries
            .iter()
            .filter_map(|e| e.record.as_ref().map(|r| (&e.key, r.fencing)))
            .collect();
        for chunk in fenced.chunks(batch.max(1)) {
            let removals = chunk
                .iter()
                .map(|(key, fencing)| target.remove(key, *fencing));
            for removed in futures_util::future::join_all(removals).await {
                if removed? {
                    done.purged += 1;
                } else {
                    done.changed += 1;
                }
            }
            progress(done);
        }
    }
    Ok(done)
}

/// Counts the records `filter` matches (unreadable ones aside), and how many of them are
/// live reservations.
pub(crate) async fn count_matching(
    target: &Target,
    filter: &Checked,
) -> Result<(u64, u64), StoreError> {
    let (mut n, mut live) = (0u64, 0u64);
    let mut walk = Walk::new(target, filter);
    while let Some((entries, now)) = walk.next().await? {
        for r in entries.iter().filter_map(|e| e.record.as_ref()) {
            n += 1;
            if matches!(r.state, RecordState::Reserved) && r.expires_at_ms > now {
                live += 1;
            }
        }
    }
    Ok((n, live))
}

fn progress_bar(done: Purged, total: u64) {
    let seen = done.purged + done.changed;
    let width = 30u64;
    let filled = (seen * width)
        .checked_div(total)
        .unwrap_or(width)
        .min(width);
    eprint!(
        "\r[{}{}] {seen}/{total}",
        "#".repeat(filled as usize),
        ".".repeat((width - filled) as usize)
    );
    let _ = std::io::stderr().flush();
}

/// `idemkit purge`: count, confirm (unless `--yes`), then remove in bounded batches.
pub(crate) async fn purge(store: &StoreArgs, args: &PurgeArgs) -> Exit {
    let mut filter = args.filter.clone();
    if args.expired {
        filter.state = Some(StateFilter::Expired);
    }
    if filter.state == Some(StateFilter::Unreadable) {
        return fail(
            Exit::Usage,
            "unreadable entries are never purged: inspect them, then remove them with the store's own tools",
        );
    }
    let (filter, target) = match open(store, &filter).await {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    let (matched, live) = match count_matching(&target, &filter).await {
        Ok(n) => n,
        Err(e) => return store_failed(&e),
    };
    let what = describe_filter(&filter, args);
    if live > 0 && !args.dry_run && !args.force && args.filter.older_than.is_none() {
        return fail(
            Exit::Refused,
            format!(
                "{live} of the {matched} records ({what}) are live reservations: removing one lets \
                 its effect run again while its owner may still be running it. Add --older-than \
                 (only reservations held that long) or --force; nothing purged"
            ),
        );
    }
    let report = |done: Purged, dry_run: bool| {
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "matched": matched,
                    "purged": done.purged,
                    "changed": done.changed,
                    "dry_run": dry_run,
                })
            );
        } else if dry_run {
            println!("would purge {matched} records ({what})");
        } else {
            println!(
                "purged {} records ({what}); {} changed meanwhile and were left",
                done.purged, done.changed
            );
        }
    };
    if args.dry_run || matched == 0 {
        report(Purged::default(), args.dry_run);
        return Exit::Ok;
    }
    let warning = if live > 0 {
        format!(" {live} of them are live reservations: their effects may then run again.")
    } else {
        String::new()
    };
    if !args.yes
        && !confirm(&format!(
            "purge {matched} records ({what}) from {}?{warning}",
            redact(&store.store)
        ))
    {
        return fail(Exit::Refused, "not confirmed: nothing purged");
    }
    let tty = std::io::stderr().is_terminal();
    let done = purge_matching(&target, &filter, args.batch as usize, |d| {
        if tty {
            progress_bar(d, matched);
        }
    })
    .await;
    if tty {
        eprintln!();
    }
    match done {
        Ok(done) => {
            eprintln!(
                "idemkit: purged {} records ({what}) from {}",
                done.purged,
                redact(&store.store)
            );
            report(done, false);
            Exit::Ok
        }
        Err(e) => store_failed(&e),
    }
}

fn describe_filter(filter: &Checked, args: &PurgeArgs) -> String {
    let mut parts = vec![match filter.operation() {
        Some(op) => format!("operation {op}"),
        None => "every operation".to_string(),
    }];
    if let Some(state) = filter.state {
        parts.push(format!("{state:?}").to_lowercase());
    }
    if let Some(d) = args.filter.older_than {
        parts.push(format!("older than {}", human(d.as_millis() as u64)));
    }
    parts.join(", ")
}

/// Asks on stderr, reads one line from stdin: `y` or `yes` confirms; anything else,
/// including the end of input, does not.
fn confirm(question: &str) -> bool {
    eprint!("{question} This cannot be undone. [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    match std::io::stdin().lock().read_line(&mut answer) {
        Ok(_) => matches!(answer.trim().to_lowercase().as_str(), "y" | "yes"),
        Err(_) => false,
    }
}

/// One operation's numbers.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct OpStats {
    pub(crate) reserved: u64,
    pub(crate) completed: u64,
    pub(crate) permanent_errors: u64,
    pub(crate) results_unavailable: u64,
    pub(crate) expired: u64,
    pub(crate) unreadable: u64,
    pub(crate) bytes: u64,
    pub(crate) expiring_soon: u64,
    /// The age of the oldest live reservation, in ms.
    pub(crate) oldest_reservation_ms: u64,
}

impl OpStats {
    /// The columns of `stats` and the status page: reserved, completed, errors (permanent
    /// or result unavailable), expired, unreadable, bytes, expiring soon, oldest reservation.
    pub(crate) fn cells(&self) -> [String; 8] {
        [
            self.reserved.to_string(),
            self.completed.to_string(),
            (self.permanent_errors + self.results_unavailable).to_string(),
            self.expired.to_string(),
            self.unreadable.to_string(),
            self.bytes.to_string(),
            self.expiring_soon.to_string(),
            if self.reserved > 0 {
                human(self.oldest_reservation_ms)
            } else {
                "-".to_string()
            },
        ]
    }
}

/// What one walk of the store found: every operation's numbers, and the oldest live
/// reservations.
pub(crate) struct Survey {
    pub(crate) by_op: BTreeMap<String, OpStats>,
    /// The oldest live reservations, oldest first: at most the number asked for.
    pub(crate) oldest: Vec<Listed>,
    /// The store's clock at the last page, in Unix ms.
    pub(crate) now_ms: u64,
}

impl Survey {
    /// Live reservations, all operations together.
    pub(crate) fn reserved(&self) -> u64 {
        self.by_op.values().map(|s| s.reserved).sum()
    }
}

/// Every operation's numbers and the `keep` oldest live reservations, from one walk of the
/// store.
pub(crate) async fn survey(
    target: &Target,
    soon: Duration,
    keep: usize,
) -> Result<Survey, StoreError> {
    let soon = soon.as_millis() as u64;
    let mut by_op: BTreeMap<String, OpStats> = BTreeMap::new();
    let mut oldest: Vec<Listed> = Vec::new();
    let mut now_ms = 0;
    let everything = Checked::everything();
    let mut walk = Walk::new(target, &everything);
    while let Some((entries, now)) = walk.next().await? {
        now_ms = now;
        for e in entries {
            let op = e.key.as_str().split(':').next().unwrap_or_default();
            let s = by_op.entry(op.to_string()).or_default();
            s.bytes += e.size;
            let Some(r) = &e.record else {
                s.unreadable += 1;
                continue;
            };
            match state_of(r, now) {
                "expired" => s.expired += 1,
                "reserved" => {
                    s.reserved += 1;
                    s.oldest_reservation_ms = s
                        .oldest_reservation_ms
                        .max(now.saturating_sub(r.created_at_ms));
                    if keep > 0 {
                        oldest.push(e.clone());
                    }
                }
                "permanent error" => s.permanent_errors += 1,
                "result unavailable" => s.results_unavailable += 1,
                _ => s.completed += 1,
            }
            if !matches!(r.state, RecordState::Reserved)
                && r.expires_at_ms > now
                && r.expires_at_ms - now <= soon
            {
                s.expiring_soon += 1;
            }
        }
        // Bounded: only the `keep` oldest are kept from page to page.
        oldest.sort_by_key(|e| e.record.as_ref().map_or(u64::MAX, |r| r.created_at_ms));
        oldest.truncate(keep);
    }
    Ok(Survey {
        by_op,
        oldest,
        now_ms,
    })
}

/// What the store itself says about its health.
pub(crate) struct StoreFacts {
    /// Redis: `maxmemory-policy`.
    pub(crate) eviction_policy: Option<String>,
    /// PostgreSQL and MySQL: the table's size on disk.
    pub(crate) table_bytes: Option<u64>,
}

pub(crate) async fn store_facts(target: &Target) -> StoreFacts {
    match target {
        Target::Redis(s) => StoreFacts {
            eviction_policy: Some(s.eviction_policy().await.unwrap_or_else(|e| {
                eprintln!("idemkit: cannot read maxmemory-policy: {e}");
                "unknown".to_string()
            })),
            table_bytes: None,
        },
        Target::Postgres(s) => StoreFacts {
            eviction_policy: None,
            table_bytes: s.table_bytes().await.ok(),
        },
        Target::MySql(s) => StoreFacts {
            eviction_policy: None,
            table_bytes: s.table_bytes().await.ok(),
        },
    }
}

/// `idemkit stats`.
pub(crate) async fn stats(store: &StoreArgs, soon: Duration, json: bool) -> Exit {
    let target = match connect(store).await {
        Ok(t) => t,
        Err(code) => return code,
    };
    let by_op = match survey(&target, soon, 0).await {
        Ok(s) => s.by_op,
        Err(e) => return store_failed(&e),
    };
    let facts = store_facts(&target).await;
    let evicts = facts
        .eviction_policy
        .as_deref()
        .is_some_and(|p| p != "noeviction");
    if json {
        println!(
            "{}",
            serde_json::json!({
                "operations": by_op,
                "eviction_policy": facts.eviction_policy,
                "table_bytes": facts.table_bytes,
                "expiring_within_ms": soon.as_millis() as u64,
            })
        );
    } else {
        println!(
            "{:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>12} {:>15}",
            "OPERATION",
            "RESERVED",
            "COMPLETED",
            "ERRORS",
            "EXPIRED",
            "UNREADABLE",
            "BYTES",
            "EXPIRING",
            "OLDEST RESERVED"
        );
        for (op, s) in &by_op {
            let c = s.cells();
            println!(
                "{:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>12} {:>15}",
                op, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
            );
        }
        println!(
            "expiring: completed records whose retention ends within {}",
            human(soon.as_millis() as u64)
        );
        if let Some(policy) = &facts.eviction_policy {
            println!("eviction policy: {policy}");
        }
        if let Some(bytes) = facts.table_bytes {
            println!("table size: {bytes} bytes");
        }
    }
    if by_op.is_empty() {
        eprintln!("{}", where_we_looked(store, &target));
    }
    if evicts {
        return fail(
            Exit::Check,
            format!(
                "maxmemory-policy is {:?}: a full server evicts reservations and records (every key of ours has a TTL, so volatile-* policies evict them too), and actions run again; set it to noeviction",
                facts.eviction_policy.unwrap_or_default()
            ),
        );
    }
    Exit::Ok
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn store_times_read_as_utc() {
        for (ms, shown) in [
            (0, "1970-01-01 00:00:00 UTC"),
            (951_782_400_000, "2000-02-29 00:00:00 UTC"),
            (1_795_995_123_456, "2026-11-29 23:32:03 UTC"),
            (4_102_444_799_000, "2099-12-31 23:59:59 UTC"),
        ] {
            assert_eq!(super::utc(ms), shown);
        }
    }
}
