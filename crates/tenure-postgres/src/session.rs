//! A session: a row in `sessions` whose expiry the server's clock decides.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::{lock, BackendSession, Lifetime, Purpose, SessionEvents};
use tenure_core::{Candidate, ElectionName, FencingToken, Member, Result};
use tokio_postgres::types::Type;

use crate::config::SCHEME;
use crate::link::Param;
use crate::shared::{get, token_of, Shared};

/// Seats per call of `try_many` or `resign_many`: the statement holds that many
/// elections' locks until it commits.
pub(crate) const BATCH: usize = 128;

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
        f.debug_struct("PostgresSession")
            .field("id", &self.life.id())
            .finish()
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
        let params: [Param; 3] = [
            (&id, Type::TEXT),
            (&shared.channel, Type::TEXT),
            (&ttl_ms, Type::INT8),
        ];
        let sql = "SELECT {S}.open($1, $2, $3)";
        shared
            .call(Purpose::Renewal, "open session", sql, &params)
            .await?;
        shared.hub.add_session(&id, events.clone());
        Ok(PostgresSession {
            life: Lifetime::new(SCHEME, id),
            shared,
            told: Mutex::new(HashSet::new()),
            events,
        })
    }

    fn id_param(&self) -> String {
        self.life.id().to_owned()
    }

    async fn resign_batch(&self, grants: &[(ElectionName, Option<FencingToken>)]) -> Result<()> {
        let sid = self.id_param();
        let names: Vec<&str> = grants.iter().map(|(e, _)| e.as_str()).collect();
        let tokens: Vec<Option<i64>> = grants
            .iter()
            .map(|(_, t)| t.map(|t| i64::try_from(t.0).unwrap_or(i64::MAX)))
            .collect();
        let params: [Param; 3] = [
            (&names, Type::TEXT_ARRAY),
            (&sid, Type::TEXT),
            (&tokens, Type::INT8_ARRAY),
        ];
        let sql = "SELECT {S}.resign_many($1, $2, $3)";
        self.shared
            .call(Purpose::Election, "resign", sql, &params)
            .await?;
        let mut told = lock(&self.told);
        told.retain(|(e, t)| {
            !grants
                .iter()
                .any(|(g, gt)| g == e && gt.is_none_or(|gt| gt == *t))
        });
        Ok(())
    }

    async fn try_batch(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        let sid = self.id_param();
        let names: Vec<&str> = seats.iter().map(|(e, _)| e.as_str()).collect();
        let ids: Vec<&str> = seats.iter().map(|(_, c)| c.id()).collect();
        let values: Vec<&str> = seats.iter().map(|(_, c)| c.value()).collect();
        let priorities: Vec<i32> = seats.iter().map(|(_, c)| c.priority()).collect();
        let preemptible: Vec<bool> = seats.iter().map(|(_, c)| c.preemptible()).collect();
        let params: [Param; 6] = [
            (&names, Type::TEXT_ARRAY),
            (&sid, Type::TEXT),
            (&ids, Type::TEXT_ARRAY),
            (&values, Type::TEXT_ARRAY),
            (&priorities, Type::INT4_ARRAY),
            (&preemptible, Type::BOOL_ARRAY),
        ];
        let sql = "SELECT {S}.try_many($1, $2, $3, $4, $5, $6)";
        let rows = self
            .shared
            .call(Purpose::Election, "campaign", sql, &params)
            .await?;
        let answers: Vec<Option<i64>> = match rows.first() {
            Some(row) => get("campaign", row, 0)?,
            None => Vec::new(),
        };
        if answers.len() != seats.len() {
            return Err(crate::link::unexpected(
                "campaign",
                "one answer per seat expected",
            ));
        }
        Ok(answers.into_iter().map(|t| t.map(token_of)).collect())
    }
}

#[async_trait]
impl BackendSession for PostgresSession {
    fn id(&self) -> &str {
        self.life.id()
    }

    async fn keep_alive(&self) -> Result<()> {
        self.life.check_open()?;
        let sid = self.id_param();
        let sql = "SELECT election, token FROM {S}.renew($1)";
        let rows = self
            .shared
            .call(
                Purpose::Renewal,
                "renew session",
                sql,
                &[(&sid, Type::TEXT)],
            )
            .await?;
        for row in rows {
            let (election, token): (String, i64) = (get("renew", &row, 0)?, get("renew", &row, 1)?);
            let Ok(election) = ElectionName::new(election) else {
                continue;
            };
            let token = token_of(token);
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
        let (mut token, mut wait) = self.shared.join(election, id, candidate).await?;
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
            (token, wait) = self.shared.grant(election, id).await?;
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
        for batch in seats.chunks(BATCH) {
            answers.extend(self.try_batch(batch).await?);
        }
        Ok(answers)
    }

    async fn resign_many(&self, grants: &[(ElectionName, Option<FencingToken>)]) -> Result<()> {
        for batch in grants.chunks(BATCH) {
            self.resign_batch(batch).await?;
        }
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        if !self.life.close() {
            return Ok(());
        }
        self.shared.hub.remove_session(self.life.id());
        let sid = self.id_param();
        let sql = "SELECT {S}.close($1)";
        self.shared
            .call(
                Purpose::Election,
                "close session",
                sql,
                &[(&sid, Type::TEXT)],
            )
            .await?;
        Ok(())
    }

    fn abandon(&self) {
        self.shared.hub.remove_session(self.life.id());
    }

    async fn register_member(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        self.life.check_open()?;
        let (ns, sid, id, value) = (
            namespace.as_str(),
            self.id_param(),
            member.id(),
            member.value(),
        );
        let params: [Param; 4] = [
            (&ns, Type::TEXT),
            (&sid, Type::TEXT),
            (&id, Type::TEXT),
            (&value, Type::TEXT),
        ];
        let sql = "SELECT {S}.register($1, $2, $3, $4)";
        self.shared
            .call(Purpose::Election, "register member", sql, &params)
            .await?;
        Ok(())
    }

    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        self.life.check_open()?;
        let (ns, sid) = (namespace.as_str(), self.id_param());
        let params: [Param; 3] = [(&ns, Type::TEXT), (&sid, Type::TEXT), (&id, Type::TEXT)];
        let sql = "SELECT {S}.unregister($1, $2, $3)";
        self.shared
            .call(Purpose::Election, "unregister member", sql, &params)
            .await?;
        Ok(())
    }
}
