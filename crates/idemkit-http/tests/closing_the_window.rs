//! The end-to-end example across two services (`examples/closing_the_window.rs`): a consumer
//! process killed after the mail service accepted its send, then the redelivery. With the
//! downstream key as `Idempotency-Key`, the mail service sends one email; with the fencing
//! token (which changes on every attempt) it sends two. Both counts come from one run.

fn count(out: &str, line: &str, field: &str) -> u64 {
    out.lines()
        .find(|l| l.starts_with(line))
        .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix(field)))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {line} {field} in:\n{out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receiver_closes_the_last_window_with_the_downstream_key() {
    let url =
        std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let up = idemkit_redis::RedisStore::connect(&url).await.is_ok();
    if !idemkit_test::require_service(&format!("redis at {url}"), up) {
        return;
    }
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(idemkit_test::example_binary("closing_the_window"))
            .env("REDIS_URL", url)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The first delivery really reached the mail service, and was then killed, both times.
    assert_eq!(
        text.matches("demo: killed the consumer").count(),
        2,
        "{text}"
    );
    assert_eq!(count(&text, "downstream-key", "deliveries="), 2);
    assert_eq!(count(&text, "downstream-key", "sent="), 1, "{text}");
    assert_eq!(count(&text, "fencing-token", "deliveries="), 2);
    assert_eq!(count(&text, "fencing-token", "sent="), 2, "{text}");
}
