// Over 500 lines: discovery of every device kind (PCI, RDMA, netdev) into one attribute map, as upstream.
//! Discovery of the node's network devices with upstream's attribute names
//! (`pkg/inventory`): PCI network functions (sysfs), RDMA devices (`class/infiniband`) and the
//! netdevs of a network namespace (rtnetlink), merged into [`Device`]s named as upstream.
//!
//! [`scan`] reads the kernel; [`build_devices`] is the pure merge, testable with a fixture sysfs
//! tree and synthetic links. Netdevs are skipped when loopback, `cilium_net`, `cilium_host`,
//! `docker0`, uplinks (default-route holders and their master descendants), or IPoIB with
//! `move_ib_interfaces == false`; then the CEL filter runs.

mod filter;
mod held;
mod host_state;
mod names;
mod netlink;
mod pciids;
mod sysfs;
mod tc;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

pub use filter::{DEFAULT_FILTER, Filter};
pub use held::{HELD_FILE, Held, HeldAttributes, HeldError, HeldIdentity};
pub use names::{base32_lower_nopad, is_dns_label, netdev_device_name, pci_device_name};
pub use netlink::{LinkRecord, MAX_ATTRIBUTE_LEN, NetScan, NetnsTarget, capped_join, is_global_unicast};
pub use pciids::{PciIds, PciIdsSource, SYSTEM_PATHS as PCI_IDS_PATHS};
pub use sysfs::{PciInfo, RdmaInfo, Sysfs, is_pci_address, pci_address_of};

use crate::plan::CharDevice;
use crate::shared::Shared;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("rtnetlink {what} failed: {detail}")]
    Netlink { what: &'static str, detail: String },
    #[error("reading the links")]
    Links(#[source] crate::sys::rtnl::DumpError),
    #[error("the scan thread panicked")]
    Thread,
    #[error("invalid CEL filter {expr:?}: {detail}")]
    Filter { expr: String, detail: String },
}

/// Attribute names (`pkg/apis/attributes.go`).
pub mod attr {
    pub const PCI_ADDRESS: &str = "dra.net/pciAddress";
    pub const PCI_VENDOR: &str = "dra.net/pciVendor";
    pub const PCI_DEVICE: &str = "dra.net/pciDevice";
    pub const PCI_SUBSYSTEM: &str = "dra.net/pciSubsystem";
    pub const NUMA_NODE: &str = "dra.net/numaNode";
    pub const IF_NAME: &str = "dra.net/ifName";
    pub const MAC: &str = "dra.net/mac";
    pub const MTU: &str = "dra.net/mtu";
    pub const ENCAPSULATION: &str = "dra.net/encapsulation";
    pub const ALIAS: &str = "dra.net/alias";
    pub const STATE: &str = "dra.net/state";
    pub const TYPE: &str = "dra.net/type";
    pub const IPV4: &str = "dra.net/ipv4";
    pub const IPV6: &str = "dra.net/ipv6";
    pub const SRIOV: &str = "dra.net/sriov";
    pub const SRIOV_VFS: &str = "dra.net/sriovVfs";
    pub const IS_SRIOV_VF: &str = "dra.net/isSriovVf";
    pub const VIRTUAL: &str = "dra.net/virtual";
    pub const RDMA: &str = "dra.net/rdma";
    pub const RDMA_DEVICE: &str = "dra.net/rdmaDevice";
    pub const EBPF: &str = "dra.net/ebpf";
    pub const TC_FILTER_NAMES: &str = "dra.net/tcFilterNames";
    pub const TCX_PROGRAM_NAMES: &str = "dra.net/tcxProgramNames";
    pub const STD_NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
    pub const STD_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
}

/// A `DeviceAttribute` value; serialises as the API does (`{"string": "…"}`, `{"int": 1}`…).
/// `Ints` is the list form (`{"ints": [1, 0]}`) of resource.k8s.io/v1 from Kubernetes 1.36
/// with the `DRAListTypeAttributes` gate; k8s-openapi's v1 types have no list forms, so slices
/// are serialised from these.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttrValue {
    String(String),
    Int(i64),
    Bool(bool),
    Version(String),
    Ints(Vec<i64>),
}

impl AttrValue {
    /// True for a list form (a slice with one holds at most 64 devices).
    #[must_use]
    pub fn is_list(&self) -> bool {
        matches!(self, Self::Ints(_))
    }
}

/// Identifiers of a device that a cloud provider or webhook matches against its metadata
/// (upstream's `cloudprovider.DeviceIdentifiers`, same JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DeviceIds {
    #[serde(rename = "mac_address", default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(rename = "pci_address", default, skip_serializing_if = "String::is_empty")]
    pub pci_address: String,
    #[serde(default)]
    pub name: String,
}

