//! The whole election contract against a real ZooKeeper: one server for this test binary
//! (or the one named by `TENURE_TEST_ZOOKEEPER`, every server of an ensemble given as
//! `h1:2181,h2:2181,h3:2181`), a random election prefix per test, a
//! TTL (session timeout) of 2 s (the server's tickTime is 1000 ms, so 2 s is its
//! shortest), and faults injected through a TCP proxy (disconnect) and by closing the
//! session from a second connection with the same session id (expiry).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure_core::testing::Env;
use tenure_core::{Candidate, ElectionName, ErrorKind, Leadership, LossReason};
use tenure_integration::cluster_faults::{spawn_campaign, wait_grant};
use tenure_integration::membership::{member, open, pairs, until, until_where};
use tenure_integration::{assert_ttls_refused, ZooKeeperServer};
use tenure_zookeeper::ZooKeeperBackend;

#[path = "support/zookeeper.rs"]
mod zookeeper;

tenure_integration::shared_server!(ZooKeeperServer, "ZooKeeper");

/// The URL for `hosts` (`host:port`, or every server of an external ensemble).
fn url(hosts: impl std::fmt::Display) -> String {
    format!("zk://{hosts}/tenure-test?connect_timeout=2s&request_timeout=1s&session_timeout=4s")
}

async fn zk_env() -> Env {
    zookeeper::env(shared_server(), |hosts| url(hosts)).await
}

tenure_core::conformance_tests!(zk_env());

/// A fresh environment with the election `<prefix>/<name>`, held by candidate "a" of a
/// new session.
async fn held_by_a(name: &str) -> (Env, ElectionName, tenure_core::Session, Leadership) {
    let env = zk_env().await;
    let election = ElectionName::new(format!("{}/{name}", env.prefix)).unwrap();
    let sa = env.session().await;
    let a = sa
        .campaign(&election, &Candidate::new("a").unwrap())
        .await
        .unwrap();
    (env, election, sa, a)
}

/// Not in the shared suite: a TTL the server would clamp is refused, naming the field.
#[tokio::test]
async fn ttl_outside_the_session_timeout_range_is_rejected() {
    let ttls = [Duration::from_millis(1500), Duration::from_secs(25)];
    assert_ttls_refused(&zk_env().await.backend, &ttls).await;
}

/// A session closed with `close()` hands over at once and the next token is higher;
/// the election node holds the records as data, and a record's two nodes (`:r-<session>`
/// and `:c-<session>`, which its waiters and its owner watch) are the node's children.
#[tokio::test]
async fn close_hands_over_and_the_election_node_holds_the_records() {
    let env = zk_env().await;
    let election = ElectionName::new(format!("{}/layout", env.prefix)).unwrap();
    let (sa, sb) = (env.session().await, env.session().await);
    let a = sa
        .campaign(&election, &Candidate::new("a").unwrap())
        .await
        .unwrap();
    let waiter = spawn_campaign(sb.clone(), &election, Candidate::new("b").unwrap());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = std::time::Instant::now();
    sa.close().await.unwrap();
    let (b, _sb) = wait_grant(waiter, Duration::from_secs(1), "handover after close").await;
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert!(b.token() > a.token());
    let leader = env.backend.leader(&election).await.unwrap().unwrap();
    assert_eq!((leader.id.as_str(), leader.token), ("b", b.token()));
    let admin = zookeeper_client::Client::connect(&shared_server().1.to_string())
        .await
        .unwrap();
    let dir = format!("/tenure-test/{election}");
    let mut children = admin.list_children(&dir).await.unwrap();
    children.sort();
    let id = sb.id();
    assert_eq!(children, [format!(":c-{id}"), format!(":r-{id}")]);
    let (data, _) = admin.get_data(&dir).await.unwrap();
    let data = String::from_utf8_lossy(&data);
    assert!(data.contains(&format!("\"s\":\"{id}\"")), "{data}");
    assert!(!data.contains(&sa.id()), "{data}");
}

