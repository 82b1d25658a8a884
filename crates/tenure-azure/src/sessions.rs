//! Sessions: one blob each, `[prefix/]sessions/<id>`, rewritten (conditional on its
//! etag) by every renewal. Azure cannot expire a blob, so liveness is judged the way
//! client-go judges a lease: a session whose blob a reader has seen unchanged for
//! longer than its TTL (the reader's own clock, from the first time it saw that etag)
//! has ended; a deleted one has ended too.
//!
//! Why never early: a renewal counts for its owner only if its answer came back within
//! `ttl × (1 − CLOCK_DRIFT_MARGIN)` of the send time of the last renewal that counted
//! (else the owner ends the session), and the core's deadline is earlier still. A
//! reader that first saw an etag did so after the renewal that wrote it was sent; it
//! calls the session ended only once that etag is still there a TTL later, by which
//! time the owner has given up: no renewal can count for it any more. A session ended
//! once is ended for good (its owner never renews it again).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tenure_core::backend::{lock, Purpose};
use tenure_core::{ErrorKind, Result, CLOCK_DRIFT_MARGIN};

use crate::error::TAG;
use crate::names::{new_id, Layout};
use crate::store::{Store, When};

/// Metadata field of a session blob: its TTL in milliseconds.
const META_TTL: &str = "tenurettlms";

/// How many requests a batch of renewals or checks keeps in flight.
const CONCURRENCY: usize = 8;

/// A session this process opened.
#[derive(Debug)]
struct Own {
    ttl: Duration,
    /// Send time of the last renewal that counted (or of the open).
    confirmed: Instant,
    etag: String,
    ended: bool,
}

impl Own {
    fn bound(&self) -> Instant {
        self.confirmed + self.ttl.mul_f64(1.0 - CLOCK_DRIFT_MARGIN)
    }

    fn live(&mut self, now: Instant) -> bool {
        if now >= self.bound() {
            self.ended = true;
        }
        !self.ended
    }
}

/// Another process's session, as this process has seen it.
#[derive(Debug)]
struct Seen {
    etag: String,
    /// When this process first saw `etag`.
    first: Instant,
    /// When it last saw it (still `etag`).
    checked: Instant,
    ttl: Duration,
    ended: bool,
}

impl Seen {
    fn live(&self) -> bool {
        !self.ended && self.checked.saturating_duration_since(self.first) <= self.ttl
    }
}

/// The sessions of one backend: its own, and those it has seen.
pub(crate) struct Sessions {
    pub(crate) store: Arc<Store>,
    pub(crate) layout: Layout,
    /// A session seen this recently is not read again for a snapshot.
    fresh: Duration,
    own: Mutex<HashMap<String, Own>>,
    seen: Mutex<HashMap<String, Seen>>,
}

impl Sessions {
    pub(crate) fn new(store: Arc<Store>, layout: Layout, fresh: Duration) -> Self {
        Sessions {
            store,
            layout,
            fresh,
            own: Mutex::default(),
            seen: Mutex::default(),
        }
    }

    fn metadata(ttl: Duration) -> HashMap<String, String> {
        HashMap::from([(META_TTL.to_string(), ttl.as_millis().to_string())])
    }

    pub(crate) async fn open(&self, ttl: Duration) -> Result<String> {
        let id = new_id();
        let sent = Instant::now();
        let name = self.layout.session(&id);
        let put = self.store.put(
            &name,
            Vec::new(),
            Self::metadata(ttl),
            When::Absent,
            Purpose::Renewal,
        );
        let etag = put
            .await
            .map_err(|f| f.into_error("open session"))?
            .ok_or_else(|| TAG.own(ErrorKind::Unavailable, "open session: the id is taken"))?;
        let own = Own {
            ttl,
            confirmed: sent,
            etag,
            ended: false,
        };
        lock(&self.own).insert(id.clone(), own);
        Ok(id)
    }

    /// Renew one of this process's sessions: whether it still lives.
    ///
    /// A renewal whose answer was lost (timed out) may still reach the store later, as
    /// a request held up in the network does, and change the blob's etag: the next
    /// renewal's `If-Match` then fails though the blob is there. Only the owner writes
    /// its session blob (an open creates a new id, a revoke deletes it), so a blob that
    /// is there with another etag is that late renewal: the renewal is sent again on
    /// the etag read back. A blob that is gone ended the session.
    async fn renew_one(&self, id: &str) -> Result<bool> {
        let held = {
            let mut own = lock(&self.own);
            match own.get_mut(id) {
                Some(o) => match o.live(Instant::now()) {
                    true => Some((o.ttl, o.etag.clone())),
                    false => return Ok(false),
                },
                None => None,
            }
        };
        let Some((ttl, mut etag)) = held else {
            return Ok(self.live(&[id.to_string()]).await?[0]);
        };
        let name = self.layout.session(id);
        let mut read_back = false;
        loop {
            let sent = Instant::now();
            let put = self.store.put(
                &name,
                Vec::new(),
                Self::metadata(ttl),
                When::Is(&etag),
                Purpose::Renewal,
            );
            let r = put.await.map_err(|f| f.into_error("renew session"));
            if matches!(r, Ok(None)) && !read_back {
                read_back = true;
                let props = self.store.properties(&name).await;
                if let Some(now) = props.map_err(|f| f.into_error("renew session"))? {
                    etag = now.etag;
                    continue;
                }
            }
            let mut own = lock(&self.own);
            let Some(o) = own.get_mut(id) else {
                return Ok(false);
            };
            return match r {
                // Late answers do not count: readers may have seen the session end.
                Ok(Some(etag)) if o.live(Instant::now()) => {
                    o.confirmed = sent;
                    o.etag = etag;
                    Ok(true)
                }
                Ok(_) => {
                    o.ended = true;
                    Ok(false)
                }
                Err(e) => Err(e),
            };
        }
    }

