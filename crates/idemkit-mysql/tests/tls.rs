//! MySQL/MariaDB over TLS: the URL's `ssl-mode` against a MariaDB server of the test's own
//! (`mysql_server`: the machine's server cannot be given certificates at run time) whose
//! certificate, for `127.0.0.1`, the test made.
//!
//! What must hold: `REQUIRED`, `VERIFY_CA` and `VERIFY_IDENTITY` connect over TLS (the
//! server's own `Ssl_version` for the session says so) and every call works; a certificate
//! the store does not trust, or the machine's server without TLS under `REQUIRED`, fails
//! the connect with a configuration error (not an outage), so no action runs against it.

mod support;

use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation, Source};
use idemkit_mysql::MySqlStore;
use idemkit_test::Mailer;
use idemkit_test::mysql_server::MySqlServer;
use idemkit_test::tls::TestCerts;

fn with(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// The session's TLS version as the server reports it (empty: plain text).
async fn tls_version(store: &MySqlStore) -> String {
    let row: (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_version'")
        .fetch_one(store.pool())
        .await
        .expect("Ssl_version");
    row.1
}

async fn runs_once(store: MySqlStore) {
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

fn tls_server() -> Option<(TestCerts, MySqlServer)> {
    let certs = TestCerts::make();
    if !idemkit_test::require_service("openssl (test certificates)", certs.is_ok()) {
        return None;
    }
    let certs = certs.unwrap();
    let server = MySqlServer::start_tls(&certs);
    if let Err(e) = &server {
        eprintln!("{e}");
    }
    if !idemkit_test::require_service("a MariaDB server of the test's own", server.is_ok()) {
        return None;
    }
    Some((certs, server.unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ssl_mode_that_asks_for_tls_gets_it_and_checks_what_it_says() {
    let Some((certs, server)) = tls_server() else {
        return;
    };
    let ca = certs.ca();
    for params in [
        "ssl-mode=REQUIRED".to_string(),
        format!("ssl-mode=VERIFY_CA&ssl-ca={}", ca.display()),
        format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", ca.display()),
    ] {
        let store = MySqlStore::builder()
            .table("idemkit_tls_records")
            .connect(&with(&server.url(), &params))
            .await
            .unwrap_or_else(|e| panic!("{params}: {e:?}"));
        let version = tls_version(&store).await;
        assert!(
            version.starts_with("TLS"),
            "{params}: Ssl_version {version:?}"
        );
        runs_once(store).await;
    }
    // The check can tell: a plain connection reports no version.
    let plain = MySqlStore::builder()
        .table("idemkit_tls_records")
        .connect(&with(&server.url(), "ssl-mode=DISABLED"))
        .await
        .expect("ssl-mode=DISABLED");
    assert_eq!(tls_version(&plain).await, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_a_configuration_error_at_connect() {
    let Some((certs, server)) = tls_server() else {
        return;
    };
    let url = with(
        &server.url(),
        &format!(
            "ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
            certs.other_ca().display()
        ),
    );
    let e = MySqlStore::builder()
        .table("idemkit_tls_records")
        .connect(&url)
        .await
        .expect_err("a certificate signed by another authority");
    assert!(!e.is_unavailable(), "a bad certificate is no outage: {e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssl_mode_required_refuses_a_server_without_tls() {
    // The machine's server has no certificate (have_ssl DISABLED); one that has is asked to
    // refuse plain connections' TLS, and REQUIRED must then connect.
    let Some(store) = support::store().await else {
        return;
    };
    let (_, have_ssl): (String, String) = sqlx::query_as("SHOW VARIABLES LIKE 'have_ssl'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    if have_ssl == "YES" {
        let tls = MySqlStore::builder()
            .table("idemkit_test_records")
            .connect(&with(&support::url(), "ssl-mode=REQUIRED"))
            .await
            .expect("the machine's server has TLS");
        assert!(tls_version(&tls).await.starts_with("TLS"));
        return;
    }
    let e = MySqlStore::builder()
        .table("idemkit_test_records")
        .connect(&with(&support::url(), "ssl-mode=REQUIRED"))
        .await
        .expect_err("TLS required, the server has none");
    assert!(!e.is_unavailable(), "no TLS is no outage: {e:?}");
}
