//! A database restart in the middle of a handler, on a PostgreSQL server this test owns
//! (initdb in a temporary directory, on a free port): the open transaction fails cleanly,
//! nothing half-written survives, and the next delivery succeeds.

mod support;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use idemkit_core::{Coordinator, Error, Key, Operation, StoreErrorKind};
use idemkit_postgres::{Inbox, PgStore, Seen};
use idemkit_test::Mailer;

/// The newest PostgreSQL server binaries installed (Debian's layout), or `PG_BIN`.
fn bin() -> Option<std::path::PathBuf> {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return Some(dir.into());
    }
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort();
    let dir = std::path::PathBuf::from(format!("/usr/lib/postgresql/{}/bin", versions.pop()?));
    dir.join("initdb").exists().then_some(dir)
}

struct PgProcess {
    dir: PathBuf,
    port: u16,
}

/// Runs a PostgreSQL tool as the `postgres` user when we are root (the server refuses root).
fn pg(tool: &str, args: &[&str]) -> bool {
    let Some(bin) = bin() else { return false };
    let tool = bin.join(tool);
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false);
    let status = if root {
        Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(&tool)
            .args(args)
            .status()
    } else {
        Command::new(&tool).args(args).status()
    };
    status.map(|s| s.success()).unwrap_or(false)
}

impl PgProcess {
    fn start() -> Option<Self> {
        if bin().is_none() {
            idemkit_test::require_service(
                "PostgreSQL server binaries (/usr/lib/postgresql/<version>/bin, or PG_BIN)",
                false,
            );
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("idemkit-pg-{port}-{:x}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = Command::new("chown")
            .args(["postgres:postgres", dir.to_str().unwrap()])
            .status();
        let data = dir.join("data");
        let ok = pg(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        let p = PgProcess { dir, port };
        let ok = ok && p.ctl("start");
        idemkit_test::require_service("a PostgreSQL server of the test's own (initdb, pg_ctl)", ok)
            .then_some(p)
    }

    fn ctl(&self, what: &str) -> bool {
        let data = self.dir.join("data");
        let log = self.dir.join("log");
        let opts = format!("-p {} -k {} -c fsync=off", self.port, self.dir.display());
        match what {
            "start" => pg(
                "pg_ctl",
                &[
                    "-D",
                    data.to_str().unwrap(),
                    "-o",
                    &opts,
                    "-l",
                    log.to_str().unwrap(),
                    "-w",
                    "start",
                ],
            ),
            // A crash, not a clean shutdown: no checkpoint, recovery on start.
            "crash" => pg(
                "pg_ctl",
                &[
                    "-D",
                    data.to_str().unwrap(),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
            ),
            _ => unreachable!(),
        }
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PgProcess {
    fn drop(&mut self) {
        let _ = self.ctl("crash");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_transaction_leaves_nothing_half_written_and_the_next_delivery_succeeds() {
    let Some(server) = PgProcess::start() else {
        return;
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .test_before_acquire(true)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&server.url())
        .await
        .unwrap();
    support::ledger(&pool).await;
    let store = PgStore::new(pool.clone());
    store.migrate().await.unwrap();
    let inbox = Inbox::new();
    inbox.migrate(&pool).await.unwrap();
    let keys = Coordinator::new(store.clone());
    let (op, key) = (
        Operation::new("mail.invoice").unwrap(),
        Key::new("order-1.invoice").unwrap(),
    );
    let mailer = Mailer::default();

    // Delivery 1: inbox row and ledger row written, then the server crashes before the
    // commit.
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        inbox.claim(&mut tx, "billing", "m-1").await.unwrap(),
        Seen::New
    );
    sqlx::query("INSERT INTO idemkit_test.ledger (order_id) VALUES ('order-1')")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(server.ctl("crash"));
    // While it is down, the key fails closed: the email is not sent unprotected.
    let down = keys
        .call(&op, &key)
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert!(
        matches!(&down, Err(Error::Store { source, .. }) if source.kind() == StoreErrorKind::Unavailable),
        "{down:?}"
    );
    assert!(server.ctl("start"));
    assert!(
        tx.commit().await.is_err(),
        "the commit on a crashed server must fail"
    );

    // Nothing half-written survived.
    assert_eq!(support::ledger_rows(&pool, "order-1").await, 0);
    let inbox_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM public.idemkit_inbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(inbox_rows, 0);

    // Delivery 2 succeeds: one row, one email.
    let done = inbox
        .deliver(
            &pool,
            "billing",
            "m-1",
            |conn| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO idemkit_test.ledger (order_id) VALUES ('order-1')")
                        .execute(conn)
                        .await
                        .map(drop)
                })
            },
            keys.call(&op, &key),
            |_| async { Ok::<_, sqlx::Error>(mailer.send(Duration::ZERO).await.unwrap()) },
        )
        .await
        .unwrap();
    assert_eq!(done.seen, Seen::New);
    assert_eq!(support::ledger_rows(&pool, "order-1").await, 1);
    assert_eq!(mailer.sent(), 1);
}
