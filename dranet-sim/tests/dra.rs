//! DRA side end to end: the kubelet simulator registers the plugin over its unix socket and calls
//! NodePrepare/NodeUnprepare (v1 and v1beta1); inventory on real links in a unique netns (root);
//! ResourceSlices split at 128 devices. The test kernel has no `dummy` module, so the links are
//! veth pairs and bridges.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers panic on setup failure, like the tests"
)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dranet::dra::{DraMetrics, KubeletPlugin, MemoryClaimSource, PluginConfig, Preparer, ResourceClaim};
use dranet::inventory::{self, AttrValue, Device, NetnsTarget, ScanOptions, SharedInventory, Sysfs};
use dranet::slices::{DirPublisher, SliceController};
use dranet_sim::fixtures::{RecordingSink, StateDir, wait_for_blocking};
use dranet_sim::kernel::{PodNetns, require_root, sh, unique};
use dranet_sim::kubelet::{Claim, DraVersion, KubeletSim, RegisteredPlugin};
use serde_json::json;

fn claim_json(
    name: &str,
    uid: &str,
    pod: &str,
    results: serde_json::Value,
    config: serde_json::Value,
) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "status": {
            "allocation": {"devices": {"results": results, "config": config}},
            "reservedFor": [{"resource": "pods", "name": format!("{pod}-name"), "uid": pod}]
        }
    }))
    .unwrap()
}

fn result(request: &str, pool: &str, device: &str) -> serde_json::Value {
    json!({"request": request, "driver": "dra.net", "pool": pool, "device": device})
}

struct Harness {
    _dir: StateDir,
    cfg: PluginConfig,
    plugin: Option<KubeletPlugin>,
    claims: MemoryClaimSource,
    sink: Arc<RecordingSink>,
    kubelet: KubeletSim,
    metrics: DraMetrics,
    plugin_dir_mode: u32,
}

async fn harness() -> Harness {
    let dir = StateDir::create("kubelet").unwrap();
    let cfg = PluginConfig {
        kubelet_root: dir.0.clone(),
        driver: "dra.net".into(),
    };
    // A stale socket file from a previous run must not prevent start-up.
    std::fs::create_dir_all(cfg.plugin_dir()).unwrap();
    std::fs::write(cfg.dra_socket(), b"stale").unwrap();
    let plugin_dir_mode = std::fs::metadata(cfg.plugin_dir()).unwrap().permissions().mode() & 0o777;
    let claims = MemoryClaimSource::new();
    let sink = Arc::new(RecordingSink::default());
    let inv = SharedInventory::new(vec![
        Device {
            name: "eth1".into(),
            ifname: Some("eth1".into()),
            ..Device::default()
        },
        Device {
            name: "eth2".into(),
            ifname: Some("eth2".into()),
            ..Device::default()
        },
    ]);
    let metrics = DraMetrics::default();
    let preparer = Arc::new(
        Preparer::new(
            "dra.net",
            "node-a",
            Arc::new(claims.clone()),
            Arc::new(inv),
            sink.clone(),
        )
        .with_metrics(metrics.clone()),
    );
    let plugin = KubeletPlugin::start(&cfg, preparer).await.unwrap();
    let kubelet = KubeletSim::new(&dir.0);
    Harness {
        _dir: dir,
        cfg,
        plugin: Some(plugin),
        claims,
        sink,
        kubelet,
        metrics,
        plugin_dir_mode,
    }
}

/// [`harness`], registered with the kubelet simulator.
async fn registered() -> (Harness, RegisteredPlugin) {
    let h = harness().await;
    let reg = h
        .kubelet
        .register_when_ready(Duration::from_secs(5))
        .await
        .unwrap();
    (h, reg)
}

