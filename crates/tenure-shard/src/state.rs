//! What a node publishes in its member value, and the view every node builds from the
//! member list: who is a member, with which weight and drain flag, who holds which
//! shard and who campaigns for which.
//!
//! The value is one line of text:
//! `tenure-shard/2 p=<shards> w=<weight> d=<0|1> [z=<zone>] b=<base> dh=<list> dc=<list> [dl=<pairs>] [mv=<moves>] h=<set> c=<set> [lc=<codes>]`.
//! `z` (the node's failure domain) is there only when the node has one; readers
//! ignore fields they do not know, so older nodes read newer values. `lc` (in the
//! base) and `dl` (changes since) carry the load codes of the shards the node holds:
//! `lc` one code byte for each shard of the base's `h`, in ascending order (0: none),
//! in base64; `dl` ascending (shard gap, code byte) pairs. (`l`, the base's codes as
//! pairs like `dl`, is still read.) A node whose value would pass
//! [`MAX_MEMBER_VALUE_LEN`] with its codes publishes none ([`OwnState::loads_withheld`]).
//! `mv` is there when the node balances by load: the leaders it asks for as the
//! balancer, `-` or `<node>:<list>` groups joined by `,`.
//! `h` and `c` are the *base*: the shards held and campaigned for when the base named
//! `b` was written. `dh` and `dc` list the shards whose held and campaigning bits have
//! flipped since. A node rewrites its base only when the lists grow past a quarter of
//! its size, so most updates change the short lists and keep the base, byte for byte,
//! under the same name; a reader that already decoded that base applies the lists to
//! what it had, at a cost that grows with the shards that changed, not with `p`.
//!
//! A set is `-` when empty, `b` and a bitmap (bit `i` is bit `i % 8` of byte `i / 8`),
//! or `l` and a list; a list is its ascending indices as LEB128 gaps (the first from
//! 0). Both are URL-safe base64 without padding. A node picks the shorter of the two:
//! 10,000 shards cost at most 1.7 KB per set, 1,000,000 at most 167 KB.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use tenure_core::{Member, MAX_MEMBER_VALUE_LEN};

use crate::assign::NodeSpec;

const TAG: &str = "tenure-shard/2";

