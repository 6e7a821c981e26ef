//! Operation, scope and key construction from any text, and the storage key: a value that
//! is accepted is storable, and its storage key parses back to it (the encoding is
//! injective); any text given to `parse` is refused or parsed, never a panic.
#![no_main]

use idemkit_core::{Key, Operation, Scope, StorageKey};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = StorageKey::parse(&text);
    // Three parts, split at the first two NUL bytes.
    let mut parts = text.splitn(3, '\0');
    let (op, scope, key) = (parts.next(), parts.next(), parts.next());
    let (Some(op), Some(key)) = (op, key.or(scope)) else {
        return;
    };
    let (Ok(op), Ok(key)) = (Operation::new(op), Key::new(key)) else {
        return;
    };
    let scope = scope
        .filter(|_| parts.next().is_none())
        .and_then(|s| Scope::new(s).ok());
    let storage = StorageKey::new(&op, scope.as_ref(), &key);
    let (op2, scope2, key2) = StorageKey::parse(storage.as_str()).expect("a storage key parses");
    assert_eq!((op2, scope2, key2), (op, scope, key));
});
