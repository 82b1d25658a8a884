//! Authorisation policies for the `azure_core` pipeline: shared-key signing (what Azurite
//! and account keys need; the official client offers only Entra ID) and shared access
//! signatures. Neither prints its secret.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use azure_core::credentials::Secret;
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{Context, Request};
use azure_core::time::{to_rfc7231, OffsetDateTime};

/// Signs every request (each try) with the account's shared key:
/// `Authorization: SharedKey <account>:<base64 HMAC-SHA256(key, string-to-sign)>`, the
/// string to sign built as the Blob service's shared-key scheme prescribes (version
/// 2009-09-19 and later), with a fresh `x-ms-date`.
pub(crate) struct SharedKeyPolicy {
    account: String,
    key: Secret,
}

impl fmt::Debug for SharedKeyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedKeyPolicy")
            .field("account", &self.account)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl SharedKeyPolicy {
    pub(crate) fn new(account: &str, key: &str) -> Self {
        SharedKeyPolicy {
            account: account.to_string(),
            key: Secret::new(key.to_string()),
        }
    }
}

impl Authorize for SharedKeyPolicy {
    const NAME: &'static str = "shared-key policy";

    fn authorize(&self, request: &mut Request) -> azure_core::Result<()> {
        request.insert_header("x-ms-date", to_rfc7231(&OffsetDateTime::now_utc()));
        let to_sign = string_to_sign(&self.account, request);
        let signature = azure_core::hmac::hmac_sha256(&to_sign, &self.key)?;
        request.insert_header(
            "authorization",
            format!("SharedKey {}:{signature}", self.account),
        );
        Ok(())
    }
}

/// The standard headers of the string to sign, in order (after the verb).
const SIGNED_HEADERS: [&str; 11] = [
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
];

/// The string to sign for `request` (which must already carry `x-ms-date`) of `account`.
pub(crate) fn string_to_sign(account: &str, request: &Request) -> String {
    let headers = request.headers();
    let mut lower: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers.iter() {
        lower.insert(
            name.as_str().to_ascii_lowercase(),
            value.as_str().trim().to_string(),
        );
    }
    let mut out = String::new();
    out.push_str(request.method().as_ref());
    out.push('\n');
    for h in SIGNED_HEADERS {
        let value = match h {
            "content-length" => {
                let n = lower
                    .get(h)
                    .cloned()
                    .or_else(|| request.body().len().map(|n| n.to_string()))
                    .unwrap_or_default();
                // Since version 2015-02-21 a zero length is signed as empty.
                if n == "0" {
                    String::new()
                } else {
                    n
                }
            }
            _ => lower.get(h).cloned().unwrap_or_default(),
        };
        out.push_str(&value);
        out.push('\n');
    }
    for (name, value) in lower.iter().filter(|(n, _)| n.starts_with("x-ms-")) {
        out.push_str(name);
        out.push(':');
        out.push_str(value);
        out.push('\n');
    }
    // Canonicalised resource: /account/path, then each query parameter (names
    // lowercase, sorted; values decoded, several joined by commas).
    let url = request.url();
    out.push('/');
    out.push_str(account);
    out.push_str(url.path());
    let mut params: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in url.query_pairs() {
        params
            .entry(k.to_ascii_lowercase())
            .or_default()
            .push(v.into_owned());
    }
    for (k, mut vs) in params {
        vs.sort();
        out.push('\n');
        out.push_str(&k);
        out.push(':');
        out.push_str(&vs.join(","));
    }
    out
}

/// Appends a shared access signature to every request's query.
pub(crate) struct SasPolicy {
    pairs: Vec<(String, String)>,
}

impl fmt::Debug for SasPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SasPolicy")
            .field("sas", &"<redacted>")
            .finish()
    }
}

impl SasPolicy {
    pub(crate) fn new(sas: &str) -> Self {
        let sas = sas.trim().trim_start_matches('?');
        let pairs = url::form_urlencoded::parse(sas.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        SasPolicy { pairs }
    }
}

impl Authorize for SasPolicy {
    const NAME: &'static str = "SAS policy";

    fn authorize(&self, request: &mut Request) -> azure_core::Result<()> {
        let url = request.url_mut();
        let present: Vec<String> = url.query_pairs().map(|(k, _)| k.into_owned()).collect();
        let mut q = url.query_pairs_mut();
        for (k, v) in &self.pairs {
            if !present.contains(k) {
                q.append_pair(k, v);
            }
        }
        Ok(())
    }
}

/// What an authorisation policy does to a request (each try) before the pipeline
/// sends it on.
pub(crate) trait Authorize: fmt::Debug + Send + Sync + 'static {
    /// The policy's name in errors.
    const NAME: &'static str;

    /// Sign or otherwise authorise `request`.
    fn authorize(&self, request: &mut Request) -> azure_core::Result<()>;
}

/// The pipeline policy of an [`Authorize`]: authorise each request, then hand it to
/// the first of the next policies (the transport comes last; a policy with nothing
/// after it is a pipeline built wrong).
#[derive(Debug)]
struct Authorizing<A>(A);

/// `authorize` as a policy for the pipeline's per-try policies.
pub(crate) fn policy(authorize: impl Authorize) -> Arc<dyn Policy> {
    Arc::new(Authorizing(authorize))
}

#[async_trait]
impl<A: Authorize> Policy for Authorizing<A> {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        self.0.authorize(request)?;
        match next.split_first() {
            Some((first, rest)) => first.send(ctx, request, rest).await,
            None => Err(azure_core::Error::with_message(
                azure_core::error::ErrorKind::Other,
                format!("{}: no transport after it", A::NAME),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use azure_core::http::{Method, Url};

    #[test]
    fn string_to_sign_follows_the_shared_key_scheme() {
        let url = Url::parse(
            "http://127.0.0.1:10000/devstoreaccount1/c1/e/a%20b?comp=lease&timeout=5&Include=b&include=a",
        )
        .unwrap();
        let mut r = Request::new(url, Method::Put);
        r.insert_header("x-ms-date", "Fri, 20 Nov 2026 10:00:00 GMT");
        r.insert_header("x-ms-version", "2025-11-05");
        r.insert_header("x-ms-lease-action", "acquire");
        r.insert_header("if-match", "\"0x1\"");
        r.insert_header("content-length", "0");
        let s = string_to_sign("devstoreaccount1", &r);
        assert_eq!(
            s,
            "PUT\n\n\n\n\n\n\n\n\"0x1\"\n\n\n\n\
             x-ms-date:Fri, 20 Nov 2026 10:00:00 GMT\n\
             x-ms-lease-action:acquire\n\
             x-ms-version:2025-11-05\n\
             /devstoreaccount1/devstoreaccount1/c1/e/a%20b\n\
             comp:lease\ninclude:a,b\ntimeout:5"
        );
    }

    #[test]
    fn policies_redact_their_secrets() {
        let p = SharedKeyPolicy::new("acct", "c2VjcmV0");
        assert!(!format!("{p:?}").contains("c2VjcmV0"));
        let p = SasPolicy::new("?sv=1&sig=S3CRET");
        assert!(!format!("{p:?}").contains("S3CRET"));
        assert_eq!(p.pairs.len(), 2);
    }
}
