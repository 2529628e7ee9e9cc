//! The six sequences of the identities issue, each as the real components produce it, against the
//! real `dranet run` binary (NRI runtime harness + kubelet simulator) where a daemon is involved,
//! on real netns and veth pairs standing in for NICs:
//!
//! 1. kubelet re-creates a pod's sandbox under the same UID and garbage-collects the old one
//!    later: the old sandbox's hooks never touch the new one's devices;
//! 2. a host link carrying the MAC a tenant wrote into the claim, or the device's original MAC,
//!    is never renamed or reconfigured;
//! 3. a pod with NET_ADMIN renames the device and makes an impostor under its name and MAC: the
//!    impostor stays in the pod, the device comes home;
//! 4. records of sandboxes torn down and removed while dranet was down, or never reported by a
//!    restarted runtime, are dropped;
//! 5. a reconcile that starts while an attach runs does not act on the phase it read before
//!    owning the pod;
//! 6. lost events (eBPF ring buffer full, rtnetlink ENOBUFS) become a reconcile.
//!
//! `DRANET_BIN=<old build>/dranet cargo test -p dranet-sim --test identities` runs the daemon
//! tests against another build of the daemon.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use dranet::rescue::EngineOptions;
use dranet::watch::{EventKind, Source, Watcher, WatcherOptions};
use dranet_sim::fixtures::{
    StateDir, device_plan, engine_case, nic_device, pod_plan, pod_ref, prepare_claim, sandbox_ref,
    stop_sandbox, wait_for, watched_engine,
};
use dranet_sim::kernel::{PodNetns, Veth, host_has, sh, unique};
use dranet_sim::kubelet::Claim;
use dranet_sim::nic::{Nic, assert_same, view, wait_restored};
use dranet_sim::node::{Node, NodeOptions, sandbox_with_id};
use dranet_sim::nri_runtime::{Flavor, RuntimeConfig};
use dranet_sim::root_or_skip;
use serde_json::{Value, json};

fn node_opts(flavor: Flavor) -> NodeOptions {
    NodeOptions {
        runtime: RuntimeConfig {
            flavor,
            ..RuntimeConfig::default()
        },
        ..NodeOptions::default()
    }
}

/// A stand-in NIC and its host view, a node whose runtime is `flavor`, and pod `<tag>…`'s claim
/// on the NIC with `config`, prepared.
async fn node_with_claim(
    flavor: Flavor,
    tag: &str,
    config: Value,
) -> Result<(Nic, Value, Node, String, Claim)> {
    let (nic, before) = Nic::with_view()?;
    let node = Node::start(node_opts(flavor)).await?;
    let uid = unique(tag);
    let claim = prepare_claim(&node, &uid, &[nic_device(&nic, config)]).await?;
    Ok((nic, before, node, uid, claim))
}

/// A runtime-style sandbox id (64 hex digits), unique on this machine.
fn sandbox_id() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{:032x}{n:032x}", std::process::id())
}

// ---------------------------------------------------------------------------------------------
// 1. Sandbox re-creation
// ---------------------------------------------------------------------------------------------

