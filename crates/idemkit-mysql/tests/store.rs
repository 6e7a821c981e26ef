//! MySqlStore beyond the conformance suite: a missing table, names, a server that is down,
//! fencing tokens after a record written by hand far ahead of the clock and its purge, and
//! many callers of one key at once.

mod support;

use std::time::Duration;

use idemkit_core::{
    BeginRequest, Claim, FencingToken, OwnerToken, RawStore, Record, RecordState, Store,
    StoreErrorKind,
};
use idemkit_mysql::MySqlStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_an_error_that_names_the_migration() {
    let Some(store) = support::store().await else {
        return;
    };
    let unmigrated = MySqlStore::builder()
        .table(&format!("idemkit_missing_{:x}", fastrand::u32(..)))
        .build(store.pool().clone())
        .unwrap();
    let key = idemkit_test::unique_key("missing");
    let e = unmigrated
        .begin(&BeginRequest::new(
            &key,
            OwnerToken::random(),
            Duration::from_secs(5),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Rejected, "{e}");
    assert!(e.to_string().contains("MySqlStore::migrate()"), "{e}");
}

#[tokio::test]
async fn invalid_names_and_an_unreachable_server_are_typed_errors() {
    for bad in ["", "Keys", "1keys", "keys;drop", &"k".repeat(49)] {
        let e = MySqlStore::builder()
            .table(bad)
            .connect("mysql://root@127.0.0.1:1/test")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Other, "{bad:?}: {e}");
    }
    let e = MySqlStore::builder()
        .connect("mysql://root@127.0.0.1:1/test")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
}