impl DeviceIds {
    /// From a device's attributes, as upstream: `name` is its `dra.net/ifName`, `mac` its
    /// `dra.net/mac`, `pci_address` its `dra.net/pciAddress`.
    #[must_use]
    pub fn of(d: &Device) -> Self {
        let s = |k: &str| match d.attributes.get(k) {
            Some(AttrValue::String(v)) => v.clone(),
            _ => String::new(),
        };
        Self {
            mac: s(attr::MAC),
            pci_address: s(attr::PCI_ADDRESS),
            name: s(attr::IF_NAME),
        }
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.mac.is_empty() && self.pci_address.is_empty() && self.name.is_empty()
    }
}

/// More attributes for a device (the cloud provider's): called during a scan, on a blocking
/// thread.
pub trait DeviceAttributeSource: Send + Sync + std::fmt::Debug {
    fn attributes(&self, ids: &DeviceIds) -> BTreeMap<String, AttrValue>;
}

/// The API's limit of attributes (and capacities) per device.
pub const MAX_ATTRIBUTES: usize = 32;

/// One allocatable device: its slice name and attributes, plus what Prepare needs to find it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Device {
    /// DNS label: the ifname, `net-<base32>` or `pci-dddd-bb-dd-f`.
    pub name: String,
    /// Shared with earlier scans' entries of the device while it is unchanged ([`Shared`]).
    pub attributes: Shared<BTreeMap<String, AttrValue>>,
    /// Host netdev name (none for RDMA-only devices).
    pub ifname: Option<String>,
    pub pci_address: Option<String>,
    /// Permanent MAC when known, else the current one.
    pub mac: Option<String>,
    pub rdma_device: Option<String>,
    pub char_devices: Vec<CharDevice>,
    /// Current MTU of the netdev.
    pub mtu: Option<u32>,
    /// MTU of the physical function, for an SR-IOV VF (a VF's MTU may not exceed it).
    pub pf_mtu: Option<u32>,
    /// All global-unicast addresses of the netdev (the attributes are capped at 64 bytes).
    pub addresses: Vec<String>,
    /// Host routes through the netdev (see [`LinkRecord::routes`]).
    pub routes: Vec<crate::config::RouteConfig>,
    /// Host rules that look up one of the tables of [`Device::routes`].
    pub rules: Vec<crate::config::RuleConfig>,
    /// Permanent neighbour entries on the netdev.
    pub neighbors: Vec<crate::config::NeighborConfig>,
    /// Published from the kept attributes of a device in a pod that the scan did not see
    /// ([`HeldAttributes`]): in the slices, but not found by [`SharedInventory::get`] (Prepare
    /// rescans for the live device instead).
    pub held: bool,
    /// For a [`Device::held`] entry: why the link that has the device's name is not the device
    /// ([`Held::drop_impostors`]), which Prepare answers with.
    pub squatted: Option<String>,
}

impl Device {
    fn set(&mut self, key: &str, v: AttrValue) {
        self.attributes.insert(key.to_owned(), v);
    }

    fn set_str(&mut self, key: &str, v: impl Into<String>) {
        self.set(key, AttrValue::String(v.into()));
    }
}

/// How to scan.
#[derive(Debug)]
pub struct ScanOptions {
    /// Root of the sysfs tree for the PCI and RDMA parts (`/sys`).
    pub sysfs: Sysfs,
    /// Netns whose netdevs to list. For [`NetnsTarget::Path`] the per-netdev sysfs lookups are
    /// skipped (sysfs shows the host's view), so such netdevs are never PCI-merged.
    pub netns: NetnsTarget,
    /// `--move-ib-interfaces`: false skips IPoIB netdevs (the device stays RDMA-only).
    pub move_ib_interfaces: bool,
    /// Vendor/device names (default: [`PciIds::load_default`]); IDs the database does not know
    /// are published as `unknown`, as upstream.
    pub pci_ids: PciIds,
    pub filter: Option<Filter>,
    /// Upstream's `DRAListTypeAttributes` gate: `resource.kubernetes.io/numaNode` as an int
    /// list (the physical node, then the equally near nodes of its socket).
    pub numa_list: bool,
    /// Cloud attributes (added before the filter runs, as upstream).
    pub extra: Option<std::sync::Arc<dyn DeviceAttributeSource>>,
    /// Also list the uplinks (the default-route holders and their master descendants), which
    /// are never published (`dranet inventory --with-uplinks`, for a look at them).
    pub keep_uplinks: bool,
}

