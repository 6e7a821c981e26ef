//! The record decoder reads whatever bytes a store holds under a key: it never panics, and
//! what it accepts it writes back the same.
#![no_main]

use idemkit_core::Record;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = Record::decode(data) {
        let again = Record::decode(&record.encode()).expect("an encoded record decodes");
        assert_eq!(again, record);
    }
});
