//! Per-pod device plans: what NodePrepareResources decided for each device of a pod, consumed by
//! the NRI hooks and the rescue core. Keyed by pod UID (upstream: `claim.status.reservedFor[0].uid`).

use serde::{Deserialize, Serialize};

use crate::config::NetworkConfig;
use crate::shared::Shared;

/// A claim reference as kubelet passes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// A character device to inject into the pod's containers (`/dev/infiniband/*`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CharDevice {
    pub path: String,
    /// "c" for character devices.
    pub kind: String,
    pub major: i64,
    pub minor: i64,
}

/// What to do with one allocated device of a pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicePlan {
    /// Device name in the ResourceSlice (e.g. `eth1`, `pci-0000-10-1b-0`, `net-...`).
    pub device: String,
    pub pool: String,
    pub request: String,
    pub claim: ClaimRef,
    /// Host netdev name at prepare time; `None` for RDMA-only devices.
    pub host_ifname: Option<String>,
    /// PCI address (`0000:10:1b.0`) when PCI-backed.
    pub pci_address: Option<String>,
    /// Permanent MAC (`IFLA_PERM_ADDRESS`) or MAC at prepare time, to find the device again.
    pub permanent_mac: Option<String>,
    /// RDMA link name (`mlx5_0`), if the device has one.
    pub rdma_device: Option<String>,
    /// Validated opaque config (defaults applied).
    pub config: NetworkConfig,
    /// RDMA character devices to inject into every container.
    pub char_devices: Vec<CharDevice>,
}

impl DevicePlan {
    /// The name the netdev gets inside the pod: the configured one, else the host name.
    #[must_use]
    pub fn pod_ifname(&self) -> Option<&str> {
        self.config
            .interface
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .or(self.host_ifname.as_deref())
    }
}

/// All devices of one pod, across its claims.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodPlan {
    pub pod_uid: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub devices: Vec<DevicePlan>,
}

/// The devices one claim brings to one pod: what NodePrepareResources planned for that claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimPlan {
    pub pod_uid: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub claim_uid: String,
    pub devices: Vec<DevicePlan>,
}

/// The plans of every prepared pod by pod UID. A pod's plan is the union of its claims' devices,
/// ordered by claim UID (then as planned); the functions below are the only merge of claims.
/// Each plan is shared with the checkpoint writer's copy until it changes ([`Shared`]).
pub type Plans = std::collections::BTreeMap<String, Shared<PodPlan>>;

/// The devices stored now for claim `claim_uid` (empty when none).
#[must_use]
pub fn claim_devices(plans: &Plans, claim_uid: &str) -> Vec<DevicePlan> {
    plans
        .values()
        .flat_map(|p| p.devices.iter())
        .filter(|d| d.claim.uid == claim_uid)
        .cloned()
        .collect()
}

/// Replaces the devices of `claim.claim_uid` in its pod's plan with `claim.devices` (a device
/// named by another claim of the pod moves to this one). A pod left without devices is removed; a
/// claim with no devices for a pod with no plan stores nothing. Returns the pods whose plan is
/// gone (for the caller's per-pod clean-up).
pub fn set_claim(plans: &mut Plans, claim: ClaimPlan) -> Vec<String> {
    // A claim belongs to one pod: drop it from any other (a claim re-reserved for a new pod).
    let mut emptied = remove_claim_from(plans, &claim.claim_uid, Some(&claim.pod_uid)).1;
    if claim.devices.is_empty() && !plans.contains_key(&claim.pod_uid) {
        return emptied;
    }
    let plan = plans.entry(claim.pod_uid.clone()).or_insert_with(|| {
        PodPlan {
            pod_uid: claim.pod_uid.clone(),
            pod_namespace: String::new(),
            pod_name: String::new(),
            devices: Vec::new(),
        }
        .into()
    });
    plan.pod_namespace = claim.pod_namespace;
    plan.pod_name = claim.pod_name;
    plan.devices.retain(|d| {
        d.claim.uid != claim.claim_uid
            && !claim
                .devices
                .iter()
                .any(|n| n.device == d.device && n.pool == d.pool)
    });
    plan.devices.extend(claim.devices);
    // Stable: the devices of one claim keep their planned order.
    plan.devices.sort_by(|a, b| a.claim.uid.cmp(&b.claim.uid));
    if plan.devices.is_empty() {
        plans.remove(&claim.pod_uid);
        emptied.push(claim.pod_uid);
    }
    emptied
}

/// Forgets the devices of claim `claim_uid` in every pod. Returns them, and the pods whose plan is
/// gone with them.
pub fn remove_claim(plans: &mut Plans, claim_uid: &str) -> (Vec<DevicePlan>, Vec<String>) {
    remove_claim_from(plans, claim_uid, None)
}

fn remove_claim_from(
    plans: &mut Plans,
    claim_uid: &str,
    except_pod: Option<&str>,
) -> (Vec<DevicePlan>, Vec<String>) {
    let mut removed = Vec::new();
    let mut emptied = Vec::new();
    for (uid, plan) in plans.iter_mut() {
        if except_pod == Some(uid.as_str()) || !plan.devices.iter().any(|d| d.claim.uid == claim_uid) {
            continue;
        }
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut plan.devices)
            .into_iter()
            .partition(|d| d.claim.uid == claim_uid);
        plan.devices = kept;
        removed.extend(gone);
        if plan.devices.is_empty() {
            emptied.push(uid.clone());
        }
    }
    for uid in &emptied {
        plans.remove(uid);
    }
    (removed, emptied)
}

