//! PostgreSQL over TLS: the URL's `sslmode` on the machine's server (which has `ssl` on) and
//! on a server of the test's own whose certificate (for `127.0.0.1`) the test made, so that
//! `verify-full` has a certificate authority to check against.
//!
//! What must hold: `require` and `verify-*` connect over TLS (the server's own view,
//! `pg_stat_ssl`, says so) and every call works; a certificate the store does not trust, or
//! a server without TLS under `require`, fails the connect with a configuration error (not
//! an outage), so no action ever runs against it.

mod support;

use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation, Source};
use idemkit_postgres::PgStore;
use idemkit_test::Mailer;
use idemkit_test::pg_server::PgServer;
use idemkit_test::tls::TestCerts;

fn with(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// Whether the store's connections are TLS, as the server sees its own session.
async fn over_tls(store: &PgStore) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .expect("pg_stat_ssl")
}

/// A miss then a replay through the store: one email.
async fn runs_once(store: PgStore) {
    store.migrate().await.expect("migrate");
    let c = Coordinator::new(store);
    let mailer = Mailer::default();
    let op = Operation::new("mail.invoice").unwrap();
    let key = Key::new(format!("tls-{:016x}", fastrand::u64(..))).unwrap();
    for expected in [Source::Fresh, Source::Replayed] {
        let out = c
            .call(&op, &key)
            .run(|_| mailer.send(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(out.source, expected);
    }
    assert_eq!(mailer.sent(), 1);
}

fn builder() -> idemkit_postgres::PgStoreBuilder {
    PgStore::builder().schema("idemkit_test").table("records")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_talks_tls_to_the_machines_server_and_disable_does_not() {
    if support::pool().await.is_none() {
        return;
    }
    let store = builder()
        .connect(&with(&support::url(), "sslmode=require"))
        .await
        .expect("sslmode=require (the machine's PostgreSQL has ssl on)");
    assert!(over_tls(&store).await, "sslmode=require in plain text");
    runs_once(store).await;
    // The check can tell: a plain connection says so.
    let plain = builder()
        .connect(&with(&support::url(), "sslmode=disable"))
        .await
        .expect("sslmode=disable");
    assert!(!over_tls(&plain).await);
}

/// The test's certificates and a server of its own serving them, or a failure under `CI`.
fn tls_server() -> Option<(TestCerts, PgServer)> {
    let certs = TestCerts::make();
    if !idemkit_test::require_service("openssl (test certificates)", certs.is_ok()) {
        return None;
    }
    let certs = certs.unwrap();
    let server = PgServer::start_tls(&certs);
    if let Err(e) = &server {
        eprintln!("{e}");
    }
    if !idemkit_test::require_service("a PostgreSQL server of the test's own", server.is_ok()) {
        return None;
    }
    Some((certs, server.unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_and_verify_ca_check_the_servers_certificate() {
    let Some((certs, server)) = tls_server() else {
        return;
    };
    for mode in ["verify-full", "verify-ca"] {
        let url = with(
            &server.url(),
            &format!("sslmode={mode}&sslrootcert={}", certs.ca().display()),
        );
        let store = builder()
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("sslmode={mode}: {e:?}"));
        assert!(over_tls(&store).await);
        runs_once(store).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_a_configuration_error_at_connect() {
    let Some((certs, server)) = tls_server() else {
        return;
    };
    let url = with(
        &server.url(),
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            certs.other_ca().display()
        ),
    );
    let e = builder()
        .connect(&url)
        .await
        .expect_err("a certificate signed by another authority");
    assert!(!e.is_unavailable(), "a bad certificate is no outage: {e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_refuses_a_server_without_tls() {
    let server = match PgServer::start() {
        Ok(s) => s,
        Err(e) => {
            idemkit_test::require_service(&e, false);
            return;
        }
    };
    let e = builder()
        .connect(&with(&server.url(), "sslmode=require"))
        .await
        .expect_err("TLS required, the server has none");
    assert!(!e.is_unavailable(), "no TLS is no outage: {e:?}");
    // Its default, `prefer`, falls back to plain text there.
    let plain = builder()
        .connect(&server.url())
        .await
        .expect("sslmode=prefer");
    assert!(!over_tls(&plain).await);
}