#[tokio::test]
async fn registration_like_kubelet() {
    let mut h = harness().await;
    let sock = h
        .kubelet
        .wait_for_registration_socket(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(sock, h.cfg.registration_socket());
    assert!(sock.ends_with("plugins_registry/dra.net-reg.sock"));
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    // Created by the plugin: 0750.
    assert_eq!(mode(&h.cfg.kubelet_root.join("plugins_registry")), 0o750);
    // Existed already (the stale socket was put there): its mode is left alone.
    assert_eq!(mode(&h.cfg.plugin_dir()), h.plugin_dir_mode);

    let registrations = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r2 = registrations.clone();
    let _watch = h.plugin.as_ref().unwrap().on_registered(move || {
        r2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let reg = h.kubelet.register(&sock).await.unwrap();
    assert_eq!(reg.info.r#type, "DRAPlugin");
    assert_eq!(reg.info.name, "dra.net");
    assert_eq!(PathBuf::from(&reg.info.endpoint), h.cfg.dra_socket());
    assert_eq!(
        reg.info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );
    assert_eq!(reg.version, DraVersion::V1);
    let status = h
        .plugin
        .as_ref()
        .unwrap()
        .registration()
        .borrow()
        .clone()
        .unwrap();
    assert!(status.plugin_registered);

    // A rejected registration is reported back as an error, as the Go library does.
    let err = h.kubelet.reject(&sock, "version mismatch").await.unwrap_err();
    assert!(err.to_string().contains("version mismatch"), "{err}");
    let status = h
        .plugin
        .as_ref()
        .unwrap()
        .registration()
        .borrow()
        .clone()
        .unwrap();
    assert!(!status.plugin_registered);

    h.plugin.take().unwrap().stop().await;
    assert!(!h.cfg.registration_socket().exists());
    assert!(!h.cfg.dra_socket().exists());
}

#[tokio::test]
async fn prepare_with_config_errors_and_unprepare_v1() {
    let (h, reg) = registered().await;

    h.claims.insert(claim_json(
        "good",
        "uid-good",
        "pod-1",
        json!([result("nic", "node-a", "eth1")]),
        json!([{"source": "FromClaim", "requests": ["nic"],
                "opaque": {"driver": "dra.net", "parameters": {
                    "interface": {"name": "net1", "addresses": ["10.9.0.2/24"], "mtu": 1400},
                    "routes": [{"destination": "10.10.0.0/16", "gateway": "10.9.0.1"}]}}}]),
    ));
    h.claims.insert(claim_json(
        "badcfg",
        "uid-bad",
        "pod-1",
        json!([result("nic", "node-a", "eth2")]),
        json!([{"source": "FromClaim", "opaque": {"driver": "dra.net",
                "parameters": {"interface": {"name": "this-name-is-too-long"}}}}]),
    ));
    h.claims.insert(claim_json(
        "otherpool",
        "uid-pool",
        "pod-1",
        json!([result("nic", "node-b", "eth2")]),
        json!([]),
    ));
    let res = reg
        .prepare(&[
            Claim::new("default", "good", "uid-good"),
            Claim::new("default", "badcfg", "uid-bad"),
            Claim::new("default", "missing", "uid-missing"),
            Claim::new("default", "otherpool", "uid-pool"),
        ])
        .await
        .unwrap();
    assert_eq!(res.len(), 4, "every claim gets an entry: {res:?}");
    let good = &res["uid-good"];
    assert_eq!(good.error, "");
    assert_eq!(good.devices.len(), 1);
    assert_eq!(good.devices[0].device, "eth1");
    assert_eq!(good.devices[0].pool, "node-a");
    assert_eq!(good.devices[0].request_names, ["nic"]);
    assert!(
        res["uid-bad"].error.contains("exceeds maximum length of 15"),
        "{:?}",
        res["uid-bad"]
    );
    assert!(res["uid-bad"].devices.is_empty());
    assert!(
        res["uid-missing"].error.contains("not found"),
        "{:?}",
        res["uid-missing"]
    );
    assert!(
        res["uid-pool"].error.contains("pool node-b"),
        "{:?}",
        res["uid-pool"]
    );
    assert_eq!(h.metrics.requests("PrepareResourceClaims", "failed"), 1);
    assert_eq!(h.metrics.requests("PrepareResourceClaims", "success"), 0);

    {
        let plans = h.sink.plans();
        let plan = &plans["pod-1"];
        assert_eq!(plan.pod_name, "pod-1-name");
        assert_eq!(plan.devices.len(), 1);
        let d = &plan.devices[0];
        assert_eq!(d.pod_ifname(), Some("net1"));
        assert_eq!(d.config.interface.mtu, Some(1400));
        assert_eq!(d.config.routes[0].gateway, "10.9.0.1");
        assert_eq!(d.claim.name, "good");
    }

    // Repeat is idempotent.
    let again = reg
        .prepare(&[Claim::new("default", "good", "uid-good")])
        .await
        .unwrap();
    assert_eq!(again["uid-good"], res["uid-good"]);

    let un = reg
        .unprepare(&[Claim::new("default", "good", "uid-good")])
        .await
        .unwrap();
    assert_eq!(un["uid-good"], "");
    assert_eq!(h.sink.removed(), ["uid-good"]);
    assert!(h.sink.plans().is_empty());
    // Unknown claim: still fine.
    let un = reg
        .unprepare(&[Claim::new("default", "x", "uid-x")])
        .await
        .unwrap();
    assert_eq!(un["uid-x"], "");
}

#[tokio::test]
async fn v1beta1_and_two_claims_of_one_pod() {
    let (h, reg) = registered().await;
    h.claims.insert(claim_json(
        "a",
        "uid-a",
        "pod-2",
        json!([result("r", "node-a", "eth1")]),
        json!([]),
    ));
    h.claims.insert(claim_json(
        "b",
        "uid-b",
        "pod-2",
        json!([result("r", "node-a", "eth2")]),
        json!([]),
    ));
    let res = reg
        .prepare_with(
            DraVersion::V1beta1,
            &[
                Claim::new("default", "a", "uid-a"),
                Claim::new("default", "b", "uid-b"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(res["uid-a"].error, "");
    assert_eq!(res["uid-b"].devices[0].device, "eth2");
    {
        let plans = h.sink.plans();
        let names: Vec<&str> = plans["pod-2"].devices.iter().map(|d| d.device.as_str()).collect();
        assert_eq!(names, ["eth1", "eth2"], "devices of both claims merged");
    }
    let un = reg
        .unprepare_with(DraVersion::V1beta1, &[Claim::new("default", "a", "uid-a")])
        .await
        .unwrap();
    assert_eq!(un["uid-a"], "");
    let plans = h.sink.plans();
    assert_eq!(plans["pod-2"].devices.len(), 1);
}

/// `ip link del` on drop.
struct HostLink(String);

/// Tests that add links to the host netns run one at a time (the rescan test counts the scans
/// that host link events cause).
static HOST_LINKS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Drop for HostLink {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.0])
            .output();
    }
}

fn attr<'a>(d: &'a Device, k: &str) -> &'a AttrValue {
    d.attributes
        .get(k)
        .unwrap_or_else(|| panic!("{} has no {k}: {:?}", d.name, d.attributes))
}

#[test]
fn inventory_of_a_netns_with_bridge_and_veth() {
    if !require_root("inventory_of_a_netns_with_bridge_and_veth").unwrap() {
        return;
    }
    let ns = PodNetns::create(&unique("dinv")).unwrap();
    let br = unique("br");
    let va = unique("va");
    let vb = unique("vb");
    ns.ip(&["link", "add", &br, "type", "bridge"]).unwrap();
    ns.ip(&[
        "link",
        "set",
        &br,
        "mtu",
        "9000",
        "address",
        "02:11:22:33:44:55",
        "up",
    ])
    .unwrap();
    ns.ip(&["addr", "add", "192.0.2.10/24", "dev", &br]).unwrap();
    ns.ip(&["addr", "add", "2001:db8::10/64", "dev", &br, "nodad"])
        .unwrap();
    ns.ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])
        .unwrap();
    // A classic BPF filter on the veth's ingress: dra.net/ebpf must report it.
    let tc = |args: &[&str]| {
        let mut full = vec!["ip", "netns", "exec", ns.name.as_str(), "tc"];
        full.extend_from_slice(args);
        sh(&full).unwrap();
    };
    tc(&["qdisc", "add", "dev", &va, "clsact"]);
    tc(&[
        "filter",
        "add",
        "dev",
        &va,
        "ingress",
        "bpf",
        "bytecode",
        "1,6 0 0 0,",
    ]);
    let odd = "Odd_Name";
    ns.ip(&["link", "add", odd, "type", "bridge"]).unwrap();

    let opts = ScanOptions {
        netns: NetnsTarget::Path(ns.path.clone()),
        sysfs: Sysfs::new("/nonexistent-sysfs"),
        ..ScanOptions::default()
    };
    let devs = inventory::scan(&opts).unwrap();
    let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
    assert!(!names.contains(&"lo"), "{names:?}");
    let d = devs.iter().find(|d| d.name == br).unwrap();
    assert_eq!(attr(d, "dra.net/type"), &AttrValue::String("bridge".into()));
    assert_eq!(attr(d, "dra.net/ifName"), &AttrValue::String(br.clone()));
    assert_eq!(attr(d, "dra.net/mtu"), &AttrValue::Int(9000));
    assert_eq!(
        attr(d, "dra.net/mac"),
        &AttrValue::String("02:11:22:33:44:55".into())
    );
    assert_eq!(
        attr(d, "dra.net/ipv4"),
        &AttrValue::String("192.0.2.10/24".into())
    );
    assert_eq!(
        attr(d, "dra.net/ipv6"),
        &AttrValue::String("2001:db8::10/64".into())
    );
    assert_eq!(
        attr(d, "dra.net/encapsulation"),
        &AttrValue::String("ether".into())
    );
    assert_eq!(attr(d, "dra.net/virtual"), &AttrValue::Bool(true));
    assert_eq!(attr(d, "dra.net/rdma"), &AttrValue::Bool(false));
    assert!(matches!(attr(d, "dra.net/state"), AttrValue::String(_)));
    assert_eq!(d.ifname.as_deref(), Some(br.as_str()));
    let v = devs.iter().find(|d| d.name == va).unwrap();
    assert_eq!(attr(v, "dra.net/type"), &AttrValue::String("veth".into()));
    assert_eq!(attr(v, "dra.net/state"), &AttrValue::String("down".into()));
    assert_eq!(attr(v, "dra.net/ebpf"), &AttrValue::Bool(true));
    let peer = devs.iter().find(|d| d.name == vb).unwrap();
    assert_eq!(attr(peer, "dra.net/ebpf"), &AttrValue::Bool(false));
    assert_eq!(attr(d, "dra.net/ebpf"), &AttrValue::Bool(false));
    let odd_dev = devs.iter().find(|d| d.ifname.as_deref() == Some(odd)).unwrap();
    assert_eq!(odd_dev.name, inventory::netdev_device_name(odd));
    assert!(odd_dev.name.starts_with("net-"));

    // Upstream's default filter drops the veth pair.
    let filtered = inventory::scan(&ScanOptions {
        filter: inventory::Filter::compile(inventory::DEFAULT_FILTER).unwrap(),
        ..opts
    })
    .unwrap();
    assert!(filtered.iter().all(|d| d.name != va && d.name != vb));
    assert!(filtered.iter().any(|d| d.name == br));
}

