//! What the examples share: where the store is.

/// The backend URL: the first argument, else `TENURE_BACKEND`, else `mem://` (this
/// process only, no server).
pub fn backend_url() -> String {
    std::env::args()
        .nth(1)
        .or_else(|| std::env::var("TENURE_BACKEND").ok())
        .unwrap_or_else(|| "mem://".to_string())
}