/// kubelet's order when it re-creates a sandbox: StopPodSandbox(A), RunPodSandbox(B) under the
/// same pod UID (no new Prepare), and later its GC sends RemovePodSandbox(A) while B runs.
async fn recreation(flavor: Flavor) -> Result<()> {
    let (nic, before, mut node, uid, claim) =
        node_with_claim(flavor, "recreate-", json!({"interface": {"name": "net0"}})).await?;
    let mut ns_a = PodNetns::create(&unique("dranet-idA-"))?;
    let a = sandbox_with_id(&uid, &sandbox_id(), &ns_a.path);
    node.runtime.run_pod_sandbox(&a).await.context("Run(A)")?;
    assert!(ns_a.has("net0"));
    match flavor {
        Flavor::Containerd => {
            node.runtime.stop_pod_sandbox(&a).await.context("Stop(A)")?;
            tokio::time::sleep(Duration::from_millis(70)).await;
            ns_a.remove_crio_style()?;
        }
        Flavor::Crio => {
            ns_a.remove_crio_style()?;
            wait_for("rescued from A", Duration::from_secs(5), || host_has(&nic.name)).await?;
            node.runtime.stop_pod_sandbox(&a).await.context("Stop(A)")?;
        }
    }
    wait_restored(&nic.name, &before, Duration::from_secs(5)).await?;
    let ns_b = PodNetns::create(&unique("dranet-idB-"))?;
    let b = sandbox_with_id(&uid, &sandbox_id(), &ns_b.path);
    node.runtime.run_pod_sandbox(&b).await.context("Run(B)")?;
    node.runtime.set_state(vec![a.clone(), b.clone()], vec![]);
    assert!(ns_b.has("net0"), "the new sandbox did not get the device");
    // The container GC, while B runs.
    tokio::time::sleep(Duration::from_millis(100)).await;
    node.runtime.remove_pod_sandbox(&a).await.context("Remove(A)")?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        ns_b.has("net0"),
        "RemovePodSandbox of the old sandbox pulled the device out of the new one"
    );
    assert!(!host_has(&nic.name));
    // A restarted runtime re-synchronizes with B alone: still nothing moves.
    node.runtime.set_state(vec![b.clone()], vec![]);
    node.runtime.disconnect();
    node.runtime.wait_ready(2, Duration::from_secs(10)).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(ns_b.has("net0"), "Synchronize pulled the device out of B");
    assert_eq!(node.records()?.len(), 1, "{:?}", node.records()?);
    node.runtime.stop_pod_sandbox(&b).await?;
    wait_restored(&nic.name, &before, Duration::from_secs(5)).await?;
    node.runtime.remove_pod_sandbox(&b).await?;
    node.unprepare(&claim).await?;
    // RemovePodSandbox drops the record staged, not awaited (rescue::sandbox: a crash that
    // loses it leaves a record the restart drops again): it leaves the disk right after.
    let gone = wait_for("the record of B dropped", Duration::from_secs(3), || {
        node.records().is_ok_and(|r| r.is_empty())
    })
    .await;
    assert!(gone.is_ok(), "{:?}", node.records()?);
    node.stop()?;
    Ok(())
}

dranet_sim::root_tests! {
    sandbox_recreation_containerd_gc_of_the_old_sandbox_leaves_the_new_one_alone => recreation(Flavor::Containerd);
    sandbox_recreation_crio_gc_of_the_old_sandbox_leaves_the_new_one_alone => recreation(Flavor::Crio);
}

/// The old sandbox's StopPodSandbox never came before the new sandbox started (it comes late):
/// RunPodSandbox(B) brings the device home from A first, then moves it to B; the late Stop(A)
/// touches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_sandbox_takes_the_devices_from_an_old_one_still_holding_them() -> Result<()> {
    root_or_skip!("a_new_sandbox_takes_the_devices_from_an_old_one_still_holding_them");
    let (nic, before, node, uid, claim) = node_with_claim(
        Flavor::Containerd,
        "late-stop-",
        json!({"interface": {"name": "net0"}}),
    )
    .await?;
    let mut ns_a = PodNetns::create(&unique("dranet-idA-"))?;
    let a = sandbox_with_id(&uid, &sandbox_id(), &ns_a.path);
    node.runtime.run_pod_sandbox(&a).await?;
    let ns_b = PodNetns::create(&unique("dranet-idB-"))?;
    let b = sandbox_with_id(&uid, &sandbox_id(), &ns_b.path);
    node.runtime
        .run_pod_sandbox(&b)
        .await
        .context("Run(B) while A holds the device")?;
    assert!(ns_b.has("net0") && !ns_a.has("net0"));
    node.runtime.stop_pod_sandbox(&a).await?;
    ns_a.remove_crio_style()?;
    node.runtime.remove_pod_sandbox(&a).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        ns_b.has("net0"),
        "the late Stop/Remove of A took the device from B"
    );
    node.runtime.stop_pod_sandbox(&b).await?;
    wait_restored(&nic.name, &before, Duration::from_secs(5)).await?;
    node.runtime.remove_pod_sandbox(&b).await?;
    node.unprepare(&claim).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 2. A tenant-chosen MAC on host links
