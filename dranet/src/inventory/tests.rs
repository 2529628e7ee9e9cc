use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;
use crate::test_support::{TempDir, symlink_at as link, write_file as write};

/// A fixture sysfs tree in a unique temp dir, removed on drop.
struct Fixture {
    root: PathBuf,
    _dir: TempDir,
}

fn pci_fn(root: &Path, bus: &str, addr: &str, class: &str, driver: Option<&str>) -> PathBuf {
    let dir = root.join("devices").join(bus).join(addr);
    write(&dir.join("class"), &format!("{class}\n"));
    write(&dir.join("vendor"), "0x15b3\n");
    write(&dir.join("device"), "0x101B\n");
    write(&dir.join("subsystem_device"), "0x0001\n");
    write(&dir.join("numa_node"), "1\n");
    if let Some(drv) = driver {
        std::fs::create_dir_all(root.join("bus/pci/drivers").join(drv)).unwrap();
        link(&format!("../../../bus/pci/drivers/{drv}"), &dir.join("driver"));
    }
    link(
        &format!("../../../devices/{bus}/{addr}"),
        &root.join("bus/pci/devices").join(addr),
    );
    dir
}

fn fixture() -> Fixture {
    let dir = TempDir::new("sysfs");
    let root = dir.path().to_path_buf();
    // A Mellanox PF with SR-IOV, netdev ens1 and RDMA device mlx5_0.
    let nic = pci_fn(&root, "pci0000:10", "0000:10:1b.0", "0x020000", Some("mlx5_core"));
    write(&nic.join("sriov_totalvfs"), "8\n");
    write(&nic.join("sriov_numvfs"), "2\n");
    std::fs::create_dir_all(nic.join("net/ens1")).unwrap();
    link("../../../0000:10:1b.0", &nic.join("net/ens1/device"));
    link(
        "../../devices/pci0000:10/0000:10:1b.0/net/ens1",
        &root.join("class/net/ens1"),
    );
    std::fs::create_dir_all(nic.join("infiniband/mlx5_0")).unwrap();
    link("../../../0000:10:1b.0", &nic.join("infiniband/mlx5_0/device"));
    link(
        "../../devices/pci0000:10/0000:10:1b.0/infiniband/mlx5_0",
        &root.join("class/infiniband/mlx5_0"),
    );
    write(&root.join("class/infiniband_verbs/uverbs0/ibdev"), "mlx5_0\n");
    write(&root.join("class/infiniband_verbs/uverbs0/dev"), "231:192\n");
    write(&root.join("class/infiniband_mad/umad0/ibdev"), "mlx5_0\n");
    write(&root.join("class/infiniband_mad/umad0/dev"), "231:0\n");
    write(&root.join("class/infiniband_mad/issm0/ibdev"), "mlx5_0\n");
    write(&root.join("class/infiniband_mad/issm0/dev"), "231:64\n");
    write(&root.join("class/infiniband_verbs/uverbs1/ibdev"), "erdma_0\n");
    write(&root.join("class/infiniband_verbs/uverbs1/dev"), "231:193\n");
    write(&root.join("class/misc/rdma_cm/dev"), "10:58\n");
    write(&nic.join("net/ens1/mtu"), "9000\n");
    // One of its VFs, netdev ens1v0.
    let vf = pci_fn(&root, "pci0000:10", "0000:10:1b.1", "0x020000", Some("mlx5_core"));
    link("../0000:10:1b.0", &vf.join("physfn"));
    std::fs::create_dir_all(vf.join("net/ens1v0")).unwrap();
    link("../../../0000:10:1b.1", &vf.join("net/ens1v0/device"));
    link(
        "../../devices/pci0000:10/0000:10:1b.1/net/ens1v0",
        &root.join("class/net/ens1v0"),
    );
    // A NIC bound to vfio-pci: not allocatable.
    pci_fn(&root, "pci0000:20", "0000:20:00.0", "0x020000", Some("vfio-pci"));
    // A NIC without driver: not allocatable.
    pci_fn(&root, "pci0000:20", "0000:20:00.1", "0x020000", None);
    // An eRDMA function (class 0x00ff): IB-only device.
    let erdma = pci_fn(&root, "pci0000:30", "0000:30:00.0", "0x00ff00", Some("erdma"));
    std::fs::create_dir_all(erdma.join("infiniband/erdma_0")).unwrap();
    link("../../../0000:30:00.0", &erdma.join("infiniband/erdma_0/device"));
    link(
        "../../devices/pci0000:30/0000:30:00.0/infiniband/erdma_0",
        &root.join("class/infiniband/erdma_0"),
    );
    // The uplink NIC with eth0.
    let up = pci_fn(
        &root,
        "pci0000:40",
        "0000:40:00.0",
        "0x020000",
        Some("virtio-pci"),
    );
    write(&up.join("numa_node"), "-1\n");
    std::fs::create_dir_all(up.join("virtio0/net/eth0")).unwrap();
    link("../../../virtio0", &up.join("virtio0/net/eth0/device"));
    link(
        "../../devices/pci0000:40/0000:40:00.0/virtio0/net/eth0",
        &root.join("class/net/eth0"),
    );
    // A virtual dummy.
    std::fs::create_dir_all(root.join("devices/virtual/net/dummy1")).unwrap();
    link("../../devices/virtual/net/dummy1", &root.join("class/net/dummy1"));
    Fixture { root, _dir: dir }
}

