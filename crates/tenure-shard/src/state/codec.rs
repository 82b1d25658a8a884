//! Shard sets and the text encodings of a member value's fields: sets as lists or
//! bitmaps, LEB128 gap lists, (shard, code) pairs, aligned load codes and the
//! balancer's moves (the format is described in the parent module).

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

pub(super) const TAG: &str = "tenure-shard/2";

/// A set of shard indices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShardSet {
    pub(super) bits: Vec<u8>,
}

impl ShardSet {
    pub(crate) fn new(shards: usize) -> Self {
        ShardSet {
            bits: vec![0; shards.div_ceil(8)],
        }
    }

    pub(crate) fn contains(&self, i: usize) -> bool {
        self.bits
            .get(i / 8)
            .is_some_and(|b| b & (1 << (i % 8)) != 0)
    }

    pub(crate) fn set(&mut self, i: usize, on: bool) {
        if let Some(b) = self.bits.get_mut(i / 8) {
            if on {
                *b |= 1 << (i % 8);
            } else {
                *b &= !(1 << (i % 8));
            }
        }
    }

    pub(super) fn flip(&mut self, i: usize) {
        if let Some(b) = self.bits.get_mut(i / 8) {
            *b ^= 1 << (i % 8);
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.bits.iter().enumerate().flat_map(|(i, b)| {
            (0..8)
                .filter(move |k| b & (1 << k) != 0)
                .map(move |k| i * 8 + k)
        })
    }

    /// The indices where `self` and `other` (of the same size) differ, found a byte at
    /// a time: a byte that did not change costs one comparison.
    pub(crate) fn changed<'a>(&'a self, other: &'a ShardSet) -> impl Iterator<Item = usize> + 'a {
        self.bits
            .iter()
            .zip(&other.bits)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .flat_map(|(i, (a, b))| {
                let d = a ^ b;
                (0..8)
                    .filter(move |k| d & (1 << k) != 0)
                    .map(move |k| i * 8 + k)
            })
    }

    fn len(&self) -> usize {
        self.bits.iter().map(|b| b.count_ones() as usize).sum()
    }

    pub(super) fn encode(&self) -> String {
        let n = self.len();
        if n == 0 {
            "-".to_string()
        } else if n.saturating_mul(12) < self.bits.len() * 8 {
            // Sparse: a list of gaps of about a byte each beats a bit per shard.
            format!("l{}", encode_list(self.iter()))
        } else {
            format!("b{}", URL_SAFE_NO_PAD.encode(&self.bits))
        }
    }

    pub(super) fn decode(s: &str, shards: usize) -> Result<Self, String> {
        let mut set = ShardSet::new(shards);
        if s == "-" {
            return Ok(set);
        }
        if let Some(list) = s.strip_prefix('l') {
            for i in decode_list(list, shards)? {
                set.set(i as usize, true);
            }
            return Ok(set);
        }
        let Some(bitmap) = s.strip_prefix('b') else {
            return Err(format!("a set starts with '-', 'b' or 'l', not {s:.8?}"));
        };
        let bits = URL_SAFE_NO_PAD
            .decode(bitmap)
            .map_err(|e| format!("bad bitmap: {e}"))?;
        if bits.len() != shards.div_ceil(8) {
            return Err(format!(
                "bitmap of {} bytes for {shards} shards",
                bits.len()
            ));
        }
        set.bits = bits;
        // Bits past the last shard are ignored.
        for i in shards..set.bits.len() * 8 {
            set.set(i, false);
        }
        Ok(set)
    }
}

/// Ascending indices as LEB128 gaps in base64, or `-` when there are none.
pub(super) fn encode_list(indices: impl Iterator<Item = usize>) -> String {
    encode_gaps(indices.map(|i| (i, None)))
}

/// The indices of a list from [`encode_list`]: strictly ascending and below `shards`.
pub(super) fn decode_list(s: &str, shards: usize) -> Result<Vec<u32>, String> {
    Ok(decode_gaps(s, shards, false, "list")?
        .into_iter()
        .map(|(i, _)| i)
        .collect())
}

/// Ascending `(shard, code)` pairs as LEB128 gaps each followed by the code byte, in
/// base64, or `-` when there are none.
pub(super) fn encode_pairs(pairs: impl Iterator<Item = (u32, u8)>) -> String {
    encode_gaps(pairs.map(|(i, code)| (i as usize, Some(code))))
}

/// The codes of the shards of `held`, one byte each in ascending order (0: none), in
/// base64: a base's codes cost a byte per held shard, the shards being named by `h`.
pub(super) fn encode_aligned(held: &ShardSet, codes: &BTreeMap<u32, u8>) -> String {
    let bytes: Vec<u8> = held
        .iter()
        .map(|s| {
            u32::try_from(s)
                .ok()
                .and_then(|i| codes.get(&i).copied())
                .unwrap_or(0)
        })
        .collect();
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The (shard, code) pairs, codes above 0, of [`encode_aligned`] for `held`.
pub(super) fn decode_aligned(s: &str, held: &ShardSet) -> Result<Vec<(u32, u8)>, String> {
    let bytes = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|e| format!("load codes: {e}"))?;
    if bytes.len() != held.len() {
        return Err(format!(
            "load codes: {} for {} held shards",
            bytes.len(),
            held.len()
        ));
    }
    Ok(held
        .iter()
        .zip(bytes)
        .filter(|(_, code)| *code > 0)
        .map(|(s, code)| (s as u32, code))
        .collect())
}

/// The pairs of [`encode_pairs`]: shards strictly ascending and below `shards`.
pub(super) fn decode_pairs(s: &str, shards: usize) -> Result<Vec<(u32, u8)>, String> {
    decode_gaps(s, shards, true, "loads")
}

/// Ascending indices as LEB128 gaps (the first from 0), each followed by its byte
/// where it has one, in base64; `-` when there are none.
fn encode_gaps(items: impl Iterator<Item = (usize, Option<u8>)>) -> String {
    let mut bytes = Vec::new();
    let mut last = 0;
    for (i, byte) in items {
        let mut gap = i - last;
        last = i;
        loop {
            let low = (gap & 0x7f) as u8;
            gap >>= 7;
            if gap == 0 {
                bytes.push(low);
                break;
            }
            bytes.push(low | 0x80);
        }
        bytes.extend(byte);
    }
    if bytes.is_empty() {
        "-".to_string()
    } else {
        URL_SAFE_NO_PAD.encode(bytes)
    }
}

/// What [`encode_gaps`] wrote, each index with its byte (0 when `with_byte` is
/// false); `what` names the field in errors.
fn decode_gaps(
    s: &str,
    shards: usize,
    with_byte: bool,
    what: &str,
) -> Result<Vec<(u32, u8)>, String> {
    if s == "-" {
        return Ok(Vec::new());
    }
    let bytes = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|e| format!("bad {what}: {e}"))?;
    let mut out = Vec::new();
    let (mut gap, mut shift, mut last) = (0usize, 0u32, None::<usize>);
    let mut bytes = bytes.into_iter();
    while let Some(b) = bytes.next() {
        if shift > 28 {
            return Err(format!("bad {what}: a gap of more than 32 bits"));
        }
        gap |= usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 != 0 {
            continue;
        }
        let i = match last {
            None => gap,
            Some(_) if gap == 0 => return Err(format!("bad {what}: an index twice")),
            Some(l) => l + gap,
        };
        if i >= shards {
            return Err(format!("bad {what}: shard {i} of {shards}"));
        }
        let byte = if with_byte {
            bytes
                .next()
                .ok_or_else(|| format!("bad {what}: an index without its byte"))?
        } else {
            0
        };
        out.push((i as u32, byte));
        (last, gap, shift) = (Some(i), 0, 0);
    }
    if shift != 0 {
        return Err(format!("bad {what}: it ends inside a gap"));
    }
    Ok(out)
}