/// An unreachable server is `Unavailable`/`Timeout` within the connect timeout.
#[tokio::test]
async fn unreachable_server_fails_fast() {
    let t0 = std::time::Instant::now();
    let err = ZooKeeperBackend::from_url("zk://127.0.0.1:9/x?connect_timeout=500ms")
        .await
        .expect_err("nothing listens on port 9");
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

/// How long a member list may take to show a change.
const SHOWN: Duration = Duration::from_secs(5);

/// Asserts that `env`'s backend lists exactly `want` in `ns`.
async fn assert_listed(env: &Env, ns: &ElectionName, want: &[(&str, &str)]) {
    let want: Vec<_> = want
        .iter()
        .map(|(id, v)| (id.to_string(), v.to_string()))
        .collect();
    assert_eq!(pairs(&env.backend.members(ns).await.unwrap()), want);
}

/// Membership through backend sessions: register, replace (one node per registration,
/// read back at once), the latest registration of an id wins across sessions and the
/// older one shows again when the latest goes, unregister, 512 KiB values, and an
/// election of the same name as the namespace living beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_register_replace_unregister_and_watch() {
    let env = zk_env().await;
    let ns = ElectionName::new(format!("{}/members/shards", env.prefix)).unwrap();
    let ttl = env.timing.ttl;
    let (a, b) = (
        open(&*env.backend, ttl).await,
        open(&*env.backend, ttl).await,
    );
    let mut stream = env.backend.watch_members(&ns).await.unwrap();
    until(&mut stream, &[], SHOWN).await;

    a.register_member(&ns, &member("x", "1")).await.unwrap();
    assert_listed(&env, &ns, &[("x", "1")]).await;
    until(&mut stream, &[("x", "1")], SHOWN).await;

    a.register_member(&ns, &member("x", "2")).await.unwrap();
    assert_listed(&env, &ns, &[("x", "2")]).await;
    until(&mut stream, &[("x", "2")], SHOWN).await;

    // Another session registers the same id later: it wins; when it goes, a's shows.
    b.register_member(&ns, &member("x", "3")).await.unwrap();
    a.register_member(&ns, &member("y", "")).await.unwrap();
    until(&mut stream, &[("x", "3"), ("y", "")], SHOWN).await;
    b.unregister_member(&ns, "x").await.unwrap();
    b.unregister_member(&ns, "x").await.unwrap();
    until(&mut stream, &[("x", "2"), ("y", "")], SHOWN).await;
    // Re-registering makes a's registration the latest again.
    b.register_member(&ns, &member("x", "5")).await.unwrap();
    a.register_member(&ns, &member("x", "6")).await.unwrap();
    assert_listed(&env, &ns, &[("x", "6"), ("y", "")]).await;

    // A value at the limit.
    let big = "v".repeat(tenure_core::MAX_MEMBER_VALUE_LEN);
    a.register_member(&ns, &member("z", &big)).await.unwrap();
    until_where(&mut stream, "z with 512 KiB", SHOWN, |l| {
        l.iter()
            .any(|m| m.id() == "z" && m.value().len() == big.len())
    })
    .await;

    // An election of the same name, and one named like the namespace's directory,
    // live beside the namespace without seeing its nodes.
    let session = env.session().await;
    for name in [ns.as_str().to_string(), format!("{}/x", ns.as_str())] {
        let election = ElectionName::new(name).unwrap();
        assert_eq!(env.backend.leader(&election).await.unwrap(), None);
        let l = session
            .campaign(&election, &Candidate::new("leader").unwrap())
            .await
            .unwrap();
        let info = env.backend.leader(&election).await.unwrap().unwrap();
        assert_eq!((info.id.as_str(), info.token), ("leader", l.token()));
    }
    assert_eq!(env.backend.members(&ns).await.unwrap().len(), 3);

    // Unregistering leaves the others; closing removes the session's registrations.
    a.unregister_member(&ns, "y").await.unwrap();
    a.unregister_member(&ns, "never").await.unwrap();
    until_where(&mut stream, "x=6, z", SHOWN, |l| {
        l.iter().map(|m| m.id()).eq(["x", "z"]) && l[0].value() == "6"
    })
    .await;
    a.close().await.unwrap();
    until(&mut stream, &[("x", "5")], SHOWN).await;
    b.close().await.unwrap();
    until(&mut stream, &[], SHOWN).await;
}

