//! Every attribute dranet publishes for six fixture devices, compared with what upstream
//! (kubernetes-sigs/dranet at f258477: `pkg/inventory/db.go` `addLinkAttributes`,
//! `addPCIAttributes`, `addRDMAAttributes`, with ghw v0.25.0, pcidb and Kubernetes'
//! `deviceattribute` helpers) publishes for the same sysfs tree, links and pci.ids.
//!
//! The machine: four NUMA nodes (0 and 1 on socket 0, 2 on socket 1, 3 a CPU-less node), a
//! ConnectX-7 PF with SR-IOV and RoCE, one of its VFs, an EFA function (no netdev, an RDMA
//! device), a gVNIC, a virtio-net NIC without NUMA affinity and a dummy link.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;
use crate::test_support::{TempDir, symlink_at as link, write_file as write};

/// A fixture sysfs tree in a unique temp dir, removed on drop.
struct Fixture {
    root: PathBuf,
    _dir: TempDir,
}

/// A PCI function at `devices/<path>` (its last component is the address).
struct Pci<'a> {
    path: &'a str,
    ids: (&'a str, &'a str, &'a str),
    driver: &'a str,
    numa: &'a str,
}

impl Fixture {
    fn pci(&self, p: &Pci<'_>) -> PathBuf {
        let dir = self.root.join("devices").join(p.path);
        let addr = p.path.rsplit('/').next().unwrap();
        write(&dir.join("class"), "0x020000\n");
        write(&dir.join("vendor"), &format!("0x{}\n", p.ids.0));
        write(&dir.join("device"), &format!("0x{}\n", p.ids.1));
        write(&dir.join("subsystem_device"), &format!("0x{}\n", p.ids.2));
        write(&dir.join("numa_node"), &format!("{}\n", p.numa));
        std::fs::create_dir_all(self.root.join("bus/pci/drivers").join(p.driver)).unwrap();
        let depth = p.path.split('/').count() + 1;
        link(
            &format!("{}bus/pci/drivers/{}", "../".repeat(depth), p.driver),
            &dir.join("driver"),
        );
        link(
            &format!("../../../devices/{}", p.path),
            &self.root.join("bus/pci/devices").join(addr),
        );
        dir
    }

    /// Netdev `name` at `devices/<path>/net/<name>`, its `device` link `up` levels up.
    fn netdev(&self, path: &str, name: &str, device_up: usize) {
        let dir = self.root.join("devices").join(path).join("net").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        if device_up > 0 {
            let target = format!("{}{}", "../".repeat(device_up), "");
            link(target.trim_end_matches('/'), &dir.join("device"));
        }
        link(
            &format!("../../devices/{path}/net/{name}"),
            &self.root.join("class/net").join(name),
        );
    }

    fn rdma(&self, pci_path: &str, name: &str) {
        let dir = self
            .root
            .join("devices")
            .join(pci_path)
            .join("infiniband")
            .join(name);
        std::fs::create_dir_all(&dir).unwrap();
        link("../..", &dir.join("device"));
        link(
            &format!("../../devices/{pci_path}/infiniband/{name}"),
            &self.root.join("class/infiniband").join(name),
        );
    }
}

