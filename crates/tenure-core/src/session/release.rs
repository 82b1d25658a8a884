//! Releases: a grant given up in the store after its lost signal fired, one by one
//! or in batches, and the task that releases lost seats.

use super::*;

impl SessionCore {
    /// Release a grant in the store (after its lost signal fired), then forget it.
    pub(super) async fn release(
        self: &Arc<Self>,
        state: &Arc<GrantState>,
        left: Option<&[u8]>,
    ) -> Result<()> {
        self.release_leaving(std::slice::from_ref(state), left)
            .await
    }

    /// Release grants in the store (after their lost signals fired) in the backend's
    /// batches, then forget them. Grants that ended with their session (the store
    /// expired or revoked it) are forgotten at once: the store ended their seats with
    /// the session, and a resign through the session it no longer has is a round trip
    /// for nothing, to a store that has just come back and may answer slowly. A
    /// campaign of the re-opened session for the same election waits for this (see
    /// `settle_held`): with etcd's resuming raft leader revoking the leases, releasing
    /// 128 such seats through the revoked lease took 3.7 s, and every shard's
    /// re-campaign waited for it.
    pub(crate) async fn release_many(self: &Arc<Self>, states: &[Arc<GrantState>]) -> Result<()> {
        self.release_leaving(states, None).await
    }

    /// [`release_many`](Self::release_many), a single release leaving `left` to its
    /// successor (clause 16).
    ///
    /// A release the store did not answer in time (an error worth another try) is
    /// reported to the caller and goes on in the background ([`release_later`](Self::release_later)).
    /// Its grants stay held, as lost, until it is done, so a campaign of this session
    /// for one of their elections waits for it (`settle_held`). Forgetting them at once
    /// left their records in the store under a session that lives on: the session's
    /// next campaign was handed the resigned grant back, with its old token (a chaos
    /// run on Azure: a resign during a store restart failed, and the candidate's next
    /// campaign 8 s later held token 5 again), and a waiter was kept out for as long as
    /// the session lived.
    pub(super) async fn release_leaving(
        self: &Arc<Self>,
        states: &[Arc<GrantState>],
        left: Option<&[u8]>,
    ) -> Result<()> {
        let (ended, live): (Vec<Arc<GrantState>>, Vec<Arc<GrantState>>) =
            states.iter().cloned().partition(|s| ended_with_session(s));
        for state in &ended {
            self.forget(state);
        }
        let grants: Vec<(ElectionName, Option<FencingToken>)> = live
            .iter()
            .map(|s| (s.election.clone(), Some(s.token)))
            .collect();
        let result = self.release_in_store(&grants, left).await;
        match &result {
            Err(e) if e.is_retryable() && !live.is_empty() => {
                let core = self.clone();
                let left = left.map(<[u8]>::to_vec);
                tokio::spawn(async move { core.release_later(live, grants, left).await });
            }
            _ => {
                for state in &live {
                    self.forget(state);
                }
            }
        }
        result
    }