/// The default-route interface and everything enslaved under it (here a bridge port: this kernel
/// has no bond module; deeper chains are unit-tested) are the node's uplink and never published;
/// a link beside them is; moving the default route moves the exclusion.
#[test]
fn inventory_excludes_the_default_route_uplink_and_its_members() {
    if !require_root("inventory_excludes_the_default_route_uplink_and_its_members").unwrap() {
        return;
    }
    let ns = PodNetns::create(&unique("dup")).unwrap();
    let ip = |args: &[&str]| ns.ip(args).unwrap();
    // br0 (default route) <- ua (port); ub (peer of ua) and the other pair free.
    ip(&["link", "add", "br0", "type", "bridge"]);
    ip(&["link", "add", "ua", "type", "veth", "peer", "name", "ub"]);
    ip(&["link", "add", "fa", "type", "veth", "peer", "name", "fb"]);
    ip(&["link", "set", "ua", "master", "br0"]);
    for l in ["br0", "ua", "ub", "fa", "fb"] {
        ip(&["link", "set", l, "up"]);
    }
    ip(&["addr", "add", "198.51.100.2/24", "dev", "br0"]);
    ip(&["addr", "add", "203.0.113.2/24", "dev", "fa"]);
    ip(&["route", "add", "default", "via", "198.51.100.1", "dev", "br0"]);
    let names = || -> Vec<String> {
        let opts = ScanOptions {
            netns: NetnsTarget::Path(ns.path.clone()),
            sysfs: Sysfs::new("/nonexistent-sysfs"),
            ..ScanOptions::default()
        };
        inventory::scan(&opts)
            .unwrap()
            .into_iter()
            .filter_map(|d| d.ifname)
            .collect()
    };
    let got = names();
    for uplink in ["br0", "ua"] {
        assert!(!got.iter().any(|n| n == uplink), "{uplink} published: {got:?}");
    }
    for free in ["ub", "fa", "fb"] {
        assert!(got.iter().any(|n| n == free), "{free} missing: {got:?}");
    }
    // A better (lower-metric) default route through fa makes fa the uplink instead.
    ip(&["route", "del", "default", "via", "198.51.100.1", "dev", "br0"]);
    ip(&[
        "route",
        "add",
        "default",
        "via",
        "198.51.100.1",
        "dev",
        "br0",
        "metric",
        "100",
    ]);
    ip(&[
        "route",
        "add",
        "default",
        "via",
        "203.0.113.1",
        "dev",
        "fa",
        "metric",
        "50",
    ]);
    let got = names();
    assert!(!got.iter().any(|n| n == "fa"), "{got:?}");
    for back in ["br0", "ua"] {
        assert!(got.iter().any(|n| n == back), "{back} missing: {got:?}");
    }
}

