//! A write as ZooKeeper commits it: one `multi` (checks of the session nodes of the
//! records put or touched, `setData` of the election node at the version it was
//! decided on, the records' nodes beside it), and batches of them.

use tenure_core::engine::{Op, Snapshot, Token, Write};
use tenure_core::{ElectionName, Error, ErrorKind, Result};
use zookeeper_client::{
    Acls, CreateMode, Error as ZkError, MultiWriteError, MultiWriteResult, Stat,
};

use super::election::{change, presence, Known, Rec};
use super::{session_path, ZkPrimitives, BATCH, BATCH_BYTES};
use crate::error::{map, TAG};
use crate::nodes::election_dir;
use crate::shared::is_node_exists;

/// A write to a record's nodes beside the election node's data.
enum Signal {
    Create(String, Vec<u8>),
    Set(String, Vec<u8>),
    Delete(String),
}

impl Signal {
    fn path(&self) -> &str {
        match self {
            Signal::Create(p, _) | Signal::Set(p, _) | Signal::Delete(p) => p,
        }
    }
}

/// A write planned on a known election: the multi's ops and the election after.
struct Plan {
    election: ElectionName,
    dir: String,
    checks: Vec<String>,
    create: bool,
    expected: i32,
    data: Vec<u8>,
    signals: Vec<Signal>,
    after: Known,
}

impl Plan {
    fn ops(&self) -> usize {
        self.checks.len() + usize::from(self.create) + 1 + self.signals.len()
    }

    fn add(&self, writer: &mut zookeeper_client::MultiWriter<'_>) -> Result<()> {
        let bad = |e| map("commit", e);
        let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
        for path in &self.checks {
            writer.add_check_version(path, -1).map_err(bad)?;
        }
        if self.create {
            writer.add_create(&self.dir, &[], &options).map_err(bad)?;
        }
        writer
            .add_set_data(&self.dir, &self.data, Some(self.expected))
            .map_err(bad)?;
        for signal in &self.signals {
            match signal {
                Signal::Create(p, d) => writer.add_create(p, d, &options),
                Signal::Set(p, d) => writer.add_set_data(p, d, None),
                Signal::Delete(p) => writer.add_delete(p, None),
            }
            .map_err(bad)?;
        }
        Ok(())
    }

    /// The election after the write, given the `setData`'s stat.
    fn done(&self, stat: &Stat) -> Known {
        let mut after = self.after.clone();
        after.version = Some(stat.version);
        after.mzxid = stat.mzxid;
        after.written = true;
        after
    }

    /// Where the election node's `setData` answers among the plan's results.
    fn set_at(&self) -> usize {
        self.checks.len() + usize::from(self.create)
    }
}

/// What a failed multi says of one write: which op failed.
enum Failed {
    /// A session it puts or touches has ended.
    Session(String),
    /// The node was created meanwhile (the write assumed none).
    Exists,
    /// The node's parent is missing.
    NoParent,
    /// The election moved on.
    Moved,
    /// A record's node was not as the records say (changed by hand): repair it.
    Signal(String, ZkError),
}

impl Plan {
    fn failed(&self, index: usize, err: &ZkError) -> Failed {
        if let Some(path) = self.checks.get(index) {
            let id = path.rsplit('/').next().unwrap_or_default().to_string();
            return Failed::Session(id);
        }
        if let Some(signal) = index
            .checked_sub(self.set_at() + 1)
            .and_then(|i| self.signals.get(i))
        {
            return Failed::Signal(signal.path().to_string(), err.clone());
        }
        match err {
            ZkError::NodeExists => Failed::Exists,
            ZkError::NoNode if self.create => Failed::NoParent,
            _ => Failed::Moved,
        }
    }
}

/// The `InvalidArgument` error for an election that holds Curator `LeaderLatch` nodes:
/// the layouts must never share an election (each would elect its own leader).
fn mixed_layouts(election: &ElectionName) -> Error {
    TAG.own(
        ErrorKind::InvalidArgument,
        format!(
            "election {election}: holds Curator LeaderLatch nodes, but this backend uses the \
             default layout; candidates of both layouts must not share an election (connect \
             with layout=curator to join them)"
        ),
    )
}

