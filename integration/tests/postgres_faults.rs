//! The shared fault scenarios (`fault_suite`) against a real PostgreSQL, a restart
//! longer than the TTL included, plus wrong passwords.

use std::time::Duration;

use tenure_integration::fault_suite::{self, FaultSpec, Restart, TIMEOUTS};
use tenure_integration::PostgresServer;

/// The candidates' session TTL.
const TTL: Duration = Duration::from_secs(2);

/// How candidates reach PostgreSQL at `endpoint`: 1 s timeouts, tables in a schema
/// named after `prefix`.
fn spec_in(endpoint: &str, prefix: &str) -> FaultSpec {
    let schema: String = prefix
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() {
            true => c.to_ascii_lowercase(),
            false => '_',
        })
        .collect();
    let url = tenure_integration::with_query(endpoint, &format!("schema=s{schema}&{TIMEOUTS}"));
    FaultSpec::new(url, TTL, Duration::from_millis(300))
}

tenure_integration::fault_tests!(PostgresServer::start(), spec_in, restart: Restart::DownPastTheTtl);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_unauthorized() {
    let pg = PostgresServer::start().await.expect("postgres");
    pg.require_local("it sets a password");
    let password = "right-Pa55word";
    pg.require_password("app", password)
        .await
        .expect("password");
    let host = pg.addr();
    let db = PostgresServer::DATABASE;
    let at = |url: String| FaultSpec::new(url, TTL, Duration::from_secs(1));
    fault_suite::wrong_credentials(
        &[
            at(format!("postgres://app:wrong-pw@{host}/{db}")),
            at(format!("postgres://app@{host}/{db}")),
            at(format!("postgres://nobody:wrong-pw@{host}/{db}")),
        ],
        &at(format!("postgres://app:{password}@{host}/{db}")),
        "wrong-pw",
    )
    .await;
}
