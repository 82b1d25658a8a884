//! Metric names and recording, through the `metrics` facade. Install any `metrics`
//! recorder (e.g. the Prometheus exporter the CLI offers) to collect them.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `tenure_leader` | gauge | `backend`, `election` | 1 while this process leads the election, else 0 |
//! | `tenure_leadership_transitions_total` | counter | `backend`, `election`, `transition` (`elected`, `stepping_down`, `lost`, `resigned`) | leadership changes of this process |
//! | `tenure_renew_latency_seconds` | histogram | `backend` | round trip of one session renewal |
//! | `tenure_deadline_remaining_seconds` | gauge | `backend` | time left until the local deadline, right after a renewal |
//! | `tenure_campaign_duration_seconds` | histogram | `backend` | from campaign start to grant |

use std::time::Duration;

use crate::name::ElectionName;

/// Gauge: 1 while this process leads the election.
pub const LEADER: &str = "tenure_leader";
/// Counter: leadership transitions.
pub const TRANSITIONS: &str = "tenure_leadership_transitions_total";
/// Histogram: renewal round trip in seconds.
pub const RENEW_LATENCY: &str = "tenure_renew_latency_seconds";
/// Gauge: seconds until the local deadline after a renewal.
pub const DEADLINE_REMAINING: &str = "tenure_deadline_remaining_seconds";
/// Histogram: campaign duration in seconds.
pub const CAMPAIGN_DURATION: &str = "tenure_campaign_duration_seconds";

pub(crate) fn elected(backend: &'static str, election: &ElectionName) {
    let e = election.as_str().to_string();
    metrics::gauge!(LEADER, "backend" => backend, "election" => e.clone()).set(1.0);
    metrics::counter!(TRANSITIONS, "backend" => backend, "election" => e, "transition" => "elected")
        .increment(1);
}

pub(crate) fn leadership_ended(
    backend: &'static str,
    election: &ElectionName,
    transition: &'static str,
) {
    let e = election.as_str().to_string();
    metrics::gauge!(LEADER, "backend" => backend, "election" => e.clone()).set(0.0);
    metrics::counter!(TRANSITIONS, "backend" => backend, "election" => e, "transition" => transition)
        .increment(1);
}

pub(crate) fn stepping_down(backend: &'static str, election: &ElectionName) {
    let e = election.as_str().to_string();
    metrics::counter!(TRANSITIONS, "backend" => backend, "election" => e, "transition" => "stepping_down")
        .increment(1);
}

pub(crate) fn renewed(backend: &'static str, took: Duration, remaining: Duration) {
    metrics::histogram!(RENEW_LATENCY, "backend" => backend).record(took.as_secs_f64());
    metrics::gauge!(DEADLINE_REMAINING, "backend" => backend).set(remaining.as_secs_f64());
}

pub(crate) fn campaign_finished(backend: &'static str, took: Duration) {
    metrics::histogram!(CAMPAIGN_DURATION, "backend" => backend).record(took.as_secs_f64());
}
