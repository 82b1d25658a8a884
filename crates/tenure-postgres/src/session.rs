//! A session: a row in `sessions` whose expiry the server's clock decides.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::{
    lock, revision_token, BackendSession, Lifetime, Purpose, SessionEvents,
};
use tenure_core::{Candidate, ElectionName, FencingToken, Member, Result};

use crate::config::SCHEME;
use crate::link::{unexpected, Arg};
use crate::shared::{get, Shared, BATCH};

/// How long a waiter that is not next waits without a wake-up before it looks again
/// anyway: only a safety net (wake-ups come by notification, and the listening
/// connection's return makes every waiter look again).
const IDLE: Duration = Duration::from_secs(60);

pub(crate) struct PostgresSession {
    shared: Arc<Shared>,
    life: Lifetime,
    /// Seats already reported as asked to step down (a renewal reports them again
    /// until they are released).
    told: Mutex<HashSet<(ElectionName, FencingToken)>>,
    events: SessionEvents,
}

impl std::fmt::Debug for PostgresSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PostgresSession({})", self.life.id())
    }
}

impl PostgresSession {
    pub(crate) async fn open(
        shared: Arc<Shared>,
        ttl: Duration,
        events: SessionEvents,
    ) -> Result<Self> {
        let id = format!("{:032x}", tenure_core::backend::random_id());
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let sql = "SELECT {S}.open($1, $2, $3)";
        let args: [&dyn Arg; 3] = [&id, &shared.channel, &ttl_ms];
        shared
            .requester
            .call(Purpose::Renewal, "open session", sql, &args)
            .await?;
        shared.hub.add_session(&id, events.clone());
        let (life, told) = (Lifetime::new(SCHEME, id), Mutex::default());
        Ok(PostgresSession {
            shared,
            life,
            told,
            events,
        })
    }

    /// Run `sql` with this session's id as `$2` after `first`, and `rest` after it.
    async fn call(
        &self,
        what: &str,
        sql: &str,
        first: &dyn Arg,
        rest: &[&dyn Arg],
    ) -> Result<Option<tokio_postgres::Row>> {
        let sid = self.life.id();
        let args: Vec<&dyn Arg> = [first, &sid]
            .into_iter()
            .chain(rest.iter().copied())
            .collect();
        let rows = self
            .shared
            .requester
            .call(Purpose::Election, what, sql, &args)
            .await?;
        Ok(rows.into_iter().next())
    }

    async fn try_batch(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        let column =
            |f: fn(&Candidate) -> &str| seats.iter().map(|(_, c)| f(c)).collect::<Vec<_>>();
        let names: Vec<&str> = seats.iter().map(|(e, _)| e.as_str()).collect();
        let (ids, values) = (column(Candidate::id), column(Candidate::value));
        let priorities: Vec<i32> = seats.iter().map(|(_, c)| c.priority()).collect();
        let preemptible: Vec<bool> = seats.iter().map(|(_, c)| c.preemptible()).collect();
        let sql = "SELECT {S}.try_many($1, $2, $3, $4, $5, $6)";
        let rest: [&dyn Arg; 4] = [&ids, &values, &priorities, &preemptible];
        let row = self.call("campaign", sql, &names, &rest).await?;
        let answers: Vec<Option<i64>> = match &row {
            Some(row) => get("campaign", row, 0)?,
            None => Vec::new(),
        };
        if answers.len() != seats.len() {
            return Err(unexpected("campaign", "not one answer per seat"));
        }
        Ok(answers.into_iter().map(|t| t.map(revision_token)).collect())
    }

