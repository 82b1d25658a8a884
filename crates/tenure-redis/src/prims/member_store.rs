//! Member lists on Redis: the registrations of a session in a namespace's hash.

use super::*;

/// Remove `session`'s members `id` (every one if `None`) of `namespace`.
pub(crate) async fn unregister(
    shared: &Shared,
    session: &str,
    namespace: &ElectionName,
    id: Option<&str>,
) -> Result<()> {
    let keys = shared.member_keys(namespace);
    let mut invocation = UNREGISTER_SCRIPT.key(&keys.hash);
    invocation.arg(session).arg(&keys.channel);
    if let Some(id) = id {
        invocation.arg(id);
    }
    shared.script("unregister member", &invocation).await?;
    Ok(())
}

#[async_trait]
impl MemberStore for RedisPrimitives {
    async fn register(
        &self,
        session: &str,
        namespace: &ElectionName,
        member: &Member,
    ) -> Result<()> {
        let keys = self.shared.member_keys(namespace);
        lock(&self.registered)
            .entry(session.to_string())
            .or_default()
            .insert(namespace.clone());
        let mut invocation = REGISTER_SCRIPT.key(self.session_key(session));
        invocation
            .key(&keys.hash)
            .arg(session)
            .arg(member.id())
            .arg(member.value())
            .arg(&keys.channel);
        let reply = self.shared.script("register member", &invocation).await?;
        match as_int(&reply) {
            Some(-1) => Err(session_gone("register member", session)),
            Some(0 | 1) => Ok(()),
            _ => Err(unexpected("register member", format!("{reply:?}"))),
        }
    }

    async fn unregister(&self, session: &str, namespace: &ElectionName, id: &str) -> Result<()> {
        Member::check_id(id)?;
        unregister(&self.shared, session, namespace, Some(id)).await
    }

    async fn list(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        let keys = self.shared.member_keys(namespace);
        let (members, _) = members::list(&self.shared, &keys.hash, &mut Known::new()).await?;
        Ok(members)
    }

    async fn watch(&self, namespace: &ElectionName) -> Result<MemberStream> {
        members::watch(self.shared.clone(), namespace).await
    }
}