fn rec(index: u32, name: &str, kind: &str) -> LinkRecord {
    LinkRecord {
        index,
        name: name.into(),
        kind: kind.into(),
        mac: Some(format!("02:00:00:00:00:{index:02x}")),
        hardware_addr: format!("02:00:00:00:00:{index:02x}"),
        mtu: Some(1500),
        encapsulation: "ether".into(),
        operstate: "up".into(),
        ..LinkRecord::default()
    }
}

fn netscan() -> NetScan {
    let mut lo = rec(1, "lo", "device");
    lo.loopback = true;
    let mut ens1 = rec(2, "ens1", "device");
    ens1.ipv4 = vec!["192.168.10.2/24".into()];
    ens1.perm_mac = Some("b8:ce:f6:00:00:01".into());
    ens1.routes = vec![crate::config::RouteConfig {
        destination: "10.20.0.0/16".into(),
        gateway: "192.168.10.1".into(),
        table: 100,
        ..Default::default()
    }];
    let mut eth0 = rec(5, "eth0", "device");
    eth0.ipv4 = vec!["10.0.0.5/24".into()];
    let mut slave = rec(7, "bondslave", "veth");
    slave.master = Some(5);
    NetScan {
        links: vec![
            lo,
            ens1,
            rec(3, "dummy1", "dummy"),
            rec(4, "docker0", "bridge"),
            eth0,
            rec(6, "eth0.100", "vlan"),
            slave,
            rec(8, "veth1", "veth"),
            rec(10, "ens1v0", "device"),
        ],
        uplinks: [5, 7].into(),
        rules: vec![
            crate::config::RuleConfig {
                priority: 100,
                source: "192.168.10.0/24".into(),
                table: 100,
                ..Default::default()
            },
            crate::config::RuleConfig {
                priority: 200,
                table: 200,
                ..Default::default()
            },
        ],
    }
}

fn opts(fx: &Fixture) -> ScanOptions {
    ScanOptions {
        sysfs: Sysfs::new(&fx.root),
        pci_ids: PciIds::default(),
        ..ScanOptions::default()
    }
}

fn s(v: &str) -> AttrValue {
    AttrValue::String(v.into())
}

