//! A small etcd v3 client over tonic: the calls of [`crate::proto`] on one channel
//! balanced over every endpoint, TLS, and user/password authentication whose token is
//! fetched again when etcd says it expired.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::channel::mpsc;
use tenure_core::{Error, Result};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status, Streaming};

use crate::config::EtcdConfig;
use crate::proto::{self, path};

/// How often the client pings an idle HTTP/2 connection. etcd refuses pings more often
/// than every 5 s (`--grpc-keepalive-min-time`), so stay above that.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(10);

/// The largest answer accepted (a page of 64 members of up to 128 KiB, a batch of
/// watch events); tonic's default of 4 MiB is too small for those.
const MAX_ANSWER_BYTES: usize = 128 * 1024 * 1024;

/// The gRPC metadata key etcd reads the auth token from.
const TOKEN_KEY: &str = "token";

/// The connection to an etcd cluster. Cheap to clone: clones share the channel and the
/// auth token.
#[derive(Clone)]
pub(crate) struct EtcdClient {
    channel: Channel,
    auth: Option<Arc<Auth>>,
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
}

/// A watch stream (`Watch/Watch`).
pub(crate) type WatchStream = Duplex<proto::WatchRequest, proto::WatchResponse>;

/// A lease keep-alive stream (`Lease/LeaseKeepAlive`).
pub(crate) type KeepAliveStream =
    Duplex<proto::LeaseKeepAliveRequest, proto::LeaseKeepAliveResponse>;

