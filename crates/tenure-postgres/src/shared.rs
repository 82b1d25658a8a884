//! What the backend and its sessions share: the settings, the connections, and the
//! statements every part sends (each a call of one of tenure's functions in
//! `schema.sql`, or one query, so each is one round trip).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure_core::backend::{revision_token, Purpose};
use tenure_core::{CancellationToken, Candidate, ElectionName, FencingToken, LeaderInfo, Result};
use tokio_postgres::types::FromSql;
use tokio_postgres::Row;

use crate::config::PostgresConfig;
use crate::link::{unexpected, Arg, Hub, Requester};

/// Seats per statement of a batch (`try_many`, `resign_many`, `reap`): the statement
/// holds that many elections' locks until it commits.
pub(crate) const BATCH: i32 = 128;

/// The most requests one task of [`Shared::clear_dead_sessions`] sends.
const MAX_REAPS: usize = 1000;

/// The schema version this crate's `schema.sql` creates, and the file.
pub(crate) const SCHEMA: (i32, &str) = (1, include_str!("schema.sql"));

/// What the backend and its sessions share.
pub(crate) struct Shared {
    pub(crate) config: PostgresConfig,
    pub(crate) requester: Requester,
    pub(crate) hub: Arc<Hub>,
    /// The channel this backend LISTENs on for its sessions' wake-ups and notices.
    pub(crate) channel: String,
    /// Stops the listening connection when the backend goes.
    pub(crate) stop: CancellationToken,
    /// Whether a task of this backend clears dead sessions away now.
    pub(crate) reaping: AtomicBool,
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
    /// End session `sid` now: from this request on, what it held counts for nothing,
    /// and its first batch of seats is released (their waiters woken); the rest is
    /// cleared away by a task, a batch per request (a transaction may not lock more
    /// elections than the server's lock table holds).
    pub(crate) async fn end_session(self: &Arc<Self>, sid: &str) -> Result<()> {
        let row = self
            .one("close session", "SELECT {S}.close($1, $2)", &[&sid, &BATCH])
            .await?;
        if get::<bool>("close session", &row, 0)? {
            self.reap(Some(sid.to_owned()));
        }
        Ok(())
    }

    /// Clear expired sessions away from a task of its own, unless one runs already:
    /// what they held goes, a batch of seats per request, and the waiters that are
    /// first now are woken. Counted as maintenance, not as election requests.
    pub(crate) fn clear_dead_sessions(self: &Arc<Self>) {
        if !self.reaping.swap(true, Ordering::SeqCst) {
            self.reap(None);
        }
    }

    /// Call `reap(sid, …)` from a task until it says it is done (`sid` none: any
    /// expired session, and the task clears the `reaping` mark at its end).
    fn reap(self: &Arc<Self>, sid: Option<String>) {
        let shared = self.clone();
        tokio::spawn(async move {
            let sql = "SELECT {S}.reap($1, $2)";
            for _ in 0..MAX_REAPS {
                let args: [&dyn Arg; 2] = [&sid.as_deref(), &BATCH];
                let call = shared
                    .requester
                    .call(Purpose::Renewal, "clear a session away", sql, &args)
                    .await;
                match call.map(|rows| rows.first().map(|row| get::<bool>("reap", row, 0))) {
                    Ok(Some(Ok(true))) => continue,
                    Err(e) => tracing::debug!(error = %e, "clearing a session away failed"),
                    _ => {}
                }
                break;
            }
            if sid.is_none() {
                shared.reaping.store(false, Ordering::SeqCst);
            }
        });
    }

    /// An election request answered by one row.
    pub(crate) async fn one(&self, what: &str, sql: &str, args: &[&dyn Arg]) -> Result<Row> {
        let rows = self
            .requester
            .call(Purpose::Election, what, sql, args)
            .await?;
        rows.into_iter()
            .next()
            .ok_or_else(|| unexpected(what, "no row"))
    }

    /// `join` (with `candidate`) or `grant` (without): this candidacy's turn.
    pub(crate) async fn turn(
        &self,
        e: &ElectionName,
        sid: &str,
        candidate: Option<&Candidate>,
    ) -> Result<Turn> {
        let row = match candidate {
            Some(c) => {
                let sql = "SELECT token, wait_ms FROM {S}.join($1, $2, $3, $4, $5, $6)";
                let (id, value, prio, preempt) = (c.id(), c.value(), c.priority(), c.preemptible());
                let args: [&dyn Arg; 6] = [&e.as_str(), &sid, &id, &value, &prio, &preempt];
                self.one("campaign", sql, &args).await?
            }
            None => {
                let sql = "SELECT token, wait_ms FROM {S}.grant($1, $2)";
                self.one("campaign", sql, &[&e.as_str(), &sid]).await?
            }
        };
        let token: Option<i64> = get("campaign", &row, 0)?;
        Ok((
            token.map(revision_token),
            get::<Option<i64>>("campaign", &row, 1)?.map(millis),
        ))
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
        let rows = self
            .requester
            .call(Purpose::Election, "read leader", sql, &[&e.as_str()])
            .await?;
        let Some(row) = rows.first() else {
            return Ok((None, None));
        };
        let expiry = millis(get("read leader", row, 3)?);
        Ok((Some(leader_info("read leader", row)?), Some(expiry)))
    }
}

/// Column `i` of `row`.
pub(crate) fn get<'a, T: FromSql<'a>>(what: &str, row: &'a Row, i: usize) -> Result<T> {
    row.try_get(i).map_err(|e| unexpected(what, e))
}

/// The `(candidate, value, token)` columns of a holder.
pub(crate) fn leader_info(what: &str, row: &Row) -> Result<LeaderInfo> {
    let token = revision_token(get(what, row, 2)?);
    Ok(LeaderInfo {
        id: get(what, row, 0)?,
        value: get(what, row, 1)?,
        token,
    })
}

/// A number of milliseconds the server computed, as a wait.
pub(crate) fn millis(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0).unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FNV-1a, 64 bits: a hash that stays the same across Rust versions.
    fn fnv(text: &str) -> u64 {
        text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// A database keeps the functions of the version it was created or upgraded with:
    /// a changed `schema.sql` under the same version would never reach it. Change the
    /// file, bump the version, and record the new hash here.
    #[test]
    fn schema_sql_changes_with_its_version() {
        let recorded: &[(i32, u64)] = &[(1, 0x05dd_e894_22ee_6164)];
        let (version, sql) = SCHEMA;
        let hash = fnv(sql);
        assert!(
            recorded.contains(&(version, hash)),
            "schema.sql (version {version}) hashes to {hash:#x}, not what is recorded for \
             its version: bump SCHEMA's version and record ({}, {hash:#x})",
            version + 1
        );
    }
}
