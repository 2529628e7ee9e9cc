//! Shared pieces of the root tests that drive the rescue engine directly: a state dir guard,
//! plans for stand-in NICs, an engine on that state dir. Test support only.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use dranet::config::NetworkConfig;
use dranet::plan::{ClaimRef, DevicePlan, PodPlan};
use dranet::rescue::{Engine, EngineOptions, PodRef};
use dranet::watch::Watcher;

use crate::kernel::unique;
use crate::nic::Nic;

/// A state dir removed (with any pins left in it unmounted) at drop.
pub struct StateDir(pub PathBuf);

impl StateDir {
    #[must_use]
    pub fn new(tag: &str) -> Self {
        Self(std::env::temp_dir().join(unique(&format!("dranet-state-{tag}-"))))
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        if let Ok(rd) = std::fs::read_dir(self.0.join("pins")) {
            for e in rd.flatten() {
                let _ = nix::mount::umount2(&e.path(), nix::mount::MntFlags::MNT_DETACH);
            }
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The plan of one stand-in NIC moved into the pod as `pod_if`, with `config` (its
/// `interface.name` is set to `pod_if`).
#[must_use]
pub fn device_plan(nic: &Nic, pod_if: &str, uid: &str, mut config: NetworkConfig) -> DevicePlan {
    config.interface.name = Some(pod_if.to_owned());
    DevicePlan {
        device: nic.name.clone(),
        pool: "node-a".into(),
        request: "nic".into(),
        claim: ClaimRef {
            namespace: "default".into(),
            name: format!("claim-{uid}"),
            uid: format!("claim-{uid}"),
        },
        host_ifname: Some(nic.name.clone()),
        pci_address: None,
        permanent_mac: None,
        rdma_device: None,
        config,
        char_devices: vec![],
    }
}

/// A pod `uid` (namespace `default`, name `p`) with `devices`.
#[must_use]
pub fn pod_plan(uid: &str, devices: Vec<DevicePlan>) -> PodPlan {
    PodPlan {
        pod_uid: uid.into(),
        pod_namespace: "default".into(),
        pod_name: "p".into(),
        devices,
    }
}

/// An engine on `state`, default options otherwise.
pub async fn engine(state: &StateDir, watcher: Option<Watcher>) -> Result<Engine> {
    let opts = EngineOptions {
        state_dir: state.0.clone(),
        ..EngineOptions::default()
    };
    Ok(Engine::new(opts, watcher).await?)
}

/// The runtime's name of pod `uid` (as [`pod_plan`] names it), in a sandbox whose id is the
/// pod UID.
#[must_use]
pub fn pod_ref(uid: &str) -> PodRef<'_> {
    PodRef {
        uid,
        sandbox: uid,
        namespace: "default",
        name: "p",
    }
}

/// The checkpoint key of the sandbox [`pod_ref`] names (its id is the pod UID).
#[must_use]
pub fn sandbox_key(uid: &str) -> String {
    dranet::state::pod_key(uid, uid)
}

/// Polls `ok` every 2 ms until it holds (how long that took) or `timeout` passes (an error
/// naming `what`).
pub async fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> Result<Duration> {
    let start = Instant::now();
    while !ok() {
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(start.elapsed())
}

/// A claim in namespace `ns` reserved for one pod, allocating `device` of pool `node-a` with
/// `parameters` as this driver's opaque config.
pub fn claim_for(device: &str, parameters: serde_json::Value) -> Result<dranet::dra::ResourceClaim> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "r", "driver": "dra.net", "pool": "node-a", "device": device}],
                "config": [{"source": "FromClaim", "opaque": {"driver": "dra.net", "parameters": parameters}}]
            }},
            "reservedFor": [{"resource": "pods", "name": "pod-a", "uid": "pod-u"}]
        }
    }))?)
}
