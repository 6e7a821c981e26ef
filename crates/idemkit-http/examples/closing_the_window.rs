//! Closing the last window, across two services: a consumer mails an invoice through a mail
//! service, and dies after the mail service accepted the send but before its own result was
//! stored. No reservation can prevent the redelivery from sending again; the receiver can
//! answer it with its first answer, if the consumer passes a key that is the same on every
//! attempt: the downstream key.
//!
//! ```text
//! # Redis on 127.0.0.1:6379 (or REDIS_URL)
//! cargo run -p idemkit-http --example closing_the_window      # both runs, and the table
//! ```
//!
//! - The mail service is an axum app behind idemkit's HTTP layer (`Idempotency-Key`), keys on
//!   Redis. It counts the emails it really sends.
//! - The consumer is a process of its own. It handles message `order-9` under idemkit (key
//!   `order-9.invoice`, lease 1 s) and sends the invoice with `Idempotency-Key: <downstream
//!   key>`. The demo kills the first delivery's process (SIGKILL) right after the mail
//!   service answered, before it completes. The second delivery (the redelivery) runs once
//!   the dead owner's lease ends.
//! - The same run passes the fencing token as the key instead. It changes on every attempt,
//!   so the mail service sends twice.
//!
//! Modes: no argument (the demo), `mail-service`, and `consumer` (a child process of the
//! demo). The last two lines of the demo are `downstream-key sent=N deliveries=M` and
//! `fencing-token sent=N deliveries=M`, for the test.

