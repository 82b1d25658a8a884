//! What the backend and its sessions share: the client, the settings, the request
//! count, the prefix watch, and the calls every part makes.

use std::sync::Mutex;
use std::time::Duration;

use tenure_core::backend::{lock, whole_units, Purpose, Requests};
use tenure_core::{ErrorKind, Result};

use crate::client::{EtcdClient, KeepAliveStream};
use crate::config::EtcdConfig;
use crate::error::{map, TAG};
use crate::keys::KeySpace;
use crate::proto::{LeaseGrantRequest, LeaseRevokeRequest, Unary};
use crate::watches::Watches;

/// What the backend and its sessions share.
pub(crate) struct Shared {
    pub(crate) client: EtcdClient,
    pub(crate) config: EtcdConfig,
    /// Where elections and members are, in the configured prefix and layout.
    pub(crate) keys: KeySpace,
    /// The timeout, error tags and count of every request.
    pub(crate) requests: Requests<tonic::Status>,
    /// Every wait and observer, on one watch of the prefix (see [`crate::watches`]).
    pub(crate) watches: Watches,
    /// Keep-alive streams not in use; a renewal takes one (or opens one) and puts it
    /// back, so renewals in flight at once do not wait for each other, and a renewal
    /// dropped half-way leaves no stale answer for the next one to read.
    keepers: Mutex<Vec<KeepAliveStream>>,
}

impl Shared {
    pub(crate) fn new(client: EtcdClient, config: EtcdConfig) -> Self {
        let requests = Requests::new(
            TAG,
            config.endpoints().join(","),
            config.get_request_timeout(),
            map,
        );
        let keys = KeySpace::new(config.key_prefix(), config.key_layout());
        let timeout = config.get_request_timeout();
        Shared {
            watches: Watches::spawn(client.clone(), timeout, keys.root()),
            client,
            keys,
            config,
            requests,
            keepers: Mutex::new(Vec::new()),
        }
    }

    /// One unary call through the request layer (its timeout, error tags and count);
    /// `what` names it in errors.
    pub(crate) async fn call<Q: Unary>(&self, what: &str, request: Q) -> Result<Q::Answer> {
        self.requests.call(what, self.client.call(request)).await
    }

    /// Count one election request made without the request layer (a watch added to
    /// a shared stream, a wake-up).
    pub(crate) fn count(&self) {
        self.requests.count(Purpose::Election);
    }

    /// How long a renewal of a lease of `ttl` waits for one member before it asks the
    /// next as well: the member timeout, at most a tenth of the TTL. A renewal goes out
    /// every quarter TTL and the core gives each attempt at most that long, so the next
    /// member gets most of the attempt, and the renewal still lands within the renew
    /// deadline; asking it early is cheap, since the slow member's call goes on beside
    /// it (the client's hedged requests). With one member only the request timeout
    /// applies.
    pub(crate) fn answer_limit(&self, ttl: Duration) -> Duration {
        self.client.member_timeout.min(ttl / 10)
    }

    /// Renew `leases` (at least one), waiting `limit` for one member's answer (see
    /// [`answer_limit`](Self::answer_limit)): each lease's remaining TTL in seconds (0
    /// or less: gone).
    pub(crate) async fn renew(&self, leases: &[i64], limit: Duration) -> Result<Vec<i64>> {
        let existing = lock(&self.keepers).pop();
        let renewal = self.client.keep_alive(leases, existing, limit);
        let (stream, ttls) = self
            .requests
            .call_as(Purpose::Renewal, "keep-alive", renewal)
            .await?;
        lock(&self.keepers).push(stream);
        Ok(ttls)
    }

    /// Revoke `lease`; one etcd no longer has counts as revoked.
    pub(crate) async fn revoke(&self, what: &str, lease: i64) -> Result<()> {
        match self.call(what, LeaseRevokeRequest { id: lease }).await {
            Err(e) if e.kind() != ErrorKind::SessionExpired => Err(e),
            _ => Ok(()),
        }
    }

    /// Grant a lease of `ttl` (in whole seconds, rounded up); its id.
    pub(crate) async fn grant_lease(&self, ttl: Duration) -> Result<i64> {
        let seconds = lease_seconds(ttl);
        let request = LeaseGrantRequest { ttl: seconds };
        let granted = self.call("open session", request).await?;
        if !granted.error.is_empty() {
            return Err(TAG.own(
                ErrorKind::Backend,
                format!("open session: etcd refused the lease: {}", granted.error),
            ));
        }
        if granted.ttl > seconds {
            tracing::warn!(
                requested = seconds,
                granted = granted.ttl,
                "etcd raised the lease TTL to its minimum; failover takes that long"
            );
        }
        Ok(granted.id)
    }
}

/// The whole seconds of an etcd lease for `ttl`: rounded up, so the store never keeps a
/// session shorter than the core assumes.
pub(crate) fn lease_seconds(ttl: Duration) -> i64 {
    let secs = whole_units(ttl, Duration::from_secs(1));
    i64::try_from(secs).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_round_up_to_whole_seconds() {
        assert_eq!(lease_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(lease_seconds(Duration::MAX), i64::MAX);
    }
}
