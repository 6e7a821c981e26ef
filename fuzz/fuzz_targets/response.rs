//! The stored-response decoder of the HTTP layer reads the bytes of a completed record: it
//! refuses what is not a response, never panics, and never reads past what it was given.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((status, body)) = idemkit_http::__fuzz::decode_response(data) {
        assert!((100..1000).contains(&status));
        assert!(body <= data.len());
    }
});
