//! Clause 13: member lists, and a watch through a broken link.

use super::*;

fn member(id: &str, value: &str) -> Member {
    match Member::new(id, value) {
        Ok(m) => m,
        Err(e) => panic!("member: {e}"),
    }
}

fn ids_values(list: &[Member]) -> Vec<(String, String)> {
    list.iter()
        .map(|m| (m.id().to_string(), m.value().to_string()))
        .collect()
}

/// Read `stream` until a list equals `want` (as (id, value) pairs, sorted by id);
/// panics, saying `what`, if it does not within `bound` or the stream yields an error.
pub async fn watch_until(
    stream: &mut MemberStream,
    want: &[(&str, &str)],
    bound: Duration,
    what: &str,
) {
    watch_for(stream, want, bound, what, false).await
}

/// [`watch_until`] that reads past errors (while the store is unreachable, a stream
/// yields them and goes on).
async fn watch_for(
    stream: &mut MemberStream,
    want: &[(&str, &str)],
    bound: Duration,
    what: &str,
    errors_ok: bool,
) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(i, v)| (i.to_string(), v.to_string()))
        .collect();
    let mut last = None;
    let found = tokio::time::timeout(bound, async {
        while let Some(item) = stream.next().await {
            let list = match item {
                Ok(l) => l,
                Err(e) if errors_ok => {
                    last = Some(vec![("error".to_string(), e.to_string())]);
                    continue;
                }
                Err(e) => panic!("{what}: member stream error: {e}"),
            };
            let got = ids_values(&list);
            if got == want {
                return true;
            }
            last = Some(got);
        }
        false
    })
    .await;
    match found {
        Ok(true) => {}
        Ok(false) => panic!("{what}: member stream ended; last list {last:?}, wanted {want:?}"),
        Err(_) => panic!("{what}: not seen within {bound:?}; last list {last:?}, wanted {want:?}"),
    }
}

