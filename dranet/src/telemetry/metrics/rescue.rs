//! Rescue metrics: returns by trigger, rescue latency, repairs, failures.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Label of the return counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabel {
    pub trigger: String,
}

/// Label of the stuck-return counter: why the move home still failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// The engine's metrics (cheap to clone: shared handles).
#[derive(Clone, Debug)]
pub struct RescueMetrics {
    /// Pods whose devices came home, by what triggered it (hook, netns_unmounted, ...).
    pub returns: Family<TriggerLabel, Counter>,
    /// Seconds from the teardown signal to every device home.
    pub rescue_latency: Histogram,
    /// Seconds from the teardown signal to the engine starting its first device move.
    pub rescue_reaction: Histogram,
    pub attach_latency: Histogram,
    pub repaired: Counter,
    pub rollbacks: Counter,
    pub failures: Counter,
    /// Times events were lost (eBPF ring buffer full, rtnetlink ENOBUFS, a slow subscriber) and
    /// a reconcile ran instead.
    pub lost_events: Counter,
    /// Sandbox records deleted because the runtime no longer has the sandbox.
    pub records_dropped: Counter,
    /// Pods whose devices were all attached.
    pub attached: Counter,
    /// Attaches that failed after a device had moved (each rolled back).
    pub attach_failures: Counter,
    /// Pods whose devices a netns teardown brought home (rescues, whatever signalled them).
    pub rescued: Counter,
    /// Devices that no longer existed anywhere when they were to come home (deleted in the pod).
    pub vanished: Counter,
    /// Rescues given up with a device still out after every retry, by reason.
    pub stuck: Family<ReasonLabel, Counter>,
}

/// The engine's running totals, read from its metrics (one count, two views).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Counters {
    pub attached_pods: u64,
    pub attach_failures: u64,
    pub rollbacks: u64,
    pub returned_by_hook: u64,
    pub rescued_by_teardown: u64,
    pub returned_by_reconcile: u64,
    pub repaired_devices: u64,
    pub return_failures: u64,
}

impl Default for RescueMetrics {
    fn default() -> Self {
        let buckets = [
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        ];
        Self {
            returns: Family::default(),
            rescue_latency: Histogram::new(buckets),
            rescue_reaction: Histogram::new([
                0.000_05, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.1,
            ]),
            attach_latency: Histogram::new(buckets),
            repaired: Counter::default(),
            rollbacks: Counter::default(),
            failures: Counter::default(),
            lost_events: Counter::default(),
            records_dropped: Counter::default(),
            attached: Counter::default(),
            attach_failures: Counter::default(),
            rescued: Counter::default(),
            vanished: Counter::default(),
            stuck: Family::default(),
        }
    }
}

impl RescueMetrics {
    /// The totals so far.
    #[must_use]
    pub fn counters(&self) -> Counters {
        let returns = |trigger: &str| {
            self.returns
                .get(&TriggerLabel {
                    trigger: trigger.to_owned(),
                })
                .map_or(0, |c| c.get())
        };
        Counters {
            attached_pods: self.attached.get(),
            attach_failures: self.attach_failures.get(),
            rollbacks: self.rollbacks.get(),
            returned_by_hook: returns("hook") + returns("replaced"),
            rescued_by_teardown: self.rescued.get(),
            returned_by_reconcile: returns("reconcile") + returns("vanished"),
            repaired_devices: self.repaired.get(),
            return_failures: self.failures.get(),
        }
    }

    pub fn register(&self, r: &mut Registry) {
        r.register(
            "dranet_rescue_returns",
            "Pods whose devices were brought home, by trigger",
            self.returns.clone(),
        );
        r.register(
            "dranet_rescue_latency_seconds",
            "Time from a netns teardown signal to every device of the pod home",
            self.rescue_latency.clone(),
        );
        r.register(
            "dranet_rescue_reaction_seconds",
            "Time from a netns teardown signal to the first device move of the rescue",
            self.rescue_reaction.clone(),
        );
        r.register(
            "dranet_attach_latency_seconds",
            "Time to move and configure every device of a pod",
            self.attach_latency.clone(),
        );
        r.register(
            "dranet_devices_repaired",
            "Devices the kernel returned by itself, restored",
            self.repaired.clone(),
        );
        r.register(
            "dranet_lost_events",
            "Times lifecycle events were lost and a full reconcile ran instead",
            self.lost_events.clone(),
        );
        r.register(
            "dranet_sandbox_records_dropped",
            "Sandbox records deleted once their devices were home and the runtime no longer had the sandbox",
            self.records_dropped.clone(),
        );
        r.register(
            "dranet_attach_rollbacks",
            "Attaches rolled back after a failure",
            self.rollbacks.clone(),
        );
        r.register(
            "dranet_attached_pods",
            "Pods whose devices were all attached",
            self.attached.clone(),
        );
        r.register(
            "dranet_attach_failures",
            "Attaches that failed after a device had moved (each is rolled back)",
            self.attach_failures.clone(),
        );
        r.register(
            "dranet_rescued_pods",
            "Pods whose devices a netns teardown brought home, whatever signalled it",
            self.rescued.clone(),
        );
        r.register(
            "dranet_return_failures",
            "Detaches that left a device outside the host",
            self.failures.clone(),
        );
        r.register(
            "dranet_devices_vanished",
            "Managed devices that no longer existed anywhere when they were to come home (deleted while in the pod); each record ended",
            self.vanished.clone(),
        );
        r.register(
            "dranet_return_stuck",
            "Rescues that left a device out after every retry (reported; retried at the next hook, trigger or reconcile), by reason",
            self.stuck.clone(),
        );
    }
}