/// A set of shard indices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShardSet {
    bits: Vec<u8>,
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

    fn flip(&mut self, i: usize) {
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

    fn encode(&self) -> String {
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

    fn decode(s: &str, shards: usize) -> Result<Self, String> {
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
fn encode_list(indices: impl Iterator<Item = usize>) -> String {
    encode_gaps(indices.map(|i| (i, None)))
}

/// The indices of a list from [`encode_list`]: strictly ascending and below `shards`.
fn decode_list(s: &str, shards: usize) -> Result<Vec<u32>, String> {
    Ok(decode_gaps(s, shards, false, "list")?
        .into_iter()
        .map(|(i, _)| i)
        .collect())
}

/// Ascending `(shard, code)` pairs as LEB128 gaps each followed by the code byte, in
/// base64, or `-` when there are none.
fn encode_pairs(pairs: impl Iterator<Item = (u32, u8)>) -> String {
    encode_gaps(pairs.map(|(i, code)| (i as usize, Some(code))))
}

/// The codes of the shards of `held`, one byte each in ascending order (0: none), in
/// base64: a base's codes cost a byte per held shard, the shards being named by `h`.
fn encode_aligned(held: &ShardSet, codes: &BTreeMap<u32, u8>) -> String {
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
fn decode_aligned(s: &str, held: &ShardSet) -> Result<Vec<(u32, u8)>, String> {
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
fn decode_pairs(s: &str, shards: usize) -> Result<Vec<(u32, u8)>, String> {
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
fn code_in(pairs: &[(u32, u8)], s: u32) -> Option<u8> {
    pairs
        .binary_search_by_key(&s, |(i, _)| *i)
        .ok()
        .map(|k| pairs[k].1)
}

/// Directives as published: `-`, or `<node>:<list>` groups joined by `,` (member ids
/// have neither character).
fn encode_directives(moves: &[(u32, String)]) -> String {
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

fn decode_directives(s: &str, shards: usize) -> Result<Vec<(u32, Arc<str>)>, String> {
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
fn flipped(a: &[u32], b: &[u32]) -> Vec<usize> {
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

/// One value per shard in chunks shared between views: a new view copies only the
/// chunks where a value changed (copy on write), so cloning costs P / 4096 reference
/// counts rather than P entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Chunked<T> {
    chunks: Vec<Arc<Vec<T>>>,
    len: usize,
}

/// Shards per chunk of [`Chunked`].
const CHUNK: usize = 4096;

impl<T: Copy> Chunked<T> {
    fn filled(len: usize, value: T) -> Self {
        let chunks = (0..len.div_ceil(CHUNK))
            .map(|c| Arc::new(vec![value; CHUNK.min(len - c * CHUNK)]))
            .collect();
        Chunked { chunks, len }
    }

    fn get(&self, s: usize) -> Option<T> {
        self.chunks
            .get(s / CHUNK)
            .and_then(|c| c.get(s % CHUNK))
            .copied()
    }

    fn set(&mut self, s: usize, value: T) {
        if let Some(chunk) = self.chunks.get_mut(s / CHUNK) {
            if let Some(v) = Arc::make_mut(chunk).get_mut(s % CHUNK) {
                *v = value;
            }
        }
    }
}

/// Which node holds each shard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Holders(Chunked<u32>);

/// "No holder" in [`Holders`].
const NO_HOLDER: u32 = u32::MAX;

impl Holders {
    fn new(len: usize) -> Self {
        Holders(Chunked::filled(len, NO_HOLDER))
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len
    }

    /// The node holding shard `s`, if any.
    pub(crate) fn get(&self, s: usize) -> Option<u32> {
        self.0.get(s).filter(|h| *h != NO_HOLDER)
    }

    fn set(&mut self, s: usize, holder: Option<u32>) {
        self.0.set(s, holder.unwrap_or(NO_HOLDER));
    }

    /// Every shard's holder, in order.
    pub(crate) fn to_vec(&self) -> Vec<Option<u32>> {
        (0..self.len()).map(|s| self.get(s)).collect()
    }
}

/// The last load code published for each shard ([`crate::balance::quantize`]), by its
/// holder at the time: kept while a shard has no holder, so a new leader starts from
/// the last figure. Nothing is allocated until a load is reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Loads {
    codes: Chunked<u8>,
    /// Shards with a code above 0.
    pub(crate) reported: usize,
}

impl Loads {
    /// Shard `s`'s code (0: none reported).
    pub(crate) fn get(&self, s: usize) -> u8 {
        self.codes.get(s).unwrap_or(0)
    }

    /// Set shard `s`'s code out of `shards`; true if it changed.
    fn set(&mut self, s: usize, code: u8, shards: usize) -> bool {
        let old = self.get(s);
        if old == code || s >= shards {
            return false;
        }
        if self.codes.len != shards {
            self.codes = Chunked::filled(shards, 0);
        }
        self.codes.set(s, code);
        match (old, code) {
            (0, _) => self.reported += 1,
            (_, 0) => self.reported -= 1,
            _ => {}
        }
        true
    }

    /// Every shard's load in thousandths of the unit ([`crate::balance::level`]).
    pub(crate) fn levels(&self, shards: usize) -> Vec<u64> {
        (0..shards)
            .map(|s| crate::balance::level(self.get(s)))
            .collect()
    }
}

/// Whether a member value says its node drains (`d=1`), read without decoding the
/// rest: the flag comes before the sets.
pub(crate) fn draining_in(value: &str) -> bool {
    let mut parts = value.split(' ');
    parts.next() == Some(TAG)
        && parts
            .take_while(|p| !p.starts_with("h="))
            .any(|p| p == "d=1")
}

/// One node's published state, as a reader decoded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodeState {
    pub(crate) shards: usize,
    pub(crate) weight: u32,
    pub(crate) draining: bool,
    pub(crate) zone: Option<String>,
    pub(crate) held: ShardSet,
    pub(crate) campaigning: ShardSet,
    /// The name of the base the sets were built from, and where they differ from it
    /// (ascending).
    base: Arc<str>,
    held_delta: Vec<u32>,
    campaigning_delta: Vec<u32>,
    /// Load codes of the shards it holds (ascending, no zeros): the base's, and the
    /// shards whose code differs from it (a 0 there removes the base's).
    load_base: Arc<Vec<(u32, u8)>>,
    load_delta: Vec<(u32, u8)>,
    /// The leaders it asks for as the balancer by load, (shard, node) ascending;
    /// `None` when it balances by count.
    pub(crate) moves: Option<Vec<(u32, Arc<str>)>>,
}

impl NodeState {
    /// Decode a member value. With `prev`, the same member's previous state: when the
    /// value keeps that state's base, the base is not decoded again and the cost grows
    /// with the listed changes only.
    pub(crate) fn decode(value: &str, prev: Option<&NodeState>) -> Result<Self, String> {
        let mut parts = value.split(' ');
        if parts.next() != Some(TAG) {
            return Err(format!("not a {TAG} value"));
        }
        let (mut p, mut w, mut d, mut b, mut z) = (None, None, None, None, None);
        let (mut dh, mut dc, mut h, mut c) = (None, None, None, None);
        let (mut l, mut lc, mut dl, mut mv) = (None, None, None, None);
        for part in parts {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("field {:.16?} has no '='", part))?;
            match k {
                "p" => p = Some(v.parse::<usize>().map_err(|e| format!("p: {e}"))?),
                "w" => w = Some(v.parse::<u32>().map_err(|e| format!("w: {e}"))?),
                "d" => d = Some(v == "1"),
                "z" => z = Some(v.to_string()),
                "b" => b = Some(v),
                "dh" => dh = Some(v),
                "dc" => dc = Some(v),
                "h" => h = Some(v),
                "c" => c = Some(v),
                "l" => l = Some(v),
                "lc" => lc = Some(v),
                "dl" => dl = Some(v),
                "mv" => mv = Some(v),
                _ => {} // later versions may add fields
            }
        }
        let shards = p.ok_or("missing p")?;
        let base = b.ok_or("missing b")?;
        let held_delta = decode_list(dh.ok_or("missing dh")?, shards)?;
        let campaigning_delta = decode_list(dc.ok_or("missing dc")?, shards)?;
        let load_delta = decode_pairs(dl.unwrap_or("-"), shards)?;
        let moves = mv.map(|v| decode_directives(v, shards)).transpose()?;
        let (held, campaigning, base, load_base) = match prev {
            Some(prev) if prev.shards == shards && *prev.base == *base => {
                // The same base: move from the old changes to the new ones.
                let mut held = prev.held.clone();
                for i in flipped(&prev.held_delta, &held_delta) {
                    held.flip(i);
                }
                let mut campaigning = prev.campaigning.clone();
                for i in flipped(&prev.campaigning_delta, &campaigning_delta) {
                    campaigning.flip(i);
                }
                (held, campaigning, prev.base.clone(), prev.load_base.clone())
            }
            _ => {
                let mut held = ShardSet::decode(h.ok_or("missing h")?, shards)?;
                let load_base = match lc {
                    Some(codes) => decode_aligned(codes, &held)?,
                    None => decode_pairs(l.unwrap_or("-"), shards)?,
                };
                for i in &held_delta {
                    held.flip(*i as usize);
                }
                let mut campaigning = ShardSet::decode(c.ok_or("missing c")?, shards)?;
                for i in &campaigning_delta {
                    campaigning.flip(*i as usize);
                }
                (held, campaigning, Arc::from(base), Arc::new(load_base))
            }
        };
        Ok(NodeState {
            shards,
            weight: w.ok_or("missing w")?,
            draining: d.unwrap_or(false),
            zone: z,
            held,
            campaigning,
            base,
            held_delta,
            campaigning_delta,
            load_base,
            load_delta,
            moves,
        })
    }

    /// The load code this node publishes for shard `s` (0: none).
    pub(crate) fn load(&self, s: usize) -> u8 {
        let s = s as u32;
        code_in(&self.load_delta, s)
            .or_else(|| code_in(&self.load_base, s))
            .unwrap_or(0)
    }

    /// Whether this node publishes any load code.
    fn has_loads(&self) -> bool {
        !self.load_base.is_empty() || !self.load_delta.is_empty()
    }

    /// The shards whose load code differs between `self` and `new`, two states of one
    /// member: from the change lists when both keep one base.
    fn loads_changed(&self, new: &NodeState) -> Vec<usize> {
        let mut keys: Vec<u32> = self.load_delta.iter().map(|(s, _)| *s).collect();
        keys.extend(new.load_delta.iter().map(|(s, _)| *s));
        if !Arc::ptr_eq(&self.load_base, &new.load_base) {
            keys.extend(self.load_base.iter().map(|(s, _)| *s));
            keys.extend(new.load_base.iter().map(|(s, _)| *s));
        }
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter()
            .map(|s| s as usize)
            .filter(|&s| self.load(s) != new.load(s))
            .collect()
    }

    /// The shards whose held or campaigning bit differs between `self` and `new`, two
    /// states of one member: from the change lists when both keep one base.
    /// Returns (held changes, campaigning changes).
    fn changed(&self, new: &NodeState) -> (Vec<usize>, Vec<usize>) {
        if self.base == new.base {
            (
                flipped(&self.held_delta, &new.held_delta),
                flipped(&self.campaigning_delta, &new.campaigning_delta),
            )
        } else {
            (
                self.held.changed(&new.held).collect(),
                self.campaigning.changed(&new.campaigning).collect(),
            )
        }
    }
}

/// This node's own state, kept ready to publish: the sets, and the base and change
/// lists of the value that carries them (see the module docs).
#[derive(Debug)]
pub(crate) struct OwnState {
    shards: usize,
    weight: u32,
    draining: bool,
    zone: Option<String>,
    held: ShardSet,
    campaigning: ShardSet,
    /// Names bases uniquely across this node's restarts; `generation` counts them.
    nonce: u64,
    generation: u64,
    /// `h=… c=…` of the current base.
    base_text: String,
    held_delta: BTreeSet<u32>,
    campaigning_delta: BTreeSet<u32>,
    /// Load codes of held shards (no zeros), as in the base, and where they differ
    /// from it (0: the base's is gone).
    loads: BTreeMap<u32, u8>,
    base_loads: BTreeMap<u32, u8>,
    load_delta: BTreeMap<u32, u8>,
    /// The base was written without the codes, as with them the value could pass
    /// [`MAX_MEMBER_VALUE_LEN`]; no code is published until a base fits them.
    loads_withheld: bool,
    /// As the balancer by load: the leaders it asks for (`None`: balancing by count).
    moves: Option<Vec<(u32, String)>>,
}

impl OwnState {
    /// An empty state; `nonce` should differ between two runs of a node.
    pub(crate) fn new(shards: usize, weight: u32, nonce: u64) -> Self {
        OwnState {
            shards,
            weight,
            draining: false,
            zone: None,
            held: ShardSet::new(shards),
            campaigning: ShardSet::new(shards),
            nonce,
            generation: 0,
            base_text: "h=- c=-".to_string(),
            held_delta: BTreeSet::new(),
            campaigning_delta: BTreeSet::new(),
            loads: BTreeMap::new(),
            base_loads: BTreeMap::new(),
            load_delta: BTreeMap::new(),
            loads_withheld: false,
            moves: None,
        }
    }

    /// Whether the last base left the load codes out (see the field).
    pub(crate) fn loads_withheld(&self) -> bool {
        self.loads_withheld
    }

    /// Set the load code published for shard `s` (0 removes it); true if that changed
    /// the state.
    pub(crate) fn set_load(&mut self, s: usize, code: u8) -> bool {
        let Ok(i) = u32::try_from(s) else {
            return false;
        };
        if s >= self.shards || self.load(s) == code {
            return false;
        }
        if code == 0 {
            self.loads.remove(&i);
        } else {
            self.loads.insert(i, code);
        }
        if self.base_loads.get(&i).copied().unwrap_or(0) == code {
            self.load_delta.remove(&i);
        } else {
            self.load_delta.insert(i, code);
        }
        true
    }

    /// The load code published for shard `s` (0: none).
    pub(crate) fn load(&self, s: usize) -> u8 {
        u32::try_from(s)
            .ok()
            .and_then(|i| self.loads.get(&i).copied())
            .unwrap_or(0)
    }

    /// Publish `moves` as the balancer by load (`None`: this node balances by count);
    /// true if that changed the state.
    pub(crate) fn set_moves(&mut self, moves: Option<Vec<(u32, String)>>) -> bool {
        if self.moves == moves {
            return false;
        }
        self.moves = moves;
        true
    }

    /// The same state for a node in failure domain `zone`.
    pub(crate) fn in_zone(mut self, zone: Option<String>) -> Self {
        self.zone = zone;
        self
    }

    #[cfg(test)]
    pub(crate) fn holds(&self, s: usize) -> bool {
        self.held.contains(s)
    }

    /// Set whether shard `s` is held; true if that changed the state.
    pub(crate) fn set_held(&mut self, s: usize, on: bool) -> bool {
        set_tracked(&mut self.held, &mut self.held_delta, s, on)
    }

    /// Set whether this node campaigns for shard `s`; true if that changed the state.
    pub(crate) fn set_campaigning(&mut self, s: usize, on: bool) -> bool {
        set_tracked(&mut self.campaigning, &mut self.campaigning_delta, s, on)
    }

    pub(crate) fn set_draining(&mut self, on: bool) {
        self.draining = on;
    }

    /// Drop every shard (the base is rewritten, empty, at the next value).
    pub(crate) fn clear(&mut self) {
        let indices: Vec<usize> = self.held.iter().collect();
        for s in indices {
            self.set_held(s, false);
        }
        let indices: Vec<usize> = self.campaigning.iter().collect();
        for s in indices {
            self.set_campaigning(s, false);
        }
        let indices: Vec<u32> = self.loads.keys().copied().collect();
        for s in indices {
            self.set_load(s as usize, 0);
        }
        self.moves = None;
    }

    /// The member value for the state now. The base is written again only when the
    /// change lists would be longer than a quarter of it, so the lists stay short and
    /// writing the base is paid for by the changes since the last one.
    pub(crate) fn value(&mut self) -> String {
        let mv = self
            .moves
            .as_ref()
            .map_or_else(String::new, |m| format!(" mv={}", encode_directives(m)));
        let zone = self
            .zone
            .as_ref()
            .map_or_else(String::new, |z| format!(" z={z}"));
        let mut dh = encode_list(self.held_delta.iter().map(|i| *i as usize));
        let mut dc = encode_list(self.campaigning_delta.iter().map(|i| *i as usize));
        let mut dl = if self.loads_withheld {
            "-".to_string()
        } else {
            encode_pairs(self.load_delta.iter().map(|(s, c)| (*s, *c)))
        };
        if dh.len() + dc.len() + dl.len() > self.base_text.len() / 4 + 64 {
            self.base_text = format!("h={} c={}", self.held.encode(), self.campaigning.encode());
            // The codes of held shards go with the base; a code for a shard not held
            // (none is kept) would stay a change.
            let (held_codes, others): (BTreeMap<u32, u8>, BTreeMap<u32, u8>) = self
                .loads
                .iter()
                .partition(|(s, _)| self.held.contains(**s as usize));
            let codes = (!held_codes.is_empty())
                .then(|| format!(" lc={}", encode_aligned(&self.held, &held_codes)));
            // The changes until the next base add at most a quarter of it; the
            // balancer's moves and the zone are as long as now, the rest well under a
            // kilobyte.
            let rest = mv.len() + zone.len() + 1024;
            let fits = |base: usize| base + base / 4 + rest <= MAX_MEMBER_VALUE_LEN;
            self.loads_withheld = codes
                .as_ref()
                .is_some_and(|c| !fits(self.base_text.len() + c.len()));
            if self.loads_withheld {
                self.base_loads.clear();
                self.load_delta = self.loads.clone();
            } else {
                self.base_text.push_str(codes.as_deref().unwrap_or(""));
                self.base_loads = held_codes;
                self.load_delta = others;
            }
            self.generation += 1;
            self.held_delta.clear();
            self.campaigning_delta.clear();
            (dh, dc) = ("-".to_string(), "-".to_string());
            dl = if self.loads_withheld {
                "-".to_string()
            } else {
                encode_pairs(self.load_delta.iter().map(|(s, c)| (*s, *c)))
            };
        }
        let dl = if dl == "-" {
            String::new()
        } else {
            format!(" dl={dl}")
        };
        format!(
            "{TAG} p={} w={} d={}{zone} b={:x}.{} dh={dh} dc={dc}{dl}{mv} {}",
            self.shards,
            self.weight,
            u8::from(self.draining),
            self.nonce,
            self.generation,
            self.base_text
        )
    }
}

/// Set bit `s` of `set` to `on`, keeping `delta` (the bits that differ from the base)
/// in step; true if the bit changed.
fn set_tracked(set: &mut ShardSet, delta: &mut BTreeSet<u32>, s: usize, on: bool) -> bool {
    if s >= set.bits.len() * 8 || set.contains(s) == on {
        return false;
    }
    set.set(s, on);
    let i = s as u32;
    if !delta.remove(&i) {
        delta.insert(i);
    }
    true
}

/// The namespace as every node sees it from the same member list.
#[derive(Clone, Debug, Default)]
pub(crate) struct View {
    /// Members taking part, sorted by id.
    pub(crate) nodes: Vec<NodeSpec>,
    pub(crate) states: Vec<Arc<NodeState>>,
    /// Each node's member, as decoded into `states` (an unchanged value is not
    /// decoded again, and its state is shared with the previous view).
    values: Vec<Member>,
    /// Who holds each shard by the published claims (the lowest node index wins a
    /// momentary double claim; safety never depends on this).
    pub(crate) holders: Holders,
    /// Shards each node holds by `holders`.
    pub(crate) leads: Vec<usize>,
    /// Each node's load: the sum of the [`level`](crate::balance::level)s of the
    /// shards it holds by `holders` (kept up to date shard by shard, like `leads`).
    pub(crate) node_load: Vec<u64>,
    /// Members whose value could not be used, with the reason.
    pub(crate) ignored: Vec<(String, String)>,
    /// Each shard's last published load code.
    pub(crate) loads: Loads,
    /// The leaders the balancer asks for, (shard, node) ascending, when it balances by
    /// load; `None` when it balances by count. The balancer is the first active node.
    pub(crate) moves: Option<Arc<Vec<(usize, u32)>>>,
    /// Changes whenever a load code or the balancer's moves change.
    pub(crate) load_epoch: u64,
    /// Changes whenever a load code changes.
    pub(crate) figures_epoch: u64,
    /// The shards whose load code changed since the view this one was updated from.
    pub(crate) figures_changed: usize,
}

/// Whether `a` and `b` are the same text, without reading them where they are the same
/// bytes: a store's member list hands the unchanged values of one list on to the next
/// (shared), and with N members of P/8-byte states each node would otherwise compare
/// O(N·P) bytes per update of one member.
fn same_text(a: &str, b: &str) -> bool {
    a.len() == b.len() && (std::ptr::eq(a.as_ptr(), b.as_ptr()) || a == b)
}

/// Which shards may be seen differently after a new view: their holder or a node's
/// campaigning claim changed. `All` when the node list changed (node numbers moved).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Changed {
    All,
    Shards(Vec<usize>),
}

impl View {
    pub(crate) fn build(members: &[Member], shards: usize) -> View {
        View::update(&View::default(), members, shards).0
    }

    /// The view of `members`, reusing `prev`: a member whose value did not change is
    /// not decoded again, and when the node list is the same, holders are patched only
    /// where a claim changed, so the cost grows with the bytes that changed rather than
    /// with the shards. Also says which shards changed.
    pub(crate) fn update(prev: &View, members: &[Member], shards: usize) -> (View, Changed) {
        let mut sorted: Vec<&Member> = members.iter().collect();
        sorted.sort_by(|a, b| a.id().cmp(b.id()));
        let mut view = View::default();
        let same_size = prev.holders.len() == shards;
        for m in sorted {
            let known = prev.index_of(m.id()).map(|i| i as usize);
            let reused =
                known.filter(|i| same_size && same_text(prev.values[*i].value(), m.value()));
            let decoded = match (reused, known) {
                (Some(i), _) => Ok((prev.states[i].clone(), prev.values[i].clone())),
                (None, known) => {
                    let before = known.filter(|_| same_size).map(|i| &*prev.states[i]);
                    NodeState::decode(m.value(), before).map(|st| (Arc::new(st), m.clone()))
                }
            };
            match decoded {
                Ok((st, value)) if st.shards == shards => {
                    view.nodes.push(NodeSpec {
                        id: m.id().to_string(),
                        weight: st.weight,
                        draining: st.draining,
                        zone: st.zone.clone(),
                    });
                    view.states.push(st);
                    view.values.push(value);
                }
                Ok((st, _)) => view.ignored.push((
                    m.id().to_string(),
                    format!(
                        "configured for {} shards, this namespace has {shards}",
                        st.shards
                    ),
                )),
                Err(e) => view.ignored.push((m.id().to_string(), e)),
            }
        }
        let same_nodes = same_size
            && prev.nodes.len() == view.nodes.len()
            && prev
                .nodes
                .iter()
                .zip(&view.nodes)
                .all(|(a, b)| a.id == b.id);
        view.loads = if same_size {
            prev.loads.clone()
        } else {
            Loads::default()
        };
        view.load_epoch = prev.load_epoch;
        view.figures_epoch = prev.figures_epoch;
        if !same_nodes {
            view.holders = Holders::new(shards);
            view.leads = vec![0; view.nodes.len()];
            for (n, st) in view.states.iter().enumerate() {
                for s in st.held.iter() {
                    if view.holders.get(s).is_none() {
                        view.holders.set(s, Some(n as u32));
                        view.leads[n] += 1;
                    }
                }
            }
            let mut loads_moved = 0;
            view.node_load = vec![0; view.nodes.len()];
            if view.loads.reported > 0 || view.states.iter().any(|st| st.has_loads()) {
                for s in 0..shards {
                    loads_moved += usize::from(view.take_load(s, shards));
                    if let Some(h) = view.holders.get(s) {
                        view.node_load[h as usize] += crate::balance::level(view.loads.get(s));
                    }
                }
            }
            view.settle_moves(prev, loads_moved);
            return (view, Changed::All);
        }
        view.holders = prev.holders.clone();
        view.leads = prev.leads.clone();
        view.node_load = prev.node_load.clone();
        let mut changed = Vec::new();
        // Each shard whose held bit flipped somewhere, with the lowest node that took
        // it in this update (if any).
        let mut flipped: HashMap<usize, Option<u32>> = HashMap::new();
        let mut load_changed = Vec::new();
        for n in 0..view.nodes.len() {
            if Arc::ptr_eq(&prev.states[n], &view.states[n]) {
                continue;
            }
            load_changed.extend(prev.states[n].loads_changed(&view.states[n]));
            let (held, campaigning) = prev.states[n].changed(&view.states[n]);
            changed.extend(campaigning);
            for s in held {
                changed.push(s);
                let took = view.states[n].held.contains(s).then_some(n as u32);
                let lowest = flipped.entry(s).or_insert(None);
                *lowest = match (*lowest, took) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        // The holder is the lowest node that claims the shard. Nodes below the old
        // holder did not claim it, so unless the old holder let go, the new one is the
        // lower of it and the lowest taker; only a shard its holder let go needs a look
        // at every node (another may have claimed it all along: a double claim).
        for (s, lowest_taker) in flipped {
            let old = view.holders.get(s);
            let holder = match old {
                Some(h) if view.states[h as usize].held.contains(s) => {
                    Some(lowest_taker.map_or(h, |t| t.min(h)))
                }
                None => lowest_taker,
                Some(_) => view
                    .states
                    .iter()
                    .position(|st| st.held.contains(s))
                    .map(|h| h as u32),
            };
            if holder == old {
                continue;
            }
            if let Some(h) = old {
                view.leads[h as usize] -= 1;
            }
            if let Some(h) = holder {
                view.leads[h as usize] += 1;
            }
            view.holders.set(s, holder);
        }
        // A shard's load is its holder's figure: look again where a figure or a
        // holder changed.
        let mut loads_moved = 0;
        let mut looked: Vec<usize> = load_changed
            .into_iter()
            .chain(changed.iter().copied())
            .collect();
        looked.sort_unstable();
        looked.dedup();
        for &s in &looked {
            loads_moved += usize::from(view.take_load(s, shards));
            // Each node's load: out with what the shard added before, in with what it
            // adds now.
            let load = |v: &View| {
                v.holders
                    .get(s)
                    .map(|h| (h, crate::balance::level(v.loads.get(s))))
            };
            if let Some((h, l)) = load(prev) {
                view.node_load[h as usize] -= l;
            }
            if let Some((h, l)) = load(&view) {
                view.node_load[h as usize] += l;
            }
        }
        view.settle_moves(prev, loads_moved);
        (view, Changed::Shards(changed))
    }

    /// Take shard `s`'s load code from its holder, if it has one (a shard without a
    /// holder keeps its last); true if it changed.
    fn take_load(&mut self, s: usize, shards: usize) -> bool {
        match self.holders.get(s) {
            Some(h) => {
                let code = self.states[h as usize].load(s);
                self.loads.set(s, code, shards)
            }
            None => false,
        }
    }

    /// Read the balancer's moves, and move the load epoch on if they or a load
    /// (`loads_moved` of them) changed since `prev`.
    fn settle_moves(&mut self, prev: &View, loads_moved: usize) {
        self.figures_changed = loads_moved;
        let balancer = self.nodes.iter().position(|n| !n.draining && n.weight > 0);
        self.moves = balancer.and_then(|b| {
            self.states[b].moves.as_ref().map(|moves| {
                Arc::new(
                    moves
                        .iter()
                        .filter_map(|(s, to)| self.index_of(to).map(|n| (*s as usize, n)))
                        .collect(),
                )
            })
        });
        if loads_moved > 0 {
            self.figures_epoch = prev.figures_epoch.wrapping_add(1);
        }
        if loads_moved > 0 || self.moves != prev.moves {
            self.load_epoch = prev.load_epoch.wrapping_add(1);
        }
    }

    pub(crate) fn index_of(&self, id: &str) -> Option<u32> {
        self.nodes
            .binary_search_by(|n| n.id.as_str().cmp(id))
            .ok()
            .map(|i| i as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state holding `held` and campaigning for `campaigning`, as its value.
    fn value_of(shards: usize, held: &[usize], campaigning: &[usize]) -> String {
        let mut own = OwnState::new(shards, 1, 7);
        for s in held {
            own.set_held(*s, true);
        }
        for s in campaigning {
            own.set_campaigning(*s, true);
        }
        own.value()
    }

    #[test]
    fn state_round_trips() {
        let mut own = OwnState::new(13, 2, 0xab);
        own.set_held(0, true);
        own.set_held(12, true);
        own.set_campaigning(5, true);
        own.set_draining(true);
        let text = own.value();
        assert!(
            text.starts_with("tenure-shard/2 p=13 w=2 d=1 b=ab."),
            "{text}"
        );
        let st = NodeState::decode(&text, None).unwrap();
        assert_eq!(st.held.iter().collect::<Vec<_>>(), vec![0, 12]);
        assert_eq!(st.campaigning.iter().collect::<Vec<_>>(), vec![5]);
        assert!(st.draining);
        assert!(draining_in(&text));
        assert_eq!(st.weight, 2);
        assert_eq!(st.zone, None);
        let empty = OwnState::new(10_000, 1, 1).value();
        assert!(!draining_in(&empty));
        assert!(!draining_in("d=1"), "not a state value");
        assert!(empty.ends_with("dh=- dc=- h=- c=-"), "{empty}");
    }

    #[test]
    fn load_codes_and_moves_round_trip_and_patch_like_the_sets() {
        let mut own = OwnState::new(5000, 1, 9);
        let plain = own.value();
        assert!(!plain.contains(" lc=") && !plain.contains(" dl=") && !plain.contains(" mv="));
        for s in 0..5000 {
            own.set_held(s, s % 3 == 0);
            if s % 3 == 0 {
                own.set_load(s, (s % 250) as u8 + 1);
            }
        }
        own.set_moves(Some(vec![
            (7, "node-b".into()),
            (3, "node-a".into()),
            (9, "node-b".into()),
        ]));
        let first_text = own.value();
        assert!(first_text.contains(" lc=") && !first_text.contains(" l="));
        let first = NodeState::decode(&first_text, None).unwrap();
        for s in 0..5000 {
            let want = if s % 3 == 0 { (s % 250) as u8 + 1 } else { 0 };
            assert_eq!(first.load(s), want, "shard {s}");
        }
        let moves: Vec<(u32, String)> = first
            .moves
            .clone()
            .unwrap()
            .into_iter()
            .map(|(s, to)| (s, to.to_string()))
            .collect();
        assert_eq!(
            moves,
            vec![
                (3, "node-a".into()),
                (7, "node-b".into()),
                (9, "node-b".into())
            ]
        );
        // A few changes go out as `dl` under the same base; patched equals whole.
        own.set_load(0, 0);
        own.set_load(3, 200);
        own.set_load(1, 5);
        let second_text = own.value();
        assert!(second_text.contains(" dl="), "{second_text}");
        let patched = NodeState::decode(&second_text, Some(&first)).unwrap();
        let whole = NodeState::decode(&second_text, None).unwrap();
        for s in 0..5000 {
            assert_eq!(patched.load(s), whole.load(s), "shard {s}");
        }
        assert_eq!(
            (patched.load(0), patched.load(3), patched.load(1)),
            (0, 200, 5)
        );
        assert_eq!(first.loads_changed(&patched), vec![0, 1, 3]);
        assert!(NodeState::decode(
            "tenure-shard/2 p=4 w=1 d=0 b=1.0 dh=- dc=- h=- c=- l=zz",
            None
        )
        .is_err());
        // Codes aligned with the held set: one byte per held shard, no more, no less.
        let held_two = format!("h=l{}", encode_list([1usize, 3].into_iter()));
        let value = |codes: &[u8]| {
            format!(
                "tenure-shard/2 p=4 w=1 d=0 b=1.0 dh=- dc=- {held_two} c=- lc={}",
                URL_SAFE_NO_PAD.encode(codes)
            )
        };
        let st = NodeState::decode(&value(&[7, 0]), None).unwrap();
        assert_eq!((st.load(1), st.load(3)), (7, 0));
        assert!(NodeState::decode(&value(&[7]), None).is_err());
        assert!(NodeState::decode(&value(&[7, 8, 9]), None).is_err());
        // A base written as pairs (`l=`, before `lc=`) is still read.
        let pairs = format!(
            "tenure-shard/2 p=4 w=1 d=0 b=1.0 dh=- dc=- {held_two} c=- l={}",
            encode_pairs([(3u32, 9u8)].into_iter())
        );
        assert_eq!(NodeState::decode(&pairs, None).unwrap().load(3), 9);
    }

    /// At 10^6 shards a node holding 100,000 with codes publishes them within the
    /// member value limit; one holding 300,000 would pass it, so it publishes its
    /// holdings without codes, and the codes again once it holds fewer.
    #[test]
    fn load_codes_fit_the_member_value_or_are_withheld() {
        let p = 1_000_000;
        let mut own = OwnState::new(p, 1, 3);
        let hold = |own: &mut OwnState, every: usize| {
            for s in 0..p {
                let on = s % every == 0;
                own.set_held(s, on);
                own.set_load(s, if on { (s % 200) as u8 + 1 } else { 0 });
            }
        };
        hold(&mut own, 10);
        let text = own.value();
        assert!(!own.loads_withheld());
        assert!(text.len() <= MAX_MEMBER_VALUE_LEN, "{} bytes", text.len());
        eprintln!(
            "100,000 of 10^6 shards held, with codes: {} bytes",
            text.len()
        );
        let st = NodeState::decode(&text, None).unwrap();
        assert_eq!((st.load(10), st.load(20), st.load(15)), (11, 21, 0));
        hold(&mut own, 3);
        let text = own.value();
        assert!(own.loads_withheld());
        assert!(text.len() <= MAX_MEMBER_VALUE_LEN, "{} bytes", text.len());
        let st = NodeState::decode(&text, None).unwrap();
        assert!(st.held.contains(999_999) && st.load(999_999) == 0);
        hold(&mut own, 10);
        let text = own.value();
        assert!(!own.loads_withheld());
        assert_eq!(NodeState::decode(&text, None).unwrap().load(10), 11);
    }

    #[test]
    fn a_shard_s_load_is_its_holder_s_and_outlives_a_gap_without_one() {
        let (mut a, mut b) = (OwnState::new(8, 1, 1), OwnState::new(8, 1, 2));
        a.set_held(2, true);
        a.set_load(2, 40);
        b.set_load(2, 90); // not its shard: ignored
        let members = |a: &mut OwnState, b: &mut OwnState| {
            vec![
                Member::new("a", a.value()).unwrap(),
                Member::new("b", b.value()).unwrap(),
            ]
        };
        let (v1, _) = View::update(&View::default(), &members(&mut a, &mut b), 8);
        assert_eq!((v1.loads.get(2), v1.loads.reported), (40, 1));
        // a lets go: nobody holds it, the figure stays.
        a.set_held(2, false);
        a.set_load(2, 0);
        let (v2, _) = View::update(&v1, &members(&mut a, &mut b), 8);
        assert_eq!(v2.holders.get(2), None);
        assert_eq!(v2.loads.get(2), 40);
        assert_eq!(v2.figures_epoch, v1.figures_epoch);
        // b takes it with the figure it publishes.
        b.set_held(2, true);
        b.set_load(2, 41);
        let (v3, _) = View::update(&v2, &members(&mut a, &mut b), 8);
        assert_eq!(v3.loads.get(2), 41);
        assert_ne!(v3.figures_epoch, v2.figures_epoch);
        // The view rebuilt from scratch agrees.
        let fresh = View::build(&members(&mut a, &mut b), 8);
        assert_eq!(fresh.loads.get(2), 41);
    }

    #[test]
    fn a_zone_is_published_only_when_set() {
        let mut own = OwnState::new(8, 1, 7).in_zone(Some("eu-west-1a/r7".into()));
        own.set_held(3, true);
        let text = own.value();
        assert!(text.contains(" d=0 z=eu-west-1a/r7 b=7."), "{text}");
        let st = NodeState::decode(&text, None).unwrap();
        assert_eq!(st.zone.as_deref(), Some("eu-west-1a/r7"));
        assert_eq!(st.held.iter().collect::<Vec<_>>(), vec![3]);
        // A value from a node that does not know zones reads as "no zone".
        let old = OwnState::new(8, 1, 7).value();
        assert!(!old.contains("z="), "{old}");
        assert_eq!(NodeState::decode(&old, None).unwrap().zone, None);
    }

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

    /// A small deterministic generator for the randomized tests.
    fn next(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    #[test]
    fn values_decoded_from_the_change_lists_equal_values_decoded_whole() {
        let p = 5_000;
        let mut own = OwnState::new(p, 1, 99);
        let mut truth = (ShardSet::new(p), ShardSet::new(p));
        let mut prev: Option<NodeState> = None;
        let (mut rng, mut rebased, mut incremental) = (0x1234_5678_u64, 0, 0);
        for round in 0..400 {
            for _ in 0..(next(&mut rng) % 60) {
                let s = (next(&mut rng) % p as u64) as usize;
                let on = !next(&mut rng).is_multiple_of(3);
                if next(&mut rng).is_multiple_of(2) {
                    own.set_held(s, on);
                    truth.0.set(s, on);
                } else {
                    own.set_campaigning(s, on);
                    truth.1.set(s, on);
                }
            }
            let value = own.value();
            let whole = NodeState::decode(&value, None).unwrap();
            assert_eq!((&whole.held, &whole.campaigning), (&truth.0, &truth.1));
            if let Some(prev) = &prev {
                let patched = NodeState::decode(&value, Some(prev)).unwrap();
                assert_eq!(patched, whole, "round {round}");
                let (held, campaigning) = prev.changed(&patched);
                let mut expected: Vec<usize> = prev.held.changed(&whole.held).collect();
                expected.sort_unstable();
                assert_eq!(held, expected, "round {round}");
                let expected: Vec<usize> = prev.campaigning.changed(&whole.campaigning).collect();
                assert_eq!(campaigning, expected, "round {round}");
                if patched.base == prev.base {
                    incremental += 1;
                } else {
                    rebased += 1;
                }
            }
            prev = Some(whole);
        }
        assert!(incremental > 300 && rebased > 0, "{incremental} {rebased}");
    }

    #[test]
    fn a_value_keeps_its_base_until_the_changes_outgrow_a_quarter_of_it() {
        let p = 100_000;
        let mut own = OwnState::new(p, 1, 3);
        for s in (0..p).step_by(10) {
            own.set_held(s, true);
        }
        let first = own.value();
        let base = |v: &str| {
            v.split(' ')
                .find(|f| f.starts_with("b="))
                .map(str::to_string)
        };
        own.set_held(11, true);
        let second = own.value();
        assert_eq!(base(&first), base(&second));
        assert!(
            second.len() < first.len() + 16,
            "{} {}",
            first.len(),
            second.len()
        );
        // Many changes: the base is written again and the lists emptied.
        for s in (1..p).step_by(7) {
            own.set_campaigning(s, true);
        }
        let third = own.value();
        assert_ne!(base(&second), base(&third));
        assert!(third.contains(" dh=- dc=- "), "{:.80}", third);
    }

    #[test]
    fn the_largest_state_of_the_largest_layout_can_be_published() {
        let p = crate::config::MAX_SHARDS;
        let mut own = OwnState::new(p, crate::config::MAX_WEIGHT, u64::MAX);
        own.set_draining(true);
        // Every shard at density one half (the worst for both forms), then changes
        // just short of a rewrite of the base.
        let mut rng = 77_u64;
        for s in 0..p {
            own.set_held(s, next(&mut rng).is_multiple_of(2));
            own.set_campaigning(s, next(&mut rng).is_multiple_of(2));
        }
        let mut largest = own.value().len();
        for s in (0..p).step_by(97) {
            own.set_held(s, !own.holds(s));
            largest = largest.max(own.value().len());
        }
        // The crate README bounds it by about 440 KB: a base of two 175 KB bitmaps and
        // lists of at most a quarter of it.
        assert!(largest < 440_000, "{largest} bytes for {p} shards");
        assert!(
            Member::new("a-node-id-of-some-length", "x".repeat(largest)).is_ok(),
            "{largest} bytes for {p} shards"
        );
    }

    #[test]
    fn bad_values_are_reported_not_used() {
        for bad in [
            "",
            "hello",
            "tenure-shard/1 p=8 w=1 d=0 h=- c=-",
            "tenure-shard/2 p=x w=1 d=0 b=1.0 dh=- dc=- h=- c=-",
            "tenure-shard/2 p=8 w=1 d=0 b=1.0 dh=- dc=- h=b!! c=-",
            "tenure-shard/2 p=8 w=1 d=0 b=1.0 dh=- dc=- h=bAAAA c=-",
            "tenure-shard/2 p=8 w=1 d=0 b=1.0 dh=- dc=- h=AA c=-",
            "tenure-shard/2 p=8 w=1 d=0 b=1.0 dh=CQ dc=- h=- c=-",
            "tenure-shard/2 p=8 w=1 d=0 b=1.0 dh=- dc=- c=-",
            "tenure-shard/2 p=8 w=1 d=0 dh=- dc=- h=- c=-",
            "tenure-shard/2 p=8 w=1 d=0 h",
        ] {
            assert!(NodeState::decode(bad, None).is_err(), "{bad:?}");
        }
        let members = vec![
            Member::new("b", value_of(8, &[], &[])).unwrap(),
            Member::new("a", "garbage").unwrap(),
            Member::new("c", value_of(9, &[], &[])).unwrap(),
        ];
        let v = View::build(&members, 8);
        assert_eq!(v.nodes.len(), 1);
        assert_eq!(v.nodes[0].id, "b");
        assert_eq!(v.ignored.len(), 2);
    }

    /// A node list with the given held sets, by id.
    fn members(held: &[(&str, &[usize])], shards: usize) -> Vec<Member> {
        held.iter()
            .map(|(id, h)| Member::new(*id, value_of(shards, h, &[])).unwrap())
            .collect()
    }

    #[test]
    fn an_updated_view_equals_a_built_one_and_names_the_changed_shards() {
        let p = 20;
        let before = View::build(&members(&[("a", &[1, 2]), ("b", &[2, 3])], p), p);
        assert_eq!(
            before.holders.get(2),
            Some(0),
            "a double claim goes to the lower index"
        );
        // a gives up 2 (b's claim takes over) and takes 9; b's value is unchanged.
        let list = members(&[("a", &[1, 9]), ("b", &[2, 3])], p);
        let (after, changed) = View::update(&before, &list, p);
        let built = View::build(&list, p);
        assert_eq!(after.holders, built.holders);
        assert_eq!(after.leads, built.leads);
        assert_eq!(after.leads, vec![2, 2]);
        let Changed::Shards(mut shards) = changed else {
            panic!("the same nodes: shards expected");
        };
        shards.sort_unstable();
        assert_eq!(shards, vec![2, 9]);
        // A new node renumbers the others: everything may have changed.
        let list = members(&[("0", &[]), ("a", &[1, 9]), ("b", &[2, 3])], p);
        let (after, changed) = View::update(&after, &list, p);
        assert_eq!(changed, Changed::All);
        assert_eq!(after.holders, View::build(&list, p).holders);
    }

    #[test]
    fn an_update_that_keeps_the_base_patches_the_view() {
        let p = 1_000;
        let mut a = OwnState::new(p, 1, 5);
        for s in 0..400 {
            a.set_held(s, true);
        }
        let b = value_of(p, &[500, 501], &[]);
        let before = View::build(
            &[
                Member::new("a", a.value()).unwrap(),
                Member::new("b", &b).unwrap(),
            ],
            p,
        );
        a.set_held(3, false);
        a.set_campaigning(700, true);
        let list = [
            Member::new("a", a.value()).unwrap(),
            Member::new("b", &b).unwrap(),
        ];
        let (after, changed) = View::update(&before, &list, p);
        assert_eq!(
            before.states[0].base, after.states[0].base,
            "the base is kept"
        );
        assert_eq!(changed, Changed::Shards(vec![700, 3]));
        assert_eq!(after.holders, View::build(&list, p).holders);
        assert_eq!(after.leads, vec![399, 2]);
        assert!(after.states[0].campaigning.contains(700));
    }

    /// Each node's load summed afresh from `view`'s holders and codes.
    fn summed_loads(view: &View) -> Vec<u64> {
        let mut per = vec![0; view.nodes.len()];
        for s in 0..view.holders.len() {
            if let Some(h) = view.holders.get(s) {
                per[h as usize] += crate::balance::level(view.loads.get(s));
            }
        }
        per
    }

    #[test]
    fn random_updates_with_double_claims_keep_the_holders_of_a_built_view() {
        let (p, n) = (64, 6);
        let mut next = crate::hash::test_rng(0x2545_f491_4f6c_dd1du64);
        let mut own: Vec<OwnState> = (0..n).map(|i| OwnState::new(p, 1, i as u64)).collect();
        let list = |own: &mut [OwnState]| -> Vec<Member> {
            own.iter_mut()
                .enumerate()
                .map(|(i, st)| Member::new(format!("n{i}"), st.value()).unwrap())
                .collect()
        };
        let mut view = View::build(&list(&mut own), p);
        for round in 0..300 {
            // A few nodes flip a few bits each: takes, releases and double claims.
            for _ in 0..1 + next(3) {
                let node = next(n);
                for _ in 0..1 + next(6) {
                    let s = next(p);
                    let on = !own[node].held.contains(s);
                    own[node].set_held(s, on);
                }
                // And reports loads, also for shards it does not hold (its code
                // counts once it does).
                for _ in 0..next(4) {
                    own[node].set_load(next(p), next(40) as u8);
                }
            }
            let members = list(&mut own);
            let (after, _) = View::update(&view, &members, p);
            let built = View::build(&members, p);
            assert_eq!(after.holders, built.holders, "round {round}");
            assert_eq!(after.leads, built.leads, "round {round}");
            assert_eq!(after.node_load, summed_loads(&after), "round {round}");
            view = after;
        }
    }

    #[test]
    fn first_claim_wins_a_double_claim() {
        let v = View::build(
            &[
                Member::new("b", value_of(4, &[1, 2], &[])).unwrap(),
                Member::new("a", value_of(4, &[1], &[])).unwrap(),
            ],
            4,
        );
        assert_eq!(v.holders.to_vec(), vec![None, Some(0), Some(1), None]);
        assert_eq!(v.index_of("b"), Some(1));
    }
}
