//! The metrics a session records, read back through a debugging recorder.

use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use tenure_core::{metrics as names, Candidate, ElectionName, MemoryBackend, Session, Timing};

#[derive(Debug, PartialEq)]
enum Value {
    Gauge(f64),
    Counter(u64),
    Samples(usize),
}

/// One snapshot (histograms and counters are drained by each), as (kind, name, labels, value).
fn snapshot(s: &Snapshotter) -> Vec<(MetricKind, String, Vec<String>, Value)> {
    s.snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let labels = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let value = match value {
                DebugValue::Gauge(v) => Value::Gauge(v.into_inner()),
                DebugValue::Counter(n) => Value::Counter(n),
                DebugValue::Histogram(v) => Value::Samples(v.len()),
            };
            (key.kind(), key.key().name().to_string(), labels, value)
        })
        .collect()
}

fn find<'a>(
    snap: &'a [(MetricKind, String, Vec<String>, Value)],
    name: &str,
    label: &str,
) -> Option<&'a Value> {
    snap.iter()
        .find(|(_, n, labels, _)| n == name && labels.iter().any(|l| l == label))
        .map(|(.., v)| v)
}

/// Each metric `(name, label, value)` of `want` has that value in `snap`.
fn expect(snap: &[(MetricKind, String, Vec<String>, Value)], want: &[(&str, &str, Value)]) {
    for (name, label, value) in want {
        assert_eq!(
            find(snap, name, label),
            Some(value),
            "{name} {{{label}}} in {snap:?}"
        );
    }
}

#[tokio::test]
async fn leadership_renewal_and_campaign_metrics_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("only this test installs a recorder");

    let mut timing = Timing::from_ttl(Duration::from_secs(1));
    timing.renew_interval = Duration::from_millis(50);
    timing.renew_deadline = Duration::from_millis(600);
    let session = Session::open(Arc::new(MemoryBackend::new()), timing)
        .await
        .unwrap();
    let election = ElectionName::new("metrics/seat").unwrap();
    let leadership = session
        .campaign(&election, &Candidate::new("m").unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let snap = snapshot(&snapshotter);
    expect(
        &snap,
        &[
            (names::LEADER, "election=metrics/seat", Value::Gauge(1.0)),
            (names::CAMPAIGN_DURATION, "backend=mem", Value::Samples(1)),
            (names::TRANSITIONS, "transition=elected", Value::Counter(1)),
        ],
    );
    assert!(
        matches!(find(&snap, names::RENEW_LATENCY, "backend=mem"), Some(Value::Samples(n)) if *n >= 2),
        "{snap:?}"
    );
    assert!(
        matches!(find(&snap, names::DEADLINE_REMAINING, "backend=mem"), Some(Value::Gauge(v)) if *v > 0.4),
        "{snap:?}"
    );

    leadership.resign().await.unwrap();
    let snap = snapshot(&snapshotter);
    expect(
        &snap,
        &[
            (names::LEADER, "election=metrics/seat", Value::Gauge(0.0)),
            (names::TRANSITIONS, "transition=resigned", Value::Counter(1)),
        ],
    );
}