fn machine() -> Fixture {
    let dir = TempDir::new("parity");
    let root = dir.path().to_path_buf();
    let fx = Fixture { root, _dir: dir };
    let node = |n: u32, dist: &str, cpus: &str| {
        let d = fx.root.join(format!("devices/system/node/node{n}"));
        write(&d.join("distance"), &format!("{dist}\n"));
        write(&d.join("cpulist"), &format!("{cpus}\n"));
    };
    node(0, "10 12 20 20", "0");
    node(1, "12 10 20 20", "1");
    node(2, "20 20 10 12", "2");
    node(3, "20 20 12 10", "");
    write(&fx.root.join("devices/system/node/online"), "0-3\n");
    for (cpu, pkg) in [(0, 0), (1, 0), (2, 1)] {
        write(
            &fx.root.join(format!(
                "devices/system/cpu/cpu{cpu}/topology/physical_package_id"
            )),
            &format!("{pkg}\n"),
        );
    }
    // ConnectX-7 PF: SR-IOV with 2 of 16 VFs, netdev ens1f0np0, RoCE device mlx5_0.
    let pf = "pci0000:16/0000:16:02.0/0000:17:00.0";
    let d = fx.pci(&Pci {
        path: pf,
        ids: ("15b3", "1021", "0041"),
        driver: "mlx5_core",
        numa: "0",
    });
    write(&d.join("sriov_totalvfs"), "16\n");
    write(&d.join("sriov_numvfs"), "2\n");
    fx.netdev(pf, "ens1f0np0", 2);
    fx.rdma(pf, "mlx5_0");
    // Its VF: netdev ens1f0v0, RoCE device mlx5_2.
    let vf = "pci0000:16/0000:16:02.0/0000:17:00.2";
    let d = fx.pci(&Pci {
        path: vf,
        ids: ("15b3", "101e", "0041"),
        driver: "mlx5_core",
        numa: "0",
    });
    link("../0000:17:00.0", &d.join("physfn"));
    fx.netdev(vf, "ens1f0v0", 2);
    fx.rdma(vf, "mlx5_2");
    // EFA: no netdev, RDMA device rdmap16s27.
    let efa = "pci0000:10/0000:10:1b.0";
    fx.pci(&Pci {
        path: efa,
        ids: ("1d0f", "efa1", "efa1"),
        driver: "efa",
        numa: "1",
    });
    fx.rdma(efa, "rdmap16s27");
    // gVNIC eth1.
    let gvnic = "pci0000:00/0000:00:04.0";
    fx.pci(&Pci {
        path: gvnic,
        ids: ("1ae0", "0042", "0058"),
        driver: "gve",
        numa: "2",
    });
    fx.netdev(gvnic, "eth1", 2);
    // virtio-net eth2, under its virtio device, no NUMA affinity.
    let virtio = "pci0000:00/0000:00:03.0";
    fx.pci(&Pci {
        path: virtio,
        ids: ("1af4", "1041", "1100"),
        driver: "virtio-pci",
        numa: "-1",
    });
    fx.netdev(&format!("{virtio}/virtio3"), "eth2", 2);
    // dummy0.
    std::fs::create_dir_all(fx.root.join("devices/virtual/net/dummy0")).unwrap();
    link(
        "../../devices/virtual/net/dummy0",
        &fx.root.join("class/net/dummy0"),
    );
    fx
}

fn rec(index: u32, name: &str, mac: &str, mtu: u32) -> LinkRecord {
    LinkRecord {
        index,
        name: name.into(),
        kind: "device".into(),
        mac: Some(mac.into()),
        hardware_addr: mac.into(),
        mtu: Some(mtu),
        encapsulation: "ether".into(),
        operstate: "up".into(),
        ..LinkRecord::default()
    }
}

fn links() -> NetScan {
    let mut lo = rec(1, "lo", "00:00:00:00:00:00", 65536);
    lo.loopback = true;
    lo.kind = "device".into();
    lo.encapsulation = "loopback".into();
    let mut pf = rec(2, "ens1f0np0", "b8:3f:d2:00:00:01", 9000);
    pf.ipv4 = vec!["192.168.1.10/24".into()];
    let mut vf = rec(3, "ens1f0v0", "02:11:22:33:44:55", 1500);
    vf.operstate = "down".into();
    let mut gvnic = rec(4, "eth1", "42:01:0a:80:00:05", 1460);
    gvnic.ipv4 = vec!["10.128.0.5/32".into()];
    gvnic.alias = Some("gpu nic 1".into());
    let mut virtio = rec(5, "eth2", "52:54:00:12:34:56", 1500);
    virtio.ipv6 = vec!["fd00::5/64".into()];
    virtio.ebpf = true;
    virtio.tc_filter_names = vec!["cil_from_netdev".into()];
    let mut dummy = rec(6, "dummy0", "ae:2b:00:00:00:06", 1500);
    dummy.kind = "dummy".into();
    dummy.operstate = "unknown".into();
    NetScan {
        links: vec![lo, pf, vf, gvnic, virtio, dummy],
        ..NetScan::default()
    }
}