impl Default for ScanOptions {
    fn default() -> Self {
        Self {
            sysfs: Sysfs::default(),
            netns: NetnsTarget::Current,
            move_ib_interfaces: true,
            pci_ids: PciIds::load_default(),
            filter: None,
            numa_list: false,
            extra: None,
            keep_uplinks: false,
        }
    }
}

const SKIPPED_NETDEVS: [&str; 3] = ["cilium_net", "cilium_host", "docker0"];

/// Reads the kernel and returns the devices, sorted by name. Blocking.
pub fn scan(opts: &ScanOptions) -> Result<Vec<Device>, InventoryError> {
    let net = netlink::scan(&opts.netns)?;
    Ok(build_devices(&net, opts))
}

/// Merges sysfs PCI/RDMA devices and netdevs into published devices, sorted by name.
#[must_use]
pub fn build_devices(net: &NetScan, opts: &ScanOptions) -> Vec<Device> {
    let sysfs = &opts.sysfs;
    let host_view = opts.netns == NetnsTarget::Current;
    let rdma = sysfs.rdma_devices();
    let pci_opts = PciAttrs {
        ids: &opts.pci_ids,
        sysfs,
        numa_arch: sysfs.numa_architecture(),
        numa_list: opts.numa_list,
    };
    let mut pci: BTreeMap<String, Device> = BTreeMap::new();
    for p in sysfs.network_pci_devices() {
        let mut d = pci_device(&p, &pci_opts);
        if let Some(r) = rdma.iter().find(|r| r.pci_address.as_deref() == Some(&p.address)) {
            set_rdma(&mut d, r);
        }
        pci.insert(p.address.clone(), d);
    }
    // RDMA devices without a (usable) PCI network function: IB-only devices.
    for r in &rdma {
        let addr = r.pci_address.clone();
        if addr.as_ref().is_some_and(|a| pci.contains_key(a)) {
            continue;
        }
        let mut d = match addr.as_deref().and_then(|a| sysfs.pci_info(a)) {
            Some(info) => pci_device(&info, &pci_opts),
            None => Device {
                name: netdev_device_name(&r.name),
                ..Device::default()
            },
        };
        set_rdma(&mut d, r);
        pci.insert(addr.unwrap_or_else(|| r.name.clone()), d);
    }
    let mut removed_pci: BTreeSet<String> = BTreeSet::new();
    let mut netdevs: Vec<Device> = Vec::new();
    for link in &net.links {
        if link.loopback || link.name.is_empty() || SKIPPED_NETDEVS.contains(&link.name.as_str()) {
            continue;
        }
        if !opts.move_ib_interfaces && link.kind == "ipoib" {
            continue;
        }
        let pci_addr = host_view.then(|| sysfs.netdev_pci_address(&link.name)).flatten();
        if net.uplinks.contains(&link.index) && !opts.keep_uplinks {
            if let Some(a) = pci_addr {
                removed_pci.insert(a);
            }
            continue;
        }
        let is_virtual = host_view
            .then(|| sysfs.netdev_is_virtual(&link.name))
            .flatten()
            .unwrap_or(link.kind != "device");
        let sriov = if host_view {
            sysfs.netdev_sriov(&link.name)
        } else {
            sysfs::NetdevSriov::default()
        };
        match (&pci_addr, pci_addr.as_ref().and_then(|a| pci.get_mut(a))) {
            (_, Some(d)) if d.ifname.is_none() => {
                set_link(d, link, is_virtual, sriov);
                d.pf_mtu = sysfs.netdev_pf_mtu(&link.name);
                if d.rdma_device.is_none()
                    && let Some(r) = sysfs.netdev_rdma_device(&link.name)
                {
                    d.rdma_device = Some(r.clone());
                    d.set(attr::RDMA, AttrValue::Bool(true));
                    d.set_str(attr::RDMA_DEVICE, r);
                }
            }
            (_, Some(_)) => {} // a second netdev of the same PCI function: the first one wins
            (Some(a), None) => {
                // As upstream: a PCI netdev whose function is not a published PCI device (not
                // class 0x02, no usable driver) is not published.
                tracing::debug!(ifname = %link.name, pci = %a, "netdev of an unpublished PCI function: skipped");
            }
            (None, None) => {
                let mut d = Device {
                    name: netdev_device_name(&link.name),
                    ..Device::default()
                };
                d.set(attr::RDMA, AttrValue::Bool(false));
                set_link(&mut d, link, is_virtual, sriov);
                netdevs.push(d);
            }
        }
    }
    let mut out: Vec<Device> = pci
        .into_iter()
        .filter(|(a, _)| !removed_pci.contains(a))
        .map(|(_, d)| d)
        .chain(netdevs)
        .map(|mut d| {
            if let Some(extra) = &opts.extra {
                add_extra(&mut d, extra.as_ref());
            }
            d
        })
        .filter(|d| opts.filter.as_ref().is_none_or(|f| f.keep(d)))
        .collect();
    for d in &mut out {
        let tables: BTreeSet<i64> = d.routes.iter().map(|r| r.table).filter(|t| *t != 0).collect();
        d.rules = net
            .rules
            .iter()
            .filter(|r| tables.contains(&r.table))
            .cloned()
            .collect();
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup_by(|a, b| a.name == b.name);
    out
}

/// Adds a source's attributes (they replace the device's own of the same name, as upstream),
/// within the API's 32 per device: what does not fit is left out (upstream's slice would be
/// refused), with a warning the first time.
fn add_extra(d: &mut Device, extra: &dyn DeviceAttributeSource) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let ids = DeviceIds::of(d);
    if ids.is_empty() {
        return;
    }
    let mut dropped = Vec::new();
    for (k, v) in extra.attributes(&ids) {
        if d.attributes.contains_key(&k) || d.attributes.len() < MAX_ATTRIBUTES {
            d.attributes.insert(k, v);
        } else {
            dropped.push(k);
        }
    }
    if !dropped.is_empty() && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(device = %d.name, ?dropped, "cloud attributes left out: a device has at most {MAX_ATTRIBUTES} attributes");
    }
}

