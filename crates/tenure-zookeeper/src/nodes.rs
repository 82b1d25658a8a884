//! Node names and contents of both layouts.
//!
//! **Curator layout** (`layout=curator`): a candidacy is an ephemeral sequential node
//! `<chroot>/<election>/_c_<session-uuid>-latch-<10-digit sequence>`, the name Curator's
//! `LeaderLatch` gives its participants (the `_c_<uuid>-` part is Curator's "protected"
//! prefix, which lets a candidate find its own node again after a lost create answer).
//! The lowest sequence leads; other children (sub-elections, foreign nodes) are ignored.
//!
//! **Priority layout** (the default): a candidacy is an ephemeral sequential node
//! `_c_<uuid>-<flag><key>-<10-digit sequence>`, where `key` is `1000 - priority` in four
//! digits (so a higher priority sorts first) and `flag` is `p` (preemptible) or `n`
//! (never preempted). The seat is an ephemeral sequential node
//! `:leader-<uuid>-<sequence>` made by the granted session (its `czxid` is the token);
//! `<uuid>` names the holder's session, whose candidate node stays in the election. A
//! handover request is a persistent node `:handover` (to the best waiter) or
//! `:handover:<candidate node>` (to that waiter). Election names cannot contain `:`, so
//! no sub-election directory is taken for either.

use tenure_core::ElectionName;

/// The lock name Curator's `LeaderLatch` uses.
pub(crate) const LATCH: &str = "latch-";

/// The ZooKeeper path (under the chroot) of an election's directory.
pub(crate) fn election_dir(election: &ElectionName) -> String {
    format!("/{}", election.as_str())
}

/// The name prefix of this session's candidate nodes, `_c_<uuid>-latch-`.
pub(crate) fn protected_prefix(uuid: &str) -> String {
    format!("_c_{uuid}-{LATCH}")
}