    /// Go on with a release that failed in time, with the retry policy's delays, until
    /// the store answers, the session ends (the store frees the seats with it) or it is
    /// closed; then forget the grants.
    pub(super) async fn release_later(
        self: Arc<Self>,
        states: Vec<Arc<GrantState>>,
        grants: Vec<(ElectionName, Option<FencingToken>)>,
        left: Option<Vec<u8>>,
    ) {
        let mut attempt = 0;
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.timing.retry.delay(attempt)) => {}
                () = self.stop_all.cancelled() => break,
            }
            attempt = attempt.saturating_add(1);
            match self.release_in_store(&grants, left.as_deref()).await {
                Ok(()) => {
                    tracing::info!(
                        seats = grants.len(),
                        attempt,
                        "released in the store after all"
                    );
                    break;
                }
                Err(e) if e.is_retryable() => {
                    tracing::debug!(seats = grants.len(), error = %e, "release still not answered");
                }
                Err(e) => {
                    tracing::warn!(seats = grants.len(), error = %e, "could not release; the seats are freed when the session ends");
                    break;
                }
            }
        }
        for state in &states {
            self.forget(state);
        }
    }

    /// Drop a released grant from the held map (unless the seat was granted again
    /// since) and say it is released.
    pub(super) fn forget(&self, state: &GrantState) {
        {
            let mut held = self.lock_held();
            if held
                .get(&state.election)
                .is_some_and(|s| s.token == state.token)
            {
                held.remove(&state.election);
            }
        }
        state.released.set();
    }

    /// Resign `grants` in the store, retrying what may pass on a second try for up to
    /// twice the connect timeout in all.
    /// `left`: the state a single release leaves its successor (clause 16).
    pub(super) async fn release_in_store(
        &self,
        grants: &[(ElectionName, Option<FencingToken>)],
        left: Option<&[u8]>,
    ) -> Result<()> {
        if grants.is_empty()
            || self.abandoned.load(Ordering::SeqCst)
            || self.stop_all.is_cancelled()
        {
            return Ok(());
        }
        let bs = self.current();
        let mut attempt = 0;
        // One round trip may take connect_timeout; retries stop after twice that in all.
        let give_up = Instant::now() + self.batch_timeout(grants.len()) * 2;
        loop {
            let time_left = give_up.saturating_duration_since(Instant::now());
            let release = async {
                match (grants, left) {
                    ([(election, Some(token))], Some(state)) => {
                        bs.resign_with(election, *token, state).await
                    }
                    _ => bs.resign_many(grants).await,
                }
            };
            let attempt_result = match tokio::time::timeout(time_left, release).await {
                Ok(r) => r,
                Err(_) => Err(Error::new(
                    ErrorKind::Timeout,
                    "could not release the seat in time; the release goes on until the store \
                     answers or the session ends",
                )
                .with_backend(self.scheme)),
            };
            match attempt_result {
                Ok(()) => return Ok(()),
                // Gone with the session, or the session was closed: nothing to release.
                Err(e) if matches!(e.kind(), ErrorKind::SessionExpired | ErrorKind::Closed) => {
                    return Ok(())
                }
                Err(e)
                    if e.is_retryable()
                        && Instant::now() < give_up
                        && !self.stop_all.is_cancelled() =>
                {
                    tokio::time::sleep(self.timing.retry.delay(attempt)).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Releases in the store the seats whose lost signal fired for any reason other
    /// than an explicit resign (which releases its seat itself): one task per session,
    /// taking every loss that is waiting in one batch (a deadline or an expiry ends
    /// every grant at once).
    pub(super) async fn release_task(self: Arc<Self>, mut lost: mpsc::UnboundedReceiver<Loss>) {
        loop {
            let first = tokio::select! {
                m = lost.recv() => match m {
                    Some(m) => m,
                    None => return,
                },
                _ = self.stop_all.cancelled() => {
                    // Nothing is released once stopped, but listeners hear of every loss.
                    let mut rest = Vec::new();
                    while let Ok(m) = lost.try_recv() {
                        rest.push(m);
                    }
                    self.tell_listeners(&rest);
                    self.lock_listeners().clear();
                    return;
                }
            };
            let mut losses = vec![first];
            while let Ok(m) = lost.try_recv() {
                losses.push(m);
            }
            let states: Vec<Arc<GrantState>> = {
                let held = self.lock_held();
                losses
                    .iter()
                    .filter_map(|l| held.get(&l.election).filter(|g| g.token == l.token))
                    .filter(|g| !g.release_claimed.swap(true, Ordering::SeqCst))
                    .cloned()
                    .collect()
            };
            self.tell_listeners(&losses);
            if let Err(e) = self.release_many(&states).await {
                tracing::warn!(seats = states.len(), error = %e, "could not release lost seats");
            }
        }
    }

    pub(super) fn lock_listeners(
        &self,
    ) -> std::sync::MutexGuard<'_, Vec<mpsc::UnboundedSender<Loss>>> {
        crate::backend::lock(&self.listeners)
    }

    /// How long a batch of `seats` may take: the connect timeout for each round trip the
    /// backend needs for it ([`Capabilities::batch`](crate::backend::Capabilities::batch)
    /// seats per round trip; one where it asks seat by seat).
    pub(super) fn batch_timeout(&self, seats: usize) -> Duration {
        let per_trip = self.backend.capabilities().batch.unwrap_or(1).max(1);
        let trips = u32::try_from(seats.div_ceil(per_trip).max(1)).unwrap_or(u32::MAX);
        self.timing.connect_timeout.saturating_mul(trips)
    }

    pub(super) fn tell_listeners(&self, losses: &[Loss]) {
        self.lock_listeners()
            .retain(|l| losses.iter().all(|loss| l.send(loss.clone()).is_ok()));
    }
}
