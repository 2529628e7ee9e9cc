//! Prometheus metrics of the NRI plugin: hook calls, errors and latency by hook, registrations
//! and connection losses (`dranet_nri_registrations_total`, `dranet_nri_connection_losses_total`;
//! before the `dranet_` prefix they were `nri_*`, never in a release, so not kept as aliases).

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::nri::hooks::PodHook;

/// Labels of the hook metrics: upstream dranet's `dranet_driver_nri_plugin_requests_*`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookLabels {
    /// NRI method: RunPodSandbox, StopPodSandbox, RemovePodSandbox, CreateContainer,
    /// Synchronize, Shutdown.
    pub method: String,
    /// `success`, `noop` (nothing of ours) or `failed`.
    pub status: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0,
    ])
}

/// How a hook call ended, for its `status` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookStatus {
    Success,
    Noop,
    Failed,
}

impl HookStatus {
    fn label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Noop => "noop",
            Self::Failed => "failed",
        }
    }
}

/// Metrics of the NRI plugin, one set for every hook, under upstream dranet's names and labels
/// (cheap to clone; clones share the values).
#[derive(Debug, Clone)]
pub struct NriMetrics {
    requests: Family<HookLabels, Counter>,
    latency: Family<HookLabels, Histogram, fn() -> Histogram>,
    pub(crate) registrations: Counter,
    pub(crate) connection_losses: Counter,
    /// Registered and not yet disconnected.
    pub(crate) connected: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Default for NriMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            registrations: Counter::default(),
            connection_losses: Counter::default(),
            connected: std::sync::Arc::default(),
        }
    }
}

impl NriMetrics {
    /// Registers every metric.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "dranet_driver_nri_plugin_requests",
            "NRI hook calls by method and status",
            self.requests.clone(),
        );
        registry.register(
            "dranet_driver_nri_plugin_requests_latency_seconds",
            "NRI hook latency by method and status",
            self.latency.clone(),
        );
        registry.register(
            "dranet_nri_registrations",
            "Successful NRI registrations",
            self.registrations.clone(),
        );
        registry.register(
            "dranet_nri_connection_losses",
            "NRI connections lost or failed (each one is retried)",
            self.connection_losses.clone(),
        );
    }

    fn count(&self, hook: &str, status: HookStatus) -> u64 {
        self.requests
            .get_or_create(&HookLabels {
                method: hook.to_owned(),
                status: status.label().to_owned(),
            })
            .get()
    }

    /// Calls of `hook` so far, whatever their status.
    #[must_use]
    pub fn hook_calls(&self, hook: &str) -> u64 {
        [HookStatus::Success, HookStatus::Noop, HookStatus::Failed]
            .into_iter()
            .map(|s| self.count(hook, s))
            .sum()
    }

    /// Failed calls of `hook` so far.
    #[must_use]
    pub fn hook_errors(&self, hook: &str) -> u64 {
        self.count(hook, HookStatus::Failed)
    }

    /// Whether the plugin is registered with a runtime right now.
    #[must_use]
    pub fn connected(&self) -> bool {
        self.connected.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Successful registrations so far.
    #[must_use]
    pub fn registrations(&self) -> u64 {
        self.registrations.get()
    }

    pub(crate) fn observe(&self, hook: PodHook, start: Instant, status: HookStatus) {
        let l = HookLabels {
            method: hook.name().to_owned(),
            status: status.label().to_owned(),
        };
        self.requests.get_or_create(&l).inc();
        self.latency
            .get_or_create(&l)
            .observe(start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_encode() {
        let m = NriMetrics::default();
        let mut reg = Registry::default();
        m.register(&mut reg);
        m.observe(PodHook::RunPodSandbox, Instant::now(), HookStatus::Failed);
        m.observe(PodHook::RunPodSandbox, Instant::now(), HookStatus::Noop);
        assert_eq!(
            (m.hook_calls("RunPodSandbox"), m.hook_errors("RunPodSandbox")),
            (2, 1)
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(
            out.contains(
                "dranet_driver_nri_plugin_requests_total{method=\"RunPodSandbox\",status=\"failed\"} 1"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "dranet_driver_nri_plugin_requests_latency_seconds_count{method=\"RunPodSandbox\",status=\"noop\"} 1"
            ),
            "{out}"
        );
    }
}