/// (name, type, value) of one attribute, as the API shows it.
type Row = (&'static str, &'static str, &'static str);

/// What upstream publishes, device by device (without `DRAListTypeAttributes`).
const UPSTREAM: &[(&str, &[Row])] = &[
    (
        "dummy0",
        &[
            ("dra.net/alias", "string", ""),
            ("dra.net/ebpf", "bool", "false"),
            ("dra.net/encapsulation", "string", "ether"),
            ("dra.net/ifName", "string", "dummy0"),
            ("dra.net/mac", "string", "ae:2b:00:00:00:06"),
            ("dra.net/mtu", "int", "1500"),
            ("dra.net/rdma", "bool", "false"),
            ("dra.net/sriov", "bool", "false"),
            ("dra.net/state", "string", "unknown"),
            ("dra.net/type", "string", "dummy"),
            ("dra.net/virtual", "bool", "true"),
        ],
    ),
    (
        // virtio-net: no NUMA affinity, so no NUMA attribute at all.
        "pci-0000-00-03-0",
        &[
            ("dra.net/alias", "string", ""),
            ("dra.net/ebpf", "bool", "true"),
            ("dra.net/encapsulation", "string", "ether"),
            ("dra.net/ifName", "string", "eth2"),
            ("dra.net/ipv6", "string", "fd00::5/64"),
            ("dra.net/mac", "string", "52:54:00:12:34:56"),
            ("dra.net/mtu", "int", "1500"),
            ("dra.net/pciAddress", "string", "0000:00:03.0"),
            ("dra.net/pciDevice", "string", "Virtio 1.0 network device"),
            ("dra.net/pciSubsystem", "string", "1100"),
            ("dra.net/pciVendor", "string", "Red Hat, Inc."),
            ("dra.net/rdma", "bool", "false"),
            ("dra.net/sriov", "bool", "false"),
            ("dra.net/state", "string", "up"),
            ("dra.net/tcFilterNames", "string", "cil_from_netdev"),
            ("dra.net/type", "string", "device"),
            ("dra.net/virtual", "bool", "false"),
            ("resource.kubernetes.io/pcieRoot", "string", "pci0000:00"),
        ],
    ),
    (
        "pci-0000-00-04-0",
        &[
            ("dra.net/alias", "string", "gpu nic 1"),
            ("dra.net/ebpf", "bool", "false"),
            ("dra.net/encapsulation", "string", "ether"),
            ("dra.net/ifName", "string", "eth1"),
            ("dra.net/ipv4", "string", "10.128.0.5/32"),
            ("dra.net/mac", "string", "42:01:0a:80:00:05"),
            ("dra.net/mtu", "int", "1460"),
            ("dra.net/numaNode", "int", "2"),
            ("dra.net/pciAddress", "string", "0000:00:04.0"),
            (
                "dra.net/pciDevice",
                "string",
                "Compute Engine Virtual Ethernet [gVNIC]",
            ),
            ("dra.net/pciSubsystem", "string", "0058"),
            ("dra.net/pciVendor", "string", "Google, Inc."),
            ("dra.net/rdma", "bool", "false"),
            ("dra.net/sriov", "bool", "false"),
            ("dra.net/state", "string", "up"),
            ("dra.net/type", "string", "device"),
            ("dra.net/virtual", "bool", "false"),
            ("resource.kubernetes.io/numaNode", "int", "2"),
            ("resource.kubernetes.io/pcieRoot", "string", "pci0000:00"),
        ],
    ),
    (
        // EFA: no netdev, so PCI and RDMA attributes only.
        "pci-0000-10-1b-0",
        &[
            ("dra.net/numaNode", "int", "1"),
            ("dra.net/pciAddress", "string", "0000:10:1b.0"),
            ("dra.net/pciDevice", "string", "Elastic Fabric Adapter (EFA)"),
            ("dra.net/pciSubsystem", "string", "efa1"),
            ("dra.net/pciVendor", "string", "Amazon.com, Inc."),
            ("dra.net/rdma", "bool", "true"),
            ("dra.net/rdmaDevice", "string", "rdmap16s27"),
            ("resource.kubernetes.io/numaNode", "int", "1"),
            ("resource.kubernetes.io/pcieRoot", "string", "pci0000:10"),
        ],
    ),
    (
        "pci-0000-17-00-0",
        &[
            ("dra.net/alias", "string", ""),
            ("dra.net/ebpf", "bool", "false"),
            ("dra.net/encapsulation", "string", "ether"),
            ("dra.net/ifName", "string", "ens1f0np0"),
            ("dra.net/ipv4", "string", "192.168.1.10/24"),
            ("dra.net/mac", "string", "b8:3f:d2:00:00:01"),
            ("dra.net/mtu", "int", "9000"),
            ("dra.net/numaNode", "int", "0"),
            ("dra.net/pciAddress", "string", "0000:17:00.0"),
            ("dra.net/pciDevice", "string", "MT2910 Family [ConnectX-7]"),
            ("dra.net/pciSubsystem", "string", "0041"),
            ("dra.net/pciVendor", "string", "Mellanox Technologies"),
            ("dra.net/rdma", "bool", "true"),
            ("dra.net/rdmaDevice", "string", "mlx5_0"),
            ("dra.net/sriov", "bool", "true"),
            ("dra.net/sriovVfs", "int", "2"),
            ("dra.net/state", "string", "up"),
            ("dra.net/type", "string", "device"),
            ("dra.net/virtual", "bool", "false"),
            ("resource.kubernetes.io/numaNode", "int", "0"),
            ("resource.kubernetes.io/pcieRoot", "string", "pci0000:16"),
        ],
    ),
    (
        // The VF: no sriov_totalvfs of its own, so sriov is false; isSriovVf is true.
        "pci-0000-17-00-2",
        &[
            ("dra.net/alias", "string", ""),
            ("dra.net/ebpf", "bool", "false"),
            ("dra.net/encapsulation", "string", "ether"),
            ("dra.net/ifName", "string", "ens1f0v0"),
            ("dra.net/isSriovVf", "bool", "true"),
            ("dra.net/mac", "string", "02:11:22:33:44:55"),
            ("dra.net/mtu", "int", "1500"),
            ("dra.net/numaNode", "int", "0"),
            ("dra.net/pciAddress", "string", "0000:17:00.2"),
            (
                "dra.net/pciDevice",
                "string",
                "ConnectX Family mlx5Gen Virtual Function",
            ),
            ("dra.net/pciSubsystem", "string", "0041"),
            ("dra.net/pciVendor", "string", "Mellanox Technologies"),
            ("dra.net/rdma", "bool", "true"),
            ("dra.net/rdmaDevice", "string", "mlx5_2"),
            ("dra.net/sriov", "bool", "false"),
            ("dra.net/state", "string", "down"),
            ("dra.net/type", "string", "device"),
            ("dra.net/virtual", "bool", "false"),
            ("resource.kubernetes.io/numaNode", "int", "0"),
            ("resource.kubernetes.io/pcieRoot", "string", "pci0000:16"),
        ],
    ),
];

/// With `DRAListTypeAttributes`, only `resource.kubernetes.io/numaNode` changes: (device,
/// list). Node 0 and 1 share a socket at distance 12; node 3 (no CPUs, socket unknown) is kept
/// for node 2.
const UPSTREAM_NUMA_LISTS: &[(&str, &[i64])] = &[
    ("pci-0000-00-04-0", &[2, 3]),
    ("pci-0000-10-1b-0", &[1, 0]),
    ("pci-0000-17-00-0", &[0, 1]),
    ("pci-0000-17-00-2", &[0, 1]),
];

fn as_row(v: &AttrValue) -> (&'static str, String) {
    match v {
        AttrValue::String(s) => ("string", s.clone()),
        AttrValue::Int(i) => ("int", i.to_string()),
        AttrValue::Bool(b) => ("bool", b.to_string()),
        AttrValue::Version(s) => ("version", s.clone()),
        AttrValue::Ints(v) => ("ints", format!("{v:?}")),
    }
}

fn scan(fx: &Fixture, numa_list: bool) -> Vec<Device> {
    let opts = ScanOptions {
        sysfs: Sysfs::new(&fx.root),
        pci_ids: PciIds::parse(include_str!("testdata/pci.ids")),
        numa_list,
        ..ScanOptions::default()
    };
    build_devices(&links(), &opts)
}

#[test]
fn every_attribute_of_six_devices_is_upstreams() {
    let fx = machine();
    let devs = scan(&fx, false);
    let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
    let want: Vec<&str> = UPSTREAM.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, want);
    for (d, (name, rows)) in devs.iter().zip(UPSTREAM) {
        let got: BTreeMap<&str, (&str, String)> = d
            .attributes
            .iter()
            .map(|(k, v)| (k.as_str(), as_row(v)))
            .collect();
        let want: BTreeMap<&str, (&str, String)> =
            rows.iter().map(|(k, t, v)| (*k, (*t, (*v).to_owned()))).collect();
        for (k, w) in &want {
            assert_eq!(got.get(k), Some(w), "{name}: {k}");
        }
        for k in got.keys() {
            assert!(want.contains_key(k), "{name}: {k} is not published upstream");
        }
    }
}

