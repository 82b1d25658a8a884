//! A small etcd v3 client over tonic: the calls of [`crate::proto`], TLS, and
//! user/password authentication whose token is fetched again when etcd says it expired.
//!
//! # Members that stall
//!
//! The client keeps one connection per member and sends every request to a preferred
//! member. A request that the member refuses as unavailable is sent again to the next
//! member; one that gets no answer within the member timeout is sent to the next member
//! as well while the first call goes on (a hedged request), and whichever member
//! answers first becomes the preferred one. A member that is paused (a GC pause, a disk
//! stall, SIGSTOP) keeps its TCP connection open and answers nothing; without this,
//! every request would wait for the whole request timeout on it, and a leader's
//! renewals would miss their deadline while the rest of the cluster is healthy.
//!
//! Every request this backend makes can be sent twice safely: reads, deletes guarded
//! by a create revision, puts of the same value, keep-alives, creates guarded by "the
//! key does not exist" (a create that did land on the first member is found and
//! replaced by the campaign), and lease grants (a second lease nobody uses holds no
//! keys and expires after its TTL).

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::channel::mpsc;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tenure_core::{Error, Result};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

use crate::config::EtcdConfig;
use crate::proto::{self, Unary};

/// How often the client pings an idle HTTP/2 connection. etcd refuses pings more often
/// than every 5 s (`--grpc-keepalive-min-time`), so stay above that.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(10);

/// The largest answer accepted (a page of 16 members of up to 512 KiB, a batch of
/// watch events); tonic's default of 4 MiB is too small for those.
const MAX_ANSWER_BYTES: usize = 128 * 1024 * 1024;

/// The gRPC metadata key etcd reads the auth token from.
const TOKEN_KEY: &str = "token";

/// The longest one member may take to answer before a request goes to the next one
/// (when the cluster has more than one member).
const MEMBER_TIMEOUT: Duration = Duration::from_secs(1);

/// The connection to an etcd cluster. Cheap to clone: clones share the connections,
/// the preferred member and the auth token.
#[derive(Clone)]
pub(crate) struct EtcdClient {
    members: Arc<[Channel]>,
    preferred: Arc<AtomicUsize>,
    /// The longest one member may take before a request goes to the next one.
    pub(crate) member_timeout: Duration,
    auth: Option<Arc<Auth>>,
    /// Messages sent to etcd (unary calls, streams opened, stream messages), each one
    /// round trip, for measurements.
    pub(crate) sent: Arc<AtomicU64>,
    /// Unary calls sent (transactions, reads, lease grants and revokes).
    pub(crate) unary: Arc<AtomicU64>,
}

/// A user's credentials and the token etcd gave for them.
struct Auth {
    name: String,
    password: String,
    token: RwLock<Option<MetadataValue<Ascii>>>,
}

/// A bidirectional stream: requests go in through `requests`, answers come from
/// `answers`.
pub(crate) struct Duplex<Q, A> {
    requests: mpsc::UnboundedSender<Q>,
    answers: Streaming<A>,
    /// The member the stream is open to.
    member: usize,
    sent: Arc<AtomicU64>,
}

/// A watch stream (`Watch/Watch`).
pub(crate) type WatchStream = Duplex<proto::WatchRequest, proto::WatchResponse>;

/// A lease keep-alive stream (`Lease/LeaseKeepAlive`).
pub(crate) type KeepAliveStream =
    Duplex<proto::LeaseKeepAliveRequest, proto::LeaseKeepAliveResponse>;

impl<Q, A> Duplex<Q, A> {
    /// Send one more request on the stream.
    pub(crate) fn send(&self, request: Q) -> std::result::Result<(), Status> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.requests
            .unbounded_send(request)
            .map_err(|_| Status::unavailable("the stream to etcd is closed"))
    }

    /// The next answer; `None` when etcd ended the stream.
    pub(crate) async fn message(&mut self) -> std::result::Result<Option<A>, Status> {
        self.answers.message().await
    }
}

impl WatchStream {
    /// Ask for one more watch on this stream.
    pub(crate) fn create(
        &self,
        create: proto::WatchCreateRequest,
    ) -> std::result::Result<(), Status> {
        self.send(watch_create(create))
    }

    /// Cancel the watch with `watch_id`.
    pub(crate) fn cancel(&self, watch_id: i64) -> std::result::Result<(), Status> {
        self.send(proto::WatchRequest {
            request_union: Some(proto::WatchRequestUnion::Cancel(
                proto::WatchCancelRequest { watch_id },
            )),
        })
    }
}

fn watch_create(create: proto::WatchCreateRequest) -> proto::WatchRequest {
    proto::WatchRequest {
        request_union: Some(proto::WatchRequestUnion::Create(create)),
    }
}

