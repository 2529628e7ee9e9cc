//! Publishing metrics with upstream's names: `dranet_driver_published_devices_total{feature}`
//! (`total`, `rdma`) and `dranet_driver_last_published_time_seconds`; and dranet's own
//! `dranet_inventory_scans_total` and `dranet_inventory_scan_seconds` (what the debounced
//! rescans cost).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FeatureLabels {
    pub feature: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    /// HTTP status of the failed request, or `timeout`, `unreachable`, `local`.
    pub status: String,
}

/// Cheap to clone; clones share the values.
#[derive(Debug, Clone)]
pub struct SliceMetrics {
    published: Family<FeatureLabels, Gauge>,
    last_published: Gauge<f64, AtomicU64>,
    failures: Family<StatusLabels, Counter>,
    scans: Counter,
    scan_seconds: Histogram,
}

impl Default for SliceMetrics {
    fn default() -> Self {
        Self {
            published: Family::default(),
            last_published: Gauge::default(),
            failures: Family::default(),
            scans: Counter::default(),
            scan_seconds: Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]),
        }
    }
}

impl SliceMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "dranet_driver_published_devices_total",
            "Devices in the last published ResourceSlices, by feature",
            self.published.clone(),
        );
        registry.register(
            "dranet_driver_last_published_time_seconds",
            "Unix time of the last ResourceSlice publication",
            self.last_published.clone(),
        );
        registry.register(
            "dranet_driver_publish_failures",
            "Failed ResourceSlice publications, by the HTTP status of the failed request (or timeout, unreachable, local)",
            self.failures.clone(),
        );
        registry.register(
            "dranet_inventory_scans",
            "Inventory scans (link events, devices coming home, kubelet registration, the periodic rescan; debounced)",
            self.scans.clone(),
        );
        registry.register(
            "dranet_inventory_scan_seconds",
            "Wall time of an inventory scan (kernel dump, sysfs, attributes, filter)",
            self.scan_seconds.clone(),
        );
    }

    /// Records one inventory scan that took `secs`.
    pub fn scanned(&self, secs: f64) {
        self.scans.inc();
        self.scan_seconds.observe(secs);
    }

    /// Inventory scans so far.
    #[must_use]
    pub fn scans(&self) -> u64 {
        self.scans.get()
    }

    /// Records a failed publication (`status`: see [`super::SliceError::status_label`]).
    pub fn failed(&self, status: &str) {
        self.failures
            .get_or_create(&StatusLabels {
                status: status.to_owned(),
            })
            .inc();
    }

    /// Failed publications with `status` so far.
    #[must_use]
    pub fn failures(&self, status: &str) -> u64 {
        self.failures
            .get_or_create(&StatusLabels {
                status: status.to_owned(),
            })
            .get()
    }

    /// Records a successful publication of `total` devices, `rdma` of them RDMA-capable.
    pub fn published(&self, total: usize, rdma: usize) {
        let total = i64::try_from(total).unwrap_or(i64::MAX);
        self.published
            .get_or_create(&FeatureLabels { feature: "total" })
            .set(total);
        self.published
            .get_or_create(&FeatureLabels { feature: "rdma" })
            .set(i64::try_from(rdma).unwrap_or(i64::MAX));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        self.last_published.set(now);
    }

    /// Devices with `feature` (`total`, `rdma`) in the last publication.
    #[must_use]
    pub fn devices(&self, feature: &'static str) -> i64 {
        self.published.get_or_create(&FeatureLabels { feature }).get()
    }

    #[must_use]
    pub fn last_published(&self) -> f64 {
        self.last_published.get()
    }
}