    async fn resign_batch(&self, grants: &[(ElectionName, Option<FencingToken>)]) -> Result<()> {
        let names: Vec<&str> = grants.iter().map(|(e, _)| e.as_str()).collect();
        let tokens: Vec<Option<i64>> = grants
            .iter()
            .map(|(_, t)| t.map(|t| i64::try_from(t.0).unwrap_or(i64::MAX)))
            .collect();
        self.call(
            "resign",
            "SELECT {S}.resign_many($1, $2, $3)",
            &names,
            &[&tokens],
        )
        .await?;
        let released = |e: &ElectionName, t: &FencingToken| {
            grants
                .iter()
                .any(|(g, gt)| g == e && gt.is_none_or(|gt| gt == *t))
        };
        lock(&self.told).retain(|(e, t)| !released(e, t));
        Ok(())
    }
}

#[async_trait]
impl BackendSession for PostgresSession {
    fn id(&self) -> &str {
        self.life.id()
    }

    async fn keep_alive(&self) -> Result<()> {
        self.life.check_open()?;
        let sql = "SELECT elections, tokens, dead FROM {S}.renew($1)";
        let sid = self.life.id();
        let rows = self
            .shared
            .requester
            .call(Purpose::Renewal, "renew session", sql, &[&sid])
            .await?;
        let row = rows.first().ok_or_else(|| unexpected("renew", "no row"))?;
        let elections: Vec<String> = get::<Option<_>>("renew", row, 0)?.unwrap_or_default();
        let tokens: Vec<i64> = get::<Option<_>>("renew", row, 1)?.unwrap_or_default();
        if get("renew", row, 2)? {
            self.shared.clear_dead_sessions();
        }
        for (election, token) in elections.into_iter().zip(tokens) {
            let (Ok(election), token) = (ElectionName::new(election), revision_token(token)) else {
                continue;
            };
            if lock(&self.told).insert((election.clone(), token)) {
                self.events.preempted(&election, token);
            }
        }
        Ok(())
    }

    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        self.life.check_open()?;
        let id = self.life.id();
        let waiter = self.shared.hub.waiter(id, election.as_str());
        let mut generation = self.shared.hub.generation();
        generation.borrow_and_update();
        let (mut token, mut wait) = self.shared.turn(election, id, Some(candidate)).await?;
        loop {
            if let Some(token) = token {
                return Ok(token);
            }
            tokio::select! {
                _ = waiter.notify.notified() => {}
                _ = generation.changed() => {}
                _ = tokio::time::sleep(wait.unwrap_or(IDLE)) => {}
                _ = self.life.stopped() => return Err(self.life.closed_error()),
            }
            (token, wait) = self.shared.turn(election, id, None).await?;
        }
    }

    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        let seat = [(election.clone(), candidate.clone())];
        Ok(self.try_campaign_many(&seat).await?.pop().flatten())
    }

    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        self.resign_many(&[(election.clone(), token)]).await
    }

    async fn try_campaign_many(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        self.life.check_open()?;
        let mut answers = Vec::with_capacity(seats.len());
        for batch in seats.chunks(BATCH as usize) {
            answers.extend(self.try_batch(batch).await?);
        }
        Ok(answers)
    }

    async fn resign_many(&self, grants: &[(ElectionName, Option<FencingToken>)]) -> Result<()> {
        for batch in grants.chunks(BATCH as usize) {
            self.resign_batch(batch).await?;
        }
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        if self.life.close() {
            self.shared.hub.remove_session(self.life.id());
            self.shared.end_session(self.life.id()).await?;
        }
        Ok(())
    }

    fn abandon(&self) {
        self.shared.hub.remove_session(self.life.id());
    }

    async fn register_member(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        self.life.check_open()?;
        let sql = "SELECT {S}.register($1, $2, $3, $4)";
        let rest: [&dyn Arg; 2] = [&member.id(), &member.value()];
        self.call("register member", sql, &namespace.as_str(), &rest)
            .await?;
        Ok(())
    }

    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        self.life.check_open()?;
        let sql = "SELECT {S}.unregister($1, $2, $3)";
        self.call("unregister member", sql, &namespace.as_str(), &[&id])
            .await?;
        Ok(())
    }
}
