//! Releases the store did not answer in time.

use std::time::Duration;

use super::{campaign, cand, within, Env};
use crate::backend::Clause;
use crate::Session;

/// Clause 2 after a resign that failed: a resign the store did not answer in time goes
/// on once the store answers again, while the session lives. The session's next
/// campaign for the election gets a new grant with a larger token, never the one it
/// resigned; and a waiter is granted without waiting for the resigning session to end.
///
/// The resigning session is cut off for a little longer than its release may take
/// (twice its connect timeout, an eighth of the TTL here), then joined again well
/// within the TTL, so the store never ends it. A backend whose resign completes on the
/// holder itself ([`Capabilities::resign_local`], peer mode) has no failed resign to
/// check; on every other backend a resign that succeeds while cut off fails the check.
///
/// [`Capabilities::resign_local`]: crate::backend::Capabilities::resign_local
pub async fn check_failed_resign(env: &Env) {
    if env.not_applicable(Clause::ConnectionLoss) {
        return;
    }
    let scheme = env.backend.scheme();
    if env.backend.capabilities().resign_local {
        return eprintln!(
            "failed resign not checked on {scheme}: a resign completes on the holder"
        );
    }
    let victim = match env.faults.victim_backend(env).await {
        Ok(b) => b,
        Err(why) => return eprintln!("failed resign not checked on {scheme}: {why}"),
    };
    let mut timing = env.timing.clone();
    timing.connect_timeout = timing.ttl / 8;
    let sa = match Session::open(victim, timing.clone()).await {
        Ok(s) => s,
        Err(e) => panic!("open session: {e}"),
    };
    let election = env.election("failed-resign");

    // Alone: the resign fails, and the next campaign of the same session must not be
    // handed the grant it resigned.
    let first = campaign(&sa, &election, &cand("a")).await;
    let t1 = first.token();
    if let Err(why) = env.faults.disconnect(&sa).await {
        return eprintln!("failed resign not checked on {scheme}: {why}");
    }
    let resigned = first.resign().await;
    env.faults.reconnect(&sa).await.expect("reconnect");
    assert!(
        resigned.is_err(),
        "a resign through a session cut off from the store succeeded on {scheme}, which \
         does not declare Capabilities::resign_local"
    );
    let bound = env.handover_bound() + timing.connect_timeout * 4;
    let again = within(
        bound,
        "campaign after a failed resign",
        campaign(&sa, &election, &cand("a")),
    )
    .await;
    assert!(
        again.token() > t1,
        "the campaign after a failed resign was granted token {} again (clause 2)",
        again.token().0
    );

    // With a waiter: once the store answers again, the release goes through and the
    // waiter is granted, while the resigning session still lives.
    let sb = env.session().await;
    let waiter = {
        let election = election.clone();
        tokio::spawn(async move { campaign(&sb, &election, &cand("b")).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    env.faults.disconnect(&sa).await.expect("disconnect");
    let t2 = again.token();
    let resigned = again.resign().await;
    env.faults.reconnect(&sa).await.expect("reconnect");
    assert!(
        resigned.is_err(),
        "a resign through a session cut off from the store succeeded"
    );
    let b = within(bound, "waiter granted after a failed resign", waiter)
        .await
        .expect("waiter");
    assert!(b.token() > t2, "the waiter's token is not larger");
    assert!(
        !sa.is_closed(),
        "the resigning session ended; the check needs it alive"
    );
    b.resign().await.expect("resign");
}
