//! Node names of the Curator layout (`layout=curator`): a candidacy is an ephemeral
//! sequential node `<chroot>/<election>/_c_<session-uuid>-latch-<10-digit sequence>`,
//! the name Curator's `LeaderLatch` gives its participants (the `_c_<uuid>-` part is
//! Curator's "protected" prefix, which lets a candidate find its own node again after a
//! lost create answer). The lowest sequence leads; other children (sub-elections,
//! foreign nodes) are ignored.

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

    #[test]
    fn uuids_look_like_uuids_and_differ() {
        let (a, b) = (random_uuid(), random_uuid());
        assert_eq!(a.len(), 36);
        assert_ne!(a, b);
        assert_eq!(election_dir(&ElectionName::new("a/b").unwrap()), "/a/b");
    }
}
