//! Renewal and deadlines: the task that renews the session and re-opens it when it
//! expired, the deadline task, firing every lost signal, and closing.

use super::*;

impl SessionCore {
    /// When a loss noticed now took effect: now, or the deadline if that passed first
    /// (a process that was paused learns of its loss late, but its grant was never
    /// valid past the deadline).
    pub(crate) fn loss_instant(&self) -> Instant {
        Instant::now().min(self.deadline())
    }

    pub(super) fn fire_all(&self, reason: LossReason, at: Instant) {
        // Entries leave `held` once released in the store.
        let grants: Vec<_> = self.lock_held().values().cloned().collect();
        for g in grants {
            g.fire(reason.clone(), at);
        }
    }

    pub(super) fn stop_tasks(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.stop_renewal.cancel();
        self.stop_all.cancel();
    }

    pub(super) async fn close(&self) -> Result<()> {
        let first = !self.closed.swap(true, Ordering::SeqCst);
        let abandoned = self.abandoned.load(Ordering::SeqCst);
        self.fire_all(LossReason::SessionClosed, self.loss_instant());
        self.stop_tasks();
        if first && !abandoned {
            let bs = self.current();
            tracing::debug!(parent: &self.span, "closing session");
            return with_timeout(&self.timing, bs.close()).await;
        }
        Ok(())
    }

    pub(super) async fn renewal_task(
        self: Arc<Self>,
        mut events: mpsc::UnboundedReceiver<SessionEvent>,
    ) {
        let timing = self.timing.clone();
        let mut next = Instant::now() + timing.renew_interval;
        let mut attempt = 0u32;
        // How long one renewal may go unanswered before it is sent again: half the room
        // a failover has (`renew_deadline − renew_interval`), not the interval, so a
        // store that answers slowly (a loaded ZooKeeper ensemble's write, an etcd
        // member forwarding to a new raft leader) still renews with frequent renewals.
        let request_limit = timing.connect_timeout.min(
            timing
                .renew_interval
                .max(timing.renew_deadline.saturating_sub(timing.renew_interval) / 2),
        );
        let mut events_open = true;
        loop {
            let mut expired = false;
            // Whether the last attempt went unanswered for the whole request limit.
            let mut unanswered = false;
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = self.renew_soon.notified() => {}
                ev = recv_event(&mut events, &mut events_open) => match ev {
                    Some(SessionEvent::ElectionLost { election, token, reason }) => {
                        self.grant_report(election, token, Early::Lost(LossReason::Revoked(reason)));
                        continue;
                    }
                    Some(SessionEvent::Preempted { election, token }) => {
                        self.grant_report(election, token, Early::StepDown(StepDownReason::Preempted));
                        continue;
                    }
                    Some(SessionEvent::Expired { reason }) => {
                        tracing::warn!(%reason, "store reports the session expired");
                        expired = true;
                    }
                    None => {
                        // The backend dropped its sender; renewals alone tell us now.
                        events_open = false;
                        continue;
                    }
                },
                _ = self.stop_renewal.cancelled() => return,
            }
            if !expired {
                let bs = self.current();
                let sent = Instant::now();
                match tokio::time::timeout(request_limit, bs.keep_alive()).await {
                    Ok(Ok(())) => {
                        let took = sent.elapsed();
                        self.extend_deadline(sent + timing.renew_deadline);
                        crate::metrics::renewed(
                            self.scheme,
                            took,
                            self.deadline().saturating_duration_since(Instant::now()),
                        );
                        attempt = 0;
                        next = sent + timing.renew_interval;
                        continue;
                    }
                    Ok(Err(e)) if e.kind() == ErrorKind::SessionExpired => {
                        tracing::warn!(error = %e, "session expired");
                        expired = true;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "renewal failed");
                    }
                    Err(_) => {
                        tracing::warn!(limit = ?request_limit, "renewal timed out");
                        unanswered = true;
                    }
                }
            }
            if expired {
                self.fire_all(LossReason::SessionExpired, self.loss_instant());
                match self.reopen(&mut events).await {
                    Some(()) => {
                        if !self.lock_registrations().is_empty() {
                            tokio::spawn(self.clone().reregister().instrument(self.span.clone()));
                        }
                        events_open = true;
                        attempt = 0;
                        next = Instant::now() + timing.renew_interval;
                    }
                    None => return,
                }
            } else if unanswered {
                // The attempt already waited its limit: send the next one at once, so
                // that one is always in flight while the store does not answer and the
                // first renewal after it answers again goes out then, not a back-off
                // later (the deadline counts from the send time of the one answered).
                next = Instant::now();
            } else {
                // A refusal comes back at once: back off, but by at most a quarter of
                // the interval, so a renewal still goes out within that of the store
                // answering again.
                let delay = timing.retry.delay(attempt).min(timing.renew_interval / 4);
                attempt = attempt.saturating_add(1);
                next = Instant::now() + delay;
            }
        }
    }

    /// Open a fresh backend session after expiry, retrying until it works or the
    /// session is closed. Replaces `events` with the new session's channel.
    pub(super) async fn reopen(
        &self,
        events: &mut mpsc::UnboundedReceiver<SessionEvent>,
    ) -> Option<()> {
        let mut attempt = 0u32;
        loop {
            if self.stop_renewal.is_cancelled() {
                return None;
            }
            let (tx, rx) = SessionEvents::channel();
            let sent = Instant::now();
            match open_backend_session(&self.backend, &self.timing, tx).await {
                Ok(bs) => {
                    tracing::info!(new_session = %bs.id(), "session re-opened after expiry");
                    let old = self.current();
                    self.deadline_ns.store(
                        duration_ns(
                            (sent + self.timing.renew_deadline)
                                .saturating_duration_since(self.base),
                        ),
                        Ordering::SeqCst,
                    );
                    // The new session and the generation change together: whoever sees
                    // the new session (a campaign that got through on it) reads the new
                    // generation too.
                    self.generation.send_modify(|g| {
                        self.set_current(bs);
                        *g += 1;
                    });
                    *events = rx;
                    self.deadline_moved.notify_one();
                    // Make sure the store forgets the old session even if it is only
                    // half gone.
                    let timing = self.timing.clone();
                    tokio::spawn(async move {
                        let _ = with_timeout(&timing, old.close()).await;
                    });
                    return Some(());
                }
                Err(e) => {
                    let delay = self.timing.retry.delay(attempt);
                    attempt = attempt.saturating_add(1);
                    tracing::warn!(error = %e, ?delay, "could not re-open the session");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = self.stop_renewal.cancelled() => return None,
                    }
                }
            }
        }
    }

    /// Fires every grant's lost signal when the deadline passes without a renewal.
    pub(super) async fn deadline_task(self: Arc<Self>) {
        loop {
            let deadline = self.deadline();
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = self.deadline_moved.notified() => continue,
                _ = self.stop_all.cancelled() => return,
            }
            if Instant::now() >= self.deadline() {
                let n = self.lock_held().values().filter(|g| !g.is_lost()).count();
                if n > 0 {
                    tracing::warn!(grants = n, "renew deadline passed; leadership lost");
                }
                self.fire_all(LossReason::DeadlineExceeded, deadline);
                tokio::select! {
                    _ = self.deadline_moved.notified() => {}
                    _ = self.stop_all.cancelled() => return,
                }
            }
        }
    }
}
