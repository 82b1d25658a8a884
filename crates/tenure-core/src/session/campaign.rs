//! Campaigns: the grants of a campaign and of a batch of tries, registered with
//! the session, and the withdrawal of a campaign dropped before its answer.

use super::*;

impl Session {
    /// [`try_campaign_many`](Self::try_campaign_many): the grants, registered.
    pub(crate) async fn try_many_inner(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<Arc<GrantState>>>> {
        let core = self.core();
        core.check_open()?;
        core.check_priority(seats.iter().map(|(_, c)| c))?;
        if seats.is_empty() {
            return Ok(Vec::new());
        }
        let mut locks = Vec::with_capacity(seats.len());
        let mut seen = std::collections::HashSet::with_capacity(seats.len());
        for (election, _) in seats {
            if !seen.insert(election) {
                return Err(Error::invalid(format!(
                    "election {election}: twice in one batch"
                )));
            }
            core.settle_held(election, Some(core.batch_timeout(1)))
                .await?;
            match core.election_lock(election).try_lock_owned() {
                Ok(guard) => locks.push(guard),
                Err(_) => {
                    return Err(Error::invalid(format!(
                        "election {election}: this session is already campaigning for it"
                    )))
                }
            }
        }
        let started = Instant::now();
        let bs = core.current();
        let gen = *core.generation.borrow();
        let mut pending = PendingCandidacy {
            core: core.clone(),
            elections: seats.iter().map(|(e, _)| e.clone()).collect(),
            session: Some(bs.clone()),
            locks,
        };
        let limit = core.batch_timeout(seats.len());
        let tokens = match with_timeout_of(limit, bs.try_campaign_many(seats)).await {
            Ok(tokens) => tokens,
            Err(e) => {
                if e.kind() == ErrorKind::SessionExpired {
                    // The store ended the session, and any candidacy of it: nothing to
                    // withdraw. Withdrawing through it held the elections' locks for
                    // a round trip to a store that had just come back, and the same
                    // seats asked for again through the re-opened session were refused
                    // as "already campaigning" (then retried at a back-off, 0.5-0.9 s
                    // later, when etcd's resuming raft leader revoked the leases).
                    pending.session = None;
                }
                return Err(core.tag(core.check_expired(e)));
            }
        };
        if tokens.len() != seats.len() {
            return Err(core.tag(Error::new(
                ErrorKind::Backend,
                format!(
                    "try_campaign_many: {} answers for {} seats",
                    tokens.len(),
                    seats.len()
                ),
            )));
        }
        pending.session = None;
        let won: Vec<(ElectionName, Option<FencingToken>)> = seats
            .iter()
            .zip(&tokens)
            .filter_map(|((e, _), t)| t.map(|t| (e.clone(), Some(t))))
            .collect();
        core.check_open_after_grant(&bs, &won).await?;
        let granted = seats.iter().zip(&tokens);
        if *core.generation.borrow() != gen || Instant::now() >= core.deadline() {
            // As for one seat: granted through a session whose renewal is overdue or that
            // was replaced, so not safe to hold. Give them back.
            let back: Vec<(ElectionName, Option<FencingToken>)> = granted
                .filter_map(|((e, _), t)| t.map(|t| (e.clone(), Some(t))))
                .collect();
            tracing::warn!(
                seats = back.len(),
                "grants arrived after the local deadline; releasing them"
            );
            let _ = with_timeout_of(limit, bs.resign_many(&back)).await;
            return Err(core.tag(Error::new(
                ErrorKind::Unavailable,
                "session renewal is overdue; grants released",
            )));
        }
        let leaderships = granted
            .map(|((election, candidate), token)| {
                token.map(|t| core.register(election, candidate, t))
            })
            .collect();
        crate::metrics::campaign_finished(core.scheme, started.elapsed());
        drop(pending);
        Ok(leaderships)
    }

    /// A campaign (`mode`): the grant, registered.
    pub(crate) async fn campaign_inner(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        mode: CampaignMode,
    ) -> Result<Option<Arc<GrantState>>> {
        let core = self.core();
        core.check_open()?;
        core.check_priority([candidate])?;
        let limit = (mode == CampaignMode::TryOnce).then(|| core.batch_timeout(1));
        core.settle_held(election, limit).await?;
        let lock = core.election_lock(election);
        let guard = match lock.try_lock_owned() {
            Ok(g) => g,
            Err(_) if mode == CampaignMode::Wait => {
                // A release of the same election is finishing, or another campaign of
                // this session is waiting; mode == CampaignMode::Wait for it.
                core.election_lock(election).lock_owned().await
            }
            Err(_) => {
                return Err(Error::invalid(format!(
                    "election {election}: this session is already campaigning for it"
                )))
            }
        };
        let started = Instant::now();
        let mut pending = PendingCandidacy {
            core: core.clone(),
            elections: vec![election.clone()],
            session: None,
            locks: vec![guard],
        };
        let mut generation = core.generation.subscribe();
        let mut attempt = 0u32;
        loop {
            core.check_open()?;
            let bs = core.current();
            let gen = *generation.borrow_and_update();
            pending.session = Some(bs.clone());
            let outcome = match mode {
                CampaignMode::Wait => tokio::select! {
                    r = bs.campaign(election, candidate) => r.map(Some),
                    _ = core.stop_all.cancelled() => Err(closed_error()),
                },
                CampaignMode::TryOnce => {
                    with_timeout(&core.timing, bs.try_campaign(election, candidate)).await
                }
            };
            match outcome {
                Ok(Some(token)) => {
                    pending.session = None;
                    core.check_open_after_grant(&bs, &[(election.clone(), Some(token))])
                        .await?;
                    if *core.generation.borrow() != gen || Instant::now() >= core.deadline() {
                        // Granted through a session whose renewal is overdue or that was
                        // replaced: not safe to hold. Give it back and try again.
                        tracing::warn!(election = %election, token = token.0, "grant arrived after the local deadline; releasing it");
                        let _ = with_timeout(&core.timing, bs.resign(election, Some(token))).await;
                        if mode == CampaignMode::TryOnce {
                            return Err(Error::new(
                                ErrorKind::Unavailable,
                                "session renewal is overdue; grant released",
                            )
                            .with_backend(core.scheme));
                        }
                        // Give the renewal a chance before asking again, or a store
                        // that grants at once would be asked in a tight loop.
                        let delay = core.timing.retry.delay(attempt);
                        attempt = attempt.saturating_add(1);
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = core.stop_all.cancelled() => return Err(closed_error()),
                        }
                        continue;
                    }
                    let leadership = core.register(election, candidate, token);
                    crate::metrics::campaign_finished(core.scheme, started.elapsed());
                    drop(pending);
                    return Ok(Some(leadership));
                }
                Ok(None) => {
                    pending.session = None;
                    return Ok(None);
                }
                Err(e) if e.kind() == ErrorKind::SessionExpired => {
                    pending.session = None;
                    // The store no longer has the session: re-open it now, not at the
                    // next renewal.
                    core.renew_soon.notify_one();
                    if mode == CampaignMode::TryOnce {
                        return Err(e);
                    }
                    tracing::debug!(error = %e, "session expired while campaigning; waiting for a new session");
                    tokio::select! {
                        r = generation.changed() => { if r.is_err() { return Err(closed_error()); } }
                        _ = core.stop_all.cancelled() => return Err(closed_error()),
                    }
                }
                Err(e) if e.is_retryable() && mode == CampaignMode::Wait => {
                    let delay = core.timing.retry.delay(attempt);
                    attempt = attempt.saturating_add(1);
                    tracing::debug!(error = %e, ?delay, "campaign failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = core.stop_all.cancelled() => return Err(closed_error()),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Withdraws a candidacy whose campaign future was dropped, then frees the election lock.
pub(super) struct PendingCandidacy {
    core: Arc<SessionCore>,
    elections: Vec<ElectionName>,
    session: Option<DynSession>,
    locks: Vec<OwnedMutexGuard<()>>,
}

impl Drop for PendingCandidacy {
    fn drop(&mut self) {
        let Some(bs) = self.session.take() else {
            return;
        };
        let locks = std::mem::take(&mut self.locks);
        if self.core.abandoned.load(Ordering::SeqCst) {
            return;
        }
        let timing = self.core.timing.clone();
        let grants: Vec<(ElectionName, Option<FencingToken>)> =
            self.elections.drain(..).map(|e| (e, None)).collect();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = with_timeout(&timing, bs.resign_many(&grants)).await {
                    tracing::warn!(elections = grants.len(), error = %e, "could not withdraw a cancelled candidacy");
                }
                drop(locks);
            });
        }
    }
}

impl SessionCore {
    /// Refuse candidates whose priority the backend would not keep (clause 14): a
    /// priority other than 0 on a backend that does not declare
    /// [`Capabilities::priority`](crate::backend::Capabilities::priority) is
    /// `Unsupported`, before anything reaches the store, never ignored.
    pub(super) fn check_priority<'a>(
        &self,
        candidates: impl IntoIterator<Item = &'a Candidate>,
    ) -> Result<()> {
        let Some(c) = candidates.into_iter().find(|c| c.priority() != 0) else {
            return Ok(());
        };
        let Err(why) = self.backend.capabilities().priority_refusal() else {
            return Ok(());
        };
        let (id, priority, scheme) = (c.id(), c.priority(), self.scheme);
        let text = match why {
            Some(why) => format!(
                "candidate {id:?}: priority {priority} is not supported by the {scheme} backend \
                 (only 0 is): {why}"
            ),
            None => format!(
                "candidate {id:?}: priority {priority} is not supported by the {scheme} backend \
                 yet (only 0 is)"
            ),
        };
        Err(Error::new(ErrorKind::Unsupported, text).with_backend(self.scheme))
    }

    /// Keep the grant of `election` with `token` and fire or ask what was reported of it
    /// before it was registered.
    pub(super) fn register(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        token: FencingToken,
    ) -> Arc<GrantState> {
        let state = GrantState::new(
            self.scheme,
            election.clone(),
            candidate.clone(),
            token,
            Instant::now(),
            self.timing.step_down_grace,
            self.lost_tx.clone(),
        );
        if let Some(inherited) = self.current().inherited(election, token) {
            let _ = state.inherited.set(inherited);
        }
        let state = Arc::new(state);
        let early = {
            let mut held = self.lock_held();
            held.insert(election.clone(), state.clone());
            // A report for this election from before the grant is about this grant or
            // an older one (tokens only grow): either way it is used up now.
            crate::backend::lock(&self.early_losses).take(election)
        };
        tracing::info!(election = %election, token = token.0, candidate = candidate.id(), "elected");
        crate::metrics::elected(self.scheme, election);
        // A grant whose deadline passed between the check and now fires at once.
        is_valid(&state, self.deadline());
        match early.filter(|(t, _)| *t == token) {
            Some((_, Early::Lost(reason))) => {
                tracing::debug!(election = %election, token = token.0, "the grant was reported lost before it was registered");
                state.fire(reason, self.loss_instant());
            }
            Some((_, Early::StepDown(reason))) => {
                tracing::debug!(election = %election, token = token.0, "the holder was asked to step down before the grant was registered");
                state.ask_step_down(reason);
            }
            None => {}
        }
        state
    }

    /// The backend reports the grant `token` of `election` lost, or asks its holder to
    /// step down (a preemption or handover, clause 14). The report may come
    /// before the grant is registered: the backend answers the campaign and then learns
    /// of the loss, and this task reads the report before the campaign's caller
    /// registers the grant (the peer backend, whose quorum leadership can end a moment
    /// after it granted the seat, did this under load; the report was dropped, and the
    /// session went on renewing a grant that no longer existed). Such a report is kept
    /// until the election's next grant is registered, which it ends (or asks to step
    /// down) if the tokens match.
    pub(super) fn grant_report(&self, election: ElectionName, token: FencingToken, report: Early) {
        let grant = {
            let held = self.lock_held();
            match held.get(&election) {
                Some(g) if g.token == token => Some(g.clone()),
                // An older grant's report: that grant is gone already.
                Some(g) if g.token > token => None,
                _ => {
                    crate::backend::lock(&self.early_losses).insert(
                        election,
                        token,
                        report.clone(),
                        self.timing.ttl,
                    );
                    None
                }
            }
        };
        match (grant, report) {
            (Some(g), Early::Lost(reason)) => {
                g.fire(reason, self.loss_instant());
            }
            (Some(g), Early::StepDown(reason)) => {
                g.ask_step_down(reason);
            }
            (None, _) => {}
        }
    }
}
