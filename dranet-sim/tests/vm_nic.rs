//! Real-NIC tests for the qemu kernel matrix (`cargo xtask vm-test`): a virtio-net NIC has no
//! `rtnl_link_ops`, so the kernel hands it back to init_net when its netns dies (a veth would be
//! deleted). They touch the named NIC, so they run only inside the test VM: env
//! `DRANET_VM_NIC=<nic>` and `dranet-vm` on the kernel command line; everywhere else (CI
//! included) they skip.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use dranet::config::NetworkConfig;
use dranet::plan::PodPlan;
use dranet::rescue::{AttachOutcome, DetachOutcome, PodRef};
use dranet::watch::{Watcher, WatcherOptions};
use dranet_sim::fixtures::{
    StateDir, TestPod, host_device_plan, pod_plan, pod_ref, stop_sandbox, wait_for, wait_for_blocking,
    watched_engine,
};
use dranet_sim::kernel::{PodNetns, host_has, sh, unique};
use dranet_sim::nic::{assert_same, view};

/// The NIC under test when inside the VM.
fn vm_nic(test: &str) -> Option<String> {
    let nic = std::env::var("DRANET_VM_NIC").ok()?;
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    if !cmdline.split_whitespace().any(|w| w == "dranet-vm") {
        eprintln!("skipping {test}: DRANET_VM_NIC is set but this is not the dranet test VM");
        return None;
    }
    Some(nic)
}

/// Puts the NIC back under its own name, DOWN, without addresses, at drop (also on panic).
struct Restore {
    nic: String,
    aliases: Vec<String>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        for a in &self.aliases {
            if host_has(a) {
                let _ = sh(&["ip", "link", "set", a, "down"]);
                let _ = sh(&["ip", "link", "set", a, "name", &self.nic]);
            }
        }
        let _ = sh(&["ip", "addr", "flush", "dev", &self.nic]);
        let _ = sh(&["ip", "link", "set", &self.nic, "down"]);
    }
}

/// The host-side state the tests start from: UP, MTU 1400, one address.
fn configure(nic: &str) -> Result<()> {
    sh(&["ip", "addr", "flush", "dev", nic])?;
    sh(&["ip", "link", "set", nic, "mtu", "1400"])?;
    sh(&["ip", "addr", "add", "192.0.2.10/24", "dev", nic])?;
    sh(&["ip", "link", "set", nic, "up"])?;
    Ok(())
}

/// The NIC under test (`None` outside the VM), configured as the tests start from, the guard
/// that puts it back (also from `net1`, its name in a pod), and its host view.
fn configured_vm_nic(test: &str) -> Result<Option<(String, Restore, serde_json::Value)>> {
    let Some(nic) = vm_nic(test) else {
        return Ok(None);
    };
    let restore = Restore {
        nic: nic.clone(),
        aliases: vec!["net1".into()],
    };
    configure(&nic)?;
    let before = view(&nic, None)?;
    Ok(Some((nic, restore, before)))
}

/// `nic` as `net1` with one address, in pod `default/vm` (pool `vm`).
fn plan(nic: &str, uid: &str) -> PodPlan {
    let mut config = NetworkConfig::default();
    config.interface.addresses = vec!["198.51.100.2/24".into()];
    let mut device = host_device_plan(nic, "net1", uid, config);
    device.pool = "vm".into();
    PodPlan {
        pod_name: "vm".into(),
        ..pod_plan(uid, vec![device])
    }
}

/// The runtime's name of [`plan`]'s pod.
fn pod(uid: &str) -> PodRef<'static> {
    PodRef {
        name: "vm",
        ..pod_ref(uid)
    }
}