/// What the PCI attributes of a device need besides its [`PciInfo`].
struct PciAttrs<'a> {
    ids: &'a PciIds,
    sysfs: &'a Sysfs,
    /// ghw's view: more (or fewer) than one NUMA node.
    numa_arch: bool,
    numa_list: bool,
}

/// The attributes upstream gives every device with a PCI address (`addPCIAttributes`): the
/// address, vendor, device and subsystem, the legacy NUMA node (only on a NUMA machine, as ghw
/// reports it), the standard NUMA node (scalar, or the list with `DRAListTypeAttributes`) and
/// PCIe root, and `rdma` (false until an RDMA device is found). SR-IOV attributes come with
/// the netdev ([`set_link`]).
fn pci_device(p: &PciInfo, o: &PciAttrs<'_>) -> Device {
    let mut d = Device {
        name: pci_device_name(&p.address),
        pci_address: Some(p.address.clone()),
        ..Device::default()
    };
    d.set_str(attr::PCI_ADDRESS, p.address.clone());
    // Upstream's slice would be refused for a name over 64 bytes: cut it instead.
    let (vendor, device) = o.ids.attributes(&p.vendor_id, &p.device_id);
    d.set_str(attr::PCI_VENDOR, truncate(&vendor));
    d.set_str(attr::PCI_DEVICE, truncate(&device));
    if !p.subsystem_id.is_empty() {
        d.set_str(attr::PCI_SUBSYSTEM, p.subsystem_id.clone());
    }
    if let Some(n) = p.numa_node {
        if o.numa_arch {
            d.set(attr::NUMA_NODE, AttrValue::Int(n));
        }
        let std = if o.numa_list {
            AttrValue::Ints(o.sysfs.numa_node_list(n))
        } else {
            AttrValue::Int(n)
        };
        d.set(attr::STD_NUMA_NODE, std);
    }
    if let Some(root) = &p.pcie_root {
        d.set_str(attr::STD_PCIE_ROOT, root.clone());
    }
    d.set(attr::RDMA, AttrValue::Bool(false));
    d
}

fn set_rdma(d: &mut Device, r: &RdmaInfo) {
    d.rdma_device = Some(r.name.clone());
    d.char_devices.clone_from(&r.char_devices);
    d.set(attr::RDMA, AttrValue::Bool(true));
    d.set_str(attr::RDMA_DEVICE, r.name.clone());
}

