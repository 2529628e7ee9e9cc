use super::*;
use crate::config::NetworkConfig;
use crate::plan::{ClaimRef, DevicePlan};
use netlink_packet_route::address::AddressAttribute;

#[test]
fn interface_names_follow_the_kernel_rules() {
    for ok in ["eth0", "net1", "a", "abcdefghijklmno", "ens1f0np0"] {
        validate_ifname(ok).unwrap();
    }
    for bad in [
        "",
        ".",
        "..",
        "abcdefghijklmnop",
        "a/b",
        "a:b",
        "a b",
        "tab\t",
        "x\n",
    ] {
        assert!(
            matches!(validate_ifname(bad), Err(LinkError::InvalidName { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn macs_and_cidrs_parse_strictly() {
    assert_eq!(parse_mac("02:d7:00:00:00:01").unwrap(), vec![2, 0xd7, 0, 0, 0, 1]);
    assert_eq!(
        parse_mac("02-D7-00-00-00-0A").unwrap(),
        vec![2, 0xd7, 0, 0, 0, 10]
    );
    for bad in [
        "",
        "02:d7:00:00:00",
        "02:d7:00:00:00:01:02",
        "0:d7:00:00:00:01",
        "zz:d7:00:00:00:01",
    ] {
        assert!(parse_mac(bad).is_err(), "{bad:?}");
    }
    assert_eq!(
        parse_cidr("10.1.2.3/24").unwrap(),
        ("10.1.2.3".parse().unwrap(), 24)
    );
    assert_eq!(parse_cidr("fd00::1/64").unwrap().1, 64);
    for bad in ["10.1.2.3", "10.1.2.3/33", "fd00::1/129", "x/24", "10.1.2.3/-1"] {
        assert!(parse_cidr(bad).is_err(), "{bad:?}");
    }
    assert_eq!(
        mac_string(&[2, 0xd7, 0, 0, 0, 1]).as_deref(),
        Some("02:d7:00:00:00:01")
    );
    assert_eq!(mac_string(&[0; 6]), None);
}

#[test]
fn temporary_names_are_valid_interface_names() {
    validate_ifname(&temp_name(u32::MAX)).unwrap();
    assert_eq!(temp_name(7), "dn7");
}

fn plan(config: &str) -> DevicePlan {
    DevicePlan {
        device: "eth9".into(),
        pool: "node".into(),
        request: "nic".into(),
        claim: ClaimRef::default(),
        host_ifname: Some("eth9".into()),
        pci_address: None,
        permanent_mac: None,
        rdma_device: None,
        config: serde_json::from_str::<NetworkConfig>(config).unwrap(),
        char_devices: vec![],
    }
}

#[test]
fn attach_spec_is_validated_before_anything_moves() {
    let p = plan(
        r#"{"interface":{"name":"net1","mtu":1400,"hardwareAddr":"02:00:00:00:00:09","addresses":["10.9.0.2/24"],"gsoMaxSize":32768},
            "routes":[{"destination":"10.10.0.0/16","gateway":"10.9.0.1"}]}"#,
    );
    let s = AttachSpec::from_plan(&p, "net1").unwrap();
    assert_eq!(s.pod_ifname, "net1");
    assert_eq!(s.mtu, Some(1400));
    assert_eq!(s.mac, Some(vec![2, 0, 0, 0, 0, 9]));
    assert_eq!(s.gso_max_size, Some(32768));
    assert_eq!(s.gro_max_size, None);
    assert_eq!(s.addresses.len(), 1);
    assert_eq!(s.routes.len(), 1);
    let bad_mac = plan(r#"{"interface":{"hardwareAddr":"nope"}}"#);
    assert!(matches!(
        AttachSpec::from_plan(&bad_mac, "net1"),
        Err(LinkError::InvalidMac(_))
    ));
    let bad_addr = plan(r#"{"interface":{"addresses":["10.0.0.1"]}}"#);
    assert!(matches!(
        AttachSpec::from_plan(&bad_addr, "net1"),
        Err(LinkError::InvalidAddress(_))
    ));
    let bad_route = plan(r#"{"routes":[{"destination":"nowhere"}]}"#);
    assert!(matches!(
        AttachSpec::from_plan(&bad_route, "net1"),
        Err(LinkError::InvalidRoute(_))
    ));
    let empty_route = plan(r#"{"routes":[{"source":"10.0.0.1"}]}"#);
    assert!(matches!(
        AttachSpec::from_plan(&empty_route, "net1"),
        Err(LinkError::InvalidRoute(_))
    ));
    assert!(matches!(
        AttachSpec::from_plan(&p, "a/b"),
        Err(LinkError::InvalidName { .. })
    ));
    // A negative or zero MTU means "unset", as upstream.
    let zero = plan(r#"{"interface":{"mtu":0}}"#);
    assert_eq!(AttachSpec::from_plan(&zero, "net1").unwrap().mtu, None);
}

#[test]
fn snapshots_parse_every_field_and_skip_link_local() {
    let mut m = LinkMessage::default();
    m.header.index = 12;
    m.header.flags = LinkFlags::Up;
    m.attributes = vec![
        LinkAttribute::IfName("eth9".into()),
        LinkAttribute::Mtu(1400),
        LinkAttribute::Address(vec![2, 0xd7, 0, 0, 0, 1]),
        LinkAttribute::PermAddress(vec![0; 6]),
        LinkAttribute::IfAlias("uplink".into()),
        LinkAttribute::PropList(vec![
            Prop::AltIfName("zeta".into()),
            Prop::AltIfName("alpha".into()),
        ]),
        LinkAttribute::GsoMaxSize(32768),
        LinkAttribute::GroMaxSize(16384),
    ];
    let mut a4 = AddressMessage::default();
    a4.header.prefix_len = 24;
    a4.attributes = vec![AddressAttribute::Local("10.1.2.3".parse().unwrap())];
    let mut ll = AddressMessage::default();
    ll.header.prefix_len = 64;
    ll.attributes = vec![AddressAttribute::Address("fe80::1".parse().unwrap())];
    let s = snapshot_of(&m, &[a4, ll]);
    assert_eq!(s.ifindex, 12);
    assert_eq!(s.name, "eth9");
    assert!(s.up);
    assert_eq!(s.mtu, 1400);
    assert_eq!(s.mac.as_deref(), Some("02:d7:00:00:00:01"));
    assert_eq!(s.perm_mac, None);
    assert_eq!(s.alias.as_deref(), Some("uplink"));
    assert_eq!(s.altnames, vec!["alpha".to_owned(), "zeta".to_owned()]);
    assert_eq!(s.gso_max_size, Some(32768));
    assert_eq!(s.gro_max_size, Some(16384));
    assert_eq!(s.addresses, vec![AddrSnapshot::plain("10.1.2.3/24")]);
}

#[test]
fn offload_requests_resolve_with_kernel_names_winning_over_aliases() {
    let mut f = crate::sys::ethtool::Features::default();
    for n in ["tx-tcp-segmentation", "tx-tcp6-segmentation", "rx-gro"] {
        f.hw.insert(n.into(), true);
    }
    f.hw.insert("loopback".into(), false);
    let want = std::collections::BTreeMap::from([
        ("tso".to_owned(), false),
        ("tx-tcp6-segmentation".to_owned(), true),
        ("gro".to_owned(), true),
    ]);
    let (got, flags) = resolve_offloads(&f, &Default::default(), &want, &Default::default()).unwrap();
    assert!(flags.is_empty());
    assert_eq!(
        got,
        std::collections::BTreeMap::from([
            ("rx-gro".to_owned(), true),
            ("tx-tcp-segmentation".to_owned(), false),
            ("tx-tcp6-segmentation".to_owned(), true),
        ])
    );
    let bad = std::collections::BTreeMap::from([("loopback".to_owned(), true), ("nope".to_owned(), true)]);
    let flags = std::collections::BTreeMap::from([("x".to_owned(), true)]);
    let problems = resolve_offloads(&f, &Default::default(), &bad, &flags).unwrap_err();
    let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields, ["features.loopback", "features.nope", "privateFlags.x"]);
}

#[test]
fn attach_spec_detaches_ebpf_only_when_asked() {
    let spec = |c| AttachSpec::from_plan(&plan(c), "net1").unwrap().disable_ebpf;
    assert!(spec(r#"{"interface":{"disableEbpfPrograms":true}}"#));
    assert!(!spec(r#"{"interface":{"disableEbpfPrograms":false}}"#));
    assert!(!spec(r#"{"interface":{}}"#));
    assert!(!spec("{}"));
}

/// A private netns (only `lo`, index 1), held by the returned handle.
pub(super) fn private_netns() -> Netns {
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .expect("unshare(CLONE_NEWNET): run as root");
        Netns::open_path(std::path::Path::new("/proc/thread-self/ns/net")).expect("open the new netns")
    })
    .join()
    .expect("netns thread")
}

#[tokio::test]
async fn a_blocking_newlink_is_applied_and_its_kernel_error_comes_back() {
    let ns = private_netns();
    let mut m = LinkMessage::default();
    m.header.index = 1;
    m.attributes.push(LinkAttribute::Mtu(1280));
    newlink_blocking(&ns, m, "set lo's MTU").unwrap();
    let nl = Netlink::in_netns(&ns).await.unwrap();
    let lo = nl.link_by_index(1).await.unwrap().expect("lo");
    assert!(lo.attributes.contains(&LinkAttribute::Mtu(1280)), "{lo:?}");
    // No link at that index: the kernel's ENODEV, not a hang or a silent success.
    let mut m = LinkMessage::default();
    m.header.index = 4242;
    m.attributes.push(LinkAttribute::Mtu(1280));
    let e = newlink_blocking(&ns, m, "set a missing link's MTU").unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENODEV), "{e:?}");
}

/// A device out in a pod: veth `d0` (peer `d1`) made in a private "pod" netns, and its
/// snapshot as if its host name were `h0`; the "host" is a private netns too.
struct Away {
    host: Netns,
    host_nl: Netlink,
    pod_nl: Netlink,
    index: u32,
    snap: LinkSnapshot,
}

async fn device_away() -> Away {
    let (host, pod) = (private_netns(), private_netns());
    let (host_nl, pod_nl) = (
        Netlink::in_netns(&host).await.unwrap(),
        Netlink::in_netns(&pod).await.unwrap(),
    );
    pod_nl
        .handle()
        .link()
        .add(rtnetlink::LinkVeth::new("d0", "d1").build())
        .execute()
        .await
        .unwrap();
    let index = pod_nl.link_by_name("d0").await.unwrap().expect("d0").header.index;
    let mut snap = snapshot_index(&pod_nl, index).await.unwrap().expect("snapshot");
    snap.name = "h0".into();
    // Snapshotted beside its peer, which a host snapshot of a veth whose peer stays home would
    // record as its lower link in the host; here the peer stays in the pod, so none.
    snap.lower = None;
    Away {
        host,
        host_nl,
        pod_nl,
        index,
        snap,
    }
}

impl Away {
    /// The return of `d0` home as `h0`, found in the pod by its ifindex.
    fn request(&self) -> DetachRequest<'_> {
        DetachRequest {
            pod_nl: &self.pod_nl,
            host_nl: &self.host_nl,
            host: &self.host,
            snap: &self.snap,
            pod_ifindex: Some(PodIfindex::new(self.index)),
            pod_ifname: "d0",
            move_from: None,
            host_nsid: None,
        }
    }

    /// The device after its return: gone from the pod, in the host under its host name.
    async fn home(&self) -> LinkMessage {
        assert!(
            self.pod_nl.link_by_index(self.index).await.unwrap().is_none(),
            "still in the pod"
        );
        self.host_nl
            .link_by_name("h0")
            .await
            .unwrap()
            .expect("home under its host name")
    }
}

/// The kernel checks a request's attributes before it moves anything (`validate_linkmsg`): a
/// restore setting it refuses (here a GRO limit over `GRO_MAX_SIZE`) must not keep the device
/// in the pod. It comes home under its host name, and the refused setting is the error.
#[tokio::test]
async fn a_refused_setting_in_the_move_does_not_keep_the_device_in_the_pod() {
    let mut away = device_away().await;
    away.snap.gro_max_size = Some(600_000);
    let req = away.request();
    let r = detach(&req, &mut None).await;
    assert!(
        matches!(&r, Err(e) if e.errno() == Some(libc::EINVAL)),
        "the refused GRO limit is the error: {r:?}"
    );
    let home = away.home().await;
    assert_eq!(home.header.index, away.index);
}

/// The move asks for the device's old host ifindex without looking first; when another link
/// holds it, the kernel refuses the move before moving anything, and the device comes home
/// bare, at a new index, under its host name.
#[tokio::test]
async fn a_taken_host_ifindex_does_not_keep_the_device_in_the_pod() {
    let away = device_away().await;
    let index = away.index;
    // Another link at that index in the host.
    away.host_nl
        .handle()
        .link()
        .add(rtnetlink::LinkVeth::new("x0", "x1").index(index).build())
        .execute()
        .await
        .unwrap();
    let req = away.request();
    assert_eq!(detach(&req, &mut None).await.unwrap(), Returned::Restored);
    let home = away.home().await;
    assert_ne!(home.header.index, index);
    let x0 = away
        .host_nl
        .link_by_name("x0")
        .await
        .unwrap()
        .expect("x0 untouched");
    assert_eq!(x0.header.index, index);
}

/// The socket kept for a sandbox outlives its connections: a new connection on it gets its own
/// answers, even when an earlier one left answers unread (a request it gave up on). Those are
/// discarded, not taken for the new connection's: every connection numbers its requests from 1.
#[tokio::test]
async fn a_kept_pod_socket_serves_a_new_connection_after_unread_answers() {
    let ns = private_netns();
    let (first, kept) = Netlink::in_netns_kept(&ns, None).await.unwrap();
    assert!(first.link_by_index(1).await.unwrap().is_some(), "lo");
    drop(first);
    // The first connection's task sees its handle gone and ends (it would read what follows).
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    // Link dumps (each answered with `lo`) under the sequence numbers the next connection uses,
    // sent and never read.
    for seq in 1..=4u32 {
        let mut req = crate::sys::rtnl::request(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            netlink_packet_core::NLM_F_DUMP,
        );
        req.header.sequence_number = seq;
        req.finalize();
        let mut buf = vec![0u8; req.buffer_len()];
        req.serialize(&mut buf);
        nix::sys::socket::send(kept.fd.as_raw_fd(), &buf, nix::sys::socket::MsgFlags::empty()).unwrap();
    }
    let nl = kept.connect(None).unwrap();
    for _ in 0..4 {
        // No link 4242: the answer is ENODEV (None), never a stale dump's `lo`.
        assert!(nl.link_by_index(4242).await.unwrap().is_none());
        assert_eq!(nl.link_by_index(1).await.unwrap().expect("lo").header.index, 1);
    }
    drop(nl);
    // And again, on the same kept socket.
    let again = kept.connect(None).unwrap();
    assert!(again.link_by_index(4242).await.unwrap().is_none());
}

/// [`Netlink::host`] checks get requests strictly, so an address dump of one link is answered
/// with that link's addresses alone, by the kernel: not every address of the host, decoded and
/// dropped here (thousands per attach on a node with 1,024 devices). [`Netlink::addresses`]
/// asks per family (dumps the kernel answers without RTNL) and brings both, once each. Run on a
/// thread in a private netns, where `host` makes its socket. The link dump and lookups it sends
/// pass the strict checks too.
#[test]
fn the_host_socket_is_answered_one_links_addresses_not_every_one() {
    use futures::TryStreamExt as _;
    use std::net::{IpAddr, Ipv4Addr};
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .expect("unshare(CLONE_NEWNET): run as root");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let nl = Netlink::host().await.unwrap();
            nl.handle()
                .link()
                .add(rtnetlink::LinkVeth::new("a0", "b0").build())
                .execute()
                .await
                .unwrap();
            let a = nl.link_by_name("a0").await.unwrap().expect("a0").header.index;
            let b = nl.link_by_name("b0").await.unwrap().expect("b0").header.index;
            for (index, last) in [(a, 1), (a, 2), (b, 3)] {
                nl.handle()
                    .address()
                    .add(index, IpAddr::V4(Ipv4Addr::new(10, 9, 0, last)), 24)
                    .execute()
                    .await
                    .unwrap();
            }
            // And one IPv6 address on a0: the per-family dumps bring both families.
            nl.handle()
                .address()
                .add(a, "fd00:9::1".parse().unwrap(), 64)
                .execute()
                .await
                .unwrap();
            let dump = |nl: &Netlink| {
                let mut req = nl.handle().address().get();
                req.message_mut().header.index = a;
                req.execute().try_collect::<Vec<_>>()
            };
            let got = dump(&nl).await.unwrap();
            assert_eq!(
                got.len(),
                3,
                "the kernel answered with other links' addresses: {got:?}"
            );
            assert!(got.iter().all(|m| m.header.index == a), "{got:?}");
            let mine = nl.addresses(a).await.unwrap();
            let families: Vec<_> = mine.iter().map(|m| m.header.family).collect();
            assert_eq!(
                families,
                [AddressFamily::Inet, AddressFamily::Inet, AddressFamily::Inet6],
                "IPv4 then IPv6, each once"
            );
            assert_eq!(nl.addresses(b).await.unwrap().len(), 1);
            assert_eq!(nl.links().await.unwrap().len(), 3, "lo, a0, b0");
            // A socket without strict checking is answered with every address: the filter
            // above is the strict check's.
            let here = Netns::open_path(std::path::Path::new("/proc/thread-self/ns/net")).unwrap();
            let plain = Netlink::in_netns(&here).await.unwrap();
            assert_eq!(dump(&plain).await.unwrap().len(), 4);
            assert_eq!(plain.addresses(a).await.unwrap().len(), 3, "filtered here");
        });
    })
    .join()
    .expect("test thread");
}

/// The ethtool fallback for a link's parent device (kernels before 5.15): `bus_info` is looked up
/// among sysfs's buses; virtio-net's (its transport's PCI function) is answered as the single
/// `virtio*` device under it, as `IFLA_PARENT_DEV_NAME` names it; no device, no parent.
#[test]
fn the_parent_fallback_finds_the_bus_and_the_virtio_device() {
    use super::parent::{parent_in_sysfs, release_version};
    let root = crate::test_support::TempDir::new("parent-sysfs");
    let sys = root.path();
    let dev = |p: &str| std::fs::create_dir_all(sys.join(p)).unwrap();
    dev("devices/pci0000:00/0000:00:05.0/virtio2");
    dev("devices/pci0000:00/0000:3b:00.1");
    dev("bus/pci/devices");
    dev("bus/virtio/devices");
    dev("bus/platform/devices");
    let link = |to: &str, at: &str| std::os::unix::fs::symlink(sys.join(to), sys.join(at)).unwrap();
    link("devices/pci0000:00/0000:00:05.0", "bus/pci/devices/0000:00:05.0");
    link("devices/pci0000:00/0000:3b:00.1", "bus/pci/devices/0000:3b:00.1");
    link(
        "devices/pci0000:00/0000:00:05.0/virtio2",
        "bus/virtio/devices/virtio2",
    );
    let p = |bus: &str, dev: &str| Some((bus.to_owned(), dev.to_owned()));
    assert_eq!(
        parent_in_sysfs(sys, "virtio_net", "0000:00:05.0"),
        p("virtio", "virtio2")
    );
    assert_eq!(
        parent_in_sysfs(sys, "ice", "0000:3b:00.1"),
        p("pci", "0000:3b:00.1")
    );
    // Another driver on a PCI function with a virtio child still names the function.
    assert_eq!(
        parent_in_sysfs(sys, "vfio", "0000:00:05.0"),
        p("pci", "0000:00:05.0")
    );
    for none in ["", "N/A", "tun", "usb-0000:00:14.0-1", "../bus", "a/b"] {
        assert_eq!(parent_in_sysfs(sys, "veth", none), None, "{none:?}");
    }
    assert_eq!(release_version("5.10.0-46-amd64"), Some((5, 10)));
    assert_eq!(release_version("6.12.118+deb13-amd64"), Some((6, 12)));
    assert_eq!(release_version("7.3.4"), Some((7, 3)));
    assert_eq!(release_version("x"), None);
}
