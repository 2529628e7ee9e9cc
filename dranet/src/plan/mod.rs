//! Per-pod device plans: what NodePrepareResources decided for each device of a pod, consumed by
//! the NRI hooks and the rescue core. Keyed by pod UID (upstream: `claim.status.reservedFor[0].uid`).

use serde::{Deserialize, Serialize};

use crate::config::NetworkConfig;

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