#[test]
fn kernel_returns_a_real_nic_down_when_its_netns_dies() -> Result<()> {
    let Some(nic) = vm_nic("kernel_returns_a_real_nic_down_when_its_netns_dies") else {
        return Ok(());
    };
    let renamed = format!("{nic}-renamed");
    let _restore = Restore {
        nic: nic.clone(),
        aliases: vec![renamed.clone()],
    };
    configure(&nic)?;
    let mac = view(&nic, None)?["address"].clone();
    let mut ns = PodNetns::create(&unique("vmt-ret-"))?;
    sh(&["ip", "link", "set", &nic, "netns", &ns.name])?;
    ns.ip(&["link", "set", &nic, "name", &renamed])?;
    ns.ip(&["addr", "add", "203.0.113.5/24", "dev", &renamed])?;
    ns.ip(&["link", "set", &renamed, "up"])?;
    assert!(!host_has(&nic));
    // No dranet: the runtime removes the netns and nothing else holds it.
    ns.remove_crio_style()?;
    let took = wait_for_blocking("the kernel to return the NIC", Duration::from_secs(20), || {
        host_has(&renamed)
    })?;
    eprintln!("kernel returned {renamed} {took:?} after the netns was removed");
    let v = view(&renamed, None)?;
    assert_eq!(v["up"], false, "returned UP: {v}");
    assert_eq!(v["addrs"], serde_json::json!([]), "addresses survived: {v}");
    assert_eq!(v["address"], mac, "MAC changed: {v}");
    assert_eq!(v["mtu"], 1400, "MTU changed: {v}");
    Ok(())
}

#[test]
fn kernel_names_a_returned_nic_devn_when_its_name_is_taken() -> Result<()> {
    let Some(nic) = vm_nic("kernel_names_a_returned_nic_devn_when_its_name_is_taken") else {
        return Ok(());
    };
    let ifindex = std::fs::read_to_string(format!("/sys/class/net/{nic}/ifindex"))?
        .trim()
        .to_owned();
    let fallback = format!("dev{ifindex}");
    let _restore = Restore {
        nic: nic.clone(),
        aliases: vec![fallback.clone(), "vmtclash".into()],
    };
    configure(&nic)?;
    let mut ns = PodNetns::create(&unique("vmt-clash-"))?;
    sh(&["ip", "link", "set", &nic, "netns", &ns.name])?;
    ns.ip(&["link", "set", &nic, "name", "vmtclash"])?;
    ns.ip(&["link", "set", "vmtclash", "up"])?;
    // The pod-side name is taken in the host when the kernel hands the NIC back.
    sh(&["ip", "link", "add", "vmtclash", "type", "dummy"])?;
    struct Dummy;
    impl Drop for Dummy {
        fn drop(&mut self) {
            let _ = sh(&["ip", "link", "delete", "vmtclash", "type", "dummy"]);
        }
    }
    let dummy = Dummy;
    ns.remove_crio_style()?;
    let took = wait_for_blocking("the kernel to return the NIC", Duration::from_secs(20), || {
        host_has(&fallback)
    })?;
    eprintln!("kernel returned the NIC as {fallback} {took:?} after the netns was removed");
    let v = view(&fallback, None)?;
    assert_eq!(v["up"], false, "returned UP: {v}");
    assert_eq!(v["addrs"], serde_json::json!([]), "addresses survived: {v}");
    drop(dummy);
    Ok(())
}

