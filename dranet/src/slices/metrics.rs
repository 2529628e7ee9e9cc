//! Publishing metrics with upstream's names: `dranet_driver_published_devices_total{feature}`
//! (`total`, `rdma`) and `dranet_driver_last_published_time_seconds`.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::inventory::{AttrValue, Device, attr};

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
#[derive(Debug, Clone, Default)]
pub struct SliceMetrics {
    published: Family<FeatureLabels, Gauge>,
    last_published: Gauge<f64, AtomicU64>,
    failures: Family<StatusLabels, Counter>,
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

    /// Records a successful publication of `devices`.
    pub fn published(&self, devices: &[Device]) {
        let total = i64::try_from(devices.len()).unwrap_or(i64::MAX);
        let rdma = devices
            .iter()
            .filter(|d| d.attributes.get(attr::RDMA) == Some(&AttrValue::Bool(true)))
            .count();
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
