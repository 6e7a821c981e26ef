//! The simulation against the real servers, in real time: Redis, PostgreSQL and MySQL (or
//! MariaDB) behind the same fault-injecting wrapper, with the same callers and the same
//! checker. Fewer seeds than in process (a server does not follow paused time, so each run
//! takes its real time), run side by side; a run does not replay exactly, but its seed still
//! names its callers and faults.

use idemkit_sim::{check, run_on};

/// How many seeds each server runs (`IDEMKIT_SIM_SERVER_SEEDS`).
fn seeds() -> u64 {
    std::env::var("IDEMKIT_SIM_SERVER_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(48)
}

/// A namespace no other run on the server uses.
fn namespace(seed: u64) -> String {
    format!("sim{:08x}s{seed}-", fastrand::u32(..))
}

/// How many runs share the server at once: enough to overlap, few enough that the
/// machine's scheduling stays within the checker's real-time slack.
const AT_ONCE: u64 = 6;

async fn all_seeds<S, F>(what: &str, store: F) -> usize
where
    S: idemkit_core::RawStore,
    F: Fn() -> S,
{
    idemkit_sim::quiet_deliberate_panics();
    let mut effects = 0;
    let seeds: Vec<u64> = (0..seeds()).collect();
    let at_once = std::env::var("IDEMKIT_SIM_AT_ONCE")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(AT_ONCE);
    for chunk in seeds.chunks(at_once as usize) {
        let mut runs = Vec::new();
        for &seed in chunk {
            let inner = store();
            runs.push(tokio::spawn(async move {
                let history = run_on(seed, inner, &namespace(seed)).await;
                (seed, check(&history).map_err(|v| (v, history)))
            }));
        }
        for run in runs {
            let (seed, checked) = run.await.expect("a run's task");
            match checked {
                Ok(tally) => effects += tally.effects,
                Err((v, history)) => {
                    let path = std::env::temp_dir().join(format!("idemkit-sim-{what}-{seed}.txt"));
                    std::fs::write(&path, format!("{history:#?}")).expect("the history written");
                    panic!(
                        "{what}: seed {seed} broke a guarantee: {v}\nits history: {}",
                        path.display()
                    );
                }
            }
        }
    }
    effects
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_every_guarantee_under_faults() {
    let url =
        std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // `IDEMKIT_SIM_COALESCE=0` turns the store's batching of concurrent calls off.
    let coalesce = std::env::var("IDEMKIT_SIM_COALESCE").map_or(true, |v| v != "0");
    let store = idemkit_redis::RedisStore::builder()
        .coalesce(coalesce)
        .connect(&url)
        .await;
    if !idemkit_test::require_service(&format!("redis at {url}"), store.is_ok()) {
        return;
    }
    let store = store.unwrap();
    let effects = all_seeds("redis", || store.clone()).await;
    eprintln!("redis: {} seeds, {effects} effects", seeds());
    assert!(effects > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_every_guarantee_under_faults() {
    let url = std::env::var("IDEMKIT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let store = idemkit_postgres::PgStore::builder()
        .schema("idemkit_sim")
        .max_connections(8)
        .connect(&url)
        .await;
    if !idemkit_test::require_service(&format!("postgres at {url}"), store.is_ok()) {
        return;
    }
    let store = store.unwrap();
    store.migrate().await.expect("migrated");
    let effects = all_seeds("postgres", || store.clone()).await;
    eprintln!("postgres: {} seeds, {effects} effects", seeds());
    assert!(effects > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_keeps_every_guarantee_under_faults() {
    let url = std::env::var("IDEMKIT_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let store = idemkit_mysql::MySqlStore::builder()
        .table("idemkit_sim_records")
        .max_connections(8)
        // Waiters re-read the row: at most this late after a completion.
        .recheck(std::time::Duration::from_millis(20))
        .connect(&url)
        .await;
    if !idemkit_test::require_service(&format!("MySQL at {url}"), store.is_ok()) {
        return;
    }
    let store = store.unwrap();
    store.migrate().await.expect("migrated");
    let effects = all_seeds("mysql", || store.clone()).await;
    eprintln!("mysql: {} seeds, {effects} effects", seeds());
    assert!(effects > 0);
}
