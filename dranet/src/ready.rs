//! Health and readiness of `dranet run`, as named conditions with reasons.
//!
//! * `/healthz` (liveness, startup) is about the daemon itself: it is OK while the rescue engine
//!   runs (checkpoint loaded, start-up reconcile done, pins held, events followed). Neither the
//!   runtime nor the API server plays a part: restarting dranet fixes neither a runtime with NRI
//!   off nor an API outage, and a restart loop would hide the cause from `kubectl logs`.
//! * `/readyz` adds what the node and the cluster see: registered with the runtime's NRI socket
//!   (unless `--no-nri`), kubelet registered the DRA plugin, the ResourceSlices are published,
//!   the last ResourceClaim read worked. A condition that is not met says why
//!   (`nri: cannot connect to the NRI socket /var/run/nri/nri.sock: ...; is NRI enabled ...`,
//!   `slices: ResourceSlices not published: 403 Forbidden: ...`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The rescue engine is up (the checkpoint loaded, reconcile done, events followed).
pub const ENGINE: &str = "engine";
/// Connected to the runtime's NRI socket.
pub const NRI: &str = "nri";
/// kubelet registered the DRA plugin.
pub const KUBELET: &str = "kubelet";
/// The ResourceSlices of the node are published.
pub const SLICES: &str = "slices";
/// ResourceClaims can be read (the last read did not fail for want of a permission or an
/// answer).
pub const CLAIMS: &str = "claims";

/// The conditions `/healthz` needs; every other one counts for `/readyz` only.
const LIVENESS: &[&str] = &[ENGINE];

#[derive(Clone, Debug, PartialEq, Eq)]
struct Condition {
    met: bool,
    /// Why it is not met (or a note while it is).
    reason: String,
}

/// The daemon's conditions; cheap to clone, clones share them.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    conds: Arc<Mutex<BTreeMap<&'static str, Condition>>>,
}

impl Readiness {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, Condition>> {
        self.conds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Declares a condition, not met yet, with `reason`.
    pub fn expect(&self, name: &'static str, reason: impl Into<String>) {
        self.lock().insert(
            name,
            Condition {
                met: false,
                reason: reason.into(),
            },
        );
    }

    /// The condition is met.
    pub fn set_met(&self, name: &'static str) {
        self.lock().insert(
            name,
            Condition {
                met: true,
                reason: String::new(),
            },
        );
    }

    /// The condition is not met, because of `reason`.
    pub fn set_unmet(&self, name: &'static str, reason: impl Into<String>) {
        self.lock().insert(
            name,
            Condition {
                met: false,
                reason: reason.into(),
            },
        );
    }

    /// Whether `name` is declared and met.
    #[must_use]
    pub fn is_met(&self, name: &str) -> bool {
        self.lock().get(name).is_some_and(|c| c.met)
    }

    /// `Ok` when the node's devices are protected; else the unmet liveness conditions.
    pub fn health(&self) -> Result<(), String> {
        self.report(|n| LIVENESS.contains(&n))
    }

    /// `Ok` when every declared condition is met; else each unmet one with its reason, one per
    /// line.
    pub fn ready(&self) -> Result<(), String> {
        self.report(|_| true)
    }

    fn report(&self, which: impl Fn(&str) -> bool) -> Result<(), String> {
        let conds = self.lock();
        let mut unmet: Vec<String> = conds
            .iter()
            .filter(|(n, c)| which(n) && !c.met)
            .map(|(n, c)| format!("{n}: {}", c.reason))
            .collect();
        // The engine is required even before it is declared (still starting).
        if which(ENGINE) && !conds.contains_key(ENGINE) {
            unmet.push(format!("{ENGINE}: starting"));
        }
        if unmet.is_empty() {
            Ok(())
        } else {
            Err(unmet.join("\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_needs_the_engine_only_readiness_needs_all() {
        let r = Readiness::new();
        assert_eq!(r.health(), Err("engine: starting".into()));
        r.set_met(ENGINE);
        r.expect(NRI, "not connected to the runtime's NRI socket");
        r.expect(SLICES, "not published yet");
        assert_eq!(
            r.health(),
            Ok(()),
            "a runtime with NRI off does not make dranet unhealthy"
        );
        assert!(r.ready().unwrap_err().contains("nri: not connected"));
        r.set_met(NRI);
        assert_eq!(r.health(), Ok(()));
        r.set_unmet(
            SLICES,
            "ResourceSlices not published: 403 Forbidden: cannot patch resourceslices.resource.k8s.io",
        );
        let why = r.ready().unwrap_err();
        assert!(
            why.starts_with("slices: ResourceSlices not published: 403"),
            "{why}"
        );
        assert_eq!(
            r.health(),
            Ok(()),
            "the API server never makes the node unhealthy"
        );
        r.set_met(SLICES);
        assert_eq!(r.ready(), Ok(()));
        assert!(r.is_met(SLICES));
    }
}
