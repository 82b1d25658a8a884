//! The primitive suite: the contract a store adapter keeps for the election engine
//! (conditional atomic writes, minted tokens, session expiry, change notification
//! without a missed change, what the election keeps for its next grant), and the engine
//! driven over the primitives by concurrent candidates (one holder at a time,
//! increasing tokens, priority order, handover, state transfer). A store author runs
//! [`check_primitives`] against the real store; the election itself is tested once, in
//! the conformance suite over [`DrivenBackend`](crate::backend::DrivenBackend).
//!
//! The checks panic on failure: they are test code.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::primitive::{self, Primitives, Release};
use crate::engine::{Candidacy, Op, Snapshot, Token, WaitFor, Write};
use crate::ElectionName;

fn election(prefix: &str, name: &str) -> ElectionName {
    ElectionName::new(format!("{prefix}/{name}")).expect("a valid name")
}

fn wait(me: &str, on: &str, seen: u64) -> WaitFor {
    WaitFor {
        me: Some(me.to_string()),
        on: Some(on.to_string()),
        seen,
    }
}

fn me(session: &str, priority: i32) -> Candidacy {
    Candidacy {
        session: session.to_string(),
        candidate: format!("c-{session}"),
        value: String::new(),
        priority,
        preemptible: true,
    }
}

fn put(c: &Candidacy, token: Token) -> Op {
    Op::Put {
        candidacy: c.clone(),
        token,
        told: false,
        chosen: false,
        inherited: None,
    }
}

fn write(revision: u64, ops: Vec<Op>) -> Write {
    Write {
        revision,
        ops,
        ..Write::default()
    }
}

fn release<'a>(session: &'a str, token: Option<u64>, state: Option<&'a [u8]>) -> Release<'a> {
    Release {
        session,
        token,
        state,
    }
}

fn token_of(snap: &Snapshot, session: &str) -> Option<u64> {
    snap.record(session).and_then(|r| r.token)
}

/// Writes commit only at the revision they were decided on, all ops or none; minted
/// tokens increase; a put for an ended session does not commit.
pub async fn conditional_atomic_writes(store: &dyn Primitives, prefix: &str) {
    let e = election(prefix, "cas");
    let (a, b) = (
        store.open(Duration::from_secs(30)).await,
        store.open(Duration::from_secs(30)).await,
    );
    let (a, b) = (me(&a.expect("open"), 0), me(&b.expect("open"), 0));
    let s0 = store.read(&e).await.expect("read");
    let (ok, s1) = store
        .commit(
            &e,
            &write(
                s0.revision,
                vec![put(&a, Token::Mint), put(&b, Token::None)],
            ),
        )
        .await
        .expect("commit");
    assert!(
        ok && s1.revision != s0.revision && s1.records.len() == 2,
        "{s1:?}"
    );
    // Stale: decided on s0.
    let (ok, s2) = store
        .commit(&e, &write(s0.revision, vec![Op::Delete(a.session.clone())]))
        .await
        .expect("commit");
    assert!(!ok && s2 == s1, "a stale write committed: {s2:?}");
    let first = token_of(&s1, &a.session).expect("a minted token");
    let (ok, s3) = store
        .commit(
            &e,
            &write(
                s1.revision,
                vec![Op::Delete(a.session.clone()), put(&b, Token::Mint)],
            ),
        )
        .await
        .expect("commit");
    assert!(ok && s3.record(&a.session).is_none(), "{s3:?}");
    assert!(
        token_of(&s3, &b.session) > Some(first),
        "tokens must increase: {s3:?}"
    );
    store.revoke(&a.session).await.expect("revoke");
    let (ok, _) = store
        .commit(&e, &write(s3.revision, vec![put(&a, Token::None)]))
        .await
        .expect("commit");
    assert!(!ok, "a put for an ended session committed");
}

/// A session not renewed ends after its TTL and its records stop counting; a renewed
/// one lives on.
pub async fn sessions_expire_unless_renewed(store: &dyn Primitives, prefix: &str) {
    let e = election(prefix, "ttl");
    let ttl = Duration::from_secs(2);
    let (a, b) = (
        store.open(ttl).await.expect("open"),
        store.open(ttl).await.expect("open"),
    );
    let s = store.read(&e).await.expect("read");
    let ops = vec![put(&me(&a, 0), Token::Mint), put(&me(&b, 0), Token::None)];
    store
        .commit(&e, &write(s.revision, ops))
        .await
        .expect("commit");
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            store.renew(std::slice::from_ref(&b)).await.expect("renew"),
            vec![true]
        );
    }
    let s = store.read(&e).await.expect("read");
    let live = |s: &Snapshot, id: &str| s.record(id).is_some_and(|r| r.live);
    assert!(!live(&s, &a) && live(&s, &b), "{s:?}");
    assert_eq!(
        store.renew(&[a.clone(), b]).await.expect("renew"),
        vec![false, true]
    );
}