/// The sequence number of a latch node name, `None` for other children.
pub(crate) fn sequence_of(name: &str) -> Option<u64> {
    let at = name.rfind(LATCH)?;
    let digits = &name[at + LATCH.len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Latch children sorted by sequence (ties by name), others dropped.
pub(crate) fn sorted_latches(children: Vec<String>) -> Vec<String> {
    let mut latches: Vec<(u64, String)> = children
        .into_iter()
        .filter_map(|c| sequence_of(&c).map(|s| (s, c)))
        .collect();
    latches.sort();
    latches.into_iter().map(|(_, c)| c).collect()
}

/// The lowest and highest priority a candidate may have (contract clause 14).
const PRIORITY_RANGE: i32 = 1000;

/// The sort key of `priority`: `1000 - priority`, so that a higher priority sorts first
/// (clamped to the contract's range, which the core already checks).
pub(crate) fn priority_key(priority: i32) -> u16 {
    let p = priority.clamp(-PRIORITY_RANGE, PRIORITY_RANGE);
    u16::try_from(PRIORITY_RANGE - p).unwrap_or(0)
}

/// The name prefix of a candidate node of the priority layout (ZooKeeper appends the
/// sequence): `_c_<uuid>-<flag><key>-`.
pub(crate) fn candidate_prefix(uuid: &str, priority: i32, preemptible: bool) -> String {
    let flag = if preemptible { 'p' } else { 'n' };
    format!("_c_{uuid}-{flag}{:04}-", priority_key(priority))
}

/// The start shared by every candidate node of a session: `_c_<uuid>-`.
pub(crate) fn session_prefix(uuid: &str) -> String {
    format!("_c_{uuid}-")
}

/// The name prefix of the leader node a session makes when granted: `:leader-<uuid>-`.
pub(crate) fn leader_prefix(uuid: &str) -> String {
    format!("{LEADER}{uuid}-")
}

/// Leader nodes start so.
pub(crate) const LEADER: &str = ":leader-";
/// Handover nodes start so.
pub(crate) const HANDOVER: &str = ":handover";

/// The handover node asking for `target` (a candidate node name), or for the best
/// waiter.
pub(crate) fn handover_name(target: Option<&str>) -> String {
    match target {
        Some(t) => format!("{HANDOVER}:{t}"),
        None => HANDOVER.to_string(),
    }
}

/// A candidate node of the priority layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The node's name.
    pub(crate) name: String,
    /// The session's uuid.
    pub(crate) uuid: String,
    /// `1000 - priority`: lower is better.
    pub(crate) key: u16,
    /// False for a candidate that campaigned never preempted.
    pub(crate) preemptible: bool,
    /// The sequence ZooKeeper appended.
    pub(crate) sequence: u64,
}

/// Splits `<rest>-<10 digits>` into the rest and the sequence.
fn split_sequence(name: &str) -> Option<(&str, u64)> {
    let (rest, digits) = name.rsplit_once('-')?;
    if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((rest, digits.parse().ok()?))
}

/// The candidate node `name` of the priority layout, `None` for anything else.
pub(crate) fn parse_candidate(name: &str) -> Option<Entry> {
    let (rest, sequence) = split_sequence(name.strip_prefix("_c_")?)?;
    let (uuid, tag) = rest.rsplit_once('-')?;
    let (flag, key) = tag.split_at_checked(1)?;
    let preemptible = match flag {
        "p" => true,
        "n" => false,
        _ => return None,
    };
    if uuid.is_empty() || key.len() != 4 || !key.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let key: u16 = key.parse().ok()?;
    if i32::from(key) > 2 * PRIORITY_RANGE {
        return None;
    }
    Some(Entry {
        name: name.to_string(),
        uuid: uuid.to_string(),
        key,
        preemptible,
        sequence,
    })
}

/// The session uuid of the leader node `name`, `None` for anything else.
pub(crate) fn parse_leader(name: &str) -> Option<&str> {
    let (uuid, _) = split_sequence(name.strip_prefix(LEADER)?)?;
    (!uuid.is_empty()).then_some(uuid)
}

/// The target of the handover node `name` (`Some(None)`: the best waiter), `None` for
/// anything else.
pub(crate) fn parse_handover(name: &str) -> Option<Option<&str>> {
    match name.strip_prefix(HANDOVER)? {
        "" => Some(None),
        rest => rest.strip_prefix(':').map(Some),
    }
}

/// An election's children as the priority layout reads them.
#[derive(Clone, Debug, Default)]
pub(crate) struct Queue {
    /// The waiters in grant order: the handover's target (if it waits) first, then by
    /// priority, then by sequence. The holder's candidate node is not among them.
    pub(crate) waiters: Vec<Entry>,
    /// The leader node, if the seat is held.
    pub(crate) leader: Option<String>,
    /// The holder's session uuid.
    pub(crate) holder: Option<String>,
    /// The holder's candidate node, if it has one.
    pub(crate) holder_entry: Option<Entry>,
    /// The handover nodes (at most one unless someone made more by hand).
    pub(crate) handovers: Vec<String>,
    /// Whether the election holds Curator `LeaderLatch` nodes (`…latch-<sequence>`).
    pub(crate) curator: bool,
}

impl Queue {
    /// Read `children`: candidates, the leader node, handover nodes; other children
    /// (sub-elections) are ignored.
    pub(crate) fn parse(children: &[String]) -> Queue {
        let mut q = Queue::default();
        let mut candidates = Vec::new();
        let mut target = None;
        for child in children {
            if let Some(entry) = parse_candidate(child) {
                candidates.push(entry);
            } else if let Some(uuid) = parse_leader(child) {
                q.leader = Some(child.clone());
                q.holder = Some(uuid.to_string());
            } else if let Some(to) = parse_handover(child) {
                q.handovers.push(child.clone());
                if let Some(t) = to {
                    target = Some(t.to_string());
                }
            } else if sequence_of(child).is_some() {
                q.curator = true;
            }
        }
        candidates.sort_by_key(|c| (c.key, c.sequence));
        for entry in candidates {
            if q.holder.as_deref() == Some(entry.uuid.as_str()) {
                q.holder_entry = Some(entry);
            } else {
                q.waiters.push(entry);
            }
        }
        if let Some(at) = target.and_then(|t| q.waiters.iter().position(|w| w.name == t)) {
            let asked = q.waiters.remove(at);
            q.waiters.insert(0, asked);
        }
        q
    }

    /// The position of the candidate node `name` among the waiters.
    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        self.waiters.iter().position(|w| w.name == name)
    }

    /// Whether a waiter has a higher priority than `key` (a holder's).
    pub(crate) fn outranks(&self, key: u16) -> bool {
        self.waiters.iter().any(|w| w.key < key)
    }
}