/// Poll `members` until it equals `want` (reads may lag a watch for a moment).
async fn members_until(s: &Session, ns: &ElectionName, want: &[(&str, &str)], bound: Duration) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(i, v)| (i.to_string(), v.to_string()))
        .collect();
    let t0 = Instant::now();
    loop {
        let got = ids_values(&s.members(ns).await.expect("members"));
        if got == want {
            return;
        }
        assert!(
            t0.elapsed() <= bound,
            "members() is {got:?} after {bound:?}, wanted {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Clause 13 (membership): members registered through sessions are listed and watched
/// (joins, value changes, unregistering, a closed session, a crashed session), the
/// latest registration of an id wins, namespaces are separate from each other and from
/// elections, and a session re-opened after expiry registers its members again.
pub async fn check_membership(env: &Env) {
    let Some(ns) = env.election_for(Clause::Membership, "ns") else {
        return;
    };
    let other = env.election("ns/other");
    let (sa, sb) = (env.session().await, env.session().await);
    let quick = env.caps().observe_poll.unwrap_or_default() * 2 + env.timing.ttl / 2 + env.slack;
    let crash = env.timing.ttl
        + env.timing.retry.max
        + env.caps().observe_poll.unwrap_or_default()
        + env.slack;
    assert!(sa.members(&ns).await.expect("members").is_empty());
    let mut w = sa.watch_members(&ns).await.expect("watch_members");
    watch_until(&mut w, &[], quick, "empty namespace").await;

    sa.register(&ns, &member("a", "1"))
        .await
        .expect("register a");
    sb.register(&ns, &member("b", "1"))
        .await
        .expect("register b");
    watch_until(&mut w, &[("a", "1"), ("b", "1")], quick, "two joins").await;
    members_until(&sa, &ns, &[("a", "1"), ("b", "1")], quick).await;

    // Separate from another namespace and from an election of the same name.
    assert!(sa.members(&other).await.expect("members").is_empty());
    let l = campaign(&sa, &ns, &cand("a")).await;
    assert_eq!(
        sb.leader(&ns).await.expect("leader").map(|i| i.id),
        Some("a".to_string())
    );
    l.resign().await.expect("resign");
    members_until(&sa, &ns, &[("a", "1"), ("b", "1")], quick).await;

    sa.register(&ns, &member("a", "2"))
        .await
        .expect("re-register a");
    watch_until(&mut w, &[("a", "2"), ("b", "1")], quick, "value change").await;

    // A value at the limit goes through whole, to watchers and to listings.
    let big: String = (0..crate::MAX_MEMBER_VALUE_LEN)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    sb.register(&ns, &member("b", &big))
        .await
        .expect("register a value at the limit");
    let whole = |list: &[Member]| list.iter().any(|m| m.id() == "b" && m.value() == big);
    within(quick, "a value at the limit, watched", async {
        while let Some(item) = w.next().await {
            if item.is_ok_and(|l| whole(&l)) {
                return;
            }
        }
        panic!("the member stream ended");
    })
    .await;
    assert!(
        whole(&sa.members(&ns).await.expect("members")),
        "a value at the limit, listed"
    );
    sb.register(&ns, &member("b", "1"))
        .await
        .expect("register b small again");
    watch_until(
        &mut w,
        &[("a", "2"), ("b", "1")],
        quick,
        "after the large value",
    )
    .await;

    sb.unregister(&ns, "b").await.expect("unregister b");
    sb.unregister(&ns, "b")
        .await
        .expect("unregister is idempotent");
    watch_until(&mut w, &[("a", "2")], quick, "unregister").await;

    sb.register(&ns, &member("b", "3"))
        .await
        .expect("register b again");
    watch_until(&mut w, &[("a", "2"), ("b", "3")], quick, "join again").await;
    sb.close().await.expect("close b");
    watch_until(&mut w, &[("a", "2")], quick, "closed session").await;

    let sc = env.session().await;
    sc.register(&ns, &member("c", "1"))
        .await
        .expect("register c");
    watch_until(&mut w, &[("a", "2"), ("c", "1")], quick, "third join").await;
    let t0 = Instant::now();
    sc.abandon();
    watch_until(&mut w, &[("a", "2")], crash, "crashed session").await;
    eprintln!("crashed member gone after {:?}", t0.elapsed());

    // Expiry: the core re-opens the session and registers again.
    let sd = env.session().await;
    sd.register(&ns, &member("d", "1"))
        .await
        .expect("register d");
    watch_until(&mut w, &[("a", "2"), ("d", "1")], quick, "fourth join").await;
    match env.faults.expire(&sd).await {
        Ok(()) => {
            watch_until(&mut w, &[("a", "2")], crash, "expired session").await;
            watch_until(
                &mut w,
                &[("a", "2"), ("d", "1")],
                crash + quick,
                "registered again after re-open",
            )
            .await;
        }
        Err(why) => eprintln!("membership after expiry not checked: {why}"),
    }
    sd.close().await.expect("close d");

    // The latest registration of an id wins across sessions, and only the session
    // that made it removes it: the earlier one unregistering or closing does not.
    let sf = env.session().await;
    sf.register(&ns, &member("x", "from f"))
        .await
        .expect("register x from f");
    watch_until(&mut w, &[("a", "2"), ("x", "from f")], quick, "x from f").await;
    sa.register(&ns, &member("x", "from a"))
        .await
        .expect("register x from a");
    watch_until(&mut w, &[("a", "2"), ("x", "from a")], quick, "x from a").await;
    sf.unregister(&ns, "x").await.expect("unregister x from f");
    let bad = sf
        .unregister(&ns, "a/b")
        .await
        .expect_err("a bad member id");
    assert_eq!(bad.kind(), ErrorKind::InvalidArgument, "{bad}");
    sf.close().await.expect("close f");
    let closed = sf
        .register(&ns, &member("z", ""))
        .await
        .expect_err("register on a closed session");
    assert_eq!(closed.kind(), ErrorKind::Closed, "{closed}");
    sa.register(&ns, &member("y", "1"))
        .await
        .expect("register y");
    watch_until(
        &mut w,
        &[("a", "2"), ("x", "from a"), ("y", "1")],
        quick,
        "the latest registration outlives the earlier session",
    )
    .await;
    members_until(&sa, &ns, &[("a", "2"), ("x", "from a"), ("y", "1")], quick).await;
    sa.close().await.expect("close a");
    watch_until(&mut w, &[], quick, "all gone").await;

    // A member that replaces its value quickly never drops out of a watcher's view.
    let churn = env.election("churn");
    let se = env.session().await;
    se.register(&churn, &member("e", "0"))
        .await
        .expect("register e");
    let mut w2 = se.watch_members(&churn).await.expect("watch_members");
    watch_until(&mut w2, &[("e", "0")], quick, "churn start").await;
    let reader = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(item) = w2.next().await {
            let got = ids_values(&item.expect("member stream"));
            let done = got == [("e".to_string(), "40".to_string())];
            seen.push(got);
            if done {
                break;
            }
        }
        seen
    });
    for i in 1..=40 {
        se.register(&churn, &member("e", &i.to_string()))
            .await
            .expect("replace e");
    }
    let seen = within(quick * 4, "the last value of a churning member", reader)
        .await
        .expect("reader");
    for list in &seen {
        assert!(
            list.len() == 1 && list[0].0 == "e",
            "a member re-registering its value dropped out of the list: {list:?}"
        );
    }
    se.close().await.expect("close e");
}

/// Clause 13 (membership) through a broken link: a watcher whose connection to the
/// store is cut while members change shows the current list once the link heals,
/// without being restarted.
pub async fn check_membership_after_a_cut(env: &Env) {
    if env.not_applicable(Clause::Membership) {
        return;
    }
    let victim = match env.faults.victim_backend(env).await {
        Ok(b) => b,
        Err(why) => return eprintln!("membership cut not checked: {why}"),
    };
    let quick = env.caps().observe_poll.unwrap_or_default() * 2 + env.timing.ttl / 2 + env.slack;
    let ns = env.election("cut");
    let watcher = env.session_on(victim).await;
    let s = env.session().await;
    s.register(&ns, &member("a", "1"))
        .await
        .expect("register a");
    let mut w = watcher.watch_members(&ns).await.expect("watch_members");
    watch_until(&mut w, &[("a", "1")], quick, "before the cut").await;
    if let Err(why) = env.faults.disconnect(&watcher).await {
        return eprintln!("membership cut not checked: {why}");
    }
    // Changes while the watcher hears nothing (shorter than its renew deadline).
    s.register(&ns, &member("a", "2")).await.expect("change a");
    s.register(&ns, &member("b", "1"))
        .await
        .expect("register b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.faults.reconnect(&watcher).await.expect("reconnect");
    let healed = quick + env.timing.ttl * 2 + env.slack;
    watch_for(
        &mut w,
        &[("a", "2"), ("b", "1")],
        healed,
        "after the cut",
        true,
    )
    .await;
    s.close().await.expect("close");
    watch_for(
        &mut w,
        &[],
        quick + env.slack,
        "all gone after the cut",
        true,
    )
    .await;
    drop(watcher);
}
