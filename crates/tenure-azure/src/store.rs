//! Thin, bounded calls on blobs: every request has the request timeout, every failure is
//! classified once ([`Failure`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use azure_core::http::{
    ClientOptions, Etag, NoFormat, RequestContent, RetryOptions, Transport, Url,
};
use azure_core::Bytes;
use azure_storage_blob::models::{
    BlobClientDeleteOptions, BlobClientGetPropertiesResultHeaders,
    BlobContainerClientListBlobsOptions, BlockBlobClientUploadOptions, ListBlobsIncludeItem,
};
use azure_storage_blob::{BlobClient, BlobContainerClient, BlobContainerClientOptions};
use futures::TryStreamExt;
use tenure_core::backend::{Purpose, Requests};
use tenure_core::{Error, ErrorKind, Result};

use crate::auth::{policy, SasPolicy, SharedKeyPolicy};
use crate::config::{AzureConfig, Credential, EntraSource};
use crate::error::{classify, Cause, ErrorKindAndText, Failure, TAG};

/// The REST API version sent with every request: the newest that Azurite 3.35 accepts
/// without `--skipApiVersionCheck`, and one Azure serves.
pub(crate) const API_VERSION: &str = "2025-11-05";

pub(crate) type Res<T> = std::result::Result<T, Failure>;

/// A blob's etag and metadata, as `get properties` reports them.
#[derive(Debug, Clone)]
pub(crate) struct Props {
    pub(crate) etag: String,
    pub(crate) metadata: HashMap<String, String>,
}

/// What a write of a blob is conditional on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum When<'a> {
    /// Nothing: it replaces whatever is there.
    Always,
    /// That no blob of the name exists (`If-None-Match: *`).
    Absent,
    /// That the blob still has this etag (`If-Match`).
    Is(&'a str),
}

/// One listed blob.
#[derive(Debug, Clone)]
pub(crate) struct Listed {
    pub(crate) name: String,
    pub(crate) etag: String,
    /// Only when listed with metadata.
    pub(crate) metadata: HashMap<String, String>,
}

/// How long an idle connection is kept for the next request. Servers close idle
/// kept-alive connections (Azurite after 5 s, as Node does), and a request sent on one
/// as it closes fails with "connection reset by peer": the client lets go first. (The
/// default client keeps them 90 s; a member stream polling every few seconds met the
/// reset in a conformance run.)
const IDLE_CONNECTIONS: std::time::Duration = std::time::Duration::from_secs(4);

/// The HTTP client: azure_core's defaults (no redirects), this config's connect
/// timeout, and idle connections dropped after [`IDLE_CONNECTIONS`].
fn http_client(config: &AzureConfig) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(config.get_connect_timeout())
        .pool_idle_timeout(IDLE_CONNECTIONS)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| {
            TAG.own(ErrorKind::Unavailable, "HTTP client")
                .with_source(Cause(e.to_string()))
        })
}

/// The container and the counters every request goes through.
pub(crate) struct Store {
    container: BlobContainerClient,
    /// The container's URL, named in every failure.
    url: String,
    pub(crate) config: AzureConfig,
    /// The request layer's count and timeout. The failure stays a [`Failure`] until
    /// the caller has matched its service code, so errors are made by the callers.
    pub(crate) requests: Requests<azure_core::Error>,
}

impl Store {
    pub(crate) fn new(config: AzureConfig) -> Result<Arc<Self>> {
        let endpoint = config.blob_endpoint();
        let url = Url::parse(&format!("{endpoint}/{}", config.container()))
            .map_err(|e| Error::invalid(format!("endpoint {endpoint:?}: {e}")))?;
        let mut client_options = ClientOptions {
            // The core retries by itself, within its deadlines.
            retry: RetryOptions::none(),
            transport: Some(Transport::new(Arc::new(http_client(&config)?))),
            ..Default::default()
        };
        let mut token = None;
        match config.credential() {
            Credential::SharedKey(key) => client_options
                .per_try_policies
                .push(policy(SharedKeyPolicy::new(config.account(), &key))),
            Credential::Sas(sas) => client_options
                .per_try_policies
                .push(policy(SasPolicy::new(&sas))),
            Credential::Token(t) => token = Some(t),
            Credential::Entra(source) => token = Some(entra(source)?),
        }
        if token.is_some() && !endpoint.starts_with("https://") {
            return Err(Error::invalid(format!(
                "endpoint {endpoint:?}: Entra ID credentials need https (use a key or SAS for http endpoints such as Azurite)"
            )));
        }
        let options = BlobContainerClientOptions {
            client_options,
            version: API_VERSION.to_string(),
        };
        let url_text = url.to_string();
        let container = BlobContainerClient::new(url, token, Some(options)).map_err(|e| {
            TAG.own(ErrorKind::InvalidArgument, "endpoint")
                .with_source(Cause(classify(&e).error.text))
                .with_endpoint(&endpoint)
        })?;
        let requests = Requests::new(
            TAG,
            url_text.clone(),
            config.get_request_timeout(),
            |what, e| classify(&e).into_error(what),
        );
        Ok(Arc::new(Store {
            container,
            url: url_text,
            config,
            requests,
        }))
    }