#[test]
fn inventory_of_the_host_netns_sees_a_new_link() {
    if !require_root("inventory_of_the_host_netns_sees_a_new_link").unwrap() {
        return;
    }
    let _host = HOST_LINKS.blocking_lock();
    let name = unique("hd");
    sh(&["ip", "link", "add", &name, "type", "bridge"]).unwrap();
    let _guard = HostLink(name.clone());
    let devs = inventory::scan(&ScanOptions::default()).unwrap();
    let d = devs.iter().find(|d| d.name == name).unwrap();
    assert_eq!(attr(d, "dra.net/type"), &AttrValue::String("bridge".into()));
    // Real sysfs: a bridge lives under /sys/devices/virtual.
    assert_eq!(attr(d, "dra.net/virtual"), &AttrValue::Bool(true));
    assert!(!d.attributes.contains_key("dra.net/pciAddress"));
}

/// Scans the test netns on the blocking pool.
async fn scan_netns(ns: &PodNetns) -> Vec<inventory::Device> {
    let nspath = ns.path.clone();
    tokio::task::spawn_blocking(move || {
        inventory::scan(&ScanOptions {
            netns: NetnsTarget::Path(nspath),
            sysfs: Sysfs::new("/nonexistent-sysfs"),
            ..ScanOptions::default()
        })
    })
    .await
    .unwrap()
    .unwrap()
}

