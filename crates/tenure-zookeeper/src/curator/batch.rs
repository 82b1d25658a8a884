//! Curator-layout batches: `try_campaign_many` in four round trips per chunk whatever
//! its size, and a seat's or many seats' nodes deleted (`resign`, `resign_many`).

use tenure_core::backend::{encode_record, CampaignMode};
use tenure_core::{Candidate, ElectionName, FencingToken, Result};
use zookeeper_client::{
    Acls, Client, CreateMode, Error as ZkError, MultiReadResult, MultiWriteResult,
};

use super::{curator_accepts, Node, ZkSession};
use crate::nodes::{election_dir, sequence_of, sorted_latches};
use crate::shared::is_no_node;

impl ZkSession {
    /// Take the free seats of `chunk` (at most [`BATCH`]) in four round trips whatever
    /// its size: one multi-read of every election's queue (a seat with a queue is taken:
    /// trying never queues), one multi creating this session's node in the others, one
    /// multi-read of those queues and of the new nodes (for their creation zxids), and
    /// one multi withdrawing the nodes that are not first. Missing election directories
    /// are made in between (once per election); a seat this session already has a node
    /// in goes the one-seat way.
    pub(super) async fn try_chunk(
        &self,
        chunk: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        const WHAT: &str = "try_campaign_many";
        for (_, c) in chunk {
            curator_accepts(c)?;
        }
        let client = self.client()?;
        let bad = |e| crate::error::map(WHAT, e);
        let dirs: Vec<String> = chunk.iter().map(|(e, _)| election_dir(e)).collect();
        let mut reader = client.new_multi_reader();
        for dir in &dirs {
            reader.add_get_children(dir).map_err(bad)?;
        }
        let queues = self.shared.requests.call(WHAT, reader.commit()).await?;
        let mut answers = vec![None; chunk.len()];
        let (mut free, mut missing) = (Vec::new(), Vec::new());
        for (i, queue) in queues.into_iter().enumerate() {
            let (election, candidate) = &chunk[i];
            if self.node(election).is_some() {
                answers[i] = self.run(election, candidate, CampaignMode::TryOnce).await?;
                continue;
            }
            match queue {
                MultiReadResult::Children { children } => {
                    if !children.iter().any(|c| sequence_of(c).is_some()) {
                        free.push(i);
                    }
                }
                MultiReadResult::Error {
                    err: ZkError::NoNode,
                } => {
                    missing.push(dirs[i].as_str());
                    free.push(i);
                }
                MultiReadResult::Error { err } => return Err(bad(err)),
                _ => return Err(self.unexpected(WHAT)),
            }
        }
        if free.is_empty() {
            return Ok(answers);
        }
        self.shared.make_dirs(&client, WHAT, &missing).await?;
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let records: Vec<Vec<u8>> = free.iter().map(|&i| encode_record(&chunk[i].1)).collect();
        let mut writer = client.new_multi_writer();
        for (&i, record) in free.iter().zip(&records) {
            let path = format!("{}/{}", dirs[i], self.prefix);
            writer.add_create(&path, record, &options).map_err(bad)?;
        }
        let commit = async { writer.commit().await.map_err(ZkError::from) };
        let created = self.shared.requests.call(WHAT, commit).await?;
        let mut paths = Vec::with_capacity(free.len());
        for result in created {
            match result {
                MultiWriteResult::Create { path, .. } => paths.push(path),
                _ => return Err(self.unexpected(WHAT)),
            }
        }
        // The creates' stats may be empty (ZOOKEEPER-4026): read the zxids back.
        let mut reader = client.new_multi_reader();
        for (&i, path) in free.iter().zip(&paths) {
            reader.add_get_children(&dirs[i]).map_err(bad)?;
            reader.add_get_data(path).map_err(bad)?;
        }
        let read = self.shared.requests.call(WHAT, reader.commit()).await?;
        let mut withdraw = client.new_multi_writer();
        let mut losers = 0;
        for ((&i, path), pair) in free.iter().zip(&paths).zip(read.chunks(2)) {
            let (MultiReadResult::Children { children }, MultiReadResult::Data { stat, .. }) =
                (&pair[0], &pair[1])
            else {
                return Err(self.unexpected(WHAT));
            };
            let name = path.rsplit('/').next().unwrap_or_default().to_string();
            let first = sorted_latches(children.clone()).into_iter().next();
            if first.as_deref() == Some(name.as_str()) {
                let election = &chunk[i].0;
                let node = Node {
                    name,
                    czxid: stat.czxid,
                };
                self.set_node(election, Some(node.clone()));
                answers[i] = Some(self.granted(election, path, &node, None));
            } else {
                withdraw.add_delete(path, None).map_err(bad)?;
                losers += 1;
            }
        }
        if losers > 0 {
            let commit = async { withdraw.commit().await.map_err(ZkError::from) };
            self.shared.requests.call(WHAT, commit).await?;
        }
        Ok(answers)
    }

    pub(super) async fn delete(
        &self,
        client: &Client,
        election: &ElectionName,
        dir: &str,
        node: &Node,
    ) -> Result<()> {
        self.unguard(election);
        let path = node.path(dir);
        let deleted = self
            .shared
            .requests
            .call("resign", client.delete(&path, None));
        match deleted.await {
            Ok(()) => {}
            Err(e) if is_no_node(&e) => {}
            Err(e) => return Err(e),
        }
        self.set_node(election, None);
        Ok(())
    }

    /// Delete this session's nodes of a chunk of seats (at most [`BATCH`]) in one
    /// multi. A node already gone fails the whole multi, and then each is deleted on
    /// its own.
    pub(super) async fn delete_many(
        &self,
        client: &Client,
        chunk: &[(&ElectionName, Node)],
    ) -> Result<()> {
        const WHAT: &str = "resign_many";
        if let [(election, node)] = chunk {
            return self
                .delete(client, election, &election_dir(election), node)
                .await;
        }
        let mut writer = client.new_multi_writer();
        for (election, node) in chunk {
            self.unguard(election);
            writer
                .add_delete(&node.path(&election_dir(election)), None)
                .map_err(|e| crate::error::map(WHAT, e))?;
        }
        let commit = async { writer.commit().await.map_err(ZkError::from) };
        match self.shared.requests.call(WHAT, commit).await {
            Ok(_) => {
                for (election, _) in chunk {
                    self.set_node(election, None);
                }
            }
            Err(e) if is_no_node(&e) => {
                for (election, node) in chunk {
                    self.delete(client, election, &election_dir(election), node)
                        .await?;
                }
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }
}
