//! Writing this node's member value: [`OwnState`], kept ready to publish, with its
//! base rewritten only when the change lists outgrow a quarter of it.

use std::collections::{BTreeMap, BTreeSet};

use tenure_core::MAX_MEMBER_VALUE_LEN;

use super::codec::{encode_aligned, encode_directives, encode_list, encode_pairs, ShardSet, TAG};

/// This node's own state, kept ready to publish: the sets, and the base and change
/// lists of the value that carries them (see the module docs).
#[derive(Debug)]
pub(crate) struct OwnState {
    shards: usize,
    weight: u32,
    draining: bool,
    zone: Option<String>,
    pub(super) held: ShardSet,
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
