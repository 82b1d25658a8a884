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
//! [`MAX_MEMBER_VALUE_LEN`](tenure_core::MAX_MEMBER_VALUE_LEN) with its codes publishes
//! none ([`OwnState::loads_withheld`]).
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

mod codec;
mod node;
mod own;
mod view;

pub(crate) use self::codec::ShardSet;
pub(crate) use self::node::draining_in;
pub(crate) use self::own::OwnState;
pub(crate) use self::view::{Changed, View};

#[cfg(test)]
mod tests {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    use tenure_core::{Member, MAX_MEMBER_VALUE_LEN};

    use super::codec::{encode_list, encode_pairs};
    use super::node::NodeState;
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
