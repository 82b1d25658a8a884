//! Membership: one ephemeral sequential node per registration.
//!
//! A namespace's members live in `<chroot>/:members/<namespace>` with each `/` of the
//! namespace written as `:` (`billing/shards` → `/:members/billing:shards`). Election
//! names and member ids never contain `:`, so no election directory (`/<election>`) can
//! be or contain a namespace directory, no two namespaces share one, and member nodes
//! cannot be taken for candidates.
//!
//! A registration is the node `<id>:<10-digit sequence>`, owned by the registering
//! session's ZooKeeper session and holding the member value as UTF-8. Node data is never
//! changed: registering again creates a new node and deletes the old one in one `multi`,
//! so a child watch sees every change and a node's value, once read, can be cached by
//! its name. Of several live registrations of one id (from different sessions) the
//! highest sequence, the latest, wins.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tenure_core::{ElectionName, Error, ErrorKind, Member, MemberStream, Result, Retry};
use tokio::sync::mpsc;
use zookeeper_client::{
    Acls, AddWatchMode, Client, CreateMode, EventType, MultiWriteResult, SessionState,
};

use crate::error::TAG;
use crate::shared::{is_no_node, Shared};

/// The directory (under the chroot) holding every namespace.
pub(crate) const MEMBERS_ROOT: &str = "/:members";

/// The directory of `namespace`'s members.
pub(crate) fn namespace_dir(namespace: &ElectionName) -> String {
    format!("{MEMBERS_ROOT}/{}", namespace.as_str().replace('/', ":"))
}

/// The path to create (sequentially) for a registration of `id` in `dir`.
pub(crate) fn registration_prefix(dir: &str, id: &str) -> String {
    format!("{dir}/{id}:")
}

/// The member id and sequence of a registration node name, `None` for anything else.
pub(crate) fn parse_registration(name: &str) -> Option<(&str, u64)> {
    let (id, digits) = name.rsplit_once(':')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Member::check_id(id).ok()?;
    Some((id, digits.parse().ok()?))
}

/// The winning registration node of each id (highest sequence), by id.
fn winners(children: &[String]) -> BTreeMap<&str, (u64, &str)> {
    let mut by_id: BTreeMap<&str, (u64, &str)> = BTreeMap::new();
    for name in children {
        let Some((id, seq)) = parse_registration(name) else {
            continue;
        };
        let e = by_id.entry(id).or_insert((seq, name.as_str()));
        if seq > e.0 {
            *e = (seq, name.as_str());
        }
    }
    by_id
}

/// The member a registration node describes; `None` (logged) for data that is not a
/// valid member value, written by something other than tenure.
fn decode_member(id: &str, data: Vec<u8>) -> Option<Member> {
    let member = String::from_utf8(data)
        .map_err(|_| Error::invalid("member value: not UTF-8"))
        .and_then(|value| Member::new(id, value));
    match member {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(member = id, error = %e, "ignoring a member node with foreign data");
            None
        }
    }
}

/// Members already read, by node name (node data never changes); `None` for nodes whose
/// data is not a member value.
pub(crate) type MemberCache = HashMap<String, Option<Member>>;

/// The member list for the children `children` of `dir`: the winner of each id, its
/// value from `cache` or read (all missing ones at once, pipelined). Also returns the
/// winners that were deleted meanwhile (left out of the list): the caller must drop them
/// from `children` and resolve again.
async fn resolve(
    shared: &Shared,
    client: &Client,
    dir: &str,
    children: &[String],
    cache: &mut MemberCache,
) -> Result<(Vec<Member>, Vec<String>)> {
    let winners = winners(children);
    let missing: Vec<(&str, &str)> = winners
        .iter()
        .filter(|(_, (_, name))| !cache.contains_key(*name))
        .map(|(id, (_, name))| (*id, *name))
        .collect();
    let paths: Vec<String> = missing
        .iter()
        .map(|(_, name)| format!("{dir}/{name}"))
        .collect();
    let reads = paths
        .iter()
        .map(|path| shared.requests.call("read members", client.get_data(path)));
    let results = futures::future::join_all(reads).await;
    let mut vanished = Vec::new();
    for ((id, name), result) in missing.into_iter().zip(results) {
        match result {
            Ok((data, _)) => {
                cache.insert(name.to_string(), decode_member(id, data));
            }
            Err(e) if is_no_node(&e) => vanished.push(name.to_string()),
            Err(e) => return Err(e),
        }
    }
    cache.retain(|name, _| children.contains(name));
    let list = winners
        .values()
        .filter_map(|(_, name)| cache.get(*name).cloned().flatten())
        .collect();
    Ok((list, vanished))
}