#[tokio::test]
async fn dranet_repairs_a_nic_the_kernel_handed_back() -> Result<()> {
    let Some((nic, _restore, before)) = configured_vm_nic("dranet_repairs_a_nic_the_kernel_handed_back")?
    else {
        return Ok(());
    };
    let state = StateDir::new("repair");
    let ns = PodNetns::create(&unique("vmt-rep-"))?;
    let uid = unique("pod-vm-rep-");
    let watcher = Watcher::start(WatcherOptions {
        ebpf: false,
        ..WatcherOptions::default()
    })
    .await?;
    let (e, events) = watched_engine(&state, watcher).await?;
    e.set_plan(plan(&nic, &uid))?;
    let out = e.attach_pod(pod(&uid), &ns.path).await?;
    assert_eq!(
        out,
        AttachOutcome::Attached {
            devices: vec!["net1".into()]
        }
    );
    let inside = view("net1", Some(&ns.name))?;
    assert_eq!(inside["up"], true, "{inside}");
    // What the kernel does on netns death (seen in kernel_returns_a_real_nic_down_…): back in
    // init_net under the pod-side name, DOWN, addresses gone.
    ns.ip(&["link", "set", "net1", "down"])?;
    ns.ip(&["link", "set", "net1", "netns", "1"])?;
    wait_for("the NIC in the host", Duration::from_secs(5), || {
        host_has("net1") || host_has(&nic)
    })
    .await?;
    let start = Instant::now();
    let key = dranet_sim::fixtures::sandbox_key(&uid);
    let repaired = || {
        e.checkpoint()
            .pods
            .get(&key)
            .is_some_and(|p| !p.has_devices_out())
    };
    while !repaired() {
        if start.elapsed() > Duration::from_secs(10) {
            bail!(
                "no repair within 10 s: {:?}",
                e.checkpoint().pods.get(&key).map(|p| p.phase)
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_same(&before, &view(&nic, None)?)?;
    assert_eq!(e.counters().repaired_devices, 1);
    drop(events);
    drop(ns);
    Ok(())
}

#[tokio::test]
async fn pinned_nic_comes_home_before_the_netns_dies() -> Result<()> {
    let Some((nic, _restore, before)) = configured_vm_nic("pinned_nic_comes_home_before_the_netns_dies")?
    else {
        return Ok(());
    };
    let state = StateDir::new("pin");
    let mut ns = PodNetns::create(&unique("vmt-pin-"))?;
    let uid = unique("pod-vm-pin-");
    let watcher = Watcher::start(WatcherOptions::default()).await?;
    let (e, events) = watched_engine(&state, watcher).await?;
    e.set_plan(plan(&nic, &uid))?;
    e.attach_pod(pod(&uid), &ns.path).await?;
    assert!(!host_has(&nic));
    // CRI-O order: the netns bind mount goes before any hook; the pin keeps the netns alive
    // until dranet has the NIC home with its host configuration.
    ns.remove_crio_style()?;
    let start = Instant::now();
    // Its netns is gone: once the devices are home the sandbox's record goes too.
    let key = dranet_sim::fixtures::sandbox_key(&uid);
    while e.counters().rescued_by_teardown == 0 || e.checkpoint().pods.contains_key(&key) {
        if start.elapsed() > Duration::from_secs(10) {
            bail!(
                "no rescue within 10 s: {:?}",
                e.checkpoint().pods.get(&key).map(|p| p.phase)
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!(
        "rescued {:?} after the netns bind mount was removed",
        start.elapsed()
    );
    assert_same(&before, &view(&nic, None)?)?;
    // The late StopPodSandbox finds nothing to do: the sandbox's record went with its netns.
    assert_eq!(stop_sandbox(&e, &uid, &ns.path).await?, DetachOutcome::NotOurs);
    drop(events);
    Ok(())
}

/// Deletes the soft-RoCE link at drop.
struct Rxe(String);

impl Drop for Rxe {
    fn drop(&mut self) {
        let _ = sh(&["rdma", "link", "delete", &self.0]);
    }
}

fn rdma_visible(netns: Option<&str>, dev: &str) -> bool {
    let out = match netns {
        Some(ns) => sh(&["ip", "netns", "exec", ns, "rdma", "dev", "show"]),
        None => sh(&["rdma", "dev", "show"]),
    };
    out.is_ok_and(|o| o.split_whitespace().any(|w| w.trim_end_matches(':') == dev))
}

/// dranet's own RDMA netlink move (thread and socket in the source netns) on soft-RoCE over the
/// VM's `DRANET_VM_RDMA` netdev. Exclusive mode (`ib_core netns_mode=0`) is set at module load.
/// With `DRANET_VM_RDMA_EXPECT=unsupported` (6.1: rxe has no `disassociate_ucontext`) the move
/// must fail with EOPNOTSUPP instead.
#[test]
fn dranet_moves_an_rdma_device_in_exclusive_mode() -> Result<()> {
    use dranet::sys::netns::Netns;
    use dranet::sys::rdma::{self, NetnsMode, RdmaError};
    let Ok(netdev) = std::env::var("DRANET_VM_RDMA") else {
        return Ok(());
    };
    if vm_nic("dranet_moves_an_rdma_device_in_exclusive_mode").is_none() {
        return Ok(());
    }
    assert_eq!(rdma::host_mode()?, Some(NetnsMode::Exclusive));
    let dev = "vmrxe1".to_owned();
    sh(&["rdma", "link", "add", &dev, "type", "rxe", "netdev", &netdev])?;
    let _rxe = Rxe(dev.clone());
    assert!(rdma_visible(None, &dev));
    let mut ns = PodNetns::create(&unique("vmt-rdma-"))?;
    let host = Netns::host()?;
    let pod_ns = Netns::open_path(&ns.path)?;
    let moved = rdma::move_device(&host, &dev, &pod_ns);
    if std::env::var("DRANET_VM_RDMA_EXPECT").is_ok_and(|v| v == "unsupported") {
        match moved {
            Err(RdmaError::Kernel { errno, .. }) if errno == libc::EOPNOTSUPP => {
                eprintln!("move refused with EOPNOTSUPP, as expected on this kernel");
                assert!(rdma_visible(None, &dev));
                return Ok(());
            }
            other => bail!("expected EOPNOTSUPP, got {other:?}"),
        }
    }
    moved?;
    assert!(rdma_visible(Some(&ns.name), &dev), "not in the pod netns");
    assert!(!rdma_visible(None, &dev), "still in the host");
    // Back: the thread and the socket must be in the pod netns.
    rdma::move_device(&pod_ns, &dev, &host)?;
    assert!(rdma_visible(None, &dev), "not back in the host");
    assert!(!rdma_visible(Some(&ns.name), &dev));
    // In again, then the netns dies: the kernel returns exclusive-mode devices to init_net.
    rdma::move_device(&host, &dev, &pod_ns)?;
    drop(pod_ns);
    ns.remove_crio_style()?;
    let took = wait_for_blocking(
        "the kernel to return the RDMA device",
        Duration::from_secs(20),
        || rdma_visible(None, &dev),
    )?;
    eprintln!("kernel returned {dev} {took:?} after the netns was removed");
    Ok(())
}

/// eth1's PCI function, read from sysfs (its kernel identity anywhere).
fn pci_of(nic: &str) -> Result<String> {
    dranet::inventory::Sysfs::new("/sys")
        .netdev_pci_address(nic)
        .ok_or_else(|| anyhow::anyhow!("{nic} has no PCI address in sysfs"))
}

/// Moves `nic` into `ns` as upstream dranet would: renamed `net1`, addressed, up.
fn move_by_hand(nic: &str, ns: &PodNetns) -> Result<()> {
    sh(&["ip", "link", "set", nic, "netns", &ns.name])?;
    ns.ip(&["link", "set", nic, "name", "net1"])?;
    ns.ip(&["addr", "add", "198.51.100.2/24", "dev", "net1"])?;
    ns.ip(&["link", "set", "net1", "up"])?;
    Ok(())
}

/// The `dra.net/ifName` of `device` in the slices under `dir`, if they carry it.
fn published_ifname(dir: &std::path::Path, device: &str) -> Option<String> {
    std::fs::read_dir(dir).ok()?.flatten().find_map(|f| {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(f.path()).ok()?).ok()?;
        v["spec"]["devices"]
            .as_array()?
            .iter()
            .find(|d| d["name"] == device)?["attributes"]["dra.net/ifName"]["string"]
            .as_str()
            .map(str::to_owned)
    })
}

/// What adoption restores of a device it did not snapshot: home under its host name, its MAC,
/// its MTU, up (addresses, offloads and sysctls were never known).
fn assert_home_adopted(nic: &str, before: &serde_json::Value) -> Result<()> {
    let v = view(nic, None)?;
    assert_eq!(v["up"], true, "came home DOWN: {v}");
    assert_eq!(v["address"], before["address"], "MAC: {v}");
    assert_eq!(v["mtu"], before["mtu"], "MTU: {v}");
    Ok(())
}

/// A NIC moved into a pod by hand (as upstream dranet would have, before a switch) is found by
/// its PCI function at the runtime's Synchronize, adopted (plan with eth1's PCI address), and
/// comes home in CRI-O order: the netns bind mount goes first, the Stop comes late.
#[tokio::test]
async fn a_nic_moved_in_by_hand_is_adopted_at_synchronize_and_comes_home_in_crio_order() -> Result<()> {
    use dranet::adoption::{Adopter, AllocationsCell, Source};
    use dranet::nri::hooks::{Outcome, Pod, PodHooks};
    use dranet::rescue::AdoptOutcome;
    let Some((nic, _restore, before)) =
        configured_vm_nic("a_nic_moved_in_by_hand_is_adopted_at_synchronize_and_comes_home_in_crio_order")?
    else {
        return Ok(());
    };
    let pci = pci_of(&nic)?;
    let state = StateDir::new("adopt");
    let mut ns = PodNetns::create(&unique("vmt-adopt-"))?;
    move_by_hand(&nic, &ns)?;
    assert!(!host_has(&nic));
    let uid = unique("pod-vm-adopt-");
    let watcher = Watcher::start(WatcherOptions::default()).await?;
    let (e, events) = watched_engine(&state, watcher).await?;
    let mut p = plan(&nic, &uid);
    p.devices[0].pci_address = Some(pci.clone());
    e.set_plan(p)?;
    // The runtime's Synchronize (after a (re)connect) lists the running sandbox; dranet has no
    // record of it. The claims never come (no kubelet side here): the plan is enough.
    let adopter = Adopter::new(e.clone(), AllocationsCell::default());
    let mut runs = adopter.runs();
    let driver = dranet::pod::Driver::new(e.clone()).with_adoption(adopter.clone());
    let sandbox = Pod {
        uid: uid.clone(),
        namespace: "default".into(),
        name: "vm".into(),
        id: uid.clone(),
        netns: Some(ns.path.clone()),
        ..Pod::default()
    };
    driver.synchronize(vec![sandbox.clone()], vec![]).await;
    tokio::time::timeout(Duration::from_secs(30), runs.wait_for(|n| *n > 0)).await??;
    let report = adopter.last();
    eprintln!("adoption: {report:?}");
    assert_eq!(report.len(), 1, "{report:?}");
    assert_eq!(report[0].from, Source::Plan);
    assert_eq!(
        report[0].outcome,
        Ok(AdoptOutcome::Adopted {
            devices: vec![nic.clone()],
            unidentified: vec![]
        })
    );
    let key = dranet_sim::fixtures::sandbox_key(&uid);
    assert!(
        e.checkpoint()
            .pods
            .get(&key)
            .is_some_and(|r| r.has_devices_out() && r.pin.is_some())
    );
    // CRI-O order: the runtime unmounts and unlinks the netns first.
    ns.remove_crio_style()?;
    let start = Instant::now();
    while e.counters().rescued_by_teardown == 0 || !host_has(&nic) || e.checkpoint().pods.contains_key(&key) {
        if start.elapsed() > Duration::from_secs(20) {
            bail!(
                "adopted NIC not home within 20 s: {:?}",
                e.checkpoint().pods.get(&key).map(|p| p.phase)
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!(
        "adopted {nic} returned {:?} after the netns bind mount was removed",
        start.elapsed()
    );
    assert_home_adopted(&nic, &before)?;
    // The late StopPodSandbox: nothing left to do.
    assert_eq!(driver.stop_pod_sandbox(sandbox).await?, Outcome::Noop);
    drop(events);
    Ok(())
}

/// The daemon attaches eth1 to a pod, is SIGKILLed and its state dir wiped (pins unmounted):
/// restarted, it has no record and no plan. The runtime's Synchronize on connect names the
/// sandbox; the daemon reads the claims dir and the slices it published before (eth1 with its
/// `dra.net/pciAddress`), finds eth1 in the pod by its PCI function, pins and records it, and
/// brings it home in CRI-O order: under its published `dra.net/ifName` when the slices kept it
/// while the NIC was in the pod, else under its pod-side name (its slice name, `pci-…`, is no
/// netdev name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_with_a_wiped_state_dir_adopts_its_nic_and_brings_it_home_in_crio_order() -> Result<()> {
    use dranet_sim::node::{Node, NodeOptions};
    use dranet_sim::nri_runtime::{Flavor, RuntimeConfig};
    let Some((nic, _restore, before)) =
        configured_vm_nic("a_daemon_with_a_wiped_state_dir_adopts_its_nic_and_brings_it_home_in_crio_order")?
    else {
        return Ok(());
    };
    let pci = pci_of(&nic)?;
    let mut node = Node::start(NodeOptions {
        runtime: RuntimeConfig {
            flavor: Flavor::Crio,
            ..RuntimeConfig::default()
        },
        ..NodeOptions::default()
    })
    .await?;
    let mut pod = TestPod::new("pod-vm-wipe-")?;
    // A PCI-backed NIC is published under its PCI function's name (as upstream), `pci-…`; its
    // host name is the `dra.net/ifName` attribute.
    let device = dranet::inventory::pci_device_name(&pci);
    pod.prepare(
        &node,
        &[(
            device.clone(),
            serde_json::json!({"interface": {"name": "net1", "addresses": ["198.51.100.2/24"]}}),
        )],
    )
    .await?;
    pod.run(&node).await?;
    assert!(!host_has(&nic), "{nic} still in the host after RunPodSandbox");
    pod.ns.ip(&["link", "show", "dev", "net1"])?;
    // The slices the daemon published keep the NIC (in a pod) with its PCI address and name.
    let slices = node.dir.join("slices");
    let (d, p) = (format!("\"{device}\""), pci.clone());
    let published = move || {
        std::fs::read_dir(&slices)
            .into_iter()
            .flatten()
            .flatten()
            .any(|f| std::fs::read_to_string(f.path()).is_ok_and(|t| t.contains(&d) && t.contains(&p)))
    };
    wait_for(
        "the NIC and its PCI address in the published slices",
        Duration::from_secs(30),
        published,
    )
    .await?;
    // The host name adoption can know: `dra.net/ifName` if the slices kept it while the NIC was in
    // the pod, else the name it has there (a PCI function's slice name is no netdev name).
    let home = published_ifname(&node.dir.join("slices"), &device).unwrap_or_else(|| "net1".to_owned());
    eprintln!("the NIC comes home as {home}");
    node.kill()?;
    node.wipe_state()?;
    assert!(node.records()?.is_empty());
    node.restart().await?;
    let start = Instant::now();
    let key = (pod.uid.clone(), pod.sandbox.id.clone());
    while !node.records()?.contains(&key) || node.pins().is_empty() {
        if start.elapsed() > Duration::from_secs(60) {
            bail!("not adopted within 60 s: records {:?}", node.records()?);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("adopted {:?} after the restart", start.elapsed());
    let cp = node.checkpoint()?;
    let rec = cp["pods"]
        .as_object()
        .and_then(|m| m.values().find(|r| r["pod_uid"] == pod.uid.as_str()))
        .cloned()
        .unwrap_or_default();
    assert_eq!(rec["phase"], "attached", "{rec}");
    assert_eq!(rec["devices"][0]["device"], device.as_str(), "{rec}");
    assert_eq!(rec["devices"][0]["pci_address"], pci.as_str(), "{rec}");
    assert_eq!(rec["devices"][0]["snapshot"]["name"], home.as_str(), "{rec}");
    // CRI-O order: netns gone first, then a late StopPodSandbox with the dead path.
    pod.ns.remove_crio_style()?;
    let start = Instant::now();
    wait_for("the adopted NIC home", Duration::from_secs(30), || {
        host_has(&home)
    })
    .await?;
    eprintln!(
        "adopted {nic} returned as {home} {:?} after the netns bind mount was removed",
        start.elapsed()
    );
    node.runtime.stop_pod_sandbox(&pod.sandbox).await?;
    assert_home_adopted(&home, &before)?;
    let start = Instant::now();
    while node.records()?.contains(&key) {
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the record stays after teardown: {:?}", node.records()?);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// `name=state` pairs (`active`/`unsupported`/`failed`), space separated.
fn parse_expected(s: &str) -> Vec<(String, String)> {
    s.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(n, st)| (n.to_owned(), st.to_owned()))
        .collect()
}

/// Which tier each kernel gets: the probe table of `dranet trace` and the daemon's
/// `dranet_probes_active` gauges must both say what the kernel matrix expects of this kernel and
/// boot (`DRANET_VM_EXPECT_PROBES`, set per kernel by `cargo xtask vm-test`), and every probe that
/// is not active must carry a reason. A kernel that cannot load a program must be seen to fall
/// back, not to fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_tiers_in_trace_and_metrics_are_what_this_kernel_allows() -> Result<()> {
    let test = "probe_tiers_in_trace_and_metrics_are_what_this_kernel_allows";
    if vm_nic(test).is_none() {
        return Ok(());
    }
    let Ok(expect) = std::env::var("DRANET_VM_EXPECT_PROBES") else {
        bail!("DRANET_VM_EXPECT_PROBES is not set: the kernel matrix names every probe's state per kernel");
    };
    let expect = parse_expected(&expect);
    let out = std::process::Command::new(dranet_sim::kernel::dranet_bin()?)
        .args(["trace", "--json", "--duration", "1"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    let table: serde_json::Value = serde_json::from_str(first)?;
    let probes = table["probes"].as_array().cloned().unwrap_or_default();
    let mut problems = Vec::new();
    for p in &probes {
        let name = p["name"].as_str().unwrap_or_default();
        let state = p["state"].as_str().unwrap_or_default();
        let reason = p["reason"].as_str().unwrap_or_default();
        println!(
            "probe tier {} {name}: {state} {reason}",
            p["tier"].as_str().unwrap_or_default()
        );
        match expect.iter().find(|(n, _)| n == name) {
            Some((_, want)) if want != state => {
                problems.push(format!("trace: {name} is {state} ({reason}), want {want}"));
            }
            None => problems.push(format!("trace: {name} is not in the expected table")),
            _ => {}
        }
        if state != "active" && reason.is_empty() {
            problems.push(format!("trace: {name} is {state} without a reason"));
        }
    }
    for (n, _) in &expect {
        if !probes.iter().any(|p| p["name"] == n.as_str()) {
            problems.push(format!("trace: no probe {n}"));
        }
    }
    // The daemon: same kernel, its own choice of probes (netns_cleanup is trace-only).
    let port = dranet_sim::node::free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let node = dranet_sim::node::Node::start(dranet_sim::node::NodeOptions {
        bind_address: addr.clone(),
        ..Default::default()
    })
    .await?;
    let (code, metrics) = dranet_sim::node::http_get(&addr, "/metrics").await?;
    drop(node);
    if code != 200 {
        bail!("/metrics answered {code}");
    }
    for (name, want) in &expect {
        let tier = probes
            .iter()
            .find(|p| p["name"] == name.as_str())
            .and_then(|p| p["tier"].as_str())
            .unwrap_or("?");
        let daemon_want = if name == "netns_cleanup" {
            "unsupported"
        } else {
            want
        };
        let value = if daemon_want == "active" { 1 } else { 0 };
        let line = format!("dranet_probes_active{{tier=\"{tier}\",probe=\"{name}\"}} {value}");
        if !metrics.lines().any(|l| l == line) {
            problems.push(format!("/metrics: no line {line}"));
        }
    }
    if !problems.is_empty() {
        bail!(
            "probe tiers on {}:\n{}\n/metrics:\n{}",
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim(),
            problems.join("\n"),
            metrics
                .lines()
                .filter(|l| l.starts_with("dranet_probes_active"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    println!(
        "probe tiers as expected: {} probes in trace and /metrics",
        expect.len()
    );
    Ok(())
}
