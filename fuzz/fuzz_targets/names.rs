//! Election names, candidate ids and values, member ids and values: never a panic, and
//! whatever is accepted is kept as given and within its documented length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenure_core::{
    Candidate, ElectionName, Member, MAX_CANDIDATE_ID_LEN, MAX_CANDIDATE_VALUE_LEN,
    MAX_ELECTION_NAME_LEN, MAX_MEMBER_ID_LEN, MAX_MEMBER_VALUE_LEN,
};

fuzz_target!(|input: (&str, &str)| {
    let (a, b) = input;
    if let Ok(name) = ElectionName::new(a) {
        assert_eq!(name.as_str(), a);
        assert!(!a.is_empty() && a.len() <= MAX_ELECTION_NAME_LEN);
        let _ = (format!("{name:?}"), name.to_string());
    }
    if let Ok(c) = Candidate::with_value(a, b) {
        assert_eq!((c.id(), c.value()), (a, b));
        assert!(a.len() <= MAX_CANDIDATE_ID_LEN && b.len() <= MAX_CANDIDATE_VALUE_LEN);
    }
    let _ = Candidate::new(a);
    if let Ok(m) = Member::new(a, b) {
        assert_eq!((m.id(), m.value()), (a, b));
        assert!(a.len() <= MAX_MEMBER_ID_LEN && b.len() <= MAX_MEMBER_VALUE_LEN);
    }
    assert_eq!(Member::check_id(a).is_ok(), Member::new(a, "").is_ok());
});
