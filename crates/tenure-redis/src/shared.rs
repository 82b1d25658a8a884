//! What the backend and its sessions share: the settings, the connection, the
//! wake-up hub, the request count, and the reads every part makes.

use std::sync::Arc;
use std::time::Duration;

use redis::{ScriptInvocation, Value};
use tenure_core::backend::{Purpose, Requests};
use tenure_core::{ElectionName, ErrorKind, Result};

use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::error::{unexpected, TAG};
use crate::hub::Hub;
use crate::keys::{jittered, millis_up, parse_seat, ElectionKeys, MemberKeys, Seat};
use crate::scripts::READ_SCRIPT;

/// What the backend and its sessions share.
pub(crate) struct Shared {
    pub(crate) config: RedisConfig,
    pub(crate) conn: Conn,
    pub(crate) hub: Hub,
    /// The request layer the connection and the hub share.
    pub(crate) requests: Arc<Requests<redis::RedisError>>,
    pub(crate) sessions: String,
    /// What every session's channel starts with (the session id follows).
    pub(crate) session_channels: String,
}

impl Shared {
    /// Count one election request made outside the connection (a subscription).
    pub(crate) fn count(&self) {
        self.requests.count(Purpose::Election);
    }

    pub(crate) fn keys(&self, election: &ElectionName) -> ElectionKeys {
        ElectionKeys::new(self.config.key_prefix(), self.config.database(), election)
    }

    pub(crate) fn member_keys(&self, namespace: &ElectionName) -> MemberKeys {
        MemberKeys::new(self.config.key_prefix(), self.config.database(), namespace)
    }

    /// Read a seat: its remaining TTL in ms (negative if none) and its holder.
    pub(crate) async fn read(&self, seat: &str) -> Result<(i64, Option<Seat>)> {
        let invocation = READ_SCRIPT.key(seat);
        let reply = self.script("read leader", &invocation).await?;
        parse_read(&reply)
    }

    /// Run a script for elections or membership (counted as an election request).
    pub(crate) async fn script(
        &self,
        what: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Value> {
        self.conn
            .script(Purpose::Election, what, invocation, None)
            .await
    }

    /// Run a script that grants or renews seats: its writes count only once the
    /// replication guard's replicas have them (see [`Conn::script`]).
    pub(crate) async fn guarded_script(
        &self,
        purpose: Purpose,
        what: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Value> {
        self.conn
            .script(purpose, what, invocation, self.config.guard())
            .await
    }

    /// How long a free seat is kept for the waiter woken to take it (ms): two poll
    /// intervals, so that a waiter whose wake-up message was lost still comes in time
    /// (it looks again within one); one that does not leaves the queue.
    pub(crate) fn grace_ms(&self) -> u64 {
        millis_up(self.config.get_poll_interval() * 2)
    }

    /// How long a waiter or observer waits before looking again, given the seat's
    /// remaining TTL: until it would expire (if sooner), never longer than the poll
    /// interval.
    pub(crate) fn next_look(&self, pttl: i64) -> Duration {
        let poll = jittered(self.config.get_poll_interval());
        match u64::try_from(pttl) {
            Ok(ms) => poll.min(Duration::from_millis(ms.saturating_add(1))),
            Err(_) => poll,
        }
    }
}

fn parse_read(reply: &Value) -> Result<(i64, Option<Seat>)> {
    let Value::Array(items) = reply else {
        return Err(unexpected("read leader", format!("{reply:?}")));
    };
    let pttl = items.first().and_then(as_int).unwrap_or(-2);
    match items.get(1) {
        None | Some(Value::Nil) => Ok((pttl, None)),
        Some(Value::BulkString(raw)) => match parse_seat(raw) {
            Some(seat) => Ok((pttl, Some(seat))),
            None => Err(TAG.own(
                ErrorKind::Backend,
                "read leader: the seat key holds a value tenure did not write",
            )),
        },
        Some(other) => Err(unexpected("read leader", format!("{other:?}"))),
    }
}

/// An integer reply (or a string holding one).
pub(crate) fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// A bulk-string reply holding `s`, as the server sends strings (for the tests of the
/// reply parsers).
#[cfg(test)]
pub(crate) fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_core::ErrorKind;

    #[test]
    fn read_replies() {
        let free = Value::Array(vec![Value::Int(-2)]);
        assert_eq!(parse_read(&free).unwrap(), (-2, None));
        let free = Value::Array(vec![Value::Int(-2), Value::Nil]);
        assert_eq!(parse_read(&free).unwrap(), (-2, None));
        let held = Value::Array(vec![
            Value::Int(900),
            Value::BulkString(b"abc\n7\nprio 3 1 0\nnode\nval".to_vec()),
        ]);
        let (pttl, seat) = parse_read(&held).unwrap();
        assert_eq!(pttl, 900);
        assert_eq!(seat.unwrap().info.token.0, 7);
        let foreign = Value::Array(vec![Value::Int(-1), Value::BulkString(b"hello".to_vec())]);
        assert_eq!(parse_read(&foreign).unwrap_err().kind(), ErrorKind::Backend);
        assert!(parse_read(&Value::Okay).is_err());
    }
}
