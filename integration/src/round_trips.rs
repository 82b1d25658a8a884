//! The store round trips of the election operations, for a store's primitives test:
//! a grant (campaign on a free seat), a join (campaign behind a holder), a release
//! (resign with a waiter, until the waiter holds the seat), and a batch of 64 tries on
//! free seats, each counted while it runs and for 300 ms after (the follow loops it
//! starts). Printed as a table, never asserted.

use std::time::Duration;

use tenure_core::{Candidate, DynBackend, ElectionName, Session};

use crate::{run_prefix, timing_ms};

/// Print the table for `backend` (called `store` in it), counting with `round_trips`
/// (the store's own count of what its client sent).
pub async fn print_round_trips(backend: DynBackend, store: &str, round_trips: impl Fn() -> u64) {
    let counted = |before: u64| round_trips() - before;
    // Renewals every 20 s: none falls inside a measurement.
    let timing = timing_ms(60_000, 20_000, 50_000, 1000);
    let open = || Session::open(backend.clone(), timing.clone());
    let (a, b, c) = (
        open().await.expect("open"),
        open().await.expect("open"),
        open().await.expect("open"),
    );
    let election =
        |name: &str| ElectionName::new(format!("{}/{name}", run_prefix())).expect("a valid name");
    let cand = |id: &str| Candidate::new(id).expect("candidate");
    let settle = || tokio::time::sleep(Duration::from_millis(300));
    let e = election("rt");

    let before = round_trips();
    let held = a.campaign(&e, &cand("a")).await.expect("granted");
    settle().await;
    let grant = counted(before);

    let before = round_trips();
    let waiting = {
        let (b, e, cb) = (b.clone(), e.clone(), cand("b"));
        tokio::spawn(async move { b.campaign(&e, &cb).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    settle().await;
    let join = counted(before);

    let before = round_trips();
    held.resign().await.expect("resign");
    let next = waiting.await.expect("join").expect("granted");
    settle().await;
    let release = counted(before);

    let seats: Vec<(ElectionName, Candidate)> = (0..64)
        .map(|i| (election(&format!("rt-many-{i}")), cand("c")))
        .collect();
    let before = round_trips();
    let many = c.try_campaign_many(&seats).await.expect("tries");
    settle().await;
    let batch = counted(before);
    assert_eq!(many.iter().flatten().count(), 64, "64 free seats taken");

    print_table(
        &format!("{store} round trips"),
        [grant, join, release, batch],
    );
    drop((next, many));
    for s in [a, b, c] {
        s.close().await.expect("close");
    }
}

/// Print the table of `counted`: a grant, a join, a release and 64 tries, in what
/// `unit` names.
pub fn print_table(unit: &str, counted: [u64; 4]) {
    let [grant, join, release, batch] = counted;
    eprintln!("| operation | {unit} |");
    eprintln!("|---|---|");
    eprintln!("| grant (campaign on a free seat) | {grant} |");
    eprintln!("| join (campaign behind a holder) | {join} |");
    eprintln!("| release (resign with a waiter, until it holds) | {release} |");
    eprintln!("| try_campaign_many, 64 free seats | {batch} |");
}

/// The two tests of every store's primitive file: the election engine's primitive
/// suite against the real store, and [`print_round_trips`]. `$backend` is an async
/// expression giving the store's backend (which has `primitives()` and is `Clone`),
/// `$store` the store's name in the table, and `$count` the backend's method counting
/// what its client sent.
#[macro_export]
macro_rules! primitive_tests {
    ($backend:expr, $store:literal, $count:ident) => {
        /// The primitive suite of the election engine against the real store.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_primitives_keep_their_contract() {
            let backend = $backend.await;
            let prefix = $crate::run_prefix();
            ::tenure_core::testing::primitives::check_primitives(backend.primitives(), prefix)
                .await;
        }

        /// The store round trips of a grant, a join, a release and 64 tries, printed.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn round_trips_per_operation() {
            let backend = $backend.await;
            let counted: ::tenure_core::DynBackend = ::std::sync::Arc::new(backend.clone());
            $crate::print_round_trips(counted, $store, || backend.$count()).await;
        }
    };
}
