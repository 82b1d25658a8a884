//! JSON event lines.

use std::io::Write;

use serde_json::{json, Value};
use tenure::{FencingToken, LeadershipEvent};

use crate::clock::{mono_ns, monotonic_now_ns};

/// Where event lines go.
pub trait EventSink: Send + Sync {
    /// Emit one event.
    fn emit(&self, event: Value);
}

/// Writes one JSON object per line to stdout and flushes each line.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdoutSink;

impl EventSink for StdoutSink {
    fn emit(&self, event: Value) {
        let mut out = std::io::stdout().lock();
        // A closed stdout (e.g. `| head`) must not kill the campaign.
        let _ = writeln!(out, "{event}");
        let _ = out.flush();
    }
}

fn token(t: FencingToken) -> u64 {
    t.get()
}

/// The JSON line for a runner event, stamped with CLOCK_MONOTONIC nanoseconds of the
/// moment it happened (for `lost` after a missed deadline: the deadline itself).
pub fn leadership_event_json(id: &str, event: &LeadershipEvent) -> Option<Value> {
    Some(match event {
        LeadershipEvent::Campaigning { election } => json!({
            "event": "campaigning", "election": election.as_str(), "id": id,
            "mono_ns": monotonic_now_ns(),
        }),
        LeadershipEvent::Elected {
            election,
            token: t,
            at,
            inherited_bytes,
            ..
        } => {
            let mut line = json!({
                "event": "elected", "election": election.as_str(), "id": id,
                "token": token(*t), "mono_ns": mono_ns(*at),
            });
            if let (Some(n), Some(map)) = (inherited_bytes, line.as_object_mut()) {
                map.insert("inherited_bytes".into(), json!(n));
            }
            line
        }
        LeadershipEvent::Lost {
            election,
            token: t,
            reason,
            at,
        } => json!({
            "event": "lost", "election": election.as_str(), "id": id,
            "token": token(*t), "reason": reason.to_string(), "mono_ns": mono_ns(*at),
        }),
        LeadershipEvent::SteppingDown {
            election,
            token: t,
            reason,
            at,
        } => json!({
            "event": "stepping_down", "election": election.as_str(), "id": id,
            "token": token(*t), "reason": reason.to_string(), "mono_ns": mono_ns(*at),
        }),
        LeadershipEvent::Resigned {
            election,
            token: t,
            cause,
            at,
            aborted,
        } => json!({
            "event": "resigned", "election": election.as_str(), "id": id,
            "token": token(*t), "cause": cause.to_string(), "aborted": aborted,
            "mono_ns": mono_ns(*at),
        }),
        _ => return None,
    })
}

/// Keeps events in memory, for the tests of the commands that emit them.
#[cfg(test)]
#[derive(Debug, Default, Clone)]
pub struct MemorySink(std::sync::Arc<std::sync::Mutex<Vec<Value>>>);

#[cfg(test)]
impl MemorySink {
    /// A snapshot of the events so far.
    pub fn events(&self) -> Vec<Value> {
        match self.0.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

#[cfg(test)]
impl EventSink for MemorySink {
    fn emit(&self, event: Value) {
        match self.0.lock() {
            Ok(mut g) => g.push(event),
            Err(p) => p.into_inner().push(event),
        }
    }
}
