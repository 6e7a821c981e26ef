//! idemkit's metrics, exported to Prometheus with `metrics-exporter-prometheus`: the recipe
//! of docs/metrics.md. Runs a few calls of each kind on a MemoryStore (a miss, its replay,
//! a waiter, a rejection, a reused key), then prints what Prometheus would scrape; with
//! `--serve ADDR` it keeps serving it at `http://ADDR/metrics` until Ctrl-C.
//!
//! ```text
//! cargo run -p idemkit-core --example prometheus
//! cargo run -p idemkit-core --example prometheus -- --serve 127.0.0.1:9000
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use idemkit_core::observe::PHASE_SECONDS;
use idemkit_core::{Coordinator, Fingerprint, InFlight, Key, MemoryStore, Operation};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// Phase latencies as a histogram with these buckets (seconds), so that dashboards can take
/// quantiles across instances (`histogram_quantile`); a summary's quantiles cannot be summed.
const BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let serve: Option<SocketAddr> = match std::env::args().nth(1).as_deref() {
        Some("--serve") => Some(std::env::args().nth(2).ok_or("--serve ADDR")?.parse()?),
        Some(other) => return Err(format!("unknown argument {other}").into()),
        None => None,
    };
    // Install the recorder before the first call: each operation registers its metric
    // handles on its first call, with the recorder installed then.
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(PHASE_SECONDS.into()), BUCKETS)?;
    let handle = match serve {
        Some(addr) => {
            let builder = builder.with_http_listener(addr);
            let (recorder, exporter) = builder.build()?;
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder)?;
            tokio::spawn(exporter);
            handle
        }
        None => builder.install_recorder()?,
    };

    let coordinator = Coordinator::new(MemoryStore::new());
    let op = Operation::new("mail.invoice")?;
    let mail = |receipt: &'static str, delay: Duration| async move {
        tokio::time::sleep(delay).await;
        Ok::<_, std::io::Error>(receipt.to_string())
    };

    // A miss, then a hit.
    let key = Key::new("order-9.invoice")?;
    coordinator
        .call(&op, &key)
        .run(|_| mail("em_1", Duration::ZERO))
        .await?;
    coordinator
        .call(&op, &key)
        .run(|_| mail("em_2", Duration::ZERO))
        .await?;
    // A waiter, and a rejection, while another owner runs.
    let busy = Key::new("order-10.invoice")?;
    let (first, waiter, rejected) = tokio::join!(
        coordinator
            .call(&op, &busy)
            .run(|_| mail("em_3", Duration::from_millis(200))),
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            coordinator
                .call(&op, &busy)
                .run(|_| mail("em_4", Duration::ZERO))
                .await
        },
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            coordinator
                .call(&op, &busy)
                .in_flight(InFlight::Reject)
                .run(|_| mail("em_5", Duration::ZERO))
                .await
        },
    );
    assert_eq!(
        first?.value, waiter?.value,
        "the waiter got the first result"
    );
    assert!(rejected.is_err(), "rejected while in flight");
    // A key reused for a different request.
    let reused = Key::new("order-11.invoice")?;
    coordinator
        .call(&op, &reused)
        .fingerprint(Fingerprint::of(b"amount=10"))
        .run(|_| mail("em_6", Duration::ZERO))
        .await?;
    let refused = coordinator
        .call(&op, &reused)
        .fingerprint(Fingerprint::of(b"amount=99"))
        .run(|_| mail("em_7", Duration::ZERO))
        .await;
    assert!(refused.is_err(), "a reused key is refused");

    print!("{}", handle.render());
    if let Some(addr) = serve {
        eprintln!("serving http://{addr}/metrics; Ctrl-C to stop");
        tokio::signal::ctrl_c().await?;
    }
    Ok(())
}
