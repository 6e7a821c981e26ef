//! Round trips and garbage through the record format.

use std::sync::Arc;

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
        proptest::option::of((
            "[a-z0-9.-]{0,64}",
            any::<u32>(),
            "[ -~]{0,64}",
            any::<u64>(),
        )),
    )
        .prop_map(|(bytes, owner, fencing, fp, c, e, k, holder)| Record {
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
            lease_ms: holder.as_ref().map(|h| h.3),
            holder: holder.map(|(host, pid, name, _)| Arc::new(Holder::new(&host, pid, &name))),
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

    /// Decoding without the holder checks every byte as decoding with it: the same
    /// answer for any bytes (a record mutated anywhere, its holder block included), but for
    /// the holder left out.
    #[test]
    fn decoding_without_the_holder_checks_the_same_bytes(
        r in record(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in 0usize..4,
    ) {
        let mut b = r.encode();
        let i = at.index(b.len());
        b[i] = byte;
        b.truncate(b.len() - cut.min(b.len()));
        let full = Record::decode(&b).map(|r| Record { holder: None, lease_ms: None, ..r });
        prop_assert_eq!(Record::decode_without_holder(b.into()), full);
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
        holder: None,
        lease_ms: None,
    }
    .encode();
    r[3] = 3;
    assert_eq!(Record::decode(&r), Err(RecordError::UnsupportedVersion(3)));
    // Version 2 without its holder block.
    r[3] = 2;
    assert_eq!(Record::decode(&r), Err(RecordError::LengthMismatch));
    r[3] = 1;
    r[4] = 9;
    assert_eq!(Record::decode(&r), Err(RecordError::InvalidField("state")));
}

#[test]
fn a_holder_makes_version_2_and_a_version_1_record_reads_as_before() {
    let v1 = Record {
        state: RecordState::Reserved,
        owner: OwnerToken::from_u128(7),
        fencing: FencingToken::new(9),
        fingerprint: Some(Fingerprint::from_bytes([3; 16])),
        created_at_ms: 1,
        expires_at_ms: 2,
        holder: None,
        lease_ms: None,
    };
    let bytes = v1.encode();
    assert_eq!(&bytes[..4], b"IDK\x01");
    let v2 = Record {
        holder: Some(Arc::new(Holder::new("web-1", 4242, "billing"))),
        lease_ms: Some(30_000),
        ..v1.clone()
    };
    let two = v2.encode();
    assert_eq!(&two[..4], b"IDK\x02");
    // The holder block follows the fingerprint: version 1's bytes, then the block.
    assert_eq!(&two[4..bytes.len()], &bytes[4..]);
    assert_eq!(
        &two[bytes.len()..],
        &Holder::new("web-1", 4242, "billing").block(30_000)[..]
    );
    assert_eq!(Record::decode(&two), Ok(v2));
    assert_eq!(Record::decode(&bytes), Ok(v1));
}

#[test]
fn a_holder_text_that_is_not_clean_is_refused() {
    let mut block = Holder::new("h", 1, "n").block(5);
    // The name's one byte becomes a control character.
    let last = block.len() - 1;
    block[last] = b'\n';
    assert_eq!(
        Holder::from_block(&block).map(|_| ()),
        Err(RecordError::InvalidField("holder"))
    );
    assert_eq!(
        Holder::skip_block(&block).map(|_| ()),
        Err(RecordError::InvalidField("holder"))
    );
}
