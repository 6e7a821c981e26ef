//! Redis key names, hash slots and durations as Redis takes them.

use std::time::Duration;

use idemkit_core::StorageKey;

/// `{prefix}:{<digest>}:{key}`, built by hand (the hot path: see docs/benchmarks.md). The
/// digest, a 64-bit FNV-1a of the storage key in hex, is the Cluster hash tag: the record and
/// its wake-up channel land in one slot whatever characters the key holds.
pub(crate) fn key_for(prefix: &str, key: &StorageKey) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let key = key.as_str();
    let mut out = String::with_capacity(prefix.len() + key.len() + 21);
    out.push_str(prefix);
    out.push_str(":{");
    let tag = fnv1a(key.as_bytes());
    // The digits and the braces around them in one write (a `push` a digit costs a
    // capacity check and a UTF-8 encoding each).
    let mut hex = *b"0000000000000000}:";
    for (i, digit) in hex[..16].iter_mut().enumerate() {
        *digit = HEX[(tag >> ((15 - i) * 4)) as usize & 0xf];
    }
    out.push_str(std::str::from_utf8(&hex).unwrap_or_default());
    out.push_str(key);
    out
}

/// The lane (connection) of a Redis key built by [`key_for`] with a prefix of `prefix_len`
/// bytes, out of `lanes`: the last hex digit of its hash tag, so a key always takes the same
/// lane and keys spread evenly.
pub(crate) fn lane(prefix_len: usize, redis_key: &str, lanes: usize) -> usize {
    if lanes <= 1 {
        return 0;
    }
    // `{prefix}:{` then 16 hex digits: the last one is at prefix_len + 17.
    let digit = redis_key
        .as_bytes()
        .get(prefix_len + 17)
        .copied()
        .unwrap_or(0);
    let value = match digit {
        b'0'..=b'9' => digit - b'0',
        b'a'..=b'f' => digit - b'a' + 10,
        _ => 0,
    };
    usize::from(value) % lanes
}

/// The wake-up channel of a record: same hash tag (the first `{...}`), hence the same slot.
pub(crate) fn channel(redis_key: &str) -> String {
    format!("{redis_key}:wake")
}

/// 64-bit FNV-1a: stable across processes and versions (it names keys), and fast.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The Cluster hash slot of a key of ours: CRC16 (XMODEM) of its hash tag, modulo 16384.
pub(crate) fn slot(redis_key: &str) -> u16 {
    let tag = redis_key
        .split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map_or(redis_key, |(tag, _)| tag);
    let mut crc: u16 = 0;
    for b in tag.bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// The longest duration sent to Redis: 100 years in ms is far inside Redis' signed 64-bit
/// expiry arithmetic.
pub(crate) const MAX_TTL: Duration = idemkit_core::Policy::MAX_DURATION;

/// Milliseconds for `PX`/`PSETEX`, rounded up (a sub-millisecond remainder must not shorten
/// a TTL, and `PX 0` is an error) and clamped to [`MAX_TTL`] (a larger value overflows
/// Redis' arithmetic, and every completion would fail).
pub(crate) fn ms(d: Duration) -> u64 {
    let d = d.min(MAX_TTL);
    let ms = d.as_millis() as u64; // below 2^42 after the clamp
    if Duration::from_millis(ms) < d {
        ms + 1
    } else {
        ms.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_milliseconds() {
        assert_eq!(ms(Duration::from_millis(1_500)), 1_500);
        assert_eq!(ms(Duration::from_micros(1_500_001)), 1_501);
        assert_eq!(ms(Duration::from_nanos(1)), 1);
        assert_eq!(ms(Duration::ZERO), 1);
    }

    /// Before: `ms(Duration::MAX)` overflowed (`u64::MAX + 1`), and `Duration::from_secs(u64::MAX)`
    /// gave a value Redis refuses.
    #[test]
    fn extreme_durations_are_clamped_to_what_redis_takes() {
        let max = ms(MAX_TTL);
        assert_eq!(ms(Duration::MAX), max);
        assert_eq!(ms(Duration::from_secs(u64::MAX)), max);
        assert!(max < i64::MAX as u64 / 1_000);
    }

    #[test]
    fn a_key_keeps_its_lane_and_keys_spread_over_the_lanes() {
        let op = idemkit_core::Operation::new("mail.invoice").unwrap();
        for lanes in [2, 3, 4] {
            let mut per_lane = vec![0usize; lanes];
            for i in 0..3_000 {
                let k = idemkit_core::Key::new(format!("order-{i}")).unwrap();
                let rkey = key_for("billing", &StorageKey::new(&op, None, &k));
                let lane = lane("billing".len(), &rkey, lanes);
                // The last hex digit of the tag, as the key shows it.
                let tag = &rkey["billing:{".len().."billing:{".len() + 16];
                let last = u8::from_str_radix(&tag[15..], 16).unwrap();
                assert_eq!(lane, usize::from(last) % lanes, "{rkey}");
                per_lane[lane] += 1;
            }
            // 16 digits over `lanes` lanes: no lane gets under half its share.
            assert!(
                per_lane.iter().all(|&n| n > 3_000 / lanes / 2),
                "{lanes} lanes: {per_lane:?}"
            );
        }
        assert_eq!(lane(7, "billing:{0123456789abcdef}:k", 1), 0);
    }

    #[test]
    fn redis_keys_carry_the_digest_as_a_hash_tag() {
        let sk = StorageKey::new(
            &idemkit_core::Operation::new("op").unwrap(),
            None,
            &idemkit_core::Key::new("a{b}").unwrap(),
        );
        let digest = format!("{:016x}", fnv1a(sk.as_str().as_bytes()));
        assert_eq!(key_for("p", &sk), format!("p:{{{digest}}}:{}", sk.as_str()));
    }

    #[test]
    fn fnv1a_is_the_reference_function() {
        // Published test vectors of 64-bit FNV-1a.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn slots_are_redis_cluster_slots() {
        // From the Redis Cluster specification: CRC16("123456789") = 0x31C3.
        assert_eq!(slot("123456789"), 0x31c3);
        // `CLUSTER KEYSLOT foo` is 12182; a hash tag is hashed alone.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("p:{foo}:x"), 12182);
    }
}