/// A random id in the UUID text form Curator uses for protected names.
pub(crate) fn random_uuid() -> String {
    let hex = format!("{:032x}", tenure_core::backend::random_id());
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_by_sequence() {
        let p = protected_prefix("0f0f");
        assert_eq!(p, "_c_0f0f-latch-");
        assert_eq!(sequence_of("_c_ab-latch-0000000012"), Some(12));
        assert_eq!(sequence_of("latch-0000000003"), Some(3));
        assert_eq!(sequence_of("sub"), None);
        assert_eq!(sequence_of("_c_ab-latch-"), None);
        let sorted = sorted_latches(vec![
            "_c_b-latch-0000000010".into(),
            "child".into(),
            "_c_a-latch-0000000002".into(),
            "_c_c-latch-0000000100".into(),
        ]);
        assert_eq!(
            sorted,
            [
                "_c_a-latch-0000000002",
                "_c_b-latch-0000000010",
                "_c_c-latch-0000000100"
            ]
        );
    }

    fn children(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn priority_keys_sort_higher_priorities_first() {
        assert_eq!(priority_key(1000), 0);
        assert_eq!(priority_key(0), 1000);
        assert_eq!(priority_key(-1000), 2000);
        assert!(priority_key(5) < priority_key(2));
        assert!(priority_key(-1) > priority_key(0));
        // Out of range (refused by the core before) still sorts at the ends.
        assert_eq!(priority_key(5000), 0);
        assert_eq!(priority_key(-5000), 2000);
        assert_eq!(candidate_prefix("u", 5, true), "_c_u-p0995-");
        assert_eq!(candidate_prefix("u", -7, false), "_c_u-n1007-");
        // The names ZooKeeper makes sort as strings in (priority, sequence) order only
        // within a session; parse them instead.
        for (p, preemptible) in [(1000, true), (0, false), (-1000, true), (42, false)] {
            let name = format!("{}0000000123", candidate_prefix("ab-cd", p, preemptible));
            let e = parse_candidate(&name).unwrap();
            assert_eq!(
                (e.uuid.as_str(), e.key, e.preemptible, e.sequence),
                ("ab-cd", priority_key(p), preemptible, 123)
            );
        }
    }

    #[test]
    fn foreign_names_are_not_candidates() {
        for name in [
            "_c_u-latch-0000000001",
            "_c_u-x0005-0000000001",
            "_c_u-p05-0000000001",
            "_c_u-p2001-0000000001",
            "_c_u-p0005-12",
            "_c_-p0005-0000000001",
            "u-p0005-0000000001",
            "sub",
            ":members",
        ] {
            assert_eq!(parse_candidate(name), None, "{name}");
        }
        assert_eq!(parse_leader(":leader-u-1-0000000009"), Some("u-1"));
        assert_eq!(parse_leader(":leader-0000000009"), None);
        assert_eq!(parse_leader(":leaders"), None);
        assert_eq!(parse_handover(":handover"), Some(None));
        assert_eq!(
            parse_handover(&handover_name(Some("_c_x"))),
            Some(Some("_c_x"))
        );
        assert_eq!(parse_handover(":handovers"), None);
    }

    #[test]
    fn queue_orders_by_priority_then_sequence_without_the_holder() {
        let name =
            |uuid: &str, p: i32, seq: u64| format!("{}{seq:010}", candidate_prefix(uuid, p, true));
        let (h, b, c, d, e) = (
            name("h", 0, 1),
            name("b", 0, 2),
            name("c", 5, 3),
            name("d", 5, 4),
            name("e", 2, 5),
        );
        let all = [h.as_str(), b.as_str(), c.as_str(), d.as_str(), e.as_str()];
        let mut listed = children(&all);
        listed.reverse();
        listed.push(":leader-h-0000000006".into());
        listed.push("sub-election".into());
        let q = Queue::parse(&listed);
        let order: Vec<&str> = q.waiters.iter().map(|w| w.uuid.as_str()).collect();
        assert_eq!(order, ["c", "d", "e", "b"]);
        assert_eq!(q.holder.as_deref(), Some("h"));
        assert_eq!(
            q.holder_entry.as_ref().map(|e| e.name.as_str()),
            Some(h.as_str())
        );
        assert_eq!(q.leader.as_deref(), Some(":leader-h-0000000006"));
        assert!(!q.curator);
        assert!(q.outranks(priority_key(0)));
        assert!(!q.outranks(priority_key(5)));
        assert_eq!(q.position(&e), Some(2));
        assert_eq!(q.position(&h), None);
        // A handover to b puts it first, ahead of higher priorities.
        listed.push(handover_name(Some(&b)));
        let q = Queue::parse(&listed);
        let order: Vec<&str> = q.waiters.iter().map(|w| w.uuid.as_str()).collect();
        assert_eq!(order, ["b", "c", "d", "e"]);
        assert_eq!(q.handovers.len(), 1);
        // One to a waiter that left changes nothing but is seen (a grant uses it up).
        let listed = children(&[b.as_str(), c.as_str(), ":handover:_c_gone-p1000-0000000001"]);
        let q = Queue::parse(&listed);
        let order: Vec<&str> = q.waiters.iter().map(|w| w.uuid.as_str()).collect();
        assert_eq!(order, ["c", "b"]);
        assert_eq!(q.handovers.len(), 1);
        assert_eq!(q.leader, None);
        // Curator latch nodes are noticed.
        assert!(Queue::parse(&children(&["_c_x-latch-0000000001"])).curator);
    }

    #[test]
    fn uuids_look_like_uuids_and_differ() {
        let (a, b) = (random_uuid(), random_uuid());
        assert_eq!(a.len(), 36);
        assert_ne!(a, b);
        assert_eq!(election_dir(&ElectionName::new("a/b").unwrap()), "/a/b");
    }
}
