//! The `Idempotency-Key` header parser takes any bytes a client sends: a key it accepts is
//! 1 to 255 printable ASCII characters.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(key) = idemkit_http::parse_key(data) {
        assert!(
            !key.is_empty() && key.len() <= idemkit_http::MAX_KEY_LEN,
            "{key:?}"
        );
        assert!(key.bytes().all(|b| (0x20..0x7f).contains(&b)), "{key:?}");
    }
});
