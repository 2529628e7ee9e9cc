//! Prometheus metrics of the kubelet plugin, with upstream dranet's names
//! (`pkg/driver/metrics.go`): `dranet_driver_dra_plugin_requests_total{method,status}` and
//! `dranet_driver_dra_plugin_requests_latency_seconds{method}`.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `PrepareResourceClaims` (upstream's method label).
pub const PREPARE: &str = "PrepareResourceClaims";
/// `UnprepareResourceClaims`.
pub const UNPREPARE: &str = "UnprepareResourceClaims";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: &'static str,
    /// `success` or `failed` (any claim of the request failed).
    pub status: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: &'static str,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Metrics of the DRA side (cheap to clone; clones share the values).
#[derive(Debug, Clone)]
pub struct DraMetrics {
    requests: Family<RequestLabels, Counter>,
    latency: Family<MethodLabels, Histogram, fn() -> Histogram>,
}

impl Default for DraMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
        }
    }
}

impl DraMetrics {
    /// Registers the metrics under upstream's names.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "dranet_driver_dra_plugin_requests",
            "DRA plugin requests by method and status",
            self.requests.clone(),
        );
        registry.register(
            "dranet_driver_dra_plugin_requests_latency_seconds",
            "DRA plugin request latency by method",
            self.latency.clone(),
        );
    }

    /// Records one request.
    pub fn observe(&self, method: &'static str, ok: bool, elapsed: Duration) {
        let status = if ok { "success" } else { "failed" };
        self.requests
            .get_or_create(&RequestLabels { method, status })
            .inc();
        self.latency
            .get_or_create(&MethodLabels { method })
            .observe(elapsed.as_secs_f64());
    }

    /// Requests of `method` with `status` so far.
    #[must_use]
    pub fn requests(&self, method: &'static str, status: &'static str) -> u64 {
        self.requests
            .get_or_create(&RequestLabels { method, status })
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_encodes_with_upstream_names() {
        let m = DraMetrics::default();
        m.observe(PREPARE, true, Duration::from_millis(3));
        m.observe(PREPARE, false, Duration::from_millis(3));
        m.observe(PREPARE, true, Duration::from_millis(3));
        assert_eq!(m.requests(PREPARE, "success"), 2);
        assert_eq!(m.requests(PREPARE, "failed"), 1);
        assert_eq!(m.requests(UNPREPARE, "success"), 0);
        let mut reg = Registry::default();
        m.register(&mut reg);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(
            out.contains(
                "dranet_driver_dra_plugin_requests_total{method=\"PrepareResourceClaims\",status=\"success\"} 2"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "dranet_driver_dra_plugin_requests_latency_seconds_count{method=\"PrepareResourceClaims\"} 3"
            ),
            "{out}"
        );
    }
}