/// Runs `ip -batch` with `lines` in the test netns.
fn ip_batch(ns: &PodNetns, dir: &StateDir, lines: impl Iterator<Item = String>) {
    let path = dir.0.join("batch");
    std::fs::write(&path, lines.collect::<String>()).unwrap();
    ns.ip(&["-batch", path.to_str().unwrap()]).unwrap();
}

#[tokio::test]
async fn slices_of_256_real_links_split_at_128() {
    if !require_root("slices_of_256_real_links_split_at_128").unwrap() {
        return;
    }
    let ns = PodNetns::create(&unique("dsl")).unwrap();
    let file = StateDir::create("batch").unwrap();
    ip_batch(
        &ns,
        &file,
        (0..128).map(|i| format!("link add a{i} type veth peer name b{i}\n")),
    );
    let devs = scan_netns(&ns).await;
    assert_eq!(
        devs.len(),
        256,
        "{:?}",
        devs.iter().map(|d| &d.name).collect::<Vec<_>>()
    );

    let out = StateDir::create("slices").unwrap();
    let publisher = DirPublisher::new(&out.0, "dra.net", "node-a");
    let mut ctl = SliceController::new(publisher.clone(), "dra.net", "node-a");
    let check = |want: &[usize], generation: i64| {
        let slices = publisher.read_all().unwrap();
        let sizes: Vec<usize> = slices.iter().map(|s| s.spec.devices.len()).collect();
        assert_eq!(sizes, want);
        let mut names = std::collections::BTreeSet::new();
        for s in &slices {
            assert_eq!(s.spec.pool.resource_slice_count, want.len() as i64);
            assert_eq!(s.spec.pool.generation, generation);
            assert_eq!(s.spec.pool.name, "node-a");
            for d in &s.spec.devices {
                assert!(names.insert(d.name.clone()), "{} in two slices", d.name);
            }
        }
    };
    assert!(ctl.update(&devs).await.unwrap());
    check(&[128, 128], 1);
    // One device over: a third slice.
    ip_batch(
        &ns,
        &file,
        std::iter::once("link add a128 type veth peer name b128\n".to_owned()),
    );
    assert!(ctl.update(&scan_netns(&ns).await).await.unwrap());
    check(&[128, 128, 2], 2);
    // Removing 5 pairs: two slices again, the third one deleted, a new generation.
    ip_batch(&ns, &file, (0..5).map(|i| format!("link del a{i}\n")));
    let devs = scan_netns(&ns).await;
    assert_eq!(devs.len(), 248);
    assert!(ctl.update(&devs).await.unwrap());
    check(&[128, 120], 3);
}

