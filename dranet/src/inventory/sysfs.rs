//! sysfs readers (under a configurable root so tests can use a fixture tree): PCI network
//! devices, SR-IOV, NUMA, PCIe root, RDMA devices and their character devices.

use std::fs;
use std::path::{Path, PathBuf};

use crate::plan::CharDevice;

/// PCI class 0x02xxxx: network controllers.
const PCI_CLASS_NETWORK: &str = "0x02";
/// Drivers that make a device unusable as a netdev (upstream `isAllocatableNetworkDevice`).
const UNALLOCATABLE_DRIVERS: [&str; 4] = ["vfio-pci", "uio_pci_generic", "igb_uio", "pci-stub"];

/// What sysfs says about one PCI function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PciInfo {
    /// `dddd:bb:dd.f`.
    pub address: String,
    /// Vendor / device / subsystem IDs, 4 lowercase hex digits (no `0x`).
    pub vendor_id: String,
    pub device_id: String,
    pub subsystem_id: String,
    pub driver: Option<String>,
    /// `numa_node` (absent or -1 → `None`).
    pub numa_node: Option<i64>,
    /// First component of the device's real path, e.g. `pci0000:10`.
    pub pcie_root: Option<String>,
    pub sriov_total_vfs: Option<i64>,
    pub sriov_num_vfs: Option<i64>,
    pub is_vf: bool,
}

/// An RDMA device from `class/infiniband`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RdmaInfo {
    pub name: String,
    pub pci_address: Option<String>,
    /// `/dev/infiniband/*` nodes of this device plus `rdma_cm`.
    pub char_devices: Vec<CharDevice>,
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
}

fn read_i64(p: &Path) -> Option<i64> {
    read_trim(p)?.parse().ok()
}

fn hex_id(p: &Path) -> String {
    read_trim(p)
        .map(|s| s.trim_start_matches("0x").to_ascii_lowercase())
        .unwrap_or_default()
}

/// True for `dddd:bb:dd.f`.
#[must_use]
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// The PCI address of a sysfs device path: the last PCI component of its real path, e.g.
/// `/sys/devices/pci0000:00/0000:00:03.0/virtio0/net/eth0` → `0000:00:03.0`.
#[must_use]
pub fn pci_address_of(real_path: &Path) -> Option<String> {
    real_path
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .rfind(|c| is_pci_address(c))
        .map(str::to_owned)
}

/// The sysfs tree to read.
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Self::new("/sys")
    }
}

impl Sysfs {
    #[must_use]
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Real path of `class/net/<ifname>` (a symlink into `devices/`).
    #[must_use]
    pub fn netdev_real_path(&self, ifname: &str) -> Option<PathBuf> {
        fs::canonicalize(self.root.join("class/net").join(ifname)).ok()
    }

    /// True when the netdev lives under `devices/virtual`.
    #[must_use]
    pub fn netdev_is_virtual(&self, ifname: &str) -> Option<bool> {
        let real = self.netdev_real_path(ifname)?;
        let virt = fs::canonicalize(self.root.join("devices/virtual")).ok()?;
        Some(real.starts_with(virt))
    }

    /// PCI address backing a netdev, if any.
    #[must_use]
    pub fn netdev_pci_address(&self, ifname: &str) -> Option<String> {
        let real = fs::canonicalize(self.root.join("class/net").join(ifname).join("device")).ok()?;
        pci_address_of(&real)
    }

    /// RDMA device of a netdev: the first entry of `class/net/<if>/device/infiniband/`.
    #[must_use]
    pub fn netdev_rdma_device(&self, ifname: &str) -> Option<String> {
        first_entry(&self.root.join("class/net").join(ifname).join("device/infiniband"))
    }

    /// MTU of the PF of an SR-IOV VF netdev (`device/physfn/net/*/mtu`).
    #[must_use]
    pub fn netdev_pf_mtu(&self, ifname: &str) -> Option<u32> {
        let net = self.root.join("class/net").join(ifname).join("device/physfn/net");
        let pf = first_entry(&net)?;
        read_trim(&net.join(pf).join("mtu"))?.parse().ok()
    }