/// A member whose ZooKeeper session expires disappears (the server deletes its node),
/// and the session's next renewal finds it expired. (The sessions are not renewed by a
/// keep-alive loop here: `b` renews by hand right after `a` is expired, and a TTL of
/// 20 s, the test server's longest, keeps it until the test ends it; the backend ends a
/// session whose last renewal was sent a TTL ago.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_go_when_their_session_expires() {
    let env = zk_env().await;
    let ns = ElectionName::new(format!("{}/expiry", env.prefix)).unwrap();
    let backend = ZooKeeperBackend::from_url(&url(shared_server().1))
        .await
        .unwrap();
    let ttl = Duration::from_secs(20);
    let a = open(&backend, ttl).await;
    let b = open(&backend, ttl).await;
    a.register_member(&ns, &member("a", "1")).await.unwrap();
    b.register_member(&ns, &member("b", "2")).await.unwrap();
    let mut stream = env.backend.watch_members(&ns).await.unwrap();
    until_where(&mut stream, "a and b", SHOWN, |l| l.len() == 2).await;
    backend.expire_session(a.id()).await.unwrap();
    b.keep_alive().await.unwrap();
    until(&mut stream, &[("b", "2")], SHOWN).await;
    // The owner's connection learns of the expiry when it re-attaches; until then a
    // renewal may time out (5 s, as long as the expiry event had before the port).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let err = loop {
        let err = a.keep_alive().await.unwrap_err();
        let unsure = matches!(err.kind(), ErrorKind::Timeout | ErrorKind::Unavailable);
        if !unsure || std::time::Instant::now() > deadline {
            break err;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(err.kind(), ErrorKind::SessionExpired, "{err}");
    // The expired session cannot register any more.
    let err = a
        .register_member(&ns, &member("a", "again"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::SessionExpired, "{err}");
    a.unregister_member(&ns, "a").await.unwrap();
    assert_listed(&env, &ns, &[("b", "2")]).await;
    b.close().await.unwrap();
}

/// Priorities under churn: candidates of mixed priorities (some never preempted)
/// campaign, hold briefly or until preempted, and resign, while an observer asks for
/// handovers now and then: no two grants overlap, tokens grow in grant order, and
/// every campaign is granted in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_under_churn_never_overlap() {
    use tenure_core::testing::{assert_intervals_disjoint, Interval};
    const ROUNDS: usize = 8;
    let env = zk_env().await;
    let election = ElectionName::new(format!("{}/churn", env.prefix)).unwrap();
    let intervals = Arc::new(Mutex::new(Vec::new()));
    let preempted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..5usize {
        let session = env.session().await;
        let (election, intervals, preempted) =
            (election.clone(), intervals.clone(), preempted.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let priority = ((i * 3 + round * 5) % 7) as i32 - 3;
                let mut me = Candidate::new(format!("c{i}"))
                    .unwrap()
                    .with_priority(priority)
                    .unwrap();
                if (i + round) % 4 == 0 {
                    me = me.never_preempted();
                }
                let l = session.campaign(&election, &me).await.expect("campaign");
                let hold = Duration::from_millis(5 + (i as u64 * 7 + round as u64 * 3) % 30);
                tokio::select! {
                    reason = l.lost_wait() => {
                        assert_eq!(reason, LossReason::Preempted, "c{i}");
                        preempted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    _ = tokio::time::sleep(hold) => {}
                }
                let watch = l.watch();
                l.resign().await.expect("resign");
                intervals.lock().unwrap().push(Interval {
                    holder: watch.candidate().id().to_string(),
                    token: watch.token(),
                    start: watch.granted_at(),
                    end: watch.lost_at().expect("ended"),
                });
            }
            session.close().await.expect("close");
        }));
    }
    let observer = env.session().await;
    let asking = {
        let (observer, election) = (observer.clone(), election.clone());
        tokio::spawn(async move {
            let mut asked = 0;
            for n in 0..40u32 {
                tokio::time::sleep(Duration::from_millis(23)).await;
                let to = format!("c{}", n % 5);
                let to = (n % 3 != 0).then_some(to.as_str());
                match observer.observer().handover(&election, to).await {
                    Ok(_) => asked += 1,
                    Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}"),
                }
            }
            asked
        })
    };
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("every campaign granted within 60 s")
            .expect("candidate task");
    }
    let asked = asking.await.expect("handover task");
    let intervals = intervals.lock().unwrap().clone();
    assert_eq!(intervals.len(), 5 * ROUNDS);
    eprintln!(
        "churn: {} grants, {} ended preempted, {asked} handovers asked",
        intervals.len(),
        preempted.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert_intervals_disjoint(intervals);
    assert_eq!(env.backend.leader(&election).await.unwrap(), None);
    observer.close().await.unwrap();
}