#[tokio::test]
async fn prepare_copies_real_host_addresses_routes_rules_and_neighbours() {
    if !require_root("prepare_copies_real_host_addresses_routes_rules_and_neighbours").unwrap() {
        return;
    }
    let ns = PodNetns::create(&unique("dhs")).unwrap();
    let (a, b) = (unique("ha"), unique("hb"));
    ns.ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])
        .unwrap();
    ns.ip(&["link", "set", &a, "up"]).unwrap();
    ns.ip(&["link", "set", &b, "up"]).unwrap();
    ns.ip(&["addr", "add", "198.51.100.2/24", "dev", &a]).unwrap();
    ns.ip(&[
        "route",
        "add",
        "203.0.113.0/24",
        "via",
        "198.51.100.1",
        "dev",
        &a,
        "table",
        "100",
    ])
    .unwrap();
    ns.ip(&["route", "add", "192.0.2.128/25", "via", "198.51.100.1", "dev", &a])
        .unwrap();
    ns.ip(&[
        "rule",
        "add",
        "from",
        "198.51.100.0/24",
        "lookup",
        "100",
        "priority",
        "1000",
    ])
    .unwrap();
    ns.ip(&[
        "neigh",
        "add",
        "198.51.100.9",
        "lladdr",
        "02:aa:bb:cc:dd:ee",
        "dev",
        &a,
        "nud",
        "permanent",
    ])
    .unwrap();

    let nspath = ns.path.clone();
    let devs = tokio::task::spawn_blocking(move || {
        inventory::scan(&ScanOptions {
            netns: NetnsTarget::Path(nspath),
            sysfs: Sysfs::new("/nonexistent-sysfs"),
            ..ScanOptions::default()
        })
    })
    .await
    .unwrap()
    .unwrap();
    let dev = devs.iter().find(|d| d.name == a).unwrap().clone();
    assert_eq!(dev.addresses, ["198.51.100.2/24"]);
    assert!(
        dev.routes
            .iter()
            .any(|r| r.destination == "203.0.113.0/24" && r.table == 100)
    );
    assert!(
        dev.routes
            .iter()
            .any(|r| r.destination == "192.0.2.128/25" && r.table == 0)
    );
    assert_eq!(dev.rules.len(), 1, "{:?}", dev.rules);
    assert_eq!(dev.rules[0].source, "198.51.100.0/24");
    assert_eq!(dev.rules[0].priority, 1000);
    assert_eq!(dev.neighbors.len(), 1);
    assert_eq!(dev.neighbors[0].hardware_addr, "02:aa:bb:cc:dd:ee");

    let claims = MemoryClaimSource::new();
    claims.insert(claim_json(
        "hs",
        "uid-hs",
        "pod-hs",
        json!([result("nic", "node-a", &a)]),
        json!([{"source": "FromClaim", "opaque": {"driver": "dra.net", "parameters": {"interface": {"name": "eth9"}}}}]),
    ));
    let sink = Arc::new(RecordingSink::default());
    let p = Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(claims),
        Arc::new(SharedInventory::new(devs)),
        sink.clone(),
    );
    p.prepare(&dranet::plan::ClaimRef {
        namespace: "default".into(),
        name: "hs".into(),
        uid: "uid-hs".into(),
    })
    .await
    .unwrap();
    let plans = sink.plans();
    let cfg = &plans["pod-hs"].devices[0].config;
    assert_eq!(cfg.interface.name.as_deref(), Some("eth9"));
    assert_eq!(cfg.interface.addresses, ["198.51.100.2/24"]);
    assert!(
        cfg.routes
            .iter()
            .any(|r| r.destination == "203.0.113.0/24" && r.gateway == "198.51.100.1")
    );
    assert_eq!(cfg.rules.len(), 1);
    assert_eq!(cfg.neighbors[0].destination, "198.51.100.9");
    // The merged config is still valid by the user-facing rules.
    dranet::config::validate(cfg).unwrap();
}

#[tokio::test]
async fn restart_over_stale_sockets_of_a_crashed_driver() {
    let dir = StateDir::create("stale").unwrap();
    let cfg = PluginConfig {
        kubelet_root: dir.0.clone(),
        driver: "dra.net".into(),
    };
    std::fs::create_dir_all(cfg.plugin_dir()).unwrap();
    std::fs::create_dir_all(cfg.registration_socket().parent().unwrap()).unwrap();
    // A crashed driver leaves bound-but-dead sockets behind.
    drop(std::os::unix::net::UnixListener::bind(cfg.dra_socket()).unwrap());
    drop(std::os::unix::net::UnixListener::bind(cfg.registration_socket()).unwrap());
    assert!(std::os::unix::net::UnixStream::connect(cfg.dra_socket()).is_err());

    let claims = MemoryClaimSource::new();
    claims.insert(claim_json(
        "c",
        "uid-c",
        "pod-c",
        json!([result("nic", "node-a", "eth1")]),
        json!([]),
    ));
    let preparer = Arc::new(Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(claims),
        Arc::new(SharedInventory::new(vec![Device {
            name: "eth1".into(),
            ifname: Some("eth1".into()),
            ..Device::default()
        }])),
        Arc::new(RecordingSink::default()),
    ));
    let plugin = KubeletPlugin::start(&cfg, preparer).await.unwrap();
    let kubelet = KubeletSim::new(&dir.0);
    let reg = kubelet.register_when_ready(Duration::from_secs(5)).await.unwrap();
    let res = reg.prepare(&[Claim::new("default", "c", "uid-c")]).await.unwrap();
    assert_eq!(res["uid-c"].error, "");
    assert_eq!(res["uid-c"].devices[0].device, "eth1");
    plugin.stop().await;
}

#[tokio::test]
async fn failed_start_leaves_no_dra_socket() {
    let dir = StateDir::create("fail").unwrap();
    let cfg = PluginConfig {
        kubelet_root: dir.0.clone(),
        driver: "dra.net".into(),
    };
    // Something that is not a socket sits where the registration socket goes.
    std::fs::create_dir_all(cfg.registration_socket()).unwrap();
    let preparer = Arc::new(Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(MemoryClaimSource::new()),
        Arc::new(SharedInventory::default()),
        Arc::new(RecordingSink::default()),
    ));
    let err = KubeletPlugin::start(&cfg, preparer).await.err().unwrap();
    assert!(err.to_string().contains("removing stale socket"), "{err}");
    assert!(!cfg.dra_socket().exists());
}