    /// PCI functions of class 0x02 with a usable driver bound, sorted by address.
    #[must_use]
    pub fn network_pci_devices(&self) -> Vec<PciInfo> {
        let mut out: Vec<PciInfo> = list_dir(&self.root.join("bus/pci/devices"))
            .into_iter()
            .filter(|a| {
                read_trim(&self.root.join("bus/pci/devices").join(a).join("class"))
                    .is_some_and(|c| c.starts_with(PCI_CLASS_NETWORK))
            })
            .filter_map(|a| self.pci_info(&a))
            .filter(|p| {
                p.driver
                    .as_deref()
                    .is_some_and(|d| !UNALLOCATABLE_DRIVERS.contains(&d))
            })
            .collect();
        out.sort_by(|a, b| a.address.cmp(&b.address));
        out
    }

    /// Everything sysfs says about one PCI address.
    #[must_use]
    pub fn pci_info(&self, address: &str) -> Option<PciInfo> {
        let dir = self.root.join("bus/pci/devices").join(address);
        let real = fs::canonicalize(&dir).ok()?;
        let devices = fs::canonicalize(self.root.join("devices")).ok();
        let pcie_root = devices.and_then(|d| {
            real.strip_prefix(d)
                .ok()?
                .components()
                .next()?
                .as_os_str()
                .to_str()
                .filter(|c| c.starts_with("pci"))
                .map(str::to_owned)
        });
        let driver = fs::read_link(dir.join("driver"))
            .ok()
            .and_then(|l| l.file_name()?.to_str().map(str::to_owned));
        Some(PciInfo {
            address: address.to_owned(),
            vendor_id: hex_id(&dir.join("vendor")),
            device_id: hex_id(&dir.join("device")),
            subsystem_id: hex_id(&dir.join("subsystem_device")),
            driver,
            numa_node: read_i64(&dir.join("numa_node")).filter(|n| *n >= 0),
            pcie_root,
            sriov_total_vfs: read_i64(&dir.join("sriov_totalvfs")),
            sriov_num_vfs: read_i64(&dir.join("sriov_numvfs")),
            is_vf: dir.join("physfn").exists(),
        })
    }

    /// All RDMA devices in `class/infiniband`, sorted by name.
    #[must_use]
    pub fn rdma_devices(&self) -> Vec<RdmaInfo> {
        list_dir(&self.root.join("class/infiniband"))
            .into_iter()
            .map(|name| {
                let pci_address =
                    fs::canonicalize(self.root.join("class/infiniband").join(&name).join("device"))
                        .ok()
                        .and_then(|p| pci_address_of(&p));
                let char_devices = self.rdma_char_devices(&name);
                RdmaInfo {
                    name,
                    pci_address,
                    char_devices,
                }
            })
            .collect()
    }

    /// `/dev/infiniband/{uverbsN,umadN,issmN}` of an RDMA device (found through the `ibdev` file
    /// of `class/infiniband_verbs/*` and `class/infiniband_mad/*`), plus `rdma_cm` when present.
    /// Major/minor come from each node's sysfs `dev` file.
    #[must_use]
    pub fn rdma_char_devices(&self, rdma_dev: &str) -> Vec<CharDevice> {
        let mut out = Vec::new();
        for class in ["infiniband_verbs", "infiniband_mad", "infiniband_cm"] {
            let dir = self.root.join("class").join(class);
            for node in list_dir(&dir) {
                if read_trim(&dir.join(&node).join("ibdev")).as_deref() != Some(rdma_dev) {
                    continue;
                }
                if let Some(cd) = char_device(&dir.join(&node), &node) {
                    out.push(cd);
                }
            }
        }
        let cm = self.root.join("class/misc/rdma_cm");
        if let Some(cd) = char_device(&cm, "rdma_cm") {
            out.push(cd);
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }
}

fn char_device(sysfs_node: &Path, name: &str) -> Option<CharDevice> {
    let dev = read_trim(&sysfs_node.join("dev"))?;
    let (major, minor) = dev.split_once(':')?;
    Some(CharDevice {
        path: format!("/dev/infiniband/{name}"),
        kind: "c".to_owned(),
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
    })
}

fn list_dir(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn first_entry(dir: &Path) -> Option<String> {
    list_dir(dir).into_iter().next()
}

/// SR-IOV state of a netdev's device, read as upstream does through `class/net/<if>/device`
/// (a netdev without a device, i.e. a virtual one, has none: `sriov` false).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetdevSriov {
    /// `device/sriov_totalvfs` (0 when absent or unreadable).
    pub total_vfs: i64,
    /// `device/sriov_numvfs` (0 when absent or unreadable).
    pub num_vfs: i64,
    /// `device/physfn` is a symlink: the netdev is a VF.
    pub is_vf: bool,
}

impl Sysfs {
    /// SR-IOV state of netdev `ifname` (upstream's `sriovTotalVFs`, `sriovNumVFs`, `isSriovVf`).
    #[must_use]
    pub fn netdev_sriov(&self, ifname: &str) -> NetdevSriov {
        let dev = self.root.join("class/net").join(ifname).join("device");
        NetdevSriov {
            total_vfs: read_i64(&dev.join("sriov_totalvfs")).unwrap_or(0),
            num_vfs: read_i64(&dev.join("sriov_numvfs")).unwrap_or(0),
            is_vf: fs::symlink_metadata(dev.join("physfn")).is_ok_and(|m| m.file_type().is_symlink()),
        }
    }