#[test]
fn sysfs_pci_and_rdma_readers() {
    let fx = fixture();
    let sys = Sysfs::new(&fx.root);
    let pcis = sys.network_pci_devices();
    let addrs: Vec<&str> = pcis.iter().map(|p| p.address.as_str()).collect();
    assert_eq!(addrs, ["0000:10:1b.0", "0000:10:1b.1", "0000:40:00.0"]);
    assert!(pcis[1].is_vf);
    assert_eq!(sys.netdev_pf_mtu("ens1v0"), Some(9000));
    assert_eq!(sys.netdev_pf_mtu("ens1"), None);
    let p = &pcis[0];
    assert_eq!(p.vendor_id, "15b3");
    assert_eq!(p.device_id, "101b");
    assert_eq!(p.numa_node, Some(1));
    assert_eq!(p.pcie_root.as_deref(), Some("pci0000:10"));
    assert_eq!(p.sriov_total_vfs, Some(8));
    assert!(!p.is_vf);
    assert_eq!(pcis[2].numa_node, None);
    assert_eq!(sys.netdev_pci_address("ens1").as_deref(), Some("0000:10:1b.0"));
    assert_eq!(sys.netdev_pci_address("eth0").as_deref(), Some("0000:40:00.0"));
    assert_eq!(sys.netdev_pci_address("dummy1"), None);
    assert_eq!(sys.netdev_is_virtual("dummy1"), Some(true));
    assert_eq!(sys.netdev_is_virtual("ens1"), Some(false));
    let rdma = sys.rdma_devices();
    assert_eq!(rdma.len(), 2);
    assert_eq!(rdma[1].name, "mlx5_0");
    assert_eq!(rdma[1].pci_address.as_deref(), Some("0000:10:1b.0"));
    let paths: Vec<&str> = rdma[1].char_devices.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/dev/infiniband/issm0",
            "/dev/infiniband/rdma_cm",
            "/dev/infiniband/umad0",
            "/dev/infiniband/uverbs0"
        ]
    );
    let uverbs = &rdma[1].char_devices[3];
    assert_eq!(
        (uverbs.major, uverbs.minor, uverbs.kind.as_str()),
        (231, 192, "c")
    );
}