/// The code of shard `s` in ascending pairs (0 if absent).
pub(super) fn code_in(pairs: &[(u32, u8)], s: u32) -> Option<u8> {
    pairs
        .binary_search_by_key(&s, |(i, _)| *i)
        .ok()
        .map(|k| pairs[k].1)
}

/// Directives as published: `-`, or `<node>:<list>` groups joined by `,` (member ids
/// have neither character).
pub(super) fn encode_directives(moves: &[(u32, String)]) -> String {
    if moves.is_empty() {
        return "-".to_string();
    }
    let mut by_node: std::collections::BTreeMap<&str, Vec<u32>> = Default::default();
    for (s, to) in moves {
        by_node.entry(to.as_str()).or_default().push(*s);
    }
    let groups: Vec<String> = by_node
        .into_iter()
        .map(|(to, mut shards)| {
            shards.sort_unstable();
            shards.dedup();
            format!(
                "{to}:{}",
                encode_list(shards.into_iter().map(|s| s as usize))
            )
        })
        .collect();
    groups.join(",")
}

pub(super) fn decode_directives(s: &str, shards: usize) -> Result<Vec<(u32, Arc<str>)>, String> {
    if s == "-" {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for group in s.split(',') {
        let (to, list) = group
            .split_once(':')
            .ok_or_else(|| format!("bad moves: {group:.16?} has no ':'"))?;
        let to: Arc<str> = Arc::from(to);
        for i in decode_list(list, shards)? {
            out.push((i, to.clone()));
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The symmetric difference of two ascending lists, ascending.
pub(super) fn flipped(a: &[u32], b: &[u32]) -> Vec<usize> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x == y => (i, j) = (i + 1, j + 1),
            (Some(x), Some(y)) if x < y => {
                out.push(*x as usize);
                i += 1;
            }
            (Some(x), None) => {
                out.push(*x as usize);
                i += 1;
            }
            (_, Some(y)) => {
                out.push(*y as usize);
                j += 1;
            }
            (None, None) => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_round_trip_and_bad_ones_are_refused() {
        for list in [vec![], vec![0], vec![5, 6, 200, 70_000, 999_999]] {
            let text = encode_list(list.iter().copied());
            let back: Vec<usize> = decode_list(&text, 1_000_000)
                .unwrap()
                .into_iter()
                .map(|i| i as usize)
                .collect();
            assert_eq!(back, list, "{text}");
        }
        let enc = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
        for (bad, why) in [
            (enc(&[3, 0]), "twice"),
            (enc(&[10]), "shard 10 of 10"),
            (enc(&[0x80]), "ends inside"),
            (enc(&[0x80, 0x80, 0x80, 0x80, 0x80, 1]), "32 bits"),
            ("!!".to_string(), "bad list"),
        ] {
            let e = decode_list(&bad, 10).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_set_is_written_as_a_list_or_a_bitmap_whichever_is_shorter() {
        let mut sparse = ShardSet::new(100_000);
        let mut dense = ShardSet::new(100_000);
        for s in (0..100_000).step_by(50) {
            sparse.set(s, true);
        }
        for s in (0..100_000).step_by(3) {
            dense.set(s, true);
        }
        let (a, b) = (sparse.encode(), dense.encode());
        assert!(a.starts_with('l') && a.len() < 3_000, "{} bytes", a.len());
        assert!(b.starts_with('b') && b.len() < 17_000, "{} bytes", b.len());
        assert_eq!(ShardSet::decode(&a, 100_000).unwrap(), sparse);
        assert_eq!(ShardSet::decode(&b, 100_000).unwrap(), dense);
    }
}