    /// Requests sent so far (every kind).
    pub(crate) fn requests(&self) -> u64 {
        self.requests.election_requests() + self.requests.renewals()
    }

    fn blob(&self, name: &str) -> BlobClient {
        self.container.blob_client(name)
    }

    /// Run one election request with the request timeout, counted.
    async fn call<T>(
        &self,
        fut: impl std::future::Future<Output = azure_core::Result<T>>,
    ) -> Res<T> {
        self.call_as(Purpose::Election, fut).await
    }

    /// Run one request for `purpose` with the request timeout, counted.
    async fn call_as<T>(
        &self,
        purpose: Purpose,
        fut: impl std::future::Future<Output = azure_core::Result<T>>,
    ) -> Res<T> {
        self.requests.count(purpose);
        let limit = self.requests.timeout();
        match tokio::time::timeout(limit, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(classify(&e).at(&self.url)),
            Err(_) => Err(timeout_failure(limit).at(&self.url)),
        }
    }

    /// Create the container if it is missing (an existing one is fine).
    pub(crate) async fn create_container(&self) -> Res<()> {
        match self.call(self.container.create(None)).await {
            Ok(_) => Ok(()),
            Err(f) if f.code_is("ContainerAlreadyExists") => Ok(()),
            Err(f) => Err(f),
        }
    }

    /// Whether the container exists (a cheap authorised read).
    pub(crate) async fn container_exists(&self) -> Res<bool> {
        match self.call(self.container.get_properties(None)).await {
            Ok(_) => Ok(true),
            Err(f) if f.status == Some(404) => Ok(false),
            Err(f) => Err(f),
        }
    }

    /// Write `body` (with `metadata`) to `name` if `when` holds; the etag it leaves.
    /// A condition that does not hold (or a blob that exists, for
    /// [`When::Absent`]) is `Ok(None)`.
    pub(crate) async fn put(
        &self,
        name: &str,
        body: Vec<u8>,
        metadata: HashMap<String, String>,
        when: When<'_>,
        purpose: Purpose,
    ) -> Res<Option<String>> {
        let (if_match, if_none_match) = match when {
            When::Always => (None, None),
            When::Absent => (None, Some(Etag::from("*"))),
            When::Is(etag) => (Some(Etag::from(etag.to_string())), None),
        };
        let options = BlockBlobClientUploadOptions {
            if_match,
            if_none_match,
            metadata: Some(metadata),
            ..Default::default()
        };
        let content: RequestContent<Bytes, NoFormat> = RequestContent::from(body);
        let blob = self.blob(name).block_blob_client();
        match self
            .call_as(purpose, blob.upload(content, Some(options)))
            .await
        {
            Ok(r) => Ok(Some(r.etag.map(|e| e.to_string()).unwrap_or_default())),
            Err(f) if matches!(f.status, Some(409 | 412)) => Ok(None),
            Err(f) if f.status == Some(404) && when != When::Always => Ok(None),
            Err(f) => Err(f),
        }
    }

    /// Etag and metadata of `name`; `None` if the blob does not exist.
    pub(crate) async fn properties(&self, name: &str) -> Res<Option<Props>> {
        match self.call(self.blob(name).get_properties(None)).await {
            Ok(r) => Ok(Some(Props {
                etag: r
                    .etag()
                    .ok()
                    .flatten()
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
                metadata: r.metadata().unwrap_or_default(),
            })),
            Err(f) if f.status == Some(404) => Ok(None),
            Err(f) => Err(f),
        }
    }