// ---------------------------------------------------------------------------------------------

/// A veth pair in the host whose first end carries `mac` (as Calico gives every host-side veth
/// one MAC): what it looked like, to compare later.
fn decoy(mac: &str) -> Result<(Veth, Value)> {
    let v = Veth::create_with_mac(&unique("dcy"), &unique("dcz"), mac)?;
    sh(&["ip", "link", "set", &v.a, "mtu", "1280", "up"]).with_context(|| {
        format!(
            "host link {} (MAC {mac}) was renamed away right after it appeared",
            v.a
        )
    })?;
    let seen = view(&v.a, None)?;
    Ok((v, seen))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_links_with_the_claims_mac_or_the_original_mac_are_never_touched() -> Result<()> {
    root_or_skip!("host_links_with_the_claims_mac_or_the_original_mac_are_never_touched");
    let tenant_mac = "02:dd:00:00:00:42";
    let (nic, before, node, uid, claim) = node_with_claim(
        Flavor::Containerd,
        "tenant-mac-",
        json!({"interface": {"name": "net0", "hardwareAddr": tenant_mac}}),
    )
    .await?;
    let ns = PodNetns::create(&unique("dranet-idM-"))?;
    let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
    node.runtime.run_pod_sandbox(&sb).await?;
    // New host links with the claim's MAC and with the device's original MAC.
    let decoys = [decoy(tenant_mac)?, decoy(&nic.mac)?];
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (v, seen) in &decoys {
        assert_same(
            seen,
            &view(&v.a, None).with_context(|| format!("{} renamed away", v.a))?,
        )
        .with_context(|| format!("host link {} was reconfigured", v.a))?;
    }
    assert!(ns.has("net0"));
    node.runtime.stop_pod_sandbox(&sb).await?;
    wait_restored(&nic.name, &before, Duration::from_secs(5)).await?;
    for (v, seen) in &decoys {
        assert_same(seen, &view(&v.a, None)?)
            .with_context(|| format!("host link {} after the return", v.a))?;
    }
    node.runtime.remove_pod_sandbox(&sb).await?;
    node.unprepare(&claim).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 3. A pod-side impostor
// ---------------------------------------------------------------------------------------------

/// What a tenant with NET_ADMIN can do: rename the device away and make a link with its pod-side
/// name and MAC.
fn impostor(ns: &PodNetns, mac: &str) -> Result<()> {
    ns.ip(&["link", "set", "net0", "down"])?;
    ns.ip(&["link", "set", "net0", "name", "tenant0"])?;
    ns.ip(&["link", "add", "net0", "type", "veth", "peer", "name", "imp0"])?;
    ns.ip(&["link", "set", "net0", "address", mac, "up"])?;
    Ok(())
}

async fn impostor_case(flavor: Flavor) -> Result<()> {
    let pod_mac = "02:dd:00:00:00:43";
    let (nic, before, node, uid, claim) = node_with_claim(
        flavor,
        "impostor-",
        json!({"interface": {"name": "net0", "hardwareAddr": pod_mac}}),
    )
    .await?;
    let mut ns = PodNetns::create(&unique("dranet-idI-"))?;
    let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
    node.runtime.run_pod_sandbox(&sb).await?;
    impostor(&ns, pod_mac)?;
    // Watch the impostor from the host: it must never show up here.
    let imp_index: u32 = ns.ip(&["-j", "link", "show", "dev", "net0"]).and_then(|j| {
        let v: Value = serde_json::from_str(&j)?;
        v[0]["ifindex"].as_u64().map(|i| i as u32).context("ifindex")
    })?;
    match flavor {
        Flavor::Containerd => {
            node.runtime.stop_pod_sandbox(&sb).await?;
            wait_restored(&nic.name, &before, Duration::from_secs(5))
                .await
                .context("the device did not come home")?;
            assert!(ns.has("net0"), "the impostor left the pod");
            ns.remove_crio_style()?;
        }
        Flavor::Crio => {
            ns.remove_crio_style()?;
            wait_restored(&nic.name, &before, Duration::from_secs(5))
                .await
                .context("the device did not come home")?;
            node.runtime.stop_pod_sandbox(&sb).await?;
        }
    }
    let host_links = sh(&["ip", "-j", "-d", "link", "show"])?;
    let host: Value = serde_json::from_str(&host_links)?;
    let kinds: Vec<(String, String)> = host
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            (
                l["ifname"].as_str().unwrap_or_default().to_owned(),
                l["address"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert!(
        !kinds
            .iter()
            .any(|(n, m)| n == "net0" || (m == pod_mac && n != &nic.name)),
        "the impostor (pod ifindex {imp_index}) came to the host: {kinds:?}"
    );
    node.runtime.remove_pod_sandbox(&sb).await?;
    node.unprepare(&claim).await?;
    Ok(())
}

dranet_sim::root_tests! {
    a_pod_side_impostor_stays_in_the_pod_containerd_order => impostor_case(Flavor::Containerd);
    a_pod_side_impostor_stays_in_the_pod_crio_order => impostor_case(Flavor::Crio);
}

// ---------------------------------------------------------------------------------------------
// 4. Stale records
// ---------------------------------------------------------------------------------------------

/// Three pods, each torn down and removed by the runtime while dranet is down: after the restart
/// the devices are home and no record is left (the checkpoint does not grow by one each time),
/// `dranet status` lists no pod, and `release-all` leaves no record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_sandboxes_removed_while_dranet_was_down_are_dropped() -> Result<()> {
    root_or_skip!("records_of_sandboxes_removed_while_dranet_was_down_are_dropped");
    let (nic, before) = Nic::with_view()?;
    let mut node = Node::start(node_opts(Flavor::Crio)).await?;
    for round in 0..3 {
        let uid = unique("down-");
        let claim = prepare_claim(
            &node,
            &uid,
            &[nic_device(&nic, json!({"interface": {"name": "net0"}}))],
        )
        .await?;
        let mut ns = PodNetns::create(&unique("dranet-idD-"))?;
        let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
        node.runtime.run_pod_sandbox(&sb).await?;
        node.runtime.set_state(vec![sb.clone()], vec![]);
        node.kill()?;
        // The runtime tears the pod down and removes it; no plugin is there to hear it.
        ns.remove_crio_style()?;
        let _ = node.runtime.stop_pod_sandbox(&sb).await;
        let _ = node.runtime.remove_pod_sandbox(&sb).await;
        node.runtime.set_state(vec![], vec![]);
        node.restart().await?;
        wait_restored(&nic.name, &before, Duration::from_secs(5))
            .await
            .with_context(|| format!("round {round}"))?;
        wait_for("no record left", Duration::from_secs(5), || {
            node.records().is_ok_and(|r| r.is_empty())
        })
        .await
        .with_context(|| format!("round {round}: records {:?}", node.records()))?;
        let status = node.cli(&["status"])?;
        let out = String::from_utf8_lossy(&status.stdout);
        assert!(!out.contains("\npod "), "dranet status still lists a pod:\n{out}");
        node.unprepare(&claim).await?;
    }
    node.kill()?;
    let rel = node.cli(&["release-all"])?;
    assert!(rel.status.success(), "{rel:?}");
    assert!(node.records()?.is_empty());
    Ok(())
}

/// containerd 2.3.4 sends no Stop/Remove to NRI for the sandboxes it recovered after its own
/// restart. The unmount probe rescues the devices; the record goes with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_runtime_that_never_sends_stop_or_remove_leaves_no_record() -> Result<()> {
    root_or_skip!("a_restarted_runtime_that_never_sends_stop_or_remove_leaves_no_record");
    let (nic, before, node, uid, claim) = node_with_claim(
        Flavor::Containerd,
        "silent-",
        json!({"interface": {"name": "net0"}}),
    )
    .await?;
    let mut ns = PodNetns::create(&unique("dranet-idS-"))?;
    let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
    node.runtime.run_pod_sandbox(&sb).await?;
    // The runtime restarts and recovers the sandbox.
    node.runtime.set_state(vec![sb.clone()], vec![]);
    node.runtime.disconnect();
    node.runtime.wait_ready(2, Duration::from_secs(10)).await?;
    assert!(ns.has("net0"));
    // Later the pod goes; the runtime tells NRI nothing.
    ns.remove_crio_style()?;
    node.runtime.set_state(vec![], vec![]);
    wait_restored(&nic.name, &before, Duration::from_secs(5)).await?;
    wait_for("the record dropped", Duration::from_secs(5), || {
        node.records().is_ok_and(|r| r.is_empty())
    })
    .await
    .with_context(|| format!("records {:?}", node.records()))?;
    assert!(node.pins().is_empty());
    node.unprepare(&claim).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 5. Reconcile on a stale phase
// ---------------------------------------------------------------------------------------------

/// A reconcile triggered at runtime (lost events) lists the pods while an attach is under way
/// (phase `Attaching`). It must act on the phase it finds once it owns the pod (`Attached`), not
/// roll back the pod that just attached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_during_an_attach_does_not_roll_it_back() -> Result<()> {
    root_or_skip!("a_reconcile_during_an_attach_does_not_roll_it_back");
    let state = StateDir::new("stale");
    let ns = PodNetns::create(&unique("dranet-idR-"))?;
    let nics = [Nic::create()?, Nic::create()?];
    let uid = unique("pod-stale-");
    let opts = EngineOptions {
        state_dir: state.0.clone(),
        // The attach holds the pod for 600 ms after its first device moved.
        pause_after_device: Some((0, Duration::from_millis(600))),
        ..EngineOptions::default()
    };
    let e = dranet::rescue::Engine::new(opts, None).await?;
    e.set_plan(pod_plan(
        &uid,
        vec![
            device_plan(&nics[0], "net1", &uid, Default::default()),
            device_plan(&nics[1], "net2", &uid, Default::default()),
        ],
    ))?;
    let (e1, u1, path) = (e.clone(), uid.clone(), ns.path.clone());
    let attach = tokio::spawn(async move { e1.attach_pod(pod_ref(&u1), &path).await });
    wait_for("the attach under way", Duration::from_secs(5), || ns.has("net1")).await?;
    let e2 = e.clone();
    let reconcile = tokio::spawn(async move { e2.reconcile().await });
    attach.await??;
    let report = reconcile.await??;
    assert!(
        ns.has("net1") && ns.has("net2"),
        "the reconcile rolled back a pod that had just attached: {report:?}"
    );
    stop_sandbox(&e, &uid, &ns.path).await?;
    // Once the sandbox is removed and its claim unprepared, nothing of the pod stays in memory.
    e.forget_sandbox(sandbox_ref(&uid, None)).await?;
    e.remove_claim(&format!("claim-{uid}"))?;
    assert!(e.checkpoint().pods.is_empty());
    assert_eq!(e.lock_count(), 0, "the per-pod lock map was not pruned");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 6. Lost events
// ---------------------------------------------------------------------------------------------

/// The eBPF ring buffer fills while the teardown happens, so the probes drop the very events that
/// would trigger the rescue. The dropped count becomes a `Lost` event, the engine reconciles, and
/// the device comes home all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_ring_buffer_becomes_a_reconcile_and_the_device_comes_home() -> Result<()> {
    root_or_skip!("a_full_ring_buffer_becomes_a_reconcile_and_the_device_comes_home");
    let (state, mut ns, nic, before, uid) = engine_case("lost")?;
    let watcher = Watcher::start(WatcherOptions {
        // The reader starts late: until then the ring buffer only fills.
        ring_reader_delay: Some(Duration::from_secs(2)),
        ..WatcherOptions::default()
    })
    .await?;
    if !watcher
        .status()
        .iter()
        .any(|s| s.name == "umount" && s.state == dranet::watch::ProbeState::Active)
    {
        bail!("the umount probe is not active: {:?}", watcher.status());
    }
    let mut probe = watcher.subscribe();
    let (e, events) = watched_engine(&state, watcher).await?;
    e.set_plan(pod_plan(
        &uid,
        vec![device_plan(&nic, "net1", &uid, Default::default())],
    ))?;
    e.attach_pod(pod_ref(&uid), &ns.path).await?;
    // Fill the ring buffer: failed umount2 calls on the watched path (each is an event).
    let path = std::ffi::CString::new(ns.path.as_os_str().as_encoded_bytes())?;
    for _ in 0..3000 {
        // SAFETY: umount2 with an invalid flag combination on a valid C string fails (EINVAL)
        // without touching the mount; only the probe sees it.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_EXPIRE | libc::MNT_FORCE) };
    }
    // The teardown: its events find the ring buffer full.
    ns.remove_crio_style()?;
    let lost = tokio::time::timeout(Duration::from_secs(8), async {
        while let Some(ev) = probe.recv().await {
            if let EventKind::Lost { count } = ev.kind
                && ev.source == Source::Probe
            {
                return Some(count);
            }
        }
        None
    })
    .await
    .context("no Lost event from the probes")?;
    assert!(lost.is_some_and(|n| n > 0), "{lost:?}");
    wait_for(
        "the device home after the reconcile",
        Duration::from_secs(8),
        || host_has(&nic.name),
    )
    .await?;
    wait_restored(&nic.name, &before, Duration::from_secs(5)).await?;
    drop(events);
    Ok(())
}

/// The rtnetlink monitor's receive buffer overflows (ENOBUFS) during a burst of link events: a
/// `Lost` event comes out instead of silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rtnetlink_overflow_is_a_lost_event() -> Result<()> {
    root_or_skip!("an_rtnetlink_overflow_is_a_lost_event");
    let watcher = Watcher::start(WatcherOptions {
        ebpf: false,
        rtnl_rcvbuf: 4096,
        // Not read while the burst lands, so the overflow does not hang on how fast this
        // machine's reader is (a fast reader kept up with 48 pairs in CI).
        rtnl_reader_delay: Some(Duration::from_secs(2)),
        ..WatcherOptions::default()
    })
    .await?;
    let mut sub = watcher.subscribe();
    // A burst of host link events (one batch, so the monitor cannot keep up with a 4 KiB buffer).
    let tag = unique("ob");
    let batch: String = (0..48)
        .map(|i| format!("link add {tag}a{i} type veth peer name {tag}b{i}\n"))
        .collect();
    let file = std::env::temp_dir().join(format!("{tag}.batch"));
    std::fs::write(&file, &batch)?;
    let _guard = Cleanup(tag.clone(), file.clone());
    sh(&["ip", "-batch", file.to_str().context("path")?])?;
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = sub.recv().await {
            if matches!(ev.kind, EventKind::Lost { .. }) && ev.source == Source::Rtnetlink {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(got, "no Lost event after an rtnetlink overflow");
    Ok(())
}

struct Cleanup(String, std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for i in 0..48 {
            let _ = std::process::Command::new("ip")
                .args(["link", "del", &format!("{}a{i}", self.0)])
                .output();
        }
        let _ = std::fs::remove_file(&self.1);
    }
}
