//! What a node publishes in its member value, and the view every node builds from the
//! member list: who is a member, with which weight and drain flag, who holds which
//! shard and who campaigns for which.
//!
//! The value is one line of text:
//! `tenure-shard/1 p=<shards> w=<weight> d=<0|1> h=<held> c=<campaigning>`, where the
//! two sets are bitmaps over the shard indices in URL-safe base64 without padding
//! (bit `i` is bit `i % 8` of byte `i / 8`), or `-` when empty. 10,000 shards cost
//! about 1.7 KB per set.

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use tenure_core::Member;

use crate::assign::NodeSpec;

const TAG: &str = "tenure-shard/1";

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

    fn is_empty(&self) -> bool {
        self.bits.iter().all(|b| *b == 0)
    }

    fn encode(&self) -> String {
        if self.is_empty() {
            "-".to_string()
        } else {
            URL_SAFE_NO_PAD.encode(&self.bits)
        }
    }

    fn decode(s: &str, shards: usize) -> Result<Self, String> {
        if s == "-" {
            return Ok(ShardSet::new(shards));
        }
        let bits = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|e| format!("bad bitmap: {e}"))?;
        if bits.len() != shards.div_ceil(8) {
            return Err(format!(
                "bitmap of {} bytes for {shards} shards",
                bits.len()
            ));
        }
        let mut set = ShardSet { bits };
        // Bits past the last shard are ignored.
        for i in shards..set.bits.len() * 8 {
            set.set(i, false);
        }
        Ok(set)
    }
}

/// Which node holds each shard, in chunks shared between views: a new view copies
/// only the chunks whose shards changed hands (copy on write), so cloning a view costs
/// P / 4096 reference counts rather than P entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Holders {
    chunks: Vec<Arc<Vec<u32>>>,
    len: usize,
}

/// Shards per chunk of [`Holders`].
const CHUNK: usize = 4096;

/// "No holder" in [`Holders`].
const NO_HOLDER: u32 = u32::MAX;

impl Holders {
    fn new(len: usize) -> Self {
        let chunks = (0..len.div_ceil(CHUNK))
            .map(|c| Arc::new(vec![NO_HOLDER; CHUNK.min(len - c * CHUNK)]))
            .collect();
        Holders { chunks, len }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The node holding shard `s`, if any.
    pub(crate) fn get(&self, s: usize) -> Option<u32> {
        self.chunks
            .get(s / CHUNK)
            .and_then(|c| c.get(s % CHUNK))
            .copied()
            .filter(|h| *h != NO_HOLDER)
    }

    fn set(&mut self, s: usize, holder: Option<u32>) {
        if let Some(chunk) = self.chunks.get_mut(s / CHUNK) {
            if let Some(h) = Arc::make_mut(chunk).get_mut(s % CHUNK) {
                *h = holder.unwrap_or(NO_HOLDER);
            }
        }
    }

    /// Every shard's holder, in order.
    pub(crate) fn to_vec(&self) -> Vec<Option<u32>> {
        (0..self.len).map(|s| self.get(s)).collect()
    }
}

/// One node's published state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodeState {
    pub(crate) shards: usize,
    pub(crate) weight: u32,
    pub(crate) draining: bool,
    pub(crate) held: ShardSet,
    pub(crate) campaigning: ShardSet,
}

impl NodeState {
    pub(crate) fn new(shards: usize, weight: u32) -> Self {
        NodeState {
            shards,
            weight,
            draining: false,
            held: ShardSet::new(shards),
            campaigning: ShardSet::new(shards),
        }
    }

    pub(crate) fn encode(&self) -> String {
        format!(
            "{TAG} p={} w={} d={} h={} c={}",
            self.shards,
            self.weight,
            u8::from(self.draining),
            self.held.encode(),
            self.campaigning.encode()
        )
    }

    pub(crate) fn decode(value: &str) -> Result<Self, String> {
        let mut parts = value.split(' ');
        if parts.next() != Some(TAG) {
            return Err(format!("not a {TAG} value"));
        }
        let (mut p, mut w, mut d, mut h, mut c) = (None, None, None, None, None);
        for part in parts {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("field {part:?} has no '='"))?;
            match k {
                "p" => p = Some(v.parse::<usize>().map_err(|e| format!("p: {e}"))?),
                "w" => w = Some(v.parse::<u32>().map_err(|e| format!("w: {e}"))?),
                "d" => d = Some(v == "1"),
                "h" => h = Some(v),
                "c" => c = Some(v),
                _ => {} // later versions may add fields
            }
        }
        let shards = p.ok_or("missing p")?;
        Ok(NodeState {
            shards,
            weight: w.ok_or("missing w")?,
            draining: d.unwrap_or(false),
            held: ShardSet::decode(h.ok_or("missing h")?, shards)?,
            campaigning: ShardSet::decode(c.ok_or("missing c")?, shards)?,
        })
    }
}