/// Whether `status` says the member could not serve the request (down, unreachable,
/// without a leader, timed out): another member may.
fn member_failed(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::DeadlineExceeded | Code::Cancelled
    ) && !token_expired(status)
}

/// Whether etcd refused a request because its auth token expired (etcd reports it as
/// `Unauthenticated`, some proxies as `InvalidArgument` with this text).
fn token_expired(status: &Status) -> bool {
    status.code() == Code::Unauthenticated || status.message().contains("invalid auth token")
}

impl EtcdClient {
    /// A client for `config`'s endpoints. Connections are made on first use; with a
    /// username, the first token is fetched here.
    pub(crate) async fn connect(config: &EtcdConfig) -> Result<Self> {
        let tls = config.client_tls()?;
        let mut members = Vec::new();
        for url in config.endpoint_urls() {
            let mut endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| Error::invalid(format!("endpoint {url}: {e}")))?
                .connect_timeout(config.get_connect_timeout())
                .http2_keep_alive_interval(HTTP2_PING_INTERVAL)
                .keep_alive_timeout(config.get_request_timeout())
                .keep_alive_while_idle(false);
            if let Some(tls) = &tls {
                endpoint = endpoint
                    .tls_config(tls.clone())
                    .map_err(|e| Error::invalid(format!("endpoint {url}: TLS: {e}")))?;
            }
            members.push(endpoint.connect_lazy());
        }
        // Spread clients over the members: start at one picked by this process.
        let first =
            (std::process::id() as usize).wrapping_add(members.len() / 2) % members.len().max(1);
        let client = EtcdClient {
            member_timeout: MEMBER_TIMEOUT
                .min(config.get_request_timeout() / members.len().max(1) as u32),
            members: members.into(),
            preferred: Arc::new(AtomicUsize::new(first)),
            sent: Arc::default(),
            unary: Arc::default(),
            auth: config.username().map(|name| {
                Arc::new(Auth {
                    name: name.to_string(),
                    password: config.password().unwrap_or_default().to_string(),
                    token: RwLock::new(None),
                })
            }),
        };
        Ok(client)
    }

    /// Send later requests to `member` (it answered first).
    fn prefer(&self, member: usize) {
        self.preferred.store(member, Ordering::SeqCst);
    }

    /// Send later requests to another member than `member` (it did not answer).
    pub(crate) fn avoid(&self, member: usize) {
        let next = (member + 1) % self.members.len().max(1);
        let _ = self
            .preferred
            .compare_exchange(member, next, Ordering::SeqCst, Ordering::SeqCst);
        if self.members.len() > 1 {
            tracing::debug!(
                member,
                next,
                "etcd member did not answer; using the next one"
            );
        }
    }

    /// Run `call` on the preferred member; when that member fails, or gives no answer
    /// within `limit`, on the next one as well, until every member was tried once. The
    /// first answer wins and its member becomes the preferred one.
    ///
    /// A member that is slow is not given up: its call keeps running beside the next
    /// member's (a hedged request). A follower forwarding a keep-alive while the cluster
    /// elects a new raft leader answers as soon as there is one; dropping its call
    /// at the member timeout would throw that answer away and start over on a member
    /// that waits for the same election. With one member there is no per-member limit
    /// (the caller's timeout applies).
    async fn on_members<T, F, Fut>(
        &self,
        limit: Duration,
        mut call: F,
    ) -> std::result::Result<T, Status>
    where
        F: FnMut(usize) -> Fut,
        Fut: Future<Output = std::result::Result<T, Status>>,
    {
        let n = self.members.len();
        if n <= 1 {
            return call(0).await;
        }
        let start = self.preferred.load(Ordering::SeqCst) % n;
        let mut running = FuturesUnordered::new();
        let mut launch = |k: usize| {
            let member = (start + k) % n;
            call(member).map(move |answer| (member, answer))
        };
        running.push(launch(0));
        let mut started = 1;
        let timer = tokio::time::sleep(limit);
        tokio::pin!(timer);
        loop {
            tokio::select! {
                Some((member, answer)) = running.next() => match answer {
                    Ok(answer) => {
                        self.prefer(member);
                        return Ok(answer);
                    }
                    Err(status) if member_failed(&status) => {
                        self.avoid(member);
                        if started < n {
                            running.push(launch(started));
                            started += 1;
                            timer.as_mut().reset(tokio::time::Instant::now() + limit);
                        } else if running.is_empty() {
                            return Err(status);
                        }
                    }
                    Err(status) => return Err(status),
                },
                () = &mut timer, if started < n => {
                    let slow = (start + started - 1) % n;
                    tracing::debug!(
                        member = slow,
                        ?limit,
                        "etcd member gave no answer in time; asking the next one as well"
                    );
                    self.avoid(slow);
                    running.push(launch(started));
                    started += 1;
                    timer.as_mut().reset(tokio::time::Instant::now() + limit);
                }
            }
        }
    }

    /// Fetch a new auth token (when a username is configured).
    pub(crate) async fn authenticate(&self) -> std::result::Result<(), Status> {
        let Some(auth) = &self.auth else {
            return Ok(());
        };
        let request = proto::AuthenticateRequest {
            name: auth.name.clone(),
            password: auth.password.clone(),
        };
        let answer = self
            .on_members(self.member_timeout, |member| {
                self.unary_once(member, tonic::Request::new(request.clone()))
            })
            .await?;
        let token = MetadataValue::try_from(answer.token.as_str())
            .map_err(|_| Status::internal("etcd sent an auth token that is not ASCII"))?;
        *auth.token.write().unwrap_or_else(|p| p.into_inner()) = Some(token);
        Ok(())
    }

    /// `request` with the current auth token attached.
    fn request<Q>(&self, message: Q) -> tonic::Request<Q> {
        let mut request = tonic::Request::new(message);
        if let Some(auth) = &self.auth {
            let token = auth.token.read().unwrap_or_else(|p| p.into_inner()).clone();
            if let Some(token) = token {
                request.metadata_mut().insert(TOKEN_KEY, token);
            }
        }
        request
    }

    fn grpc(&self, member: usize) -> tonic::client::Grpc<Channel> {
        let channel = self.members[member % self.members.len()].clone();
        tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_ANSWER_BYTES)
    }

    async fn unary_once<Q: Unary>(
        &self,
        member: usize,
        request: tonic::Request<Q>,
    ) -> std::result::Result<Q::Answer, Status> {
        let mut grpc = self.grpc(member);
        grpc.ready()
            .await
            .map_err(|e| Status::from_error(Box::new(e)))?;
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.unary.fetch_add(1, Ordering::Relaxed);
        let codec = tonic_prost::ProstCodec::<Q, Q::Answer>::default();
        let answer = grpc
            .unary(request, PathAndQuery::from_static(Q::PATH), codec)
            .await?;
        Ok(answer.into_inner())
    }

    /// [`on_members`](Self::on_members); when the auth token expired, a new one is
    /// fetched and `call` made once more.
    async fn authed<T, F, Fut>(
        &self,
        limit: Duration,
        mut call: F,
    ) -> std::result::Result<T, Status>
    where
        F: FnMut(usize) -> Fut,
        Fut: Future<Output = std::result::Result<T, Status>>,
    {
        match self.on_members(limit, &mut call).await {
            Err(status) if self.auth.is_some() && token_expired(&status) => {
                self.authenticate().await?;
                self.on_members(limit, call).await
            }
            other => other,
        }
    }

    /// One unary call, on the members in turn (see [`authed`](Self::authed)).
    pub(crate) async fn call<Q: Unary>(
        &self,
        message: Q,
    ) -> std::result::Result<Q::Answer, Status> {
        let once = |member| self.unary_once(member, self.request(message.clone()));
        self.authed(self.member_timeout, once).await
    }

    async fn duplex_once<Q, A>(
        &self,
        member: usize,
        path: &'static str,
        first: Q,
    ) -> std::result::Result<Duplex<Q, A>, Status>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let (requests, outgoing) = mpsc::unbounded();
        requests
            .unbounded_send(first)
            .map_err(|_| Status::internal("request channel closed at once"))?;
        let mut grpc = self.grpc(member);
        grpc.ready()
            .await
            .map_err(|e| Status::from_error(Box::new(e)))?;
        self.sent.fetch_add(1, Ordering::Relaxed);
        let codec = tonic_prost::ProstCodec::<Q, A>::default();
        let answers = grpc
            .streaming(
                self.request(outgoing),
                PathAndQuery::from_static(path),
                codec,
            )
            .await?
            .into_inner();
        Ok(Duplex {
            requests,
            answers,
            member,
            sent: self.sent.clone(),
        })
    }

    /// Renew the leases `ids` (at least one): their keep-alives on `existing` (the
    /// stream of the last renewal) when it is open to the preferred member, else on a
    /// new stream, sent to the members in turn with `limit` for each (see
    /// [`on_members`](Self::on_members)). Gives the stream the answers came on, for the
    /// next renewal, and each lease's remaining TTL in seconds (0 or less: gone).
    pub(crate) async fn keep_alive(
        &self,
        ids: &[i64],
        mut existing: Option<KeepAliveStream>,
        limit: Duration,
    ) -> std::result::Result<(KeepAliveStream, Vec<i64>), Status> {
        let Some((&first, rest)) = ids.split_first() else {
            return Err(Status::invalid_argument("no lease to keep alive"));
        };
        let once = |member: usize| {
            let reuse = existing.take().filter(|stream| stream.member == member);
            async move {
                let first = proto::LeaseKeepAliveRequest { id: first };
                let mut stream = match reuse {
                    Some(stream) if stream.send(first.clone()).is_ok() => stream,
                    // Opening a stream sends its first keep-alive.
                    _ => {
                        self.duplex_once(member, proto::LEASE_KEEP_ALIVE, first)
                            .await?
                    }
                };
                for id in rest {
                    stream.send(proto::LeaseKeepAliveRequest { id: *id })?;
                }
                // etcd answers each keep-alive in turn, naming its lease.
                let mut ttls = vec![None; ids.len()];
                while ttls.iter().any(Option::is_none) {
                    let Some(answer) = stream.message().await? else {
                        return Err(Status::unavailable("etcd ended the keep-alive stream"));
                    };
                    let open = ids
                        .iter()
                        .zip(&ttls)
                        .position(|(id, ttl)| *id == answer.id && ttl.is_none());
                    if let Some(i) = open {
                        ttls[i] = Some(answer.ttl);
                    }
                }
                Ok((
                    stream,
                    ttls.into_iter().map(Option::unwrap_or_default).collect(),
                ))
            }
        };
        self.authed(limit, once).await
    }

    /// Open a watch stream with its first watch, on the members in turn.
    pub(crate) async fn watch(
        &self,
        create: proto::WatchCreateRequest,
    ) -> std::result::Result<WatchStream, Status> {
        let first = watch_create(create);
        let once = |member| self.duplex_once(member, proto::WATCH, first.clone());
        self.authed(self.member_timeout, once).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{sleep, Instant};
    use tonic::Status;

    use super::EtcdClient;
    use crate::config::EtcdConfig;

    /// A client for three members nobody listens on (connections are lazy, and the
    /// calls below never touch them).
    async fn three_members() -> EtcdClient {
        let config = EtcdConfig::new(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]);
        match EtcdClient::connect(&config).await {
            Ok(client) => client,
            Err(e) => panic!("client: {e}"),
        }
    }

    const LIMIT: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn a_slow_member_goes_on_beside_the_next_and_its_answer_counts() {
        let client = three_members().await;
        client.prefer(0);
        let started = Instant::now();
        let answer = client
            .on_members(LIMIT, |member| async move {
                if member == 0 {
                    // Slower than the member limit, but it answers (a follower waiting
                    // for a new raft leader).
                    sleep(Duration::from_millis(1500)).await;
                    Ok(member)
                } else {
                    // Paused members: no answer ever.
                    std::future::pending().await
                }
            })
            .await;
        assert_eq!(answer.ok(), Some(0));
        assert_eq!(started.elapsed(), Duration::from_millis(1500));
        assert_eq!(client.preferred.load(super::Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_answer_wins_and_its_member_is_preferred() {
        let client = three_members().await;
        client.prefer(0);
        let started = Instant::now();
        let answer = client
            .on_members(LIMIT, |member| async move {
                match member {
                    0 => std::future::pending().await,
                    _ => {
                        sleep(Duration::from_millis(100)).await;
                        Ok(member)
                    }
                }
            })
            .await;
        // Member 0 is given its limit, then member 1 answers 100 ms later.
        assert_eq!(answer.ok(), Some(1));
        assert_eq!(started.elapsed(), Duration::from_millis(1100));
        assert_eq!(client.preferred.load(super::Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_moves_on_at_once_and_the_last_refusal_is_the_error() {
        let client = three_members().await;
        client.prefer(2);
        let started = Instant::now();
        let mut asked = Vec::new();
        let answer: Result<usize, Status> = client
            .on_members(LIMIT, |member| {
                asked.push(member);
                async move { Err(Status::unavailable(format!("member {member} down"))) }
            })
            .await;
        assert_eq!(asked, vec![2, 0, 1]);
        assert_eq!(started.elapsed(), Duration::ZERO);
        let status = answer.err().map(|s| s.message().to_string());
        assert_eq!(status.as_deref(), Some("member 1 down"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_error_is_not_sent_to_other_members() {
        let client = three_members().await;
        client.prefer(0);
        let mut asked = Vec::new();
        let answer: Result<usize, Status> = client
            .on_members(LIMIT, |member| {
                asked.push(member);
                async move { Err(Status::invalid_argument("bad request")) }
            })
            .await;
        assert_eq!(asked, vec![0]);
        assert!(answer.is_err());
    }
}
