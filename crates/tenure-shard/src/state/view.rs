//! The view every node builds from the member list ([`View`]): who is a member, who
//! holds each shard and with which load, patched from the last view where members
//! changed; with the copy-on-write per-shard tables it keeps.

use std::collections::HashMap;
use std::sync::Arc;

use tenure_core::Member;

use super::node::NodeState;
use crate::assign::NodeSpec;

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