#[test]
fn numa_lists_with_the_gate_are_upstreams() {
    let fx = machine();
    let plain = scan(&fx, false);
    let listed = scan(&fx, true);
    let lists: BTreeMap<&str, &[i64]> = UPSTREAM_NUMA_LISTS.iter().copied().collect();
    for (p, l) in plain.iter().zip(&listed) {
        let mut p_attrs = p.attributes.clone();
        let mut l_attrs = l.attributes.clone();
        let std_numa = l_attrs.remove(attr::STD_NUMA_NODE);
        match lists.get(p.name.as_str()) {
            Some(want) => assert_eq!(std_numa, Some(AttrValue::Ints(want.to_vec())), "{}", p.name),
            None => assert_eq!(std_numa, None, "{}", p.name),
        }
        p_attrs.remove(attr::STD_NUMA_NODE);
        assert_eq!(p_attrs, l_attrs, "{}: only the NUMA list differs", p.name);
    }
}

#[test]
fn one_numa_node_publishes_no_legacy_numa_attribute() {
    let fx = machine();
    for n in 1..4 {
        std::fs::remove_dir_all(fx.root.join(format!("devices/system/node/node{n}"))).unwrap();
    }
    write(&fx.root.join("devices/system/node/node0/distance"), "10\n");
    let devs = scan(&fx, true);
    let pf = devs.iter().find(|d| d.name == "pci-0000-17-00-0").unwrap();
    // ghw reports an SMP machine: no dra.net/numaNode; the standard one stays.
    assert!(!pf.attributes.contains_key(attr::NUMA_NODE));
    assert_eq!(
        pf.attributes[attr::STD_NUMA_NODE],
        AttrValue::Ints(vec![0]),
        "a single node's list is itself"
    );
}
