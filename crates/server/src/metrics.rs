//! Request counts and latency histograms by route, in Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Histogram bucket upper bounds, in seconds.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Default)]
struct Inner {
    requests: BTreeMap<(String, String, u16), u64>,
    latency: BTreeMap<String, Histogram>,
}

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn record(&self, route: &str, method: &str, status: u16, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let mut m = self.inner.lock().expect("metrics lock");
        *m.requests
            .entry((route.to_owned(), method.to_owned(), status))
            .or_default() += 1;
        let h = m.latency.entry(route.to_owned()).or_default();
        for (i, &b) in BUCKETS.iter().enumerate() {
            if secs <= b {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += secs;
    }

    /// The exposition text, with the collection's gauges appended.
    pub fn render(&self, gauges: &[(&str, &str, f64)]) -> String {
        let m = self.inner.lock().expect("metrics lock");
        let mut s = String::new();
        s.push_str(
            "# HELP neardup_http_requests_total HTTP requests by route, method and status.\n",
        );
        s.push_str("# TYPE neardup_http_requests_total counter\n");
        for ((route, method, status), n) in &m.requests {
            let _ = writeln!(
                s,
                "neardup_http_requests_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}} {n}"
            );
        }
        s.push_str("# HELP neardup_http_request_duration_seconds Request latency by route.\n");
        s.push_str("# TYPE neardup_http_request_duration_seconds histogram\n");
        for (route, h) in &m.latency {
            for (i, b) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "neardup_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"{b}\"}} {}",
                    h.counts[i]
                );
            }
            let _ = writeln!(
                s,
                "neardup_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                s,
                "neardup_http_request_duration_seconds_sum{{route=\"{route}\"}} {}",
                h.sum
            );
            let _ = writeln!(
                s,
                "neardup_http_request_duration_seconds_count{{route=\"{route}\"}} {}",
                h.count
            );
        }
        for (name, help, value) in gauges {
            let _ = writeln!(
                s,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        s
    }
}