use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use http::StatusCode;
use idemkit::http::{IdempotencyInfo, IdempotencyLayer};
use idemkit::redis::RedisStore;
use idemkit::{Coordinator, Key, Operation, Policy};

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The mail service: `POST /emails` sends (counts) one email per new `Idempotency-Key`;
/// `GET /sent` is the count. Returns its base URL.
async fn mail_service(
    prefix: &str,
) -> Result<(String, Arc<AtomicU64>), Box<dyn std::error::Error>> {
    let store = RedisStore::builder()
        .prefix(prefix)
        .connect(&redis_url())
        .await?;
    let idempotency =
        IdempotencyLayer::builder(Coordinator::new(store), Operation::new("mail.send")?)
            .global_scope("mail-service")?
            .required(true)
            .build()?;
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    let app = Router::new()
        .route(
            "/emails",
            post(move |info: IdempotencyInfo, body: String| {
                let counter = counter.clone();
                async move {
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    eprintln!("mail service: sent email em_{n} ({body}), key {}", info.key);
                    (StatusCode::CREATED, format!("em_{n}"))
                }
            }),
        )
        .layer(idempotency)
        .route(
            "/sent",
            get({
                let sent = sent.clone();
                move || async move { sent.load(Ordering::SeqCst).to_string() }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((base, sent))
}

/// One delivery of message `order-9`: mail its invoice under idemkit. `key_kind` is
/// `downstream-key` or `fencing-token`; with `crash`, the process exits as soon as the mail
/// service answered, before idemkit stores the result.
async fn consumer(
    prefix: &str,
    mail: &str,
    key_kind: &str,
    crash: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let store = RedisStore::builder()
        .prefix(prefix)
        .connect(&redis_url())
        .await?;
    let coordinator = Coordinator::builder(store)
        .policy(Policy::new().lease(Duration::from_secs(1)))
        .build();
    let (op, key) = (
        Operation::new("mail.invoice")?,
        Key::new("order-9.invoice")?,
    );
    let http = reqwest::Client::new();
    let key_kind = key_kind.to_string();
    let receipt = coordinator
        .call(&op, &key)
        .run(|attempt| async move {
            let idempotency_key = match key_kind.as_str() {
                "downstream-key" => attempt.downstream_key().expect("protected").into_string(),
                _ => attempt
                    .fencing_token()
                    .expect("protected")
                    .get()
                    .to_string(),
            };
            let answer = http
                .post(format!("{mail}/emails"))
                // The draft's form, a structured-field string (a bare number is not a key).
                .header("idempotency-key", format!("\"{idempotency_key}\""))
                .body("invoice for order-9")
                .send()
                .await
                .map_err(std::io::Error::other)?;
            let receipt = answer.text().await.map_err(std::io::Error::other)?;
            println!("consumer: mail service answered {receipt} for key {idempotency_key}");
            if crash {
                // The last window: the send happened, the result is not stored yet. The demo
                // kills this process (SIGKILL) as soon as it reads this line.
                println!("consumer: killed here, before the result is stored");
                std::future::pending::<()>().await;
            }
            Ok::<_, std::io::Error>(receipt)
        })
        .await?;
    println!(
        "consumer: done, receipt {} ({:?})",
        receipt.value, receipt.source
    );
    Ok(())
}

/// Both runs: each with its own prefixes and its own mail service.
async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    let run_id = format!("{:x}", (std::process::id() as u64 * 1_000_003) ^ nanos());
    let mut rows = Vec::new();
    for key_kind in ["downstream-key", "fencing-token"] {
        let (mail, sent) =
            mail_service(&format!("idemkit-window-mail-{run_id}-{key_kind}")).await?;
        let consumer_prefix = format!("idemkit-window-consumer-{run_id}-{key_kind}");
        let mut deliveries = 0;
        for crash in [true, false] {
            deliveries += 1;
            let mut cmd = Command::new(&exe);
            cmd.args(["consumer", &consumer_prefix, &mail, key_kind]);
            if crash {
                cmd.arg("--crash");
            }
            let ok = tokio::task::spawn_blocking(move || run_consumer(cmd, crash)).await??;
            if !ok {
                return Err("the consumer did not end as expected".into());
            }
        }
        rows.push((key_kind, deliveries, sent.load(Ordering::SeqCst)));
    }
    println!(
        "\nthe consumer dies after the mail service accepted the send; the message is redelivered"
    );
    println!(
        "{:<36} {:>10} {:>13}",
        "Idempotency-Key passed", "deliveries", "emails sent"
    );
    for (kind, deliveries, sent) in &rows {
        let label = match *kind {
            "downstream-key" => "attempt.downstream_key()",
            _ => "attempt.fencing_token()",
        };
        println!("{label:<36} {deliveries:>10} {sent:>13}");
    }
    for (kind, deliveries, sent) in &rows {
        println!("{kind} sent={sent} deliveries={deliveries}");
    }
    Ok(())
}

/// Runs one consumer, echoing its lines. With `crash`, kills it (SIGKILL) once it says the
/// mail service answered: it never stores its result. Whether it ended as expected.
fn run_consumer(mut cmd: Command, crash: bool) -> std::io::Result<bool> {
    use std::io::BufRead as _;
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn()?;
    let stdout = child.stdout.take().expect("piped");
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if crash && line.contains("killed here") {
            child.kill()?;
            println!("demo: killed the consumer (SIGKILL); the message is redelivered");
            break;
        }
    }
    let status = child.wait()?;
    Ok(if crash {
        status.code().is_none()
    } else {
        status.success()
    })
}

fn nanos() -> u64 {
    #[allow(clippy::disallowed_methods)] // a run id, not a deadline
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        None => demo().await,
        Some("consumer") if args.len() >= 4 => {
            consumer(&args[1], &args[2], &args[3], args.get(4).is_some_and(|a| a == "--crash"))
                .await
        }
        Some("mail-service") => match mail_service("idemkit-window-mail").await {
            Ok((base, _)) => {
                println!("mail service on {base}");
                let _ = tokio::signal::ctrl_c().await;
                Ok(())
            }
            Err(e) => Err(e),
        },
        _ => Err("usage: closing_the_window [mail-service | consumer PREFIX MAIL_URL downstream-key|fencing-token [--crash]]".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("closing_the_window: {e}");
            ExitCode::FAILURE
        }
    }
}