#[test]
fn devices_merge_pci_rdma_and_netdevs() {
    let fx = fixture();
    let devs = build_devices(&netscan(), &opts(&fx));
    let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
    // lo, docker0 skipped; eth0 (uplink) takes its PCI device with it; its bond slave too.
    assert_eq!(
        names,
        [
            "dummy1",
            "net-mv2gqmbogeyda",
            "pci-0000-10-1b-0",
            "pci-0000-10-1b-1",
            "pci-0000-30-00-0",
            "veth1"
        ]
    );
    let vf = &devs[3];
    assert_eq!(vf.attributes[attr::IS_SRIOV_VF], AttrValue::Bool(true));
    assert_eq!(vf.pf_mtu, Some(9000));
    assert_eq!(vf.ifname.as_deref(), Some("ens1v0"));

    let nic = &devs[2];
    let a = &nic.attributes;
    assert_eq!(a[attr::PCI_ADDRESS], s("0000:10:1b.0"));
    // No pci.ids in these options: upstream's placeholder, never hex.
    assert_eq!(a[attr::PCI_VENDOR], s("unknown"));
    assert_eq!(a[attr::PCI_DEVICE], s("unknown"));
    assert_eq!(a[attr::PCI_SUBSYSTEM], s("0001"));
    assert_eq!(a[attr::NUMA_NODE], AttrValue::Int(1));
    assert_eq!(a[attr::STD_NUMA_NODE], AttrValue::Int(1));
    assert_eq!(a[attr::STD_PCIE_ROOT], s("pci0000:10"));
    assert_eq!(a[attr::SRIOV], AttrValue::Bool(true));
    assert_eq!(a[attr::SRIOV_VFS], AttrValue::Int(2));
    assert!(!a.contains_key(attr::IS_SRIOV_VF));
    assert_eq!(a[attr::RDMA], AttrValue::Bool(true));
    assert_eq!(a[attr::RDMA_DEVICE], s("mlx5_0"));
    assert_eq!(a[attr::IF_NAME], s("ens1"));
    assert_eq!(a[attr::MAC], s("02:00:00:00:00:02"));
    assert_eq!(a[attr::MTU], AttrValue::Int(1500));
    assert_eq!(a[attr::TYPE], s("device"));
    assert_eq!(a[attr::STATE], s("up"));
    assert_eq!(a[attr::ENCAPSULATION], s("ether"));
    assert_eq!(a[attr::IPV4], s("192.168.10.2/24"));
    assert_eq!(a[attr::VIRTUAL], AttrValue::Bool(false));
    assert_eq!(nic.ifname.as_deref(), Some("ens1"));
    assert_eq!(nic.mac.as_deref(), Some("b8:ce:f6:00:00:01"));
    assert_eq!(nic.rdma_device.as_deref(), Some("mlx5_0"));
    assert_eq!(nic.char_devices.len(), 4);
    assert_eq!(nic.addresses, ["192.168.10.2/24"]);
    assert_eq!(nic.rules.len(), 1, "only rules for the tables of its routes");
    assert_eq!(nic.rules[0].table, 100);
    assert_eq!(nic.mtu, Some(1500));
    assert_eq!(nic.pf_mtu, None);

    let ib = &devs[4];
    assert_eq!(ib.ifname, None);
    assert_eq!(ib.attributes[attr::RDMA_DEVICE], s("erdma_0"));
    assert_eq!(ib.attributes[attr::PCI_ADDRESS], s("0000:30:00.0"));
    assert!(!ib.attributes.contains_key(attr::IF_NAME));
    assert_eq!(ib.char_devices.len(), 2, "{:?}", ib.char_devices);

    let dummy = &devs[0];
    assert_eq!(dummy.attributes[attr::VIRTUAL], AttrValue::Bool(true));
    assert_eq!(dummy.attributes[attr::RDMA], AttrValue::Bool(false));
    assert!(!dummy.attributes.contains_key(attr::PCI_ADDRESS));
    // As upstream: every netdev says whether it is SR-IOV capable; a device without a host
    // netdev (IB-only here) does not.
    assert_eq!(dummy.attributes[attr::SRIOV], AttrValue::Bool(false));
    assert!(!ib.attributes.contains_key(attr::SRIOV));
    // Not in sysfs: virtual from the link kind.
    assert_eq!(devs[1].attributes[attr::IF_NAME], s("eth0.100"));
    assert_eq!(devs[1].attributes[attr::VIRTUAL], AttrValue::Bool(true));
    for d in &devs {
        assert!(is_dns_label(&d.name), "{}", d.name);
        assert!(d.attributes.len() <= 32);
    }
}

#[test]
fn filter_and_ipoib_options() {
    let fx = fixture();
    let mut o = opts(&fx);
    o.filter = Filter::compile(DEFAULT_FILTER).unwrap();
    let devs = build_devices(&netscan(), &o);
    assert!(devs.iter().all(|d| d.name != "veth1"));
    assert!(devs.iter().any(|d| d.name == "dummy1"));

    let mut net = netscan();
    net.links.push(rec(9, "ib0", "ipoib"));
    o.move_ib_interfaces = false;
    assert!(build_devices(&net, &o).iter().all(|d| d.name != "ib0"));
    o.move_ib_interfaces = true;
    assert!(build_devices(&net, &o).iter().any(|d| d.name == "ib0"));
}

#[test]
fn pci_ids_names_are_used() {
    let fx = fixture();
    let mut o = opts(&fx);
    o.pci_ids = PciIds::parse(
        "# comment\n15b3  Mellanox Technologies\n\t101b  MT28908 Family [ConnectX-6]\n\t\t15b3 0001  sub\nC 02  Network controller\n\t00  Ethernet controller\n",
    );
    let devs = build_devices(&netscan(), &o);
    let nic = devs.iter().find(|d| d.name == "pci-0000-10-1b-0").unwrap();
    assert_eq!(nic.attributes[attr::PCI_VENDOR], s("Mellanox Technologies"));
    assert_eq!(nic.attributes[attr::PCI_DEVICE], s("MT28908 Family [ConnectX-6]"));
}