impl<Q, A> Duplex<Q, A> {
    /// Send one more request on the stream.
    pub(crate) fn send(&self, request: Q) -> std::result::Result<(), Status> {
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

/// Whether etcd refused a request because its auth token expired (etcd reports it as
/// `Unauthenticated`, some proxies as `InvalidArgument` with this text).
fn token_expired(status: &Status) -> bool {
    status.code() == Code::Unauthenticated || status.message().contains("invalid auth token")
}

impl EtcdClient {
    /// A client for `config`'s endpoints. Connections are made on first use; with a
    /// username, the first token is fetched here.
    pub(crate) async fn connect(config: &EtcdConfig) -> Result<Self> {
        let tls = tls_config(config)?;
        let mut endpoints = Vec::new();
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
            endpoints.push(endpoint);
        }
        let client = EtcdClient {
            channel: Channel::balance_list(endpoints.into_iter()),
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

    /// Fetch a new auth token (when a username is configured).
    pub(crate) async fn authenticate(&self) -> std::result::Result<(), Status> {
        let Some(auth) = &self.auth else {
            return Ok(());
        };
        let request = proto::AuthenticateRequest {
            name: auth.name.clone(),
            password: auth.password.clone(),
        };
        let answer: proto::AuthenticateResponse = self
            .unary_once(path::AUTHENTICATE, tonic::Request::new(request))
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

    fn grpc(&self) -> tonic::client::Grpc<Channel> {
        tonic::client::Grpc::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER_BYTES)
    }

    async fn unary_once<Q, A>(
        &self,
        path: &'static str,
        request: tonic::Request<Q>,
    ) -> std::result::Result<A, Status>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = self.grpc();
        grpc.ready()
            .await
            .map_err(|e| Status::from_error(Box::new(e)))?;
        let codec = tonic_prost::ProstCodec::<Q, A>::default();
        let answer = grpc
            .unary(request, PathAndQuery::from_static(path), codec)
            .await?;
        Ok(answer.into_inner())
    }

    /// One unary call; when the auth token expired, a new one is fetched and the call
    /// made once more.
    async fn unary<Q, A>(&self, path: &'static str, message: Q) -> std::result::Result<A, Status>
    where
        Q: prost::Message + Clone + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        match self.unary_once(path, self.request(message.clone())).await {
            Err(status) if self.auth.is_some() && token_expired(&status) => {
                self.authenticate().await?;
                self.unary_once(path, self.request(message)).await
            }
            other => other,
        }
    }

    async fn duplex_once<Q, A>(
        &self,
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
        let mut grpc = self.grpc();
        grpc.ready()
            .await
            .map_err(|e| Status::from_error(Box::new(e)))?;
        let codec = tonic_prost::ProstCodec::<Q, A>::default();
        let answers = grpc
            .streaming(
                self.request(outgoing),
                PathAndQuery::from_static(path),
                codec,
            )
            .await?
            .into_inner();
        Ok(Duplex { requests, answers })
    }

    /// Open a bidirectional stream whose first request is `first`.
    async fn duplex<Q, A>(
        &self,
        path: &'static str,
        first: Q,
    ) -> std::result::Result<Duplex<Q, A>, Status>
    where
        Q: prost::Message + Clone + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        match self.duplex_once(path, first.clone()).await {
            Err(status) if self.auth.is_some() && token_expired(&status) => {
                self.authenticate().await?;
                self.duplex_once(path, first).await
            }
            other => other,
        }
    }

    /// `KV/Range`.
    pub(crate) async fn range(
        &self,
        request: proto::RangeRequest,
    ) -> std::result::Result<proto::RangeResponse, Status> {
        self.unary(path::RANGE, request).await
    }

    /// `KV/Put`.
    pub(crate) async fn put(
        &self,
        request: proto::PutRequest,
    ) -> std::result::Result<proto::PutResponse, Status> {
        self.unary(path::PUT, request).await
    }

    /// `KV/DeleteRange`.
    pub(crate) async fn delete_range(
        &self,
        request: proto::DeleteRangeRequest,
    ) -> std::result::Result<proto::DeleteRangeResponse, Status> {
        self.unary(path::DELETE_RANGE, request).await
    }

    /// `KV/Txn`.
    pub(crate) async fn txn(
        &self,
        request: proto::TxnRequest,
    ) -> std::result::Result<proto::TxnResponse, Status> {
        self.unary(path::TXN, request).await
    }

    /// `Lease/LeaseGrant`.
    pub(crate) async fn lease_grant(
        &self,
        ttl: i64,
    ) -> std::result::Result<proto::LeaseGrantResponse, Status> {
        self.unary(path::LEASE_GRANT, proto::LeaseGrantRequest { ttl, id: 0 })
            .await
    }

    /// `Lease/LeaseRevoke`.
    pub(crate) async fn lease_revoke(
        &self,
        id: i64,
    ) -> std::result::Result<proto::LeaseRevokeResponse, Status> {
        self.unary(path::LEASE_REVOKE, proto::LeaseRevokeRequest { id })
            .await
    }

    /// Open a keep-alive stream for lease `id`; its first keep-alive is sent at once and
    /// its answer is the stream's first message.
    pub(crate) async fn keep_alive(&self, id: i64) -> std::result::Result<KeepAliveStream, Status> {
        self.duplex(path::LEASE_KEEP_ALIVE, proto::LeaseKeepAliveRequest { id })
            .await
    }

    /// Open a watch stream with its first watch.
    pub(crate) async fn watch(
        &self,
        create: proto::WatchCreateRequest,
    ) -> std::result::Result<WatchStream, Status> {
        self.duplex(path::WATCH, watch_create(create)).await
    }
}

fn tls_config(config: &EtcdConfig) -> Result<Option<ClientTlsConfig>> {
    if !config.is_tls() {
        return Ok(None);
    }
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| Error::invalid(format!("{what}: cannot read {}: {e}", path.display())))
    };
    let mut tls = ClientTlsConfig::new();
    let (ca, identity) = config.tls_files();
    if let Some(ca) = ca {
        tls = tls.ca_certificate(Certificate::from_pem(read("ca", ca)?));
    }
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(read("cert", cert)?, read("key", key)?));
    }
    if let Some(domain) = config.tls_domain() {
        tls = tls.domain_name(domain);
    }
    Ok(Some(tls))
}