    /// True when ghw (upstream's PCI library) sees a NUMA machine: the number of `node<N>`
    /// entries in `devices/system/node` is not 1 (an unreadable directory counts as none).
    /// Upstream publishes `dra.net/numaNode` only then.
    #[must_use]
    pub fn numa_architecture(&self) -> bool {
        let nodes = list_dir(&self.root.join("devices/system/node"))
            .into_iter()
            .filter(|n| n.strip_prefix("node").is_some_and(|i| i.parse::<u32>().is_ok()))
            .count();
        nodes != 1
    }

    /// The list form of `resource.kubernetes.io/numaNode` for a device on NUMA node `node`
    /// (Kubernetes' `deviceattribute` helper): `node` first, then, in ascending order, the
    /// nodes at the smallest distance from it in its SLIT row (`node<N>/distance`) that are on
    /// the same socket (the `physical_package_id` of the lowest CPU in each node's `cpulist`;
    /// a node whose socket cannot be read is kept). Just `[node]` when the row is missing or
    /// has no other node.
    #[must_use]
    pub fn numa_node_list(&self, node: i64) -> Vec<i64> {
        let nodes = self.root.join("devices/system/node");
        let row: Option<Vec<i64>> = read_trim(&nodes.join(format!("node{node}/distance")))
            .and_then(|s| s.split_whitespace().map(|f| f.parse().ok()).collect());
        let Some(row) = row else {
            return vec![node];
        };
        let Ok(me) = usize::try_from(node) else {
            return vec![node];
        };
        if me >= row.len() {
            return vec![node];
        }
        let Some(min) = row
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != me)
            .map(|(_, d)| *d)
            .min()
        else {
            return vec![node];
        };
        let my_socket = self.numa_node_socket(node);
        let mut out = vec![node];
        for (i, d) in row.iter().enumerate() {
            let Ok(n) = i64::try_from(i) else { continue };
            if i == me || *d != min {
                continue;
            }
            if let (Some(mine), Some(theirs)) = (my_socket, self.numa_node_socket(n))
                && mine != theirs
            {
                continue;
            }
            out.push(n);
        }
        out
    }

    fn numa_node_socket(&self, node: i64) -> Option<i64> {
        let cpulist = read_trim(&self.root.join(format!("devices/system/node/node{node}/cpulist")))?;
        let cpu = lowest_cpu(&cpulist)?;
        read_i64(&self.root.join(format!(
            "devices/system/cpu/cpu{cpu}/topology/physical_package_id"
        )))
    }
}

/// The lowest CPU of a cpulist (`0-3,8-11`); `None` when empty or malformed.
fn lowest_cpu(list: &str) -> Option<u32> {
    let mut lowest: Option<u32> = None;
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let first = part.split('-').next()?.trim().parse::<u32>().ok()?;
        lowest = Some(lowest.map_or(first, |l| l.min(first)));
    }
    lowest
}
