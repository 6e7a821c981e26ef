//! The layer with tower-test mocks (the inner service runs once per key), and with apalis on
//! its Redis backend (two workers, one job pushed twice, one effect).
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Disposition, InFlight, Key, MemoryStore, Operation};
use idemkit_tower::{BoxError, IdempotencyLayer, disposition};
use tower::{Layer as _, Service, ServiceExt};

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Invoice {
    order: String,
}

fn invoice(order: &str) -> Invoice {
    Invoice {
        order: order.into(),
    }
}

fn layer<S: idemkit_core::Store>(
    store: S,
) -> IdempotencyLayer<S, impl Fn(&Invoice) -> Result<Key, idemkit_core::KeyError> + Clone> {
    IdempotencyLayer::new(
        Coordinator::new(store),
        Operation::new("mail.invoice").unwrap(),
        |job: &Invoice| Key::compose([job.order.as_str(), "invoice"]),
    )
}

#[tokio::test]
async fn the_inner_service_runs_once_per_key() {
    let (mock, mut handle) = tower_test::mock::pair::<Invoice, String>();
    let mut svc = layer(MemoryStore::new()).layer(mock);
    handle.allow(10);

    let first = tokio::spawn(svc.ready().await.unwrap().call(invoice("order-9")));
    let (job, reply) = handle
        .next_request()
        .await
        .expect("the first job reaches the handler");
    assert_eq!(job, invoice("order-9"));
    reply.send_response("em_1".to_string());
    assert_eq!(first.await.unwrap().unwrap(), "em_1");

    // The same effect again: answered from the store; the mock is never asked (it would
    // wait for a response forever).
    let again = tokio::time::timeout(
        Duration::from_secs(5),
        svc.ready().await.unwrap().call(invoice("order-9")),
    )
    .await
    .expect("replayed without the handler")
    .unwrap();
    assert_eq!(again, "em_1");

    // Another effect runs.
    let other = tokio::spawn(svc.ready().await.unwrap().call(invoice("order-10")));
    let (job, reply) = handle.next_request().await.unwrap();
    assert_eq!(job, invoice("order-10"));
    reply.send_response("em_2".to_string());
    assert_eq!(other.await.unwrap().unwrap(), "em_2");
}

/// Before: `in_flight` and `ttl` on a layer that had been cloned panicked ("configured
/// before it is cloned"). Now each copy keeps its own options, and the service gives its
/// inner service back as tower's services do.
#[tokio::test]
async fn a_cloned_layer_takes_options_and_the_service_gives_back_its_inner_service() {
    let base = layer(MemoryStore::new());
    let copy = base.clone();
    let rejecting = copy
        .in_flight(InFlight::Reject)
        .ttl(Duration::from_secs(60));
    let debug = format!("{rejecting:?}");
    assert!(debug.contains("Reject"), "{debug}");
    assert!(
        !format!("{base:?}").contains("Reject"),
        "the original is unchanged"
    );

    let inner =
        tower::service_fn(
            |job: Invoice| async move { Ok::<_, BoxError>(format!("em_{}", job.order)) },
        );
    let mut svc: idemkit_tower::Idempotency<_, _, _> = rejecting.layer(inner);
    let _: &_ = svc.get_ref();
    let _: &mut _ = svc.get_mut();
    let future: idemkit_tower::ResponseFuture<String> =
        svc.ready().await.unwrap().call(invoice("order-9"));
    assert_eq!(future.await.unwrap(), "em_order-9");
    let mut inner = svc.into_inner();
    assert_eq!(inner.call(invoice("x")).await.unwrap(), "em_x");
}

#[tokio::test]
async fn a_failing_handler_releases_its_key_and_its_error_is_returned_as_is() {
    let (mock, mut handle) = tower_test::mock::pair::<Invoice, String>();
    let mut svc = layer(MemoryStore::new()).layer(mock);
    handle.allow(10);
    let first = tokio::spawn(svc.ready().await.unwrap().call(invoice("order-1")));
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_error(std::io::Error::other("smtp down"));
    let e = first.await.unwrap().unwrap_err();
    assert_eq!(e.to_string(), "smtp down");
    assert_eq!(disposition(&e), Disposition::Retry { after: None });
    // The retry runs the handler again.
    let retry = tokio::spawn(svc.ready().await.unwrap().call(invoice("order-1")));
    let (_, reply) = handle
        .next_request()
        .await
        .expect("the retry reaches the handler");
    reply.send_response("em_1".to_string());
    assert_eq!(retry.await.unwrap().unwrap(), "em_1");
}