    pub(crate) async fn renew(&self, ids: &[String]) -> Result<Vec<bool>> {
        let answers: Vec<Result<bool>> = futures::stream::iter(ids.iter().cloned())
            .map(|id| async move { self.renew_one(&id).await })
            .buffered(CONCURRENCY)
            .collect()
            .await;
        answers.into_iter().collect()
    }

    /// End a session now: deleted, it is ended for every reader.
    pub(crate) async fn revoke(&self, id: &str) -> Result<()> {
        if let Some(o) = lock(&self.own).get_mut(id) {
            o.ended = true;
        }
        let name = self.layout.session(id);
        self.store
            .delete(&name, None)
            .await
            .map_err(|f| f.into_error("revoke session"))
    }

    /// Whether `id` lives, from what this process knows without a request: `Some`
    /// for its own sessions and for one known to have ended.
    pub(crate) fn known(&self, id: &str) -> Option<bool> {
        if let Some(o) = lock(&self.own).get_mut(id) {
            return Some(o.live(Instant::now()));
        }
        lock(&self.seen).get(id).filter(|s| s.ended).map(|_| false)
    }

    /// Whether `id` lives as last seen (no request); a session never seen counts live.
    pub(crate) fn cached(&self, id: &str) -> bool {
        self.known(id)
            .unwrap_or_else(|| lock(&self.seen).get(id).is_none_or(Seen::live))
    }

    /// Note what a read of session `id` showed: its etag and TTL, or `None` if it is
    /// gone.
    fn note(&self, id: &str, read: Option<(String, Duration)>, at: Instant) {
        let mut seen = lock(&self.seen);
        if seen.len() > 100_000 {
            seen.retain(|_, s| s.live());
        }
        let Some((etag, ttl)) = read else {
            let ended = Seen {
                etag: String::new(),
                first: at,
                checked: at,
                ttl: Duration::ZERO,
                ended: true,
            };
            seen.insert(id.to_string(), ended);
            return;
        };
        match seen.get_mut(id) {
            Some(s) if s.ended => {}
            Some(s) if s.etag == etag => s.checked = s.checked.max(at),
            _ => {
                let fresh = Seen {
                    etag,
                    first: at,
                    checked: at,
                    ttl,
                    ended: false,
                };
                seen.insert(id.to_string(), fresh);
            }
        }
        if let Some(s) = seen.get_mut(id) {
            s.ended = !s.live();
        }
    }

    fn ttl_of(metadata: &HashMap<String, String>) -> Duration {
        let ms = metadata.get(META_TTL).and_then(|t| t.parse().ok());
        // A session blob tenure did not write ends a minute after it stops changing.
        Duration::from_millis(ms.unwrap_or(60_000))
    }

    /// Whether each of `ids` lives, reading those this process cannot answer for
    /// (one request each, at once).
    pub(crate) async fn live(&self, ids: &[String]) -> Result<Vec<bool>> {
        let recent = |id: &str| {
            lock(&self.seen)
                .get(id)
                .is_some_and(|s| s.checked.elapsed() < self.fresh)
        };
        let unknown: HashSet<String> = ids
            .iter()
            .filter(|i| self.known(i).is_none() && !recent(i))
            .cloned()
            .collect();
        let reads: Vec<Result<()>> = futures::stream::iter(unknown)
            .map(|id| async move {
                let props = self.store.properties(&self.layout.session(&id)).await;
                let at = Instant::now();
                let props = props.map_err(|f| f.into_error("read session"))?;
                let read = props.map(|p| (p.etag, Self::ttl_of(&p.metadata)));
                self.note(&id, read, at);
                Ok(())
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        reads.into_iter().collect::<Result<Vec<()>>>()?;
        Ok(ids.iter().map(|id| self.cached(id)).collect())
    }

    /// Every session's liveness in one listing (for member lists, which name many).
    pub(crate) async fn live_listed(&self) -> Result<HashSet<String>> {
        let prefix = self.layout.sessions();
        let listed = self.store.list_with_metadata(&prefix).await;
        let at = Instant::now();
        let listed = listed.map_err(|f| f.into_error("list sessions"))?;
        let mut live = HashSet::new();
        for b in listed {
            let Some(id) = b.name.strip_prefix(&prefix) else {
                continue;
            };
            if self.known(id).is_none() {
                self.note(id, Some((b.etag, Self::ttl_of(&b.metadata))), at);
            }
            if self.cached(id) {
                live.insert(id.to_string());
            }
        }
        Ok(live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_gives_its_session_up_before_any_reader_may() {
        let ttl = Duration::from_secs(15);
        let t0 = Instant::now();
        let mut own = Own {
            ttl,
            confirmed: t0,
            etag: "e1".into(),
            ended: false,
        };
        // Live until 95 % of the TTL after the last renewal that counted, then never.
        assert!(own.live(t0 + Duration::from_millis(14_200)));
        assert!(!own.live(t0 + Duration::from_millis(14_250)));
        own.confirmed = t0 + Duration::from_secs(14);
        assert!(!own.live(t0 + Duration::from_secs(15)), "ended is final");
        // A reader that first saw the etag after the renewal was sent calls the
        // session ended only a TTL later: after the owner's bound.
        let seen = |checked: Duration| Seen {
            etag: "e1".into(),
            first: t0,
            checked: t0 + checked,
            ttl,
            ended: false,
        };
        assert!(seen(Duration::from_secs(15)).live());
        assert!(!seen(Duration::from_millis(15_001)).live());
    }
}
