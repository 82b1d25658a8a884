//! What the backend and its primitives share: the settings, the connection, the
//! wake-up hub, the request count, and the script calls every part makes.

use redis::{ScriptInvocation, Value};
use tenure_core::backend::Purpose;
use tenure_core::{ElectionName, Result};

use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::hub::Hub;
use crate::keys::Keys;

/// What the backend and its primitives share.
pub(crate) struct Shared {
    pub(crate) config: RedisConfig,
    pub(crate) conn: Conn,
    pub(crate) hub: Hub,
    /// What every session's key starts with (the session id follows).
    pub(crate) sessions: String,
    /// What every session's channel starts with (the session id follows).
    pub(crate) session_channels: String,
}

impl Shared {
    pub(crate) fn keys(&self, election: &ElectionName) -> Keys {
        Keys::election(self.config.key_prefix(), self.config.database(), election)
    }

    pub(crate) fn member_keys(&self, namespace: &ElectionName) -> Keys {
        Keys::members(self.config.key_prefix(), self.config.database(), namespace)
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

    /// Run a script that commits or renews: its writes count only once the
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
}

/// An integer reply (or a string holding one).
pub(crate) fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        v => std::str::from_utf8(bytes(v)?).ok()?.parse().ok(),
    }
}

/// Bytes of a reply (a nil or an integer holds none).
pub(crate) fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// A bulk-string reply holding `s`, as the server sends strings (for the tests of the
/// reply parsers).
#[cfg(test)]
pub(crate) fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}