/// The members of the namespace in `dir` as `client` sees them.
pub(crate) async fn read_members(
    shared: &Shared,
    client: &Client,
    dir: &str,
    cache: &mut MemberCache,
) -> Result<Vec<Member>> {
    loop {
        let children = shared.children(client, "read members", dir).await?;
        let (list, vanished) = resolve(shared, client, dir, &children, cache).await?;
        if vanished.is_empty() {
            return Ok(list);
        }
    }
}

/// The live members of `namespace` (a `sync` first, so that a registration that
/// returned is seen even from a follower).
pub(crate) async fn list(shared: &Shared, namespace: &ElectionName) -> Result<Vec<Member>> {
    let client = shared.synced_reader("read members").await?;
    let dir = namespace_dir(namespace);
    read_members(shared, &client, &dir, &mut MemberCache::new()).await
}

/// The members of `namespace` as they change (see [`watch_task`]).
pub(crate) async fn watch(shared: &Arc<Shared>, namespace: &ElectionName) -> Result<MemberStream> {
    let client = shared.synced_reader("watch members").await?;
    let dir = namespace_dir(namespace);
    let mut cache = MemberCache::new();
    let first = Arc::new(read_members(shared, &client, &dir, &mut cache).await?);
    let (tx, rx) = mpsc::channel::<Observed>(QUEUED_LISTS);
    let _ = tx.try_send(Ok(first.clone()));
    tokio::spawn(watch_task(shared.clone(), dir, first, tx));
    Ok(Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        let item = item.map(|list| list.as_ref().clone());
        Some((item, rx))
    })))
}

/// The registration nodes of `id` in the namespace directory `dir` owned by the
/// ZooKeeper session `owner`, as the server has them (after a request whose answer was
/// lost or dropped).
pub(crate) async fn find_own(
    shared: &Shared,
    client: &Client,
    owner: i64,
    dir: &str,
    id: &str,
) -> Result<Vec<String>> {
    let children = shared.children(client, "register member", dir).await?;
    let mut own_nodes = Vec::new();
    for name in children {
        if parse_registration(&name).map(|(i, _)| i) != Some(id) {
            continue;
        }
        let path = format!("{dir}/{name}");
        let stat = shared
            .requests
            .call("register member", client.check_stat(&path))
            .await?;
        if stat.is_some_and(|s| s.ephemeral_owner == owner) {
            own_nodes.push(name);
        }
    }
    Ok(own_nodes)
}

/// Create a registration node for `member` in `dir` and delete `old` (the session's
/// previous nodes of the id) in the same transaction; the new node's name.
pub(crate) async fn replace(
    shared: &Shared,
    client: &Client,
    dir: &str,
    member: &Member,
    old: &[String],
) -> Result<String> {
    let prefix = registration_prefix(dir, member.id());
    let data = member.value().as_bytes();
    let mode = CreateMode::EphemeralSequential;
    if old.is_empty() {
        let (_, sequence) = shared
            .create_ephemeral(client, "register member", dir, &prefix, data, mode)
            .await?;
        return Ok(format!("{}:{sequence}", member.id()));
    }
    let options = mode.with_acls(Acls::anyone_all());
    let mut multi = client.new_multi_writer();
    let bad = |e| crate::error::map("register member", e);
    multi.add_create(&prefix, data, &options).map_err(bad)?;
    for name in old {
        multi
            .add_delete(&format!("{dir}/{name}"), None)
            .map_err(bad)?;
    }
    let results = shared
        .requests
        .call("register member", async {
            multi.commit().await.map_err(zookeeper_client::Error::from)
        })
        .await?;
    for result in results {
        if let MultiWriteResult::Create { path, .. } = result {
            if let Some(name) = path.rsplit('/').next() {
                return Ok(name.to_string());
            }
        }
    }
    Err(TAG.own(
        ErrorKind::Backend,
        "register member: the transaction answered without the created node",
    ))
}

/// A ZooKeeper session's member registrations, by namespace and id: the node's name,
/// `None` while unsure (a request in flight, failed or dropped). Held across requests,
/// so the registrations of one session are made one at a time.
pub(crate) struct Registrar {
    /// The ZooKeeper session id, the `ephemeralOwner` of its member nodes.
    owner: i64,
    registrations: tokio::sync::Mutex<HashMap<(ElectionName, String), Option<String>>>,
}