/// `dranet validate-config FILE|-`: `ok` and 0, or every error with its path and 1.
#[test]
fn validate_config_binary_prints_ok_or_every_error_with_its_path() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let bin = dranet_sim::kernel::dranet_bin().unwrap();
    let run = |args: &[&str], stdin: &str| {
        let mut child = Command::new(&bin)
            .arg("validate-config")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let good = r#"{"interface": {"name": "net1", "mtu": 9000, "addresses": ["10.9.0.2/24"]},
                   "routes": [{"destination": "10.8.0.0/16", "gateway": "10.9.0.1"}]}"#;
    assert_eq!(run(&["-"], good), (Some(0), "ok\n".to_owned(), String::new()));
    let dir = StateDir::create("vc").unwrap();
    let file = dir.0.join("good.json");
    std::fs::write(&file, good).unwrap();
    assert_eq!(run(&[file.to_str().unwrap()], "").0, Some(0));
    let (code, out, _) = run(&["--print", file.to_str().unwrap()], "");
    assert_eq!(code, Some(0));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["interface"]["mtu"],
        9000
    );

    // Rule failures: all of them, each with its path.
    let bad = r#"{"interface": {"name": "name-longer-than-15", "mtu": 10, "addresses": ["10.0.0.1"]},
                  "routes": [{"destination": "fd00::/64", "gateway": "10.0.0.1"}]}"#;
    let (code, out, _) = run(&["-"], bad);
    assert_eq!(code, Some(1), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    for want in [
        "interface.name:",
        "interface.mtu:",
        "interface.addresses[0]:",
        "routes[0]",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(want)),
            "{want} missing in {lines:?}"
        );
    }
    // Decoding failures: every unknown field and wrong type.
    let (code, out, _) = run(
        &["-"],
        r#"{"interface": {"nmae": "x", "mtu": "big"}, "rutes": []}"#,
    );
    assert_eq!(code, Some(1));
    let paths: Vec<&str> = out.lines().filter_map(|l| l.split(':').next()).collect();
    assert_eq!(paths, ["interface.mtu", "interface.nmae", "rutes"], "{out}");
    // Not JSON; a file that is not there.
    let (code, out, _) = run(&["-"], "{");
    assert_eq!(code, Some(1));
    assert!(out.starts_with("failed to unmarshal JSON data"), "{out}");
    let (code, _, err) = run(&["/nonexistent/dranet-config.json"], "");
    assert_eq!(code, Some(2));
    assert!(err.contains("/nonexistent/dranet-config.json"), "{err}");
}

/// Rescans are driven by real rtnetlink link events and debounced: a link renamed 30 ms after it
/// appeared (as udev renames a new NIC) is only ever scanned under its final name, and a burst
/// of 20 new pairs costs one scan, not one per event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_events_drive_debounced_rescans() {
    use dranet::slices::{LoopTiming, RescanHandle, link_events, publish_loop};
    if !require_root("link_events_drive_debounced_rescans").unwrap() {
        return;
    }
    let _host = HOST_LINKS.lock().await;
    let tag = unique("ev");
    let (tmp, fin, peer) = (format!("{tag}t"), format!("{tag}f"), format!("{tag}p"));
    let mut guards = vec![HostLink(tmp.clone()), HostLink(fin.clone())];
    guards.extend((0..20).map(|i| HostLink(format!("{tag}a{i}"))));
    // Every scan: the names of this test's links in the host netns.
    let scans: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let (s2, tag2) = (scans.clone(), tag.clone());
    let scan = move || {
        let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
            .map_err(|source| inventory::InventoryError::Io {
                what: "sysfs",
                source,
            })?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&tag2))
            .collect();
        names.sort();
        s2.lock().unwrap().push(names.clone());
        Ok(names
            .into_iter()
            .map(|name| Device {
                name,
                ..Device::default()
            })
            .collect::<Vec<_>>())
    };
    let out = StateDir::create("evslices").unwrap();
    let publisher = DirPublisher::new(&out.0, "dra.net", "node-a");
    let ctl = SliceController::new(publisher.clone(), "dra.net", "node-a");
    let handle = RescanHandle::new();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let timing = LoopTiming {
        min_interval: Duration::from_millis(20),
        max_interval: Duration::from_secs(3600),
        settle: Duration::from_millis(400),
        settle_max: Duration::from_secs(3),
    };
    let inv = SharedInventory::default();
    let lp = tokio::spawn(publish_loop(
        scan,
        inv,
        ctl,
        handle.clone(),
        timing,
        stop_rx.clone(),
    ));
    let ev = tokio::spawn(link_events(handle, stop_rx));
    let count = || scans.lock().unwrap().len();
    let wait_for = |pred: &dyn Fn() -> bool, what: &str| {
        if let Err(e) = wait_for_blocking(what, Duration::from_secs(10), pred) {
            panic!("{e}: {:?}", scans.lock().unwrap());
        }
    };
    wait_for(&|| count() >= 1, "first scan");
    // Let the link monitor subscribe and any earlier host event pass.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before = count();

    let script =
        format!("ip link add {tmp} type veth peer name {peer} && sleep 0.03 && ip link set {tmp} name {fin}");
    sh(&["sh", "-c", &script]).unwrap();
    guards.push(HostLink(peer.clone()));
    let want = {
        let mut v = vec![fin.clone(), peer.clone()];
        v.sort();
        v
    };
    wait_for(
        &|| scans.lock().unwrap().last() == Some(&want),
        "scan with the renamed link",
    );
    let seen = scans.lock().unwrap().clone();
    assert!(
        seen.iter().all(|names| !names.contains(&tmp)),
        "a scan saw the link before its rename: {seen:?}"
    );
    assert_eq!(seen.len() - before, 1, "{seen:?}");
    // The scan is recorded as it returns; its slices are written after it: wait for them too
    // (under load the write can lag the scan).
    let published = || -> Vec<String> {
        publisher.read_all().unwrap().first().map_or_else(Vec::new, |s| {
            s.spec.devices.iter().map(|d| d.name.clone()).collect()
        })
    };
    if wait_for_blocking("the renamed link published", Duration::from_secs(10), || {
        published() == want
    })
    .is_err()
    {
        panic!("published {:?}, want {want:?}", published());
    }

    // A burst: 20 pairs in one batch.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before = count();
    let batch = StateDir::create("evbatch").unwrap();
    let path = batch.0.join("b");
    let lines: String = (0..20)
        .map(|i| format!("link add {tag}a{i} type veth peer name {tag}b{i}\n"))
        .collect();
    std::fs::write(&path, lines).unwrap();
    sh(&["ip", "-batch", path.to_str().unwrap()]).unwrap();
    wait_for(
        &|| scans.lock().unwrap().last().is_some_and(|n| n.len() == 42),
        "scan with the burst",
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let burst_scans = count() - before;
    assert!(
        (1..=2).contains(&burst_scans),
        "{burst_scans} scans for one burst of 40 new links"
    );
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), lp)
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), ev)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    drop(guards);
}

