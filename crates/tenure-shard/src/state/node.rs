//! Reading a member value: [`NodeState`], one node's published state as decoded,
//! patched from the change lists when the base is the same as before.

use std::sync::Arc;

use super::codec::{
    code_in, decode_aligned, decode_directives, decode_list, decode_pairs, flipped, ShardSet, TAG,
};

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
    pub(super) base: Arc<str>,
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
    pub(super) fn has_loads(&self) -> bool {
        !self.load_base.is_empty() || !self.load_delta.is_empty()
    }

    /// The shards whose load code differs between `self` and `new`, two states of one
    /// member: from the change lists when both keep one base.
    pub(super) fn loads_changed(&self, new: &NodeState) -> Vec<usize> {
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
    pub(super) fn changed(&self, new: &NodeState) -> (Vec<usize>, Vec<usize>) {
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