/// The netdev's attributes (upstream's `addLinkAttributes`).
fn set_link(d: &mut Device, l: &LinkRecord, is_virtual: bool, sriov: sysfs::NetdevSriov) {
    d.ifname = Some(l.name.clone());
    d.mtu = l.mtu;
    d.addresses = l.ipv4.iter().chain(&l.ipv6).cloned().collect();
    d.routes.clone_from(&l.routes);
    d.neighbors.clone_from(&l.neighbors);
    d.mac = l.perm_mac.clone().or_else(|| l.mac.clone());
    d.set_str(attr::IF_NAME, l.name.clone());
    d.set_str(attr::MAC, l.hardware_addr.clone());
    if let Some(mtu) = l.mtu {
        d.set(attr::MTU, AttrValue::Int(i64::from(mtu)));
    }
    d.set_str(attr::ENCAPSULATION, l.encapsulation.clone());
    d.set_str(attr::ALIAS, truncate(l.alias.as_deref().unwrap_or("")));
    d.set_str(attr::STATE, l.operstate.clone());
    d.set_str(attr::TYPE, l.kind.clone());
    if !l.ipv4.is_empty() {
        d.set_str(attr::IPV4, capped_join(&l.ipv4));
    }
    if !l.ipv6.is_empty() {
        d.set_str(attr::IPV6, capped_join(&l.ipv6));
    }
    d.set(attr::VIRTUAL, AttrValue::Bool(is_virtual));
    d.set(attr::EBPF, AttrValue::Bool(l.ebpf));
    d.set(attr::SRIOV, AttrValue::Bool(sriov.total_vfs > 0));
    if sriov.total_vfs > 0 {
        d.set(attr::SRIOV_VFS, AttrValue::Int(sriov.num_vfs));
    }
    if sriov.is_vf {
        d.set(attr::IS_SRIOV_VF, AttrValue::Bool(true));
    }
    if !l.tc_filter_names.is_empty() {
        d.set_str(attr::TC_FILTER_NAMES, capped_join(&l.tc_filter_names));
    }
    if !l.tcx_program_names.is_empty() {
        d.set_str(attr::TCX_PROGRAM_NAMES, capped_join(&l.tcx_program_names));
    }
}

/// Cuts a string to at most [`MAX_ATTRIBUTE_LEN`] bytes on a char boundary.
fn truncate(s: &str) -> String {
    crate::text::cut_at_char(s, MAX_ATTRIBUTE_LEN).to_owned()
}

/// One scan's devices, shared rather than copied: the inventory, the slice controller's last
/// published set and the held-attributes memory hold the same list (1,024 devices are about
/// 0.8 MiB each copy), and a device unchanged since an earlier scan is that scan's entry
/// ([`HeldAttributes::apply`]).
pub type DeviceList = Arc<Vec<Shared<Device>>>;

/// A [`DeviceList`] of `devices`.
pub fn list_of<D: Into<Shared<Device>>>(devices: impl IntoIterator<Item = D>) -> DeviceList {
    Arc::new(devices.into_iter().map(Into::into).collect())
}

/// What a scan gives: the shared list itself, or plain devices (tests, the simulator).
pub trait IntoDeviceList {
    fn into_list(self) -> DeviceList;
}

impl IntoDeviceList for DeviceList {
    fn into_list(self) -> DeviceList {
        self
    }
}

impl IntoDeviceList for Vec<Device> {
    fn into_list(self) -> DeviceList {
        list_of(self)
    }
}

/// The latest inventory, shared between the publisher and Prepare.
#[derive(Clone, Debug, Default)]
pub struct SharedInventory {
    devices: Arc<RwLock<DeviceList>>,
}

impl SharedInventory {
    #[must_use]
    pub fn new(devices: Vec<Device>) -> Self {
        Self {
            devices: Arc::new(RwLock::new(list_of(devices))),
        }
    }

    /// Replaces the devices; returns true when they changed.
    pub fn replace(&self, devices: impl IntoDeviceList) -> bool {
        let devices = devices.into_list();
        let mut g = match self.devices.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let changed = **g != *devices;
        *g = devices;
        changed
    }

    #[must_use]
    pub fn snapshot(&self) -> Vec<Device> {
        self.current().iter().map(|d| (**d).clone()).collect()
    }

    /// The current list itself (no copy).
    #[must_use]
    pub fn current(&self) -> DeviceList {
        match self.devices.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Why device `name` is published but not to be prepared: another link holds its host
    /// name ([`Device::squatted`]).
    #[must_use]
    pub fn squatted(&self, name: &str) -> Option<String> {
        let g = match self.devices.read() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        g.iter()
            .find(|d| d.name == name && d.held)
            .and_then(|d| d.squatted.clone())
    }

    /// A device the scan saw (not one only kept for the slices).
    #[must_use]
    pub fn get(&self, name: &str) -> Option<Device> {
        let g = match self.devices.read() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        g.iter()
            .find(|d| d.name == name && !d.held)
            .map(|d| (**d).clone())
    }
}

#[cfg(test)]
mod parity_tests;
#[cfg(test)]
mod tests;
