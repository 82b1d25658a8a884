//! An election as ZooKeeper keeps it: the data of its node (records with the engine's
//! opaque body, the bytes kept for the next grant), read back with the liveness of its
//! records' sessions, and the nodes beside it that waiters watch.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tenure_core::engine::{Op, Record, Snapshot, Write};
use tenure_core::{ElectionName, ErrorKind, Result};
use zookeeper_client::{Error as ZkError, MultiReadResult, Stat};

use super::{session_path, ZkPrimitives};
use crate::error::{map, TAG};
use crate::nodes::{election_dir, sequence_of};

/// An election node's data.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Stored {
    /// Arrivals handed out so far.
    #[serde(rename = "n", default)]
    pub(super) next: u64,
    /// The bytes kept for the next grant (`Write::left_body`, UTF-8 JSON).
    #[serde(rename = "l", default, skip_serializing_if = "String::is_empty")]
    pub(super) left: String,
    #[serde(rename = "r", default)]
    pub(super) records: Vec<Rec>,
}

/// One record of an election node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Rec {
    #[serde(rename = "s")]
    pub(super) session: String,
    #[serde(rename = "a")]
    pub(super) arrival: u64,
    #[serde(rename = "v")]
    pub(super) version: u64,
    #[serde(rename = "t", default, skip_serializing_if = "Option::is_none")]
    pub(super) token: Option<u64>,
    /// Minted by the write that last set the node: the token is its `mzxid`.
    #[serde(rename = "m", default, skip_serializing_if = "is_false")]
    pub(super) minted: bool,
    /// The engine's opaque body (JSON text).
    #[serde(rename = "b")]
    pub(super) body: String,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// An election node as last read or written.
#[derive(Clone, Debug, Default)]
pub(super) struct Known {
    /// The node's data version; `None`: no node.
    pub(super) version: Option<i32>,
    /// Whether the node held data (an empty node is an election never written).
    pub(super) written: bool,
    pub(super) mzxid: i64,
    pub(super) stored: Stored,
    /// Whether each record's session lives.
    pub(super) live: HashMap<String, bool>,
    /// The node's children as last read.
    pub(super) children: i32,
    /// Whether its children include Curator `LeaderLatch` nodes (`layout=curator`).
    pub(super) curator: bool,
}

impl Known {
    pub(super) fn from_node(data: &[u8], stat: &Stat) -> Known {
        let stored = serde_json::from_slice::<Stored>(data).unwrap_or_default();
        Known {
            version: Some(stat.version),
            written: !data.is_empty(),
            mzxid: stat.mzxid,
            stored,
            live: HashMap::new(),
            children: stat.num_children,
            curator: false,
        }
    }

    /// Whether the node has children besides its records' two each (sub-elections,
    /// another layout's nodes).
    pub(super) fn foreign_children(&self) -> bool {
        let own = self.stored.records.len().saturating_mul(2);
        usize::try_from(self.children).is_ok_and(|n| n > own)
    }

    /// Whether `write` adds a record to an election Curator's recipe uses.
    pub(super) fn refuses(&self, write: &Write) -> bool {
        self.curator
            && write.ops.iter().any(|op| {
                matches!(op, Op::Put { .. })
                    && !self
                        .stored
                        .records
                        .iter()
                        .any(|r| r.session == op.session())
            })
    }

    pub(super) fn revision(&self) -> u64 {
        match self.version {
            Some(v) if self.written => u64::try_from(v).unwrap_or(0),
            _ => 0,
        }
    }

    pub(super) fn token(&self, r: &Rec) -> Option<u64> {
        match r.minted {
            true => u64::try_from(self.mzxid).ok(),
            false => r.token,
        }
    }

    pub(super) fn snapshot(&self) -> Snapshot {
        let records = self
            .stored
            .records
            .iter()
            .map(|r| {
                let live = self.live.get(&r.session).copied().unwrap_or(false);
                Record::from_store(
                    r.session.clone(),
                    r.arrival,
                    r.version,
                    self.token(r),
                    live,
                    r.body.as_bytes(),
                )
            })
            .collect();
        Snapshot::from_store(self.revision(), self.stored.left.as_bytes(), records)
    }

    pub(super) fn sessions(&self) -> Vec<String> {
        self.stored
            .records
            .iter()
            .map(|r| r.session.clone())
            .collect()
    }
}

/// The node that exists while session `session`'s record in the election at `dir`
/// does (never written: its deletion wakes the waiter behind the record).
pub(super) fn presence(dir: &str, session: &str) -> String {
    format!("{dir}/:r-{session}")
}

/// The node rewritten with every write to session `session`'s record (its data: the
/// election's revision after that write), which its owner watches.
pub(super) fn change(dir: &str, session: &str) -> String {
    format!("{dir}/:c-{session}")
}

impl ZkPrimitives {
    /// Read `elections` and the liveness of their records' sessions: one multi-read of
    /// the nodes and of the session nodes last seen in them, and one more for sessions
    /// new to them.
    pub(super) async fn read_known(&self, elections: &[ElectionName]) -> Result<Vec<Known>> {
        let client = self.shared.reader().await?;
        let mut guessed: Vec<String> = Vec::new();
        for e in elections {
            if let Some(k) = self.cache.get(e) {
                guessed.extend(k.sessions());
            }
        }
        guessed.sort();
        guessed.dedup();
        let bad = |e| map("read", e);
        let mut reader = client.new_multi_reader();
        for e in elections {
            reader.add_get_data(&election_dir(e)).map_err(bad)?;
        }
        for s in &guessed {
            reader.add_get_data(&session_path(s)).map_err(bad)?;
        }
        let mut results = self.shared.requests.call("read", reader.commit()).await?;
        let found = results.split_off(elections.len());
        let mut live: HashMap<String, bool> = HashMap::new();
        for (s, r) in guessed.into_iter().zip(found) {
            live.insert(s, matches!(r, MultiReadResult::Data { .. }));
        }
        let mut known = Vec::with_capacity(elections.len());
        for r in results {
            known.push(match r {
                MultiReadResult::Data { data, stat } => Known::from_node(&data, &stat),
                MultiReadResult::Error {
                    err: ZkError::NoNode,
                } => Known::default(),
                MultiReadResult::Error { err } => return Err(self.tag(map("read", err))),
                _ => return Err(TAG.own(ErrorKind::Backend, "read: an unexpected answer")),
            });
        }
        let mut unknown: Vec<String> = known
            .iter()
            .flat_map(Known::sessions)
            .filter(|s| !live.contains_key(s))
            .collect();
        unknown.sort();
        unknown.dedup();
        if !unknown.is_empty() {
            let mut reader = client.new_multi_reader();
            for s in &unknown {
                reader.add_get_data(&session_path(s)).map_err(bad)?;
            }
            let found = self.shared.requests.call("read", reader.commit()).await?;
            for (s, r) in unknown.into_iter().zip(found) {
                live.insert(s, matches!(r, MultiReadResult::Data { .. }));
            }
        }
        for (e, k) in elections.iter().zip(known.iter_mut()) {
            if k.foreign_children() {
                let dir = election_dir(e);
                let children = self.shared.children(&client, "read", &dir).await?;
                k.curator = children.iter().any(|c| sequence_of(c).is_some());
            }
            for s in k.sessions() {
                let l = live.get(&s).copied().unwrap_or(false);
                k.live.insert(s, l);
            }
            self.cache.remember(e, k);
        }
        Ok(known)
    }
}