impl Registrar {
    pub(crate) fn new(owner: i64) -> Self {
        Registrar {
            owner,
            registrations: tokio::sync::Mutex::default(),
        }
    }

    /// Register `member` in `namespace` on the session's `client`, replacing its
    /// registration of the id, if any.
    pub(crate) async fn register(
        &self,
        shared: &Shared,
        client: &Client,
        namespace: &ElectionName,
        member: &Member,
    ) -> Result<()> {
        let mut regs = self.registrations.lock().await;
        let dir = namespace_dir(namespace);
        let key = (namespace.clone(), member.id().to_string());
        // Unsure until the answer is in: a dropped or failed request may have applied.
        let mut old = match regs.insert(key.clone(), None) {
            None => Vec::new(),
            Some(Some(name)) => vec![name],
            Some(None) => find_own(shared, client, self.owner, &dir, member.id()).await?,
        };
        let mut attempt = 0;
        loop {
            match replace(shared, client, &dir, member, &old).await {
                Ok(name) => {
                    regs.insert(key, Some(name));
                    return Ok(());
                }
                // The old node is gone (deleted by hand): look again, then replace.
                Err(e) if is_no_node(&e) && !old.is_empty() && attempt < 3 => {
                    attempt += 1;
                    old = find_own(shared, client, self.owner, &dir, member.id()).await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Remove the session's registration of `id` in `namespace`.
    pub(crate) async fn unregister(
        &self,
        shared: &Shared,
        client: &Client,
        namespace: &ElectionName,
        id: &str,
    ) -> Result<()> {
        let mut regs = self.registrations.lock().await;
        let dir = namespace_dir(namespace);
        let key = (namespace.clone(), id.to_string());
        let names = match regs.insert(key.clone(), None) {
            None => {
                regs.remove(&key);
                return Ok(());
            }
            Some(Some(name)) => vec![name],
            Some(None) => find_own(shared, client, self.owner, &dir, id).await?,
        };
        for name in names {
            let path = format!("{dir}/{name}");
            match shared
                .requests
                .call("unregister member", client.delete(&path, None))
                .await
            {
                Err(e) if !is_no_node(&e) => return Err(e),
                _ => {}
            }
        }
        regs.remove(&key);
        Ok(())
    }
}

/// One published member list, or an error.
pub(crate) type Observed = std::result::Result<Arc<Vec<Member>>, Error>;

/// How many member lists may wait for a slow watcher before the watch task waits.
pub(crate) const QUEUED_LISTS: usize = 64;

/// The name of the registration node at `path` if it is a child of `dir`.
fn child_of<'a>(path: &'a str, dir: &str) -> Option<&'a str> {
    path.strip_prefix(dir)?
        .strip_prefix('/')
        .filter(|name| !name.is_empty() && !name.contains('/'))
}

/// Follows one namespace for its watchers with a persistent recursive watch on its
/// directory (ZooKeeper 3.6+; it may not exist yet): list once, then apply each
/// created or deleted registration node as its event arrives — a delete needs no
/// request, a create one read — and publish the list whenever it changed, so a member
/// that leaves and comes back (an expired session registered again) is seen leaving.
/// After a reconnection (events may be lost meanwhile) or a new reader session, list
/// again. Every published list is queued for the watcher (up to [`QUEUED_LISTS`], then
/// the task waits for it), so a quick leave-and-return is never coalesced away. Ends
/// when the watcher is gone.
pub(crate) async fn watch_task(
    shared: Arc<Shared>,
    dir: String,
    mut last: Arc<Vec<Member>>,
    tx: mpsc::Sender<Observed>,
) {
    let retry = Retry::default();
    let mut attempt = 0u32;
    let mut failed = false;
    'setup: loop {
        if tx.is_closed() {
            return;
        }
        let mut cache = MemberCache::new();
        let setup = async {
            let client = shared.reader().await?;
            // Watch first, then list, so no change falls between.
            let watcher = shared
                .requests
                .call(
                    "watch members",
                    client.watch(&dir, AddWatchMode::PersistentRecursive),
                )
                .await?;
            let children = shared.children(&client, "watch members", &dir).await?;
            Ok::<_, Error>((client, watcher, children))
        };
        let (client, mut watcher, mut children) = match setup.await {
            Ok(r) => r,
            Err(e) => {
                if !failed {
                    if tx.send(Err(e)).await.is_err() {
                        return;
                    }
                    failed = true;
                }
                let delay = retry.delay(attempt);
                attempt = attempt.saturating_add(1);
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                continue 'setup;
            }
        };
        attempt = 0;
        loop {
            // Resolve until no winner vanished (each vanished one is dropped), publish.
            loop {
                match resolve(&shared, &client, &dir, &children, &mut cache).await {
                    Ok((list, vanished)) if vanished.is_empty() => {
                        if *list != *last || failed {
                            last = Arc::new(list);
                            failed = false;
                            if tx.send(Ok(last.clone())).await.is_err() {
                                return;
                            }
                        }
                        break;
                    }
                    // A winner was replaced or removed after the events seen so far
                    // (a member re-registering quickly): list the children again
                    // rather than publish a list that lacks a member who is still
                    // registered under a newer node.
                    Ok(_) => match shared.children(&client, "watch members", &dir).await {
                        Ok(c) => children = c,
                        Err(e) => {
                            tracing::debug!(error = %e, dir = %dir, "listing members failed; watching again");
                            continue 'setup;
                        }
                    },
                    Err(e) => {
                        tracing::debug!(error = %e, dir = %dir, "reading members failed; watching again");
                        continue 'setup;
                    }
                }
            }
            let event = tokio::select! {
                _ = tx.closed() => return,
                event = watcher.changed() => event,
            };
            match event.event_type {
                EventType::Session => match event.session_state {
                    // Events may have been lost while disconnected; a terminal state
                    // needs a new reader session (and the watcher must not be polled
                    // again).
                    SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                        continue 'setup
                    }
                    s if s.is_terminated() => continue 'setup,
                    _ => {}
                },
                EventType::NodeCreated => {
                    if let Some(name) = child_of(&event.path, &dir) {
                        if !children.iter().any(|c| c == name) {
                            children.push(name.to_string());
                        }
                    }
                }
                EventType::NodeDeleted => {
                    if let Some(name) = child_of(&event.path, &dir) {
                        children.retain(|c| c != name);
                    }
                }
                EventType::NodeDataChanged => {
                    // Not written by tenure (its nodes never change): read it again.
                    if let Some(name) = child_of(&event.path, &dir) {
                        cache.remove(name);
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_never_meet_elections_or_each_other() {
        let ns = |s: &str| namespace_dir(&ElectionName::new(s).unwrap());
        assert_eq!(ns("billing/shards"), "/:members/billing:shards");
        assert_ne!(ns("a/b"), format!("{}/b", ns("a")));
        // No election name contains ':', so no election directory is under the root.
        assert!(ElectionName::new(":members").is_err());
        assert!(Member::check_id("a:1").is_err());
        assert_eq!(
            registration_prefix(&ns("x"), "node-1"),
            "/:members/x/node-1:"
        );
    }

    #[test]
    fn registrations_parse_and_the_latest_wins() {
        assert_eq!(
            parse_registration("node-1.a_b:0000000012"),
            Some(("node-1.a_b", 12))
        );
        for bad in [
            "node-1",
            "node-1:",
            "node-1:12x",
            ":0000000001",
            "..:0000000001",
            "_c_x-latch-0000000001",
        ] {
            assert_eq!(parse_registration(bad), None, "{bad}");
        }
        let children: Vec<String> = [
            "b:0000000003",
            "a:0000000007",
            "a:0000000002",
            "junk",
            "c:0000000001",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        let w = winners(&children);
        let got: Vec<(&str, &str)> = w.iter().map(|(id, (_, n))| (*id, *n)).collect();
        assert_eq!(
            got,
            [
                ("a", "a:0000000007"),
                ("b", "b:0000000003"),
                ("c", "c:0000000001")
            ]
        );
    }

    #[test]
    fn events_name_children_only() {
        assert_eq!(
            child_of("/:members/ns/a:0000000001", "/:members/ns"),
            Some("a:0000000001")
        );
        assert_eq!(child_of("/:members/ns", "/:members/ns"), None);
        assert_eq!(child_of("/:members/nsx/a:1", "/:members/ns"), None);
        assert_eq!(child_of("/:members/ns/a/b", "/:members/ns"), None);
    }

    #[test]
    fn foreign_data_is_skipped() {
        assert_eq!(
            decode_member("a", b"v".to_vec()),
            Some(Member::new("a", "v").unwrap())
        );
        assert_eq!(decode_member("a", vec![0xff, 0xfe]), None);
        assert_eq!(decode_member("a", b"tab\there".to_vec()), None);
    }
}