/// `changed` returns on the deletion or expiry of the record waited on and on a change
/// to the waiter's own record, also when it happened before the call.
pub async fn changes_are_never_missed(store: &dyn Primitives, prefix: &str) {
    let e = election(prefix, "watch");
    let open = || store.open(Duration::from_secs(2));
    let (h, w) = (open().await.expect("open"), open().await.expect("open"));
    let s = store.read(&e).await.expect("read");
    let (_, s) = store
        .commit(
            &e,
            &write(
                s.revision,
                vec![put(&me(&h, 0), Token::Mint), put(&me(&w, 0), Token::None)],
            ),
        )
        .await
        .expect("commit");
    let seen = s.revision;
    // Nothing changed yet: it waits.
    let what = wait(&w, &h, seen);
    let waiting = tokio::time::timeout(Duration::from_millis(500), store.changed(&e, &what));
    assert!(
        waiting.await.is_err(),
        "changed returned with nothing changed"
    );
    // The holder is deleted before the call: at once.
    let (ok, _) = store
        .commit(&e, &write(seen, vec![Op::Delete(h.clone())]))
        .await
        .expect("commit");
    assert!(ok);
    tokio::time::timeout(
        Duration::from_secs(1),
        store.changed(&e, &wait(&w, &h, seen)),
    )
    .await
    .expect("a deletion before the call is reported")
    .expect("changed");
    // The holder's session ends while waiting (renewing only the waiter).
    let h2 = open().await.expect("open");
    let s = store.read(&e).await.expect("read");
    let (_, s) = store
        .commit(&e, &write(s.revision, vec![put(&me(&h2, 0), Token::Mint)]))
        .await
        .expect("commit");
    let renewing = async {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let _ = store.renew(std::slice::from_ref(&w)).await;
        }
    };
    let what = wait(&w, &h2, s.revision);
    tokio::select! {
        r = store.changed(&e, &what) => r.expect("changed"),
        () = renewing => {}
        () = tokio::time::sleep(Duration::from_secs(5)) => panic!("the expiry of the record ahead was missed"),
    }
}

/// Candidates that campaign, hold for a while and resign, some crashing: one holder at
/// a time, tokens increasing in grant order, every candidate granted in the end.
pub async fn the_engine_elects_one_at_a_time(store: Arc<dyn Primitives>, prefix: &str) {
    let e = election(prefix, "run");
    let holding = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (store, e, holding, tokens) =
            (store.clone(), e.clone(), holding.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let id = store.open(Duration::from_secs(3)).await.expect("open");
            let renew = {
                let (store, id) = (store.clone(), id.clone());
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        let _ = store.renew(std::slice::from_ref(&id)).await;
                    }
                })
            };
            let (token, _) = primitive::campaign(&*store, &e, &me(&id, i % 3))
                .await
                .expect("granted");
            assert_eq!(holding.fetch_add(1, Ordering::SeqCst), 0, "two holders");
            tokens.lock().expect("lock").push(token);
            tokio::time::sleep(Duration::from_millis(100)).await;
            holding.fetch_sub(1, Ordering::SeqCst);
            if i == 2 {
                // A crash: stop renewing, never resign; the next is granted after the TTL.
                renew.abort();
                return;
            }
            primitive::resign(&*store, &e, release(&id, Some(token), None), None)
                .await
                .expect("resign");
            renew.abort();
        }));
    }
    for t in tasks {
        t.await.expect("a candidate failed");
    }
    let tokens = tokens.lock().expect("lock").clone();
    assert_eq!(tokens.len(), 6, "{tokens:?}");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens out of order: {tokens:?}"
    );
}

/// With the seat held, waiters are granted by priority, then arrival; a handover names
/// who goes next, and its refusals are the engine's.
pub async fn priority_and_handover(store: &dyn Primitives, prefix: &str) {
    let e = election(prefix, "prio");
    let open = || store.open(Duration::from_secs(30));
    let h = open().await.expect("open");
    let (t, _) = primitive::campaign(store, &e, &me(&h, 0))
        .await
        .expect("granted");
    let err = primitive::handover(store, &e, None)
        .await
        .expect_err("nobody waits");
    assert!(err.to_string().contains("nobody waits"), "{err}");
    let (low, high, other) = (
        open().await.expect("open"),
        open().await.expect("open"),
        open().await.expect("open"),
    );
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiting = Vec::new();
    for (id, prio) in [(low.clone(), 0), (high.clone(), 5), (other.clone(), 0)] {
        let (order, e) = (order.clone(), e.clone());
        waiting.push(async move {
            let (token, _) = primitive::campaign(store, &e, &me(&id, prio))
                .await
                .expect("granted");
            order.lock().expect("lock").push(id.clone());
            primitive::resign(store, &e, release(&id, Some(token), None), None)
                .await
                .expect("resign");
        });
    }
    // `join_all` polls them in this order and the in-memory store answers at once, so
    // they join low, high, other.
    let run = futures::future::join_all(waiting);
    let hand = async {
        // Until all three wait (a store with polls or slow writes takes a while).
        let joined = async {
            while store.read(&e).await.map_or(0, |s| s.records.len()) < 4 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), joined)
            .await
            .expect("all three waiters joined within 30 s");
        let err = primitive::handover(store, &e, Some("c-nobody"))
            .await
            .expect_err("not waiting");
        assert!(err.to_string().contains("no candidate"), "{err}");
        // Hand over to `other`, past `high` and `low`.
        primitive::handover(store, &e, Some(&format!("c-{other}")))
            .await
            .expect("handover");
        primitive::resign(store, &e, release(&h, Some(t), None), None)
            .await
            .expect("release");
    };
    tokio::join!(run, hand);
    assert_eq!(*order.lock().expect("lock"), vec![other, high, low]);
}