    /// Delete `name` (if its etag is still `etag`, when given); a missing or changed
    /// blob is fine.
    pub(crate) async fn delete(&self, name: &str, etag: Option<&str>) -> Res<()> {
        let options = BlobClientDeleteOptions {
            if_match: etag.map(|e| Etag::from(e.to_string())),
            ..Default::default()
        };
        match self.call(self.blob(name).delete(Some(options))).await {
            Ok(_) => Ok(()),
            Err(f) if matches!(f.status, Some(404 | 412)) => Ok(()),
            Err(f) => Err(f),
        }
    }

    /// The body and etag of `name`; `None` if it does not exist.
    pub(crate) async fn download(&self, name: &str) -> Res<Option<(Vec<u8>, String)>> {
        let blob = self.blob(name);
        let fut = async {
            let r = blob.download(None).await?;
            let etag = r.properties.etag.as_ref().map(|e| e.to_string());
            let bytes = r.body.collect().await?;
            Ok::<_, azure_core::Error>((bytes.to_vec(), etag.unwrap_or_default()))
        };
        match self.call(fut).await {
            Ok(b) => Ok(Some(b)),
            Err(f) if f.status == Some(404) => Ok(None),
            Err(f) => Err(f),
        }
    }

    /// Every blob whose name starts with `prefix` (all pages), with its metadata.
    pub(crate) async fn list_with_metadata(&self, prefix: &str) -> Res<Vec<Listed>> {
        self.list_blobs(prefix, true, Purpose::Election).await
    }

    async fn list_blobs(&self, prefix: &str, metadata: bool, purpose: Purpose) -> Res<Vec<Listed>> {
        let options = BlobContainerClientListBlobsOptions {
            prefix: Some(prefix.to_string()),
            include: metadata.then(|| vec![ListBlobsIncludeItem::Metadata]),
            ..Default::default()
        };
        let pager = self
            .container
            .list_blobs(Some(options))
            .map_err(|e| classify(&e).at(&self.url))?;
        let fut = async {
            let mut out = Vec::new();
            let mut pages = pager.into_pages();
            while let Some(page) = pages.try_next().await? {
                let page = page.into_model()?;
                for item in page.blob_items {
                    let Some(name) = item.name else { continue };
                    let props = item.properties.unwrap_or_default();
                    let metadata = item.metadata.and_then(|m| m.values).unwrap_or_default();
                    out.push(Listed {
                        name,
                        etag: props.etag.map(|e| e.to_string()).unwrap_or_default(),
                        metadata,
                    });
                }
            }
            Ok::<_, azure_core::Error>(out)
        };
        match self.call_as(purpose, fut).await {
            Ok(v) => Ok(v),
            Err(f) if f.status == Some(404) => Ok(Vec::new()),
            Err(f) => Err(f),
        }
    }
}

fn timeout_failure(limit: Duration) -> Failure {
    Failure {
        status: None,
        code: None,
        error: ErrorKindAndText {
            kind: ErrorKind::Timeout,
            text: format!("no answer from Azure Blob Storage within {limit:?}"),
        },
        endpoint: None,
    }
}

/// The Entra ID credential `source` names.
fn entra(source: EntraSource) -> Result<Arc<dyn azure_core::credentials::TokenCredential>> {
    let fail = |e: azure_core::Error| {
        TAG.own(ErrorKind::Unauthorized, "Entra ID credential")
            .with_source(Cause(classify(&e).error.text))
    };
    let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
    match source {
        EntraSource::ManagedIdentity => {
            let options =
                var("AZURE_CLIENT_ID").map(|id| azure_identity::ManagedIdentityCredentialOptions {
                    user_assigned_id: Some(azure_identity::UserAssignedId::ClientId(id)),
                    ..Default::default()
                });
            let c = azure_identity::ManagedIdentityCredential::new(options).map_err(fail)?;
            Ok(c)
        }
        EntraSource::DeveloperTools => {
            Ok(azure_identity::DeveloperToolsCredential::new(None).map_err(fail)?)
        }
        EntraSource::Auto => {
            match (
                var("AZURE_TENANT_ID"),
                var("AZURE_CLIENT_ID"),
                var("AZURE_CLIENT_SECRET"),
            ) {
                (Some(tenant), Some(client), Some(secret)) => {
                    let c = azure_identity::ClientSecretCredential::new(
                        &tenant,
                        client,
                        secret.into(),
                        None,
                    )
                    .map_err(fail)?;
                    Ok(c)
                }
                _ => Ok(azure_identity::DeveloperToolsCredential::new(None).map_err(fail)?),
            }
        }
    }
}
