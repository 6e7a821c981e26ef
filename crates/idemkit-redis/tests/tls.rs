//! `rediss://`: the store over TLS to a `redis-server` the test starts with `--tls-port` and
//! certificates the test makes (`openssl`). Debian's `redis-server` is built with TLS, so
//! these tests start it whatever `IDEMKIT_REDIS_SERVER` names.
//!
//! What must hold: every phase (reservation, completion, replay, the push that wakes a
//! waiter) works over TLS; a server whose certificate the store does not trust, a server
//! that asks for a client certificate the store does not have, and TLS material given with
//! a plain `redis://` URL all fail at connect, so no action ever runs against them.

mod support;

use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation, Source};
use idemkit_redis::RedisStore;
use idemkit_test::Mailer;
use idemkit_test::tls::TestCerts;
use support::{RedisProcess, free_port};

fn op() -> Operation {
    Operation::new("mail.invoice").unwrap()
}

/// The test's certificates, or a failure under `CI` (a skip elsewhere) without `openssl`.
fn certs() -> Option<TestCerts> {
    let made = TestCerts::make();
    if let Err(e) = &made {
        eprintln!("{e}");
    }
    idemkit_test::require_service("openssl (test certificates)", made.is_ok())
        .then(|| made.unwrap())
}

/// A `redis-server` with a TLS port beside its plain one (the plain one for `redis-cli`'s
/// readiness check); clients on the TLS port must present a certificate when `mutual`.
fn tls_server(certs: &TestCerts, mutual: bool) -> (RedisProcess, u16) {
    let tls_port = free_port();
    let (port, cert, key, ca) = (
        tls_port.to_string(),
        certs.server_cert(),
        certs.server_key(),
        certs.ca(),
    );
    let server = RedisProcess::start_as(
        "redis-server",
        &[
            "--tls-port",
            &port,
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
            "--tls-ca-cert-file",
            ca.to_str().unwrap(),
            "--tls-auth-clients",
            if mutual { "yes" } else { "no" },
        ],
    );
    (server, tls_port)
}

