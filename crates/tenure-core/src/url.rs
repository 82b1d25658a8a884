//! Choosing a backend from a URL.

use std::sync::Arc;

use crate::backend::{Driver, DynBackend};
use crate::error::Result;
use crate::memory::{MemoryBackend, MEM_SCHEME};

/// Open the backend named by `url`. The core knows only `mem://`; the `tenure` facade's
/// `connect` adds every backend enabled by cargo features.
pub async fn connect(url: &str) -> Result<DynBackend> {
    crate::backend::connect_with(&[MEM_DRIVER], url).await
}

/// The in-memory backend's [`Driver`](crate::backend::Driver).
pub const MEM_DRIVER: Driver = Driver::new(&[MEM_SCHEME], |url| {
    Box::pin(async move { Ok(Arc::new(MemoryBackend::from_url(url)?) as DynBackend) })
});

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
