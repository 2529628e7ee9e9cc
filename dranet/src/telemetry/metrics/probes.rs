//! Kernel probe metrics: which probes are loaded, by tier.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    tier: String,
    probe: String,
}

/// `dranet_probes_active{tier,probe}`: 1 for a probe loaded and attached, 0 otherwise.
#[derive(Clone, Debug, Default)]
pub struct ProbeMetrics {
    active: Family<ProbeLabels, Gauge>,
}

impl ProbeMetrics {
    /// Records one probe's state.
    pub fn set(&self, tier: &str, probe: &str, active: bool) {
        self.active
            .get_or_create(&ProbeLabels {
                tier: tier.to_owned(),
                probe: probe.to_owned(),
            })
            .set(i64::from(active));
    }

    /// The recorded state of one probe (`None`: never recorded).
    #[must_use]
    pub fn get(&self, tier: &str, probe: &str) -> Option<bool> {
        self.active
            .get(&ProbeLabels {
                tier: tier.to_owned(),
                probe: probe.to_owned(),
            })
            .map(|g| g.get() == 1)
    }

    pub fn register(&self, r: &mut Registry) {
        r.register(
            "dranet_probes_active",
            "Kernel probes loaded, by tier and probe (1 = active)",
            self.active.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_state_is_exported_with_its_labels() {
        let m = ProbeMetrics::default();
        m.set("Ebpf", "umount", true);
        m.set("Ebpf", "unlink", false);
        let mut r = Registry::default();
        m.register(&mut r);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        assert!(
            out.contains(r#"dranet_probes_active{tier="Ebpf",probe="umount"} 1"#),
            "{out}"
        );
        assert!(
            out.contains(r#"dranet_probes_active{tier="Ebpf",probe="unlink"} 0"#),
            "{out}"
        );
        assert_eq!(m.get("Ebpf", "umount"), Some(true));
        assert_eq!(m.get("Ebpf", "other"), None);
    }
}