/// The entries a change of claim `claim_uid` (stored for pod `pod_uid`) can touch, as they are
/// now (`None`: absent), for [`put_back`].
#[must_use]
pub fn entries_of(
    plans: &Plans,
    claim_uid: &str,
    pod_uid: Option<&str>,
) -> Vec<(String, Option<Shared<PodPlan>>)> {
    let mut out: Vec<(String, Option<Shared<PodPlan>>)> = plans
        .iter()
        .filter(|(uid, p)| {
            Some(uid.as_str()) == pod_uid || p.devices.iter().any(|d| d.claim.uid == claim_uid)
        })
        .map(|(uid, p)| (uid.clone(), Some(p.clone())))
        .collect();
    if let Some(pod) = pod_uid
        && !plans.contains_key(pod)
    {
        out.push((pod.to_owned(), None));
    }
    out
}

/// Restores entries taken by [`entries_of`] (a change that could not be saved).
pub fn put_back(plans: &mut Plans, entries: Vec<(String, Option<Shared<PodPlan>>)>) {
    for (uid, plan) in entries {
        match plan {
            Some(p) => plans.insert(uid, p),
            None => plans.remove(&uid),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(device: &str, claim: &str) -> DevicePlan {
        DevicePlan {
            device: device.into(),
            pool: "node-a".into(),
            request: "nic".into(),
            claim: ClaimRef {
                namespace: "ns".into(),
                name: claim.into(),
                uid: claim.into(),
            },
            host_ifname: Some(device.into()),
            pci_address: None,
            permanent_mac: None,
            rdma_device: None,
            config: NetworkConfig::default(),
            char_devices: Vec::new(),
        }
    }

    fn claim(pod: &str, uid: &str, devices: Vec<DevicePlan>) -> ClaimPlan {
        ClaimPlan {
            pod_uid: pod.into(),
            pod_namespace: "ns".into(),
            pod_name: format!("name-{pod}"),
            claim_uid: uid.into(),
            devices,
        }
    }

    fn names(plans: &Plans, pod: &str) -> Vec<String> {
        plans[pod].devices.iter().map(|d| d.device.clone()).collect()
    }

    #[test]
    fn claims_of_a_pod_merge_in_claim_order_and_replace_their_own_devices() {
        let mut plans = Plans::new();
        set_claim(&mut plans, claim("p", "u2", vec![dev("eth2", "u2")]));
        set_claim(
            &mut plans,
            claim("p", "u1", vec![dev("eth1", "u1"), dev("eth0", "u1")]),
        );
        assert_eq!(names(&plans, "p"), ["eth1", "eth0", "eth2"]);
        // A repeated Prepare of u1 that now plans one device drops the other.
        set_claim(&mut plans, claim("p", "u1", vec![dev("eth3", "u1")]));
        assert_eq!(names(&plans, "p"), ["eth3", "eth2"]);
        assert_eq!(claim_devices(&plans, "u2"), [dev("eth2", "u2")]);
    }

    #[test]
    fn an_empty_claim_stores_nothing_and_empties_its_pod() {
        let mut plans = Plans::new();
        assert!(set_claim(&mut plans, claim("p", "u1", vec![])).is_empty());
        assert!(plans.is_empty());
        set_claim(&mut plans, claim("p", "u1", vec![dev("eth1", "u1")]));
        assert_eq!(set_claim(&mut plans, claim("p", "u1", vec![])), ["p"]);
        assert!(plans.is_empty());
    }

    #[test]
    fn a_claim_moved_to_another_pod_leaves_the_first() {
        let mut plans = Plans::new();
        set_claim(&mut plans, claim("p1", "u1", vec![dev("eth1", "u1")]));
        set_claim(&mut plans, claim("p1", "u2", vec![dev("eth2", "u2")]));
        assert!(set_claim(&mut plans, claim("p2", "u1", vec![dev("eth1", "u1")])).is_empty());
        assert_eq!(names(&plans, "p1"), ["eth2"]);
        assert_eq!(names(&plans, "p2"), ["eth1"]);
        let (removed, emptied) = remove_claim(&mut plans, "u2");
        assert_eq!(removed, [dev("eth2", "u2")]);
        assert_eq!(emptied, ["p1"]);
        assert_eq!(plans.keys().collect::<Vec<_>>(), ["p2"]);
    }

    #[test]
    fn put_back_undoes_a_change() {
        let mut plans = Plans::new();
        set_claim(&mut plans, claim("p1", "u1", vec![dev("eth1", "u1")]));
        set_claim(&mut plans, claim("p3", "u3", vec![dev("eth3", "u3")]));
        let was = plans.clone();
        let before = entries_of(&plans, "u1", Some("p2"));
        set_claim(&mut plans, claim("p2", "u1", vec![dev("eth2", "u1")]));
        assert_ne!(plans, was);
        put_back(&mut plans, before);
        assert_eq!(plans, was);
    }
}