impl ZkPrimitives {
    /// The write `write` on `base`: the multi's ops and the election after.
    fn plan(&self, election: &ElectionName, base: &Known, write: &Write) -> Plan {
        let mut after = base.clone();
        // The records minted by the write that last set the node get their number.
        for r in &mut after.stored.records {
            if r.minted {
                r.token = u64::try_from(base.mzxid).ok();
                r.minted = false;
            }
        }
        let revision = match base.version {
            Some(v) => u64::try_from(v).unwrap_or(0) + 1,
            None => 1,
        };
        if let Some(left) = write.left_body() {
            after.stored.left = String::from_utf8_lossy(&left).into_owned();
        }
        let dir = election_dir(election);
        let stamp = revision.to_string().into_bytes();
        let mut checks = Vec::new();
        let mut signals = Vec::new();
        for op in &write.ops {
            let session = op.session().to_string();
            let exists = after.stored.records.iter().any(|r| r.session == session);
            match op {
                Op::Delete(_) if exists => {
                    signals.push(Signal::Delete(presence(&dir, &session)));
                    signals.push(Signal::Delete(change(&dir, &session)));
                }
                Op::Put { .. } if !exists => {
                    signals.push(Signal::Create(presence(&dir, &session), Vec::new()));
                    signals.push(Signal::Create(change(&dir, &session), stamp.clone()));
                }
                Op::Put { .. } | Op::Touch(_) if exists => {
                    signals.push(Signal::Set(change(&dir, &session), stamp.clone()));
                }
                _ => {}
            }
            match op {
                Op::Put { token, .. } => {
                    let body = op.body().unwrap_or_default();
                    let body = String::from_utf8_lossy(&body).into_owned();
                    let (token, minted) = match token {
                        Token::None => (None, false),
                        Token::Keep(t) => (Some(*t), false),
                        Token::Mint => (None, true),
                    };
                    match after
                        .stored
                        .records
                        .iter_mut()
                        .find(|r| r.session == session)
                    {
                        Some(r) => {
                            r.body = body;
                            r.token = token;
                            r.minted = minted;
                            r.version = revision;
                        }
                        None => {
                            after.stored.next += 1;
                            after.stored.records.push(Rec {
                                session: session.clone(),
                                arrival: after.stored.next,
                                version: revision,
                                token,
                                minted,
                                body,
                            });
                        }
                    }
                    checks.push(session.clone());
                    after.live.insert(session, true);
                }
                Op::Touch(_) => {
                    if let Some(r) = after
                        .stored
                        .records
                        .iter_mut()
                        .find(|r| r.session == session)
                    {
                        r.version = revision;
                    }
                    checks.push(session.clone());
                    after.live.insert(session, true);
                }
                Op::Delete(_) => {
                    after.stored.records.retain(|r| r.session != session);
                    after.live.remove(&session);
                }
            }
        }
        checks.sort();
        checks.dedup();
        // Serialising strings and numbers cannot fail.
        let data = serde_json::to_vec(&after.stored).unwrap_or_default();
        Plan {
            election: election.clone(),
            dir,
            signals,
            checks: checks.iter().map(|s| session_path(s)).collect(),
            create: base.version.is_none(),
            expected: base.version.unwrap_or(0),
            data,
            after,
        }
    }

    /// The election `write` is to be decided on: the one last seen if at its revision,
    /// none for revision 0 never seen, else read (`Err`: it moved on, as read).
    async fn base(
        &self,
        election: &ElectionName,
        write: &Write,
    ) -> Result<std::result::Result<Known, Known>> {
        match self.cache.get(election) {
            Some(k) if k.revision() == write.revision => return Ok(Ok(k)),
            None if write.revision == 0 => return Ok(Ok(Known::default())),
            _ => {}
        }
        let k = self.read_known(std::slice::from_ref(election)).await?;
        let k = k.into_iter().next().unwrap_or_default();
        Ok(match k.revision() == write.revision {
            true => Ok(k),
            false => Err(k),
        })
    }