fn prefix() -> String {
    support::prefix()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_phase_works_over_tls_with_the_servers_authority() {
    let Some(certs) = certs() else { return };
    let (server, port) = tls_server(&certs, false);
    let prefix = prefix();
    let store = RedisStore::builder()
        .prefix(prefix.clone())
        .tls_ca_file(certs.ca())
        .connect(&format!("rediss://127.0.0.1:{port}"))
        .await
        .expect("connect over TLS");
    let c = Coordinator::new(store);
    let mailer = Mailer::default();
    let key = Key::new("order-9.invoice").unwrap();

    // A waiter on a reservation held until after it started waiting: woken by the push,
    // which travels over the TLS connection too, long before the lease would end. The
    // owner finishes once the waiter has subscribed to the key's wake-up channel (seen by
    // the server, on its plain port): only the push over TLS can wake it in time.
    let mut waited = tokio::time::Instant::now();
    let (first, second) = support::owner_and_waiter(&c, &key, &mailer, || async {
        support::subscribed(server.port, &prefix).await;
        waited = tokio::time::Instant::now();
    })
    .await;
    assert_eq!(first.source, Source::Fresh);
    assert_eq!(second.source, Source::Replayed);
    assert_eq!(first.value, second.value);
    // Woken by the push, not by the end of a lease renewed every few seconds.
    assert!(
        waited.elapsed() < Duration::from_secs(5),
        "the waiter was not woken by the push ({:?})",
        waited.elapsed()
    );
    // A later delivery replays too: one email in all.
    let third = c
        .call(&op(), &key)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(third.source, Source::Replayed);
    assert_eq!(mailer.sent(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_signed_by_another_authority_is_refused_at_connect() {
    let Some(certs) = certs() else { return };
    let (_server, port) = tls_server(&certs, false);
    let refused = RedisStore::builder()
        .prefix(prefix())
        .tls_ca_file(certs.other_ca())
        .connect(&format!("rediss://127.0.0.1:{port}"))
        .await;
    let e = refused.expect_err("a certificate the store does not trust");
    assert!(
        format!("{e} {e:?}").to_lowercase().contains("certificate"),
        "the error should name the certificate: {e:?}"
    );
    // A configuration to fix, not an outage: nothing a fail-open call would run through.
    assert!(!e.is_unavailable(), "a bad certificate is no outage: {e:?}");
    // The system's roots do not have the test's authority either.
    let refused = RedisStore::builder()
        .prefix(prefix())
        .connect(&format!("rediss://127.0.0.1:{port}"))
        .await;
    assert!(refused.is_err(), "trusted by the system's roots?");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_asks_for_a_client_certificate_gets_it() {
    let Some(certs) = certs() else { return };
    let (_server, port) = tls_server(&certs, true);
    let url = format!("rediss://127.0.0.1:{port}");
    // Without one, the server closes the handshake: the connect fails.
    let without = RedisStore::builder()
        .prefix(prefix())
        .tls_ca_file(certs.ca())
        .connect(&url)
        .await;
    assert!(without.is_err(), "connected without a client certificate");
    // With one (as bytes this time), every phase works.
    let store = RedisStore::builder()
        .prefix(prefix())
        .tls_ca_pem(TestCerts::read(&certs.ca()))
        .tls_client_cert_pem(
            TestCerts::read(&certs.client_cert()),
            TestCerts::read(&certs.client_key()),
        )
        .connect(&url)
        .await
        .expect("connect with a client certificate");
    let c = Coordinator::new(store);
    let mailer = Mailer::default();
    let key = Key::new("k").unwrap();
    for expected in [Source::Fresh, Source::Replayed] {
        let out = c
            .call(&op(), &key)
            .run(|_| mailer.send(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(out.source, expected);
    }
    assert_eq!(mailer.sent(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_material_with_a_plain_url_is_refused_not_sent_in_plain_text() {
    let Some(certs) = certs() else { return };
    let server = RedisProcess::start_as("redis-server", &[]);
    let e = RedisStore::builder()
        .prefix(prefix())
        .tls_ca_file(certs.ca())
        .connect(&server.url())
        .await
        .expect_err("a CA file with redis://");
    assert!(e.to_string().contains("rediss://"), "{e}");
    let e = RedisStore::builder()
        .prefix(prefix())
        .tls_ca_file(certs.ca())
        .connect_cluster([server.url()])
        .await
        .expect_err("a CA file with redis:// nodes");
    assert!(e.to_string().contains("rediss://"), "{e}");
    // A CA file that is not there fails the connect, naming it.
    let e = RedisStore::builder()
        .prefix(prefix())
        .tls_ca_file("/nonexistent/ca.pem")
        .connect("rediss://127.0.0.1:1")
        .await
        .expect_err("a missing CA file");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_runs_every_phase() {
    let Some(certs) = certs() else { return };
    let (cluster, tls_ports) = idemkit_test::redis_server::Cluster::start_tls(&certs);
    let store = RedisStore::builder()
        .prefix(prefix())
        .tls_ca_file(certs.ca())
        .connect_cluster([format!("rediss://127.0.0.1:{}", tls_ports[0])])
        .await
        .expect("connect to the Cluster over TLS");
    let c = Coordinator::new(store);
    let mailer = Mailer::default();
    // Keys on every primary: the client follows the slots to each node's TLS port.
    for i in 0..48 {
        let key = Key::new(format!("order-{i}.invoice")).unwrap();
        for expected in [Source::Fresh, Source::Replayed] {
            let out = c
                .call(&op(), &key)
                .run(|_| mailer.send(Duration::ZERO))
                .await
                .unwrap();
            assert_eq!(out.source, expected);
        }
    }
    assert_eq!(mailer.sent(), 48);
    let held: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|n| idemkit_test::redis_server::dbsize(n.port))
        .collect();
    assert!(
        held.iter().all(|&n| n > 0),
        "every primary holds records: {held:?}"
    );
    // A plain client is refused by the TLS ports: what the store sent went over TLS.
    assert!(
        RedisStore::builder()
            .connect_cluster([format!("redis://127.0.0.1:{}", tls_ports[0])])
            .await
            .is_err()
    );
}
