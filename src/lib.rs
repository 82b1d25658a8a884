#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub use tenure_core::*;

/// Open the backend named by `url`, among those enabled by cargo features:
///
/// | scheme | feature | backend |
/// |---|---|---|
/// | `mem://[NAME]` | always | in-memory store of this process ([`MemoryBackend`]) |
///
/// An unknown or disabled scheme is [`ErrorKind::InvalidArgument`] naming the schemes
/// this build knows.
pub async fn connect(url: &str) -> Result<DynBackend> {
    let (scheme, _) = split_scheme(url)?;
    match scheme.as_str() {
        MEM_SCHEME => tenure_core::connect(url).await,
        other => Err(Error::invalid(format!(
            "backend url {url:?}: unknown scheme {other:?}; this build knows: {}",
            schemes().join(", ")
        ))),
    }
}

/// The URL schemes this build of tenure can [`connect`] to.
pub fn schemes() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut s = vec![MEM_SCHEME];
    s
}