/// A state left by a release goes to the waiter it grants; with nobody waiting, the
/// election keeps it for the next grant, which takes it (once).
pub async fn states_pass_to_the_next_grant(store: &dyn Primitives, prefix: &str) {
    let e = election(prefix, "state");
    let open = || store.open(Duration::from_secs(30));
    let (a, b) = (open().await.expect("open"), open().await.expect("open"));
    let (ta, _) = primitive::campaign(store, &e, &me(&a, 0))
        .await
        .expect("granted");
    let waiting = async {
        let (tb, snap) = primitive::campaign(store, &e, &me(&b, 0))
            .await
            .expect("granted");
        (tb, snap)
    };
    let leave = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        primitive::resign(store, &e, release(&a, Some(ta), Some(b"cursor=1")), None)
            .await
            .expect("resign");
    };
    let ((tb, snap), ()) = tokio::join!(waiting, leave);
    let got = snap.record(&b).and_then(|r| r.inherited.clone());
    assert_eq!(
        got.map(|i| (i.token, i.state)),
        Some((ta, b"cursor=1".to_vec())),
        "the waiter the release granted inherits its state"
    );
    // Nobody waits: the election keeps it for the next grant, and only that one.
    primitive::resign(store, &e, release(&b, Some(tb), Some(b"cursor=2")), None)
        .await
        .expect("resign");
    let c = open().await.expect("open");
    let (tc, snap) = primitive::campaign(store, &e, &me(&c, 0))
        .await
        .expect("granted");
    let got = snap.record(&c).and_then(|r| r.inherited.clone());
    assert_eq!(
        got.map(|i| (i.token, i.state)),
        Some((tb, b"cursor=2".to_vec()))
    );
    assert_eq!(snap.left, None, "a kept state goes to one grant only");
    primitive::resign(store, &e, release(&c, Some(tc), None), None)
        .await
        .expect("resign");
    let d = open().await.expect("open");
    let (_, snap) = primitive::campaign(store, &e, &me(&d, 0))
        .await
        .expect("granted");
    assert_eq!(snap.record(&d).and_then(|r| r.inherited.clone()), None);
}

/// Many seats taken and given up a batch at a time: free seats are granted, a seat
/// another session holds is not, and the released seats are free again.
pub async fn batches_take_and_release(store: &dyn Primitives, prefix: &str) {
    let open = || store.open(Duration::from_secs(30));
    let (a, b) = (open().await.expect("open"), open().await.expect("open"));
    let seats: Vec<(ElectionName, Candidacy)> = (0..10)
        .map(|i| (election(prefix, &format!("batch/{i}")), me(&a, 0)))
        .collect();
    let (held, _) = primitive::campaign(store, &seats[3].0, &me(&b, 0))
        .await
        .expect("granted");
    let got = primitive::try_take_many(store, &seats)
        .await
        .expect("try many");
    let granted: Vec<bool> = got.iter().map(Option::is_some).collect();
    let expect: Vec<bool> = (0..10).map(|i| i != 3).collect();
    assert_eq!(granted, expect, "every free seat, and only those");
    let tokens: Vec<u64> = got.iter().flatten().map(|(t, _)| *t).collect();
    assert!(tokens.iter().all(|t| *t > held), "{tokens:?} after {held}");
    let releases: Vec<(ElectionName, Release<'_>)> = seats
        .iter()
        .zip(&got)
        .filter_map(|((e, _), g)| {
            g.as_ref()
                .map(|(t, _)| (e.clone(), release(&a, Some(*t), None)))
        })
        .collect();
    let last = got.iter().flatten().map(|(_, s)| Some(s.clone())).collect();
    primitive::resign_many(store, &releases, last)
        .await
        .expect("resign many");
    let snaps = store
        .read_many(&seats.iter().map(|(e, _)| e.clone()).collect::<Vec<_>>())
        .await
        .expect("read many");
    for (i, s) in snaps.iter().enumerate() {
        let holder = crate::engine::holder(s).map(|r| r.session().to_string());
        let expect = (i == 3).then(|| b.clone());
        assert_eq!(holder, expect, "seat {i} after the releases: {s:?}");
    }
}

/// Every check of the primitive suite, on elections under `prefix`.
pub async fn check_primitives(store: Arc<dyn Primitives>, prefix: &str) {
    conditional_atomic_writes(&*store, prefix).await;
    sessions_expire_unless_renewed(&*store, prefix).await;
    changes_are_never_missed(&*store, prefix).await;
    the_engine_elects_one_at_a_time(store.clone(), prefix).await;
    priority_and_handover(&*store, prefix).await;
    states_pass_to_the_next_grant(&*store, prefix).await;
    batches_take_and_release(&*store, prefix).await;
}
