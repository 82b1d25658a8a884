//! Helpers shared by the tests of the `tenure` binary.
#![allow(dead_code)]

use std::fmt::Debug;
use std::process::{Command, Output};

/// The `tenure` binary, with no backend or metrics address taken from this
/// process's environment.
pub fn tenure() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tenure"));
    c.env_remove("TENURE_BACKEND")
        .env_remove("TENURE_METRICS_ADDR");
    c
}

/// Asserts that `out` is a command line rejected as bad input: exit 2, nothing
/// on stdout and one line `tenure: invalid_argument: …` on stderr, which is
/// returned. `case` names the command line in a failure.
pub fn assert_invalid_argument(out: &Output, case: &dyn Debug) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{case:?}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{case:?}: {stderr}");
    assert!(
        stderr.starts_with("tenure: invalid_argument: "),
        "{case:?}: {stderr}"
    );
    assert!(out.stdout.is_empty(), "{case:?}: stdout not empty");
    stderr
}