#[test]
fn pci_address_parsing() {
    assert!(is_pci_address("0000:10:1b.0"));
    assert!(!is_pci_address("0000:10:1b"));
    assert!(!is_pci_address("pci0000:10"));
    assert_eq!(
        pci_address_of(Path::new(
            "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.1/net/x"
        ))
        .as_deref(),
        Some("0000:01:00.1")
    );
    assert_eq!(pci_address_of(Path::new("/sys/devices/virtual/net/x")), None);
}

#[test]
fn attr_values_serialise_like_the_api() {
    assert_eq!(serde_json::to_string(&s("x")).unwrap(), r#"{"string":"x"}"#);
    assert_eq!(serde_json::to_string(&AttrValue::Int(3)).unwrap(), r#"{"int":3}"#);
    assert_eq!(
        serde_json::to_string(&AttrValue::Bool(true)).unwrap(),
        r#"{"bool":true}"#
    );
    assert_eq!(
        serde_json::to_string(&AttrValue::Version("1.2.3".into())).unwrap(),
        r#"{"version":"1.2.3"}"#
    );
}

#[test]
fn shared_inventory_reports_changes() {
    let inv = SharedInventory::default();
    let d = Device {
        name: "a".into(),
        ..Device::default()
    };
    assert!(inv.replace(vec![d.clone()]));
    assert!(!inv.replace(vec![d.clone()]));
    assert_eq!(inv.get("a"), Some(d));
    assert_eq!(inv.get("b"), None);
}

/// A cloud: one attribute per device from its identifiers, plus 40 more for `dummy1`.
#[derive(Debug)]
struct Cloud;

impl DeviceAttributeSource for Cloud {
    fn attributes(&self, ids: &DeviceIds) -> BTreeMap<String, AttrValue> {
        let mut out = BTreeMap::from([(
            "example.com/ids".to_owned(),
            s(&format!("{}|{}|{}", ids.name, ids.mac, ids.pci_address)),
        )]);
        if ids.name == "dummy1" {
            for i in 0..40 {
                out.insert(format!("example.com/a{i:02}"), AttrValue::Int(i));
            }
        }
        out
    }
}

#[test]
fn cloud_attributes_join_before_the_filter_within_32() {
    let fx = fixture();
    let mut o = opts(&fx);
    o.extra = Some(std::sync::Arc::new(Cloud));
    o.filter = Filter::compile(r#"attributes["example.com/ids"].StringValue != "veth1|02:00:00:00:00:08|""#)
        .unwrap();
    let devs = build_devices(&netscan(), &o);
    assert!(
        devs.iter().all(|d| d.name != "veth1"),
        "the filter saw the cloud attribute"
    );
    let nic = devs.iter().find(|d| d.name == "pci-0000-10-1b-0").unwrap();
    assert_eq!(
        nic.attributes["example.com/ids"],
        s("ens1|02:00:00:00:00:02|0000:10:1b.0"),
        "upstream's identifiers: ifName, mac, pciAddress"
    );
    let ib = devs.iter().find(|d| d.name == "pci-0000-30-00-0").unwrap();
    assert_eq!(ib.attributes["example.com/ids"], s("||0000:30:00.0"));
    let dummy = devs.iter().find(|d| d.name == "dummy1").unwrap();
    assert_eq!(dummy.attributes.len(), MAX_ATTRIBUTES);
}

#[test]
fn uplinks_are_listed_only_when_asked() {
    let fx = fixture();
    let mut o = opts(&fx);
    assert!(
        build_devices(&netscan(), &o)
            .iter()
            .all(|d| d.name != "pci-0000-40-00-0")
    );
    o.keep_uplinks = true;
    let devs = build_devices(&netscan(), &o);
    let up = devs.iter().find(|d| d.name == "pci-0000-40-00-0").unwrap();
    assert_eq!(up.attributes[attr::IF_NAME], s("eth0"));
}