    /// Send `plans` in one multi: `Ok(afters)` (remembered) if it committed, else the
    /// index of the plan whose op failed and how.
    async fn send(
        &self,
        plans: &[&Plan],
    ) -> Result<std::result::Result<Vec<Known>, (usize, Failed)>> {
        let _writing = self
            .cache
            .writing
            .enter(plans.iter().map(|p| p.election.clone()));
        let client = self.shared.reader().await?;
        let mut writer = client.new_multi_writer();
        for p in plans {
            p.add(&mut writer)?;
        }
        let commit = async { Ok::<_, ZkError>(writer.commit().await) };
        match self.shared.requests.call("commit", commit).await? {
            Ok(results) => {
                let (mut afters, mut at) = (Vec::with_capacity(plans.len()), 0);
                for p in plans {
                    let Some(MultiWriteResult::SetData { stat }) = results.get(at + p.set_at())
                    else {
                        return Err(TAG.own(ErrorKind::Backend, "commit: an unexpected answer"));
                    };
                    at += p.ops();
                    let after = p.done(stat);
                    self.cache.remember(&p.election, &after);
                    afters.push(after);
                }
                Ok(Ok(afters))
            }
            Err(MultiWriteError::OperationFailed { index, source }) => {
                let mut at = index;
                for (i, p) in plans.iter().enumerate() {
                    if at < p.ops() {
                        return Ok(Err((i, p.failed(at, &source))));
                    }
                    at -= p.ops();
                }
                Err(self.tag(map("commit", source)))
            }
            Err(MultiWriteError::RequestFailed { source }) => Err(self.tag(map("commit", source))),
        }
    }

    /// Make the parents of the election nodes `plans` create (with theirs): two round
    /// trips whatever their number.
    async fn make_parents(&self, plans: &[&Plan]) -> Result<()> {
        let parents: Vec<&str> = plans
            .iter()
            .filter(|p| p.create)
            .filter_map(|p| p.dir.rsplit_once('/').map(|(d, _)| d))
            .filter(|d| !d.is_empty())
            .collect();
        let client = self.shared.reader().await?;
        self.shared.make_dirs(&client, "commit", &parents).await
    }

    /// One write, after the base is known: its answer.
    pub(super) async fn commit_one(
        &self,
        election: &ElectionName,
        write: &Write,
    ) -> Result<(bool, Snapshot)> {
        let mut made_parent = false;
        let mut repairs = 0;
        loop {
            let base = match self.base(election, write).await? {
                Ok(b) => b,
                Err(moved) => return Ok((false, moved.snapshot())),
            };
            if base.refuses(write) {
                return Err(mixed_layouts(election));
            }
            let plan = self.plan(election, &base, write);
            match self.send(&[&plan]).await? {
                Ok(afters) => return Ok((true, afters[0].snapshot())),
                Err((_, Failed::Session(id))) => return Ok(self.refused(election, base, id)),
                Err((_, Failed::NoParent)) if !made_parent => {
                    made_parent = true;
                    self.make_parents(&[&plan]).await?;
                }
                Err((_, Failed::Signal(path, err))) if repairs < 4 => {
                    repairs += 1;
                    self.repair(&path, &err).await?;
                }
                Err((_, Failed::Signal(path, err))) => {
                    let why = format!("commit: the node {path} stays inconsistent ({err})");
                    return Err(TAG.own(ErrorKind::Backend, why));
                }
                Err((_, Failed::Exists | Failed::Moved | Failed::NoParent)) => {
                    let k = self.read_known(std::slice::from_ref(election)).await?;
                    let k = k.into_iter().next().unwrap_or_default();
                    if k.revision() == write.revision && base.version != k.version {
                        // An empty node (made for a sub-election): write it at its version.
                        continue;
                    }
                    return Ok((false, k.snapshot()));
                }
            }
        }
    }