/// A token written by hand far ahead of the server's clock: the next reservation's is above
/// it, after the row expired, after it was released, and after it was purged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_stay_above_a_hand_written_one_through_release_and_purge() {
    let Some(store) = support::store().await else {
        return;
    };
    let key = idemkit_test::unique_key("hand-written");
    // Ten years of microseconds ahead of the server's clock.
    let now_us: i64 = sqlx::query_scalar("SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let written = FencingToken::new(now_us as u64 + 10 * 365 * 86_400 * 1_000_000);
    let record = Record {
        state: RecordState::Reserved,
        owner: OwnerToken::random(),
        fencing: written,
        fingerprint: None,
        created_at_ms: 0,
        expires_at_ms: 0,
        holder: None,
        lease_ms: None,
    };
    store
        .put_raw(&key, record.encode().into(), Duration::from_millis(50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut last = written;
    for step in ["after expiry", "after release", "after purge"] {
        let req = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(5));
        let ownership = match store.begin(&req).await.unwrap() {
            Claim::Reserved { ownership, .. } => ownership,
            other => panic!("{step}: {other:?}"),
        };
        assert!(
            ownership.fencing > last,
            "{step}: the token went back: {:?} after {last:?}",
            ownership.fencing
        );
        last = ownership.fencing;
        match step {
            "after expiry" => store.release(&key, &ownership).await.unwrap(),
            "after release" => assert!(store.purge(&key).await.unwrap()),
            _ => {}
        }
    }
}

/// 32 callers of one fresh key at once: one reservation, the others see it in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_many_concurrent_callers_reserves() {
    let Some(store) = support::store().await else {
        return;
    };
    let key = idemkit_test::unique_key("race");
    let calls: Vec<_> = (0..32)
        .map(|_| {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move {
                store
                    .begin(&BeginRequest::new(
                        &key,
                        OwnerToken::random(),
                        Duration::from_secs(5),
                    ))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut reserved = 0;
    for call in calls {
        match call.await.unwrap() {
            Claim::Reserved { .. } => reserved += 1,
            Claim::InFlight { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(reserved, 1);
}

/// A record written by hand with a token the store cannot answer (above 2^62 - 1) is refused
/// before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_too_large_to_keep_is_refused() {
    let Some(store) = support::store().await else {
        return;
    };
    let key = idemkit_test::unique_key("huge-token");
    let record = Record {
        state: RecordState::Reserved,
        owner: OwnerToken::random(),
        fencing: FencingToken::new(1 << 62),
        fingerprint: None,
        created_at_ms: 0,
        expires_at_ms: 0,
        holder: None,
        lease_ms: None,
    };
    let e = store
        .put_raw(&key, record.encode().into(), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Rejected, "{e}");
    assert_eq!(store.get(&key).await.unwrap(), None);
    // And the store still reserves fresh keys.
    let fresh = idemkit_test::unique_key("after-huge-token");
    let req = BeginRequest::new(&fresh, OwnerToken::random(), Duration::from_secs(5));
    assert!(matches!(
        store.begin(&req).await.unwrap(),
        Claim::Reserved { .. }
    ));
}

/// A released reservation stays as a row that only keeps its fencing token: a scan does not
/// list it, and a page made only of such rows still moves the cursor on to the records after
/// them; `table_bytes` counts the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_skips_released_rows_and_pages_past_them() {
    use idemkit_core::scan::Scan;
    let Some(store) = support::store().await else {
        return;
    };
    let op = idemkit_core::Operation::new(format!("scanrel{:x}", fastrand::u64(..))).unwrap();
    let key =
        |k: &str| idemkit_core::StorageKey::new(&op, None, &idemkit_core::Key::new(k).unwrap());
    // Three released rows (a0..a2) sort before the live one (b).
    for k in ["a0", "a1", "a2"] {
        let k = key(k);
        let Claim::Reserved { ownership, .. } = store
            .begin(&BeginRequest::new(
                &k,
                OwnerToken::random(),
                Duration::from_secs(30),
            ))
            .await
            .unwrap()
        else {
            panic!("not reserved")
        };
        store.release(&k, &ownership).await.unwrap();
    }
    let live = key("b");
    let Claim::Reserved { .. } = store
        .begin(&BeginRequest::new(
            &live,
            OwnerToken::random(),
            Duration::from_secs(30),
        ))
        .await
        .unwrap()
    else {
        panic!("not reserved")
    };
    let mut listed = Vec::new();
    let mut cursor = None;
    let mut pages = 0;
    loop {
        let page = store.scan(Some(&op), cursor.as_ref(), 2).await.unwrap();
        listed.extend(page.entries.iter().map(|e| e.key.to_string()));
        pages += 1;
        assert!(pages < 10, "the cursor does not move");
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(listed, vec![live.to_string()]);
    assert!(store.table_bytes().await.unwrap() > 0);
}

/// Another's reservation whose holder column is not a holder block: a duplicate's `begin`
/// reads that column (to point to the original) and says `Corrupt`, as `get` does; the row
/// is left as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_column_that_is_not_a_holder_is_corrupt() {
    let Some(store) = support::store().await else {
        return;
    };
    let key = idemkit_test::unique_key("bad-holder");
    let lease = Duration::from_secs(30);
    let holder = std::sync::Arc::new(idemkit_core::record::Holder::new("host-a", 7, "original"));
    let original = BeginRequest::new(&key, OwnerToken::random(), lease);
    assert!(matches!(
        store
            .begin(&original.with_holder(Some(&holder)))
            .await
            .unwrap(),
        Claim::Reserved { .. }
    ));
    // Well formed, the duplicate is told who holds the key.
    let duplicate = BeginRequest::new(&key, OwnerToken::random(), lease);
    match store.begin(&duplicate).await.unwrap() {
        Claim::InFlight {
            holder: Some(h), ..
        } => assert_eq!(*h, *holder),
        other => panic!("expected in flight with its holder, got {other:?}"),
    }
    sqlx::query("UPDATE idemkit_test_records SET holder = ? WHERE `key` = ?")
        .bind(vec![9u8; 5])
        .bind(key.as_str().as_bytes())
        .execute(store.pool())
        .await
        .unwrap();
    let e = store.begin(&duplicate).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains("holder"), "{e}");
    assert_eq!(
        store.get(&key).await.unwrap_err().kind(),
        StoreErrorKind::Corrupt
    );
    assert!(store.purge(&key).await.unwrap());
}