/// Issue 20, item 2's audit for this layer: a handler that panics releases its key (the
/// panic goes on to the job framework, which retries the job): the retry runs at once in
/// reject mode instead of finding the key in flight for the whole lease.
#[tokio::test]
async fn a_panicking_handler_releases_its_key() {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let inner = tower::service_fn(move |job: Invoice| {
        let n = r.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                panic!("the template cannot render {}", job.order);
            }
            Ok::<_, BoxError>("em_1".to_string())
        }
    });
    let svc = layer(MemoryStore::new())
        .in_flight(InFlight::Reject)
        .layer(inner);
    let first = tokio::spawn(svc.clone().oneshot(invoice("order-1")));
    assert!(
        first.await.unwrap_err().is_panic(),
        "the panic reaches the caller"
    );
    let retry = svc
        .oneshot(invoice("order-1"))
        .await
        .expect("the retry runs");
    assert_eq!(retry, "em_1");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_job_without_a_valid_key_never_reaches_the_handler() {
    let (mock, mut handle) = tower_test::mock::pair::<Invoice, String>();
    let mut svc = layer(MemoryStore::new()).layer(mock);
    handle.allow(10);
    let e = svc
        .ready()
        .await
        .unwrap()
        .call(invoice(""))
        .await
        .unwrap_err();
    assert_eq!(disposition(&e), Disposition::DeadLetter);
    assert!(e.to_string().contains("invalid idempotency key"), "{e}");
    assert!(
        tokio::time::timeout(Duration::from_millis(100), handle.next_request())
            .await
            .is_err(),
        "the handler was not called"
    );
}

#[tokio::test]
async fn a_concurrent_duplicate_in_reject_mode_fails_with_in_flight() {
    let (mock, mut handle) = tower_test::mock::pair::<Invoice, String>();
    let mut svc = layer(MemoryStore::new())
        .in_flight(InFlight::Reject)
        .layer(mock);
    handle.allow(10);
    let first = tokio::spawn(svc.ready().await.unwrap().call(invoice("order-2")));
    let (_, reply) = handle.next_request().await.unwrap();
    let e: BoxError = svc
        .ready()
        .await
        .unwrap()
        .call(invoice("order-2"))
        .await
        .unwrap_err();
    assert!(
        matches!(disposition(&e), Disposition::Retry { after: Some(_) }),
        "{e}"
    );
    reply.send_response("em_2".to_string());
    assert_eq!(first.await.unwrap().unwrap(), "em_2");
}

mod apalis_redis_backend {
    use super::*;
    use apalis::prelude::*;
    use apalis_redis::RedisStorage;
    use idemkit_redis::RedisStore;

    fn redis_url() -> String {
        std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
    }

    /// Two apalis workers on one Redis queue; the same invoice job pushed twice (a
    /// producer's retry). The handler mails (counts), then takes 300 ms, so both workers
    /// hold a copy at once. Returns the number of mails.
    async fn two_workers_one_job_pushed_twice(protected: bool) -> u32 {
        let queue = format!("idemkit-test-{:016x}", fastrand::u64(..));
        let conn = apalis_redis::connect(redis_url())
            .await
            .expect("redis (scripts/test starts it)");
        let config = apalis_redis::Config::default().queue(&queue);
        let mut storage = RedisStorage::<Invoice, _>::new(conn.clone()).with_config(config.clone());
        storage.push(invoice("order-9")).await.unwrap();
        storage.push(invoice("order-9")).await.unwrap();

        let mails = Arc::new(AtomicU32::new(0));
        let store = RedisStore::builder()
            .prefix(queue.clone())
            .connect(&redis_url())
            .await
            .unwrap();
        let mut workers = Vec::new();
        for name in ["w1", "w2"] {
            let mails = mails.clone();
            let handler = move |job: Invoice| {
                let mails = mails.clone();
                async move {
                    mails.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, BoxDynError>(format!("em_{}", job.order))
                }
            };
            let backend = RedisStorage::<Invoice, _>::new(conn.clone()).with_config(config.clone());
            let key = |task: &Task<Invoice>| Key::compose([task.args.order.as_str(), "invoice"]);
            let idem = IdempotencyLayer::new(
                Coordinator::new(store.clone()),
                Operation::new("mail.invoice").unwrap(),
                key,
            );
            let stop = async {
                tokio::time::sleep(Duration::from_secs(4)).await;
                Ok::<_, std::io::Error>(())
            };
            if protected {
                let w = WorkerBuilder::new(format!("{queue}-{name}"))
                    .backend(backend)
                    .layer(idem)
                    .build(handler);
                workers.push(tokio::spawn(w.run_until(stop)));
            } else {
                let w = WorkerBuilder::new(format!("{queue}-{name}"))
                    .backend(backend)
                    .build(handler);
                workers.push(tokio::spawn(w.run_until(stop)));
            }
        }
        for w in workers {
            let _ = w.await.unwrap();
        }
        mails.load(Ordering::SeqCst)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_apalis_workers_and_a_job_pushed_twice_mail_once() {
        let (with, without) = tokio::join!(
            two_workers_one_job_pushed_twice(true),
            two_workers_one_job_pushed_twice(false)
        );
        eprintln!("mails with idemkit {with}, without {without}");
        assert_eq!(with, 1, "with the layer: one mail");
        assert_eq!(without, 2, "without: both copies mail");
    }
}
