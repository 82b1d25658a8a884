//! The fixed hash behind rendezvous ranking: FNV-1a (64 bit) over the UTF-8 bytes,
//! finished with the SplitMix64 mixer. Both are defined bit for bit, so every node,
//! whatever its toolchain, platform or endianness, ranks nodes the same way.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bit.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = FNV_OFFSET;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// SplitMix64's output function applied to `x` (after adding its increment), a
/// bijection that spreads every input bit over the whole word.
pub fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The hash of a shard or node name.
pub fn key_hash(name: &str) -> u64 {
    mix64(fnv1a64(name.as_bytes()))
}

/// The rendezvous (highest random weight) score of a node for a shard, from their
/// [`key_hash`]es: the shard's replicas are the nodes with the highest scores.
pub fn rendezvous_score(shard: u64, node: u64) -> u64 {
    mix64(shard ^ node.rotate_left(31))
}

/// A small deterministic generator for tests (xorshift): each call gives a number
/// below its argument.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn test_rng(mut seed: u64) -> impl FnMut(usize) -> usize {
    move |below| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % below as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_vectors() {
        // FNV-1a reference values.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
        // SplitMix64 seeded with 0 yields this first.
        assert_eq!(mix64(0), 0xe220_a839_7b1d_cdaf);
        // Our composition; a change here reshuffles every deployed cluster.
        assert_eq!(key_hash("node-1"), KEY_NODE_1);
        assert_eq!(
            rendezvous_score(key_hash("orders/0001"), key_hash("node-1")),
            SCORE_0001_NODE_1
        );
    }

    // Computed independently (a 20-line Python transcription of the definitions above).
    const KEY_NODE_1: u64 = 0x94a9_d409_86da_123d;
    const SCORE_0001_NODE_1: u64 = 0xafe6_25bf_42f5_829f;
}
