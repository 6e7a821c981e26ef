//! Round trips and garbage through the record format.

use super::*;
use proptest::prelude::*;

fn record() -> impl Strategy<Value = Record> {
    (
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
        any::<u128>(),
        any::<u64>(),
        proptest::option::of(any::<[u8; 16]>()),
        any::<u64>(),
        any::<u64>(),
        0u8..3,
    )
        .prop_map(|(bytes, owner, fencing, fp, c, e, k)| Record {
            state: match bytes {
                None => RecordState::Reserved,
                Some(b) => RecordState::Completed(StoredResult::new(
                    [
                        ResultKind::Value,
                        ResultKind::PermanentError,
                        ResultKind::Unavailable,
                    ][k as usize],
                    b,
                )),
            },
            owner: OwnerToken::from_u128(owner),
            fencing: FencingToken::new(fencing),
            fingerprint: fp.map(Fingerprint::from_bytes),
            created_at_ms: c,
            expires_at_ms: e,
        })
}

proptest! {
    #[test]
    fn roundtrip(r in record()) {
        prop_assert_eq!(Record::decode(&r.encode()), Ok(r.clone()));
        prop_assert_eq!(Record::decode_shared(r.encode().into()), Ok(r));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic(b in proptest::collection::vec(any::<u8>(), 0..120)) {
        // No panic; and whatever decodes is exactly what it encodes back to, so no two
        // byte strings are read as the same record.
        if let Ok(r) = Record::decode(&b) {
            prop_assert_eq!(r.encode(), b);
        }
    }

    #[test]
    fn truncation_and_extension_are_detected(r in record(), cut in 1usize..8) {
        let enc = r.encode();
        let cut = cut.min(enc.len());
        prop_assert!(Record::decode(&enc[..enc.len() - cut]).is_err());
        let mut longer = enc.clone();
        longer.push(0);
        prop_assert_eq!(Record::decode(&longer), Err(RecordError::LengthMismatch));
    }
}

#[test]
fn foreign_and_future_records_are_typed() {
    assert_eq!(Record::decode(b"{\"json\":1}"), Err(RecordError::BadMagic));
    let mut r = Record {
        state: RecordState::Reserved,
        owner: OwnerToken::from_u128(1),
        fencing: FencingToken::new(1),
        fingerprint: None,
        created_at_ms: 0,
        expires_at_ms: 0,
    }
    .encode();
    r[3] = 2;
    assert_eq!(Record::decode(&r), Err(RecordError::UnsupportedVersion(2)));
    r[3] = 1;
    r[4] = 9;
    assert_eq!(Record::decode(&r), Err(RecordError::InvalidField("state")));
}