    /// Make a record's node `path` fit the records again after its write failed with
    /// `err` (someone deleted or made it by hand).
    async fn repair(&self, path: &str, err: &ZkError) -> Result<()> {
        let client = self.shared.reader().await?;
        tracing::warn!(node = %path, error = %err, "a record's node was changed by hand; repairing it");
        let done = match err {
            ZkError::NodeExists => {
                self.shared
                    .requests
                    .call("repair", client.delete(path, None))
                    .await
            }
            _ => {
                let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
                let made = client.create(path, &[], &options);
                self.shared.requests.call("repair", made).await.map(drop)
            }
        };
        match done {
            Err(e) if !crate::shared::is_no_node(&e) && !is_node_exists(&e) => Err(e),
            _ => Ok(()),
        }
    }

    /// The answer to a write on `base` refused for the ended session `id`.
    fn refused(&self, election: &ElectionName, mut base: Known, id: String) -> (bool, Snapshot) {
        base.live.insert(id, false);
        self.cache.remember(election, &base);
        (false, base.snapshot())
    }

    /// Many writes in as few multis as ZooKeeper allows. The elections not last seen
    /// at their write's revision are read first (one multi-read per [`BATCH`]), and a
    /// write whose election moved on is answered from that read. The rest go
    /// [`BATCH`] writes (and at most [`BATCH_BYTES`]) to a multi. A multi fails whole at
    /// its first failing op, which names the write: a missing parent has the parents
    /// of every write of the multi made (two round trips) and the multi sent again; a
    /// write refused for an ended session is answered so; any other (its election
    /// moved meanwhile, a record's node changed by hand) is taken out and committed on
    /// its own afterwards, and the multi is sent again without it.
    pub(super) async fn commit_batch(
        &self,
        writes: &[(ElectionName, Write)],
    ) -> Result<Vec<(bool, Snapshot)>> {
        let mut answers: Vec<Option<(bool, Snapshot)>> = vec![None; writes.len()];
        let mut bases: Vec<Known> = writes
            .iter()
            .map(|(e, _)| self.cache.get(e).unwrap_or_default())
            .collect();
        let stale: Vec<usize> = (0..writes.len())
            .filter(|&i| bases[i].revision() != writes[i].1.revision)
            .collect();
        for chunk in stale.chunks(BATCH) {
            let names: Vec<ElectionName> = chunk.iter().map(|&i| writes[i].0.clone()).collect();
            for (&i, k) in chunk.iter().zip(self.read_known(&names).await?) {
                bases[i] = k;
            }
        }
        let mut alone = Vec::new();
        let mut ready: Vec<(usize, Known, Plan)> = Vec::new();
        for (i, ((election, write), base)) in writes.iter().zip(bases).enumerate() {
            if base.revision() != write.revision {
                answers[i] = Some((false, base.snapshot()));
            } else if base.curator {
                alone.push(i);
            } else {
                let plan = self.plan(election, &base, write);
                ready.push((i, base, plan));
            }
        }
        let mut ready = ready.into_iter().peekable();
        while ready.peek().is_some() {
            let (mut chunk, mut bytes) = (Vec::new(), 0);
            while let Some(next) = ready.next_if(|_| chunk.len() < BATCH && bytes < BATCH_BYTES) {
                bytes += next.2.data.len();
                chunk.push(next);
            }
            let mut made_parents = false;
            while !chunk.is_empty() {
                let plans: Vec<&Plan> = chunk.iter().map(|(_, _, p)| p).collect();
                match self.send(&plans).await? {
                    Ok(afters) => {
                        for ((i, _, _), after) in chunk.drain(..).zip(&afters) {
                            answers[i] = Some((true, after.snapshot()));
                        }
                    }
                    Err((_, Failed::NoParent)) if !made_parents => {
                        made_parents = true;
                        self.make_parents(&plans).await?;
                    }
                    Err((at, Failed::Session(id))) => {
                        let (i, base, _) = chunk.remove(at);
                        answers[i] = Some(self.refused(&writes[i].0, base, id));
                    }
                    Err((at, _)) => alone.push(chunk.remove(at).0),
                }
            }
        }
        for i in alone {
            let (election, write) = &writes[i];
            answers[i] = Some(self.commit_one(election, write).await?);
        }
        answers
            .into_iter()
            .map(|a| {
                a.ok_or_else(|| TAG.own(ErrorKind::Backend, "commit: a write went unanswered"))
            })
            .collect()
    }
}
