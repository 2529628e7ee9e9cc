//! Prometheus metrics of the NRI plugin: hook calls, errors and latency by hook, registrations
//! and connection losses.

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label set of the hook metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookLabels {
    /// NRI method: RunPodSandbox, StopPodSandbox, RemovePodSandbox, CreateContainer,
    /// Synchronize, Shutdown.
    pub hook: &'static str,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

/// Metrics of the NRI plugin (cheap to clone; clones share the values).
#[derive(Debug, Clone)]
pub struct NriMetrics {
    hook_calls: Family<HookLabels, Counter>,
    hook_errors: Family<HookLabels, Counter>,
    hook_latency: Family<HookLabels, Histogram, fn() -> Histogram>,
    pub(super) registrations: Counter,
    pub(super) connection_losses: Counter,
    /// Registered and not yet disconnected.
    pub(super) connected: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Default for NriMetrics {
    fn default() -> Self {
        Self {
            hook_calls: Family::default(),
            hook_errors: Family::default(),
            hook_latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            registrations: Counter::default(),
            connection_losses: Counter::default(),
            connected: std::sync::Arc::default(),
        }
    }
}

impl NriMetrics {
    /// Registers every metric (names prefixed `nri_`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "nri_hook_calls",
            "NRI hook calls by hook",
            self.hook_calls.clone(),
        );
        registry.register(
            "nri_hook_errors",
            "NRI hook calls that failed, by hook",
            self.hook_errors.clone(),
        );
        registry.register(
            "nri_hook_duration_seconds",
            "Time spent in NRI hooks, by hook",
            self.hook_latency.clone(),
        );
        registry.register(
            "nri_registrations",
            "Successful NRI registrations",
            self.registrations.clone(),
        );
        registry.register(
            "nri_connection_losses",
            "NRI connections lost or failed (each one is retried)",
            self.connection_losses.clone(),
        );
    }

    /// Calls of `hook` so far.
    #[must_use]
    pub fn hook_calls(&self, hook: &'static str) -> u64 {
        self.hook_calls.get_or_create(&HookLabels { hook }).get()
    }

    /// Failed calls of `hook` so far.
    #[must_use]
    pub fn hook_errors(&self, hook: &'static str) -> u64 {
        self.hook_errors.get_or_create(&HookLabels { hook }).get()
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

    pub(super) fn observe(&self, hook: &'static str, start: Instant, failed: bool) {
        let l = HookLabels { hook };
        self.hook_calls.get_or_create(&l).inc();
        if failed {
            self.hook_errors.get_or_create(&l).inc();
        }
        self.hook_latency
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
        m.observe("RunPodSandbox", Instant::now(), true);
        assert_eq!(
            (m.hook_calls("RunPodSandbox"), m.hook_errors("RunPodSandbox")),
            (1, 1)
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(
            out.contains("nri_hook_calls_total{hook=\"RunPodSandbox\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("nri_hook_duration_seconds_count{hook=\"RunPodSandbox\"} 1"),
            "{out}"
        );
    }
}
