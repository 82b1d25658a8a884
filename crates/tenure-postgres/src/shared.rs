//! What the backend and its sessions share: the settings, the connections, and the
//! statements every part sends (each a call of one of tenure's functions in
//! `schema.sql`, so each is one round trip).

use std::sync::Arc;
use std::time::Duration;

use tenure_core::backend::Purpose;
use tenure_core::{CancellationToken, Candidate, ElectionName, FencingToken, LeaderInfo, Result};
use tokio_postgres::types::Type;
use tokio_postgres::Row;

use crate::config::PostgresConfig;
use crate::link::{unexpected, Hub, Param, Requester};

/// The schema version this crate's `schema.sql` creates.
pub(crate) const SCHEMA_VERSION: i32 = 1;

/// The statements, with `{S}` for the schema.
pub(crate) const SCHEMA_SQL: &str = include_str!("schema.sql");

/// What the backend and its sessions share.
pub(crate) struct Shared {
    pub(crate) config: PostgresConfig,
    pub(crate) requester: Requester,
    pub(crate) hub: Arc<Hub>,
    /// The channel this backend LISTENs on for its sessions' wake-ups and notices.
    pub(crate) channel: String,
    /// Stops the listening connection when the backend goes.
    pub(crate) stop: CancellationToken,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A grant's token, or how long until the holder's session expires when this
/// candidacy is next (`None`: wait for a wake-up).
pub(crate) type Turn = (Option<FencingToken>, Option<Duration>);

impl Shared {
    fn sql(&self, template: &str) -> String {
        template.replace("{S}", &self.config.schema)
    }

    pub(crate) async fn call(
        &self,
        purpose: Purpose,
        what: &str,
        template: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>> {
        let sql = self.sql(template);
        self.requester.query(purpose, what, &sql, params).await
    }

    /// The seat's turn answer of `join` or `grant`.
    pub(crate) async fn turn(
        &self,
        what: &str,
        template: &str,
        params: &[Param<'_>],
    ) -> Result<Turn> {
        let rows = self.call(Purpose::Election, what, template, params).await?;
        let row = rows.first().ok_or_else(|| unexpected(what, "no row"))?;
        let token: Option<i64> = get(what, row, 0)?;
        let wait: Option<i64> = get(what, row, 1)?;
        Ok((
            token.map(token_of),
            wait.map(|ms| Duration::from_millis(ms.max(0).unsigned_abs())),
        ))
    }

    pub(crate) async fn join(&self, e: &ElectionName, sid: &str, c: &Candidate) -> Result<Turn> {
        let sql = "SELECT token, wait_ms FROM {S}.join($1, $2, $3, $4, $5, $6)";
        let (e, id, value) = (e.as_str(), c.id(), c.value());
        let (priority, preemptible) = (c.priority(), c.preemptible());
        let params: [Param; 6] = [
            (&e, Type::TEXT),
            (&sid, Type::TEXT),
            (&id, Type::TEXT),
            (&value, Type::TEXT),
            (&priority, Type::INT4),
            (&preemptible, Type::BOOL),
        ];
        self.turn("campaign", sql, &params).await
    }

    pub(crate) async fn grant(&self, e: &ElectionName, sid: &str) -> Result<Turn> {
        let sql = "SELECT token, wait_ms FROM {S}.grant($1, $2)";
        let e = e.as_str();
        self.turn("campaign", sql, &[(&e, Type::TEXT), (&sid, Type::TEXT)])
            .await
    }

    /// The holder of `e` and how long until its session expires.
    pub(crate) async fn leader(
        &self,
        e: &ElectionName,
    ) -> Result<(Option<LeaderInfo>, Option<Duration>)> {
        let sql = "SELECT c.candidate, c.value, c.token, \
            ceil(extract(epoch FROM s.expires_at - clock_timestamp()) * 1000)::int8 \
            FROM {S}.candidacies c JOIN {S}.sessions s ON s.id = c.session \
            WHERE c.election = $1 AND c.token IS NOT NULL AND s.expires_at > clock_timestamp()";
        let e = e.as_str();
        let rows = self
            .call(Purpose::Election, "read leader", sql, &[(&e, Type::TEXT)])
            .await?;
        let Some(row) = rows.first() else {
            return Ok((None, None));
        };
        let info = leader_info("read leader", row)?;
        Ok((Some(info), Some(expiry("read leader", row, 3)?)))
    }

    /// The channel observers of an election (`kind` "e") or namespace ("m") hear.
    pub(crate) async fn channel_of(&self, kind: &str, name: &ElectionName) -> Result<String> {
        let name = name.as_str();
        let params: [Param; 2] = [(&kind, Type::TEXT), (&name, Type::TEXT)];
        let rows = self
            .call(
                Purpose::Election,
                "observe",
                "SELECT {S}.chan($1, $2)",
                &params,
            )
            .await?;
        rows.first()
            .map(|row| get("observe", row, 0))
            .unwrap_or_else(|| Err(unexpected("observe", "no row")))
    }
}

/// Column `i` of `row`.
pub(crate) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    what: &str,
    row: &'a Row,
    i: usize,
) -> Result<T> {
    row.try_get(i).map_err(|e| unexpected(what, e))
}

/// The `(candidate, value, token)` columns of a holder.
pub(crate) fn leader_info(what: &str, row: &Row) -> Result<LeaderInfo> {
    Ok(LeaderInfo {
        id: get(what, row, 0)?,
        value: get(what, row, 1)?,
        token: token_of(get(what, row, 2)?),
    })
}

/// Milliseconds until a session expires (column `i`), as a wait.
pub(crate) fn expiry(what: &str, row: &Row, i: usize) -> Result<Duration> {
    let ms: i64 = get(what, row, i)?;
    Ok(Duration::from_millis(ms.max(0).unsigned_abs()))
}

/// Tokens come from a sequence, which starts at 1.
pub(crate) fn token_of(token: i64) -> FencingToken {
    FencingToken(token.max(0).unsigned_abs())
}