/// One NodeUnprepareResources call is one change of the checkpoint (one staged save, one
/// directory `fsync`), however many claims it names: 16 claims of 4 pods unprepared in one call
/// advance the engine's staged changes by exactly 1 (they advanced by 16 before: one change per
/// claim), and once it is durable no plan file is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_unprepare_call_is_one_checkpoint_change_whatever_the_number_of_claims() {
    if !require_root("one_unprepare_call_is_one_checkpoint_change_whatever_the_number_of_claims").unwrap() {
        return;
    }
    let state = StateDir::new("unprep16");
    let engine = dranet_sim::fixtures::engine(&state, None).await.unwrap();
    let mut claims = Vec::new();
    for i in 0..16 {
        let pod = format!("pod-{}", i % 4);
        let uid = format!("uid-c{i}");
        let mut d = dranet_sim::fixtures::host_device_plan(
            &format!("nope{i}"),
            &format!("net{i}"),
            &pod,
            Default::default(),
        );
        d.claim.uid.clone_from(&uid);
        d.claim.name = format!("c{i}");
        engine
            .set_claim(dranet::plan::ClaimPlan {
                pod_uid: pod.clone(),
                pod_namespace: "default".into(),
                pod_name: pod.clone(),
                claim_uid: uid.clone(),
                devices: vec![d],
            })
            .unwrap();
        claims.push(Claim::new("default", &format!("c{i}"), &uid));
    }
    engine.durable().await.unwrap();
    let plan_files = || {
        std::fs::read_dir(state.0.join("checkpoint"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("plan"))
            .count()
    };
    assert!(plan_files() >= 4, "the 4 pods' plans are on disk");

    let dir = StateDir::create("kubelet-unprep16").unwrap();
    let cfg = PluginConfig {
        kubelet_root: dir.0.clone(),
        driver: "dra.net".into(),
    };
    let preparer = Arc::new(Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(MemoryClaimSource::new()),
        Arc::new(SharedInventory::new(vec![])),
        Arc::new(engine.clone()),
    ));
    let _plugin = KubeletPlugin::start(&cfg, preparer).await.unwrap();
    let reg = KubeletSim::new(&dir.0)
        .register_when_ready(Duration::from_secs(5))
        .await
        .unwrap();
    let before = engine.staged_changes();
    let res = reg.unprepare(&claims).await.unwrap();
    assert_eq!(res.len(), 16);
    assert!(res.values().all(String::is_empty), "{res:?}");
    assert_eq!(
        engine.staged_changes() - before,
        1,
        "16 claims in one NodeUnprepareResources call: one checkpoint change"
    );
    engine.durable().await.unwrap();
    assert_eq!(plan_files(), 0, "no plan left on disk");
    assert!(engine.plan("pod-0").is_none());
}
