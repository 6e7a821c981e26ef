//! A store fed arbitrary bytes under a key (what another program, or a damaged disk, may leave
//! there): every phase answers a typed error or a claim, never a panic, and nothing is
//! overwritten.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use idemkit_core::store::{BeginRequest, CompleteRequest, Ownership};
use idemkit_core::{
    Coordinator, FencingToken, InFlight, Key, MemoryStore, Operation, OwnerToken, RawStore,
    ResultKind, StorageKey, Store,
};
use libfuzzer_sys::fuzz_target;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    runtime().block_on(async {
        let store = MemoryStore::new();
        let (op, key) = (Operation::new("fuzz").unwrap(), Key::new("k").unwrap());
        let sk = StorageKey::new(&op, None, &key);
        store
            .put_raw(&sk, Bytes::copy_from_slice(data), Duration::from_secs(60))
            .await
            .expect("raw bytes are stored");
        let owner = OwnerToken::random();
        let _ = store.get(&sk).await;
        let _ = store
            .begin(&BeginRequest::new(&sk, owner, Duration::from_secs(5)))
            .await;
        let lease = Ownership::new(owner, FencingToken::new(1));
        let _ = store.renew(&sk, &lease, Duration::from_secs(5)).await;
        let done = CompleteRequest::new(
            ResultKind::Value,
            Bytes::from_static(b"1"),
            Duration::from_secs(5),
        );
        let _ = store.complete(&sk, &lease, &done).await;
        let _ = store.release(&sk, &lease).await;
        // Through the coordinator: the action runs only if the bytes were a reservation
        // that ended, or a record that was not ours turned into a typed error first.
        let c = Coordinator::new(store.clone());
        let _ = c
            .call(&op, &key)
            .in_flight(InFlight::Reject)
            .run(|_| async { Ok::<_, std::io::Error>(1u8) })
            .await;
    });
});