/// The namespace as every node sees it from the same member list.
#[derive(Clone, Debug, Default)]
pub(crate) struct View {
    /// Members taking part, sorted by id.
    pub(crate) nodes: Vec<NodeSpec>,
    pub(crate) states: Vec<Arc<NodeState>>,
    /// Each node's member value, as decoded into `states` (an unchanged value is not
    /// decoded again, and its state is shared with the previous view).
    values: Vec<Arc<str>>,
    /// Who holds each shard by the published claims (the lowest node index wins a
    /// momentary double claim; safety never depends on this).
    pub(crate) holders: Holders,
    /// Shards each node holds by `holders`.
    pub(crate) leads: Vec<usize>,
    /// Members whose value could not be used, with the reason.
    pub(crate) ignored: Vec<(String, String)>,
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
            let reused = known.filter(|i| same_size && *prev.values[*i] == *m.value());
            let decoded = match reused {
                Some(i) => Ok((prev.states[i].clone(), prev.values[i].clone())),
                None => NodeState::decode(m.value()).map(|st| (Arc::new(st), Arc::from(m.value()))),
            };
            match decoded {
                Ok((st, value)) if st.shards == shards => {
                    view.nodes.push(NodeSpec {
                        id: m.id().to_string(),
                        weight: st.weight,
                        draining: st.draining,
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
            return (view, Changed::All);
        }
        view.holders = prev.holders.clone();
        view.leads = prev.leads.clone();
        let mut changed = Vec::new();
        for n in 0..view.nodes.len() {
            if Arc::ptr_eq(&prev.values[n], &view.values[n]) {
                continue;
            }
            let (old, new) = (&prev.states[n], &view.states[n]);
            changed.extend(old.campaigning.changed(&new.campaigning));
            for s in old.held.changed(&new.held) {
                changed.push(s);
                let holder = view.states.iter().position(|st| st.held.contains(s));
                let holder = holder.map(|h| h as u32);
                if let Some(h) = view.holders.get(s) {
                    view.leads[h as usize] -= 1;
                }
                if let Some(h) = holder {
                    view.leads[h as usize] += 1;
                }
                view.holders.set(s, holder);
            }
        }
        (view, Changed::Shards(changed))
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

    #[test]
    fn state_round_trips() {
        let mut st = NodeState::new(13, 2);
        st.held.set(0, true);
        st.held.set(12, true);
        st.campaigning.set(5, true);
        st.draining = true;
        let text = st.encode();
        assert!(text.starts_with("tenure-shard/1 p=13 w=2 d=1 h="));
        assert_eq!(NodeState::decode(&text).unwrap(), st);
        assert_eq!(st.held.iter().collect::<Vec<_>>(), vec![0, 12]);
        let empty = NodeState::new(10_000, 1).encode();
        assert!(empty.ends_with("h=- c=-"), "{empty}");
    }

    #[test]
    fn the_largest_state_of_the_largest_layout_can_be_published() {
        let p = crate::config::MAX_SHARDS;
        let mut st = NodeState::new(p, crate::config::MAX_WEIGHT);
        st.draining = true;
        for s in 0..p {
            st.held.set(s, true);
            st.campaigning.set(s, true);
        }
        let value = st.encode();
        assert!(
            Member::new("a-node-id-of-some-length", &value).is_ok(),
            "{} bytes for {p} shards",
            value.len()
        );
    }

    #[test]
    fn bad_values_are_reported_not_used() {
        for bad in [
            "",
            "hello",
            "tenure-shard/1 p=x w=1 d=0 h=- c=-",
            "tenure-shard/1 p=8 w=1 d=0 h=!! c=-",
            "tenure-shard/1 p=8 w=1 d=0 h=AAAA c=-",
            "tenure-shard/1 p=8 w=1 d=0 c=-",
            "tenure-shard/1 p=8 w=1 d=0 h",
        ] {
            assert!(NodeState::decode(bad).is_err(), "{bad:?}");
        }
        let members = vec![
            Member::new("b", NodeState::new(8, 1).encode()).unwrap(),
            Member::new("a", "garbage").unwrap(),
            Member::new("c", NodeState::new(9, 1).encode()).unwrap(),
        ];
        let v = View::build(&members, 8);
        assert_eq!(v.nodes.len(), 1);
        assert_eq!(v.nodes[0].id, "b");
        assert_eq!(v.ignored.len(), 2);
    }

    /// A node list with the given held sets, by id.
    fn members(held: &[(&str, &[usize])], shards: usize) -> Vec<Member> {
        held.iter()
            .map(|(id, h)| {
                let mut st = NodeState::new(shards, 1);
                for s in *h {
                    st.held.set(*s, true);
                }
                Member::new(*id, st.encode()).unwrap()
            })
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
    fn first_claim_wins_a_double_claim() {
        let mut a = NodeState::new(4, 1);
        a.held.set(1, true);
        let mut b = NodeState::new(4, 1);
        b.held.set(1, true);
        b.held.set(2, true);
        let v = View::build(
            &[
                Member::new("b", b.encode()).unwrap(),
                Member::new("a", a.encode()).unwrap(),
            ],
            4,
        );
        assert_eq!(v.holders.to_vec(), vec![None, Some(0), Some(1), None]);
        assert_eq!(v.index_of("b"), Some(1));
    }
}