/// A resign among 8 waiters costs 4 election requests as the engine counts them (the
/// holder's write decided on the election as its follow loop last saw it, which the
/// joins moved on, so it fails and brings the election back; the write that releases
/// and grants; the first waiter's read once woken; the new holder's wait), and wakes
/// only the first in line, which is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_among_eight_waiters_costs_four_requests() {
    let (env, election, sa, a) = held_by_a("three").await;
    let mut waiters = Vec::new();
    for i in 0..8 {
        let s = env.session().await;
        waiters.push((
            spawn_campaign(
                s.clone(),
                &election,
                Candidate::new(format!("w{i}")).unwrap(),
            ),
            s,
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = env.quiet_election_requests().await.unwrap();
    a.resign().await.unwrap();
    let (first, _) = waiters.remove(0);
    let (w0, _s0) = wait_grant(first, Duration::from_secs(2), "w0 after the resign").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let used = env.backend.election_requests().unwrap() - before;
    eprintln!("one release among 8 waiters: {used} election requests");
    assert!(used <= 4, "{used} election requests for one release");
    assert_eq!(w0.candidate().id(), "w0");
    for (w, s) in waiters {
        w.abort();
        s.close().await.unwrap();
    }
    w0.resign().await.unwrap();
    sa.close().await.unwrap();
}

/// A backend with `layout=curator` refuses to campaign in an election held in the
/// default layout (each layout would elect its own leader), naming the layout to use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_curator_layout_refuses_a_priority_layout_election() {
    let (_env, election, sa, a) = held_by_a("mixed").await;
    let curator = ZooKeeperBackend::from_url(&format!("{}&layout=curator", url(shared_server().0)))
        .await
        .unwrap();
    let sb = tenure_core::Session::open(
        Arc::new(curator),
        tenure_core::Timing::from_ttl(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let err = sb
        .campaign(&election, &Candidate::new("b").unwrap())
        .await
        .expect_err("a Curator-layout campaign in a priority-layout election");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("layout=priority"), "{err}");
    assert!(a.is_leader());
    sb.close().await.unwrap();
    a.resign().await.unwrap();
    sa.close().await.unwrap();
}

/// A holder cut off from ZooKeeper while a higher priority queues is told when its
/// connection returns (ZooKeeper re-sends the child watch's event on reconnect): it
/// loses the seat as preempted, before the newcomer is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_is_preempted_when_its_connection_returns() {
    let env = zk_env().await;
    let election = ElectionName::new(format!("{}/cut-preempt", env.prefix)).unwrap();
    let victim = env
        .faults
        .victim_backend(&env)
        .await
        .expect("victim backend");
    let sa = env.session_on(victim).await;
    let a = sa
        .campaign(&election, &Candidate::new("a").unwrap())
        .await
        .unwrap();
    env.faults.disconnect(&sa).await.expect("disconnect");
    let sb = env.session().await;
    let high = Candidate::new("b").unwrap().with_priority(5).unwrap();
    let b = spawn_campaign(sb.clone(), &election, high);
    // Within the renew deadline (1.2 s): the holder keeps the seat while cut off.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(a.is_leader(), "the holder lost its seat while cut off");
    assert!(!b.is_finished(), "granted while the holder is cut off");
    env.faults.reconnect(&sa).await.expect("reconnect");
    let reason = tokio::time::timeout(Duration::from_secs(3), a.lost_wait())
        .await
        .expect("the holder told once its connection returned");
    assert_eq!(reason, LossReason::Preempted);
    let (b, _) = wait_grant(b, Duration::from_secs(3), "b after the preemption").await;
    assert!(a.lost_at().unwrap() <= b.granted_at());
    assert!(b.token() > a.token());
    b.resign().await.unwrap();
    sb.close().await.unwrap();
    sa.close().await.unwrap();
}
