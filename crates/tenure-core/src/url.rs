//! Choosing a backend from a URL.

use std::sync::Arc;

pub use crate::backend::config::split_scheme;
use crate::backend::DynBackend;
use crate::error::{Error, Result};
use crate::memory::{MemoryBackend, MEM_SCHEME};

/// Open the backend named by `url`. The core knows only `mem://`; the `tenure` facade's
/// `connect` adds every backend enabled by cargo features.
pub async fn connect(url: &str) -> Result<DynBackend> {
    let (scheme, _) = split_scheme(url)?;
    if scheme == MEM_SCHEME {
        return Ok(Arc::new(MemoryBackend::from_url(url)?));
    }
    Err(Error::invalid(format!(
        "backend url {url:?}: unknown scheme {scheme:?} (known here: mem)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[tokio::test]
    async fn urls() {
        assert_eq!(connect("mem://").await.unwrap().scheme(), "mem");
        assert_eq!(connect("MEM://shared-1").await.unwrap().scheme(), "mem");
        for bad in [
            "",
            "mem",
            "://x",
            "mem:/x",
            "zz://x",
            "mem://a b",
            "m m://x",
        ] {
            let e = connect(bad).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}");
            assert!(e.message().contains("url"), "{e}");
        }
    }
}
