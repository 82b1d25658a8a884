//! For the tests of a store's config: the checks every store's URL and environment
//! parsing is held to. They panic on failure: they are test code.

use std::fmt;

use crate::{ErrorKind, Result};

/// Every `(input, needle)` of `cases` is refused by `parse` as
/// [`ErrorKind::InvalidArgument`] with a message that contains `needle` (what a user
/// reads to fix the input).
pub fn assert_refused<T: fmt::Debug>(parse: impl Fn(&str) -> Result<T>, cases: &[(&str, &str)]) {
    for (input, needle) in cases {
        let e = parse(input).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{input}");
        assert!(e.message().contains(needle), "{input}: {e}");
    }
}

/// An environment of exactly `vars`, read as a store's `from_env` reads the process
/// environment (so tests need not touch it).
pub fn env_lookup<'a>(vars: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    }
}
