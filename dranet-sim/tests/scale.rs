//! Scale on the real kernel: many pods torn down at once.

use std::time::Duration;

use anyhow::{Context, Result};
use dranet::watch::{Watcher, WatcherOptions};
use dranet_sim::fixtures::{StateDir, device_plan, pod_plan, pod_ref, wait_for, watched_engine};
use dranet_sim::kernel::{PodNetns, host_has, unique};
use dranet_sim::nic::{Nic, assert_same, view};
use dranet_sim::root_or_skip;
use nix::mount::MntFlags;

/// Eight pods torn down at the same instant, CRI-O style, each teardown triggering its rescue
/// exactly once (the umount2 only: no unlink follows): every device comes home restored.
/// Concurrent rescues used to share one host rtnetlink socket, and the kernel refuses a second
/// dump on a socket whose dump still runs (EBUSY): a rescue failed its pass and, with no second
/// trigger, its device stayed in the dying pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_pods_rescued_at_once_each_triggered_once() -> Result<()> {
    root_or_skip!("eight_pods_rescued_at_once_each_triggered_once");
    const PODS: usize = 8;
    let state = StateDir::new("drain8");
    let nics: Vec<Nic> = (0..PODS).map(|_| Nic::create()).collect::<Result<_>>()?;
    let before: Vec<_> = nics.iter().map(|n| view(&n.name, None)).collect::<Result<_>>()?;
    let watcher = Watcher::start(WatcherOptions::default()).await?;
    let (e, events) = watched_engine(&state, watcher).await?;
    let mut pods = Vec::new();
    for nic in &nics {
        let uid = unique("pod-drain-");
        let ns = PodNetns::create(&unique("dranet-drain-"))?;
        e.set_plan(pod_plan(
            &uid,
            vec![device_plan(nic, "net1", &uid, Default::default())],
        ))?;
        e.attach_pod(pod_ref(&uid), &ns.path).await?;
        pods.push((uid, ns));
    }
    // All at once: one thread per pod, released together, each only unmounting (one trigger).
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(PODS));
    let threads: Vec<_> = pods
        .iter()
        .map(|(_, ns)| {
            let (path, b) = (ns.path.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                nix::mount::umount2(&path, MntFlags::MNT_DETACH)
            })
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("umount thread panicked"))??;
    }
    for (nic, b) in nics.iter().zip(&before) {
        wait_for(&format!("{} home", nic.name), Duration::from_secs(10), || {
            host_has(&nic.name)
        })
        .await?;
        let mut last = Ok(());
        for _ in 0..200 {
            last = assert_same(b, &view(&nic.name, None)?);
            if last.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        last?;
    }
    // Each rescue is counted once its pin is released, right after the last restore.
    wait_for("every rescue counted", Duration::from_secs(5), || {
        e.counters().rescued_by_teardown == PODS as u64
    })
    .await
    .with_context(|| format!("{:?}", e.counters()))?;
    assert_eq!(
        e.counters().returned_by_reconcile + e.counters().repaired_devices,
        0
    );
    // The files are left for the guards (umounted already).
    for (_, ns) in &pods {
        let _ = std::fs::remove_file(&ns.path);
    }
    drop(events);
    Ok(())
}

/// 1,024 veth devices in a private netns: the scan finds every one and the slices are 8 of 128;
/// the real daemon inside that netns publishes the same 8 slices, and a device renamed there
/// comes out under its new name (the old one gone) after one debounced rescan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventory_of_1024_devices_in_eight_slices() -> Result<()> {
    root_or_skip!("inventory_of_1024_devices_in_eight_slices");
    let ns = PodNetns::create(&unique("dranet-inv1k-"))?;
    let mut batch = String::new();
    for i in 0..512 {
        batch.push_str(&format!("link add ia{i} type veth peer name ib{i}\n"));
    }
    let file = std::env::temp_dir().join(unique("dranet-inv1k-batch-"));
    std::fs::write(&file, batch)?;
    let res = ns.ip(&["-batch", &file.display().to_string()]);
    let _ = std::fs::remove_file(&file);
    res?;
    let opts = dranet::inventory::ScanOptions {
        netns: dranet::inventory::NetnsTarget::Path(ns.path.clone()),
        filter: dranet::inventory::Filter::compile(VETH_ONLY)?,
        ..dranet::inventory::ScanOptions::default()
    };
    let devices = dranet::inventory::scan(&opts)?;
    let want: std::collections::BTreeSet<String> = (0..512)
        .flat_map(|i| [format!("ia{i}"), format!("ib{i}")])
        .map(|n| dranet::inventory::netdev_device_name(&n))
        .collect();
    let got: std::collections::BTreeSet<String> = devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(got, want, "the scan must find exactly the 1,024 veth devices");
    let slices = dranet::slices::build_slices("dra.net", "n1", 1, None, &devices);
    assert_eq!(
        slices.iter().map(|s| s.spec.devices.len()).collect::<Vec<_>>(),
        vec![128; 8]
    );
    assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 8));
    // The daemon in that netns (sysfs is the netns's too under `ip netns exec`).
    let daemon = NetnsDaemon::start(&ns)?;
    let sliced = daemon
        .wait_slices(Duration::from_secs(50), |names| names == &want)
        .await?;
    assert_eq!(sliced, vec![128; 8]);
    ns.ip(&["link", "set", "ia7", "name", "iz7"])?;
    let mut renamed = want.clone();
    renamed.remove(&dranet::inventory::netdev_device_name("ia7"));
    renamed.insert(dranet::inventory::netdev_device_name("iz7"));
    let sliced = daemon
        .wait_slices(Duration::from_secs(30), |names| names == &renamed)
        .await?;
    assert_eq!(sliced, vec![128; 8]);
    Ok(())
}

const VETH_ONLY: &str = r#""dra.net/type" in attributes && attributes["dra.net/type"].StringValue == "veth""#;

/// `dranet run` inside a netns (no NRI, slices to a directory); stopped and removed on drop.
struct NetnsDaemon {
    child: std::process::Child,
    dir: std::path::PathBuf,
}

impl NetnsDaemon {
    fn start(ns: &PodNetns) -> Result<Self> {
        let dir = std::env::temp_dir().join(unique("dranet-inv1k-node-"));
        std::fs::create_dir_all(dir.join("claims"))?;
        ns.ip(&["link", "set", "lo", "up"])?;
        let mut cmd = std::process::Command::new("ip");
        cmd.args(["netns", "exec", &ns.name])
            .arg(dranet_sim::kernel::dranet_bin()?)
            .args(["run", "--node-name", "n1", "--no-nri", "--filter", VETH_ONLY])
            .args(["--cloud-provider-hint", "NONE", "--bind-address", "127.0.0.1:0"]);
        dranet_sim::fixtures::embedded_dirs(&mut cmd, &dir, &dir.join("state"));
        let child = cmd
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()?;
        Ok(Self { child, dir })
    }

    /// Waits until the published device names satisfy `done`; the slice sizes then.
    async fn wait_slices(
        &self,
        timeout: Duration,
        done: impl Fn(&std::collections::BTreeSet<String>) -> bool,
    ) -> Result<Vec<usize>> {
        let publisher = dranet::slices::DirPublisher::new(self.dir.join("slices"), "dra.net", "n1");
        let start = std::time::Instant::now();
        loop {
            let slices = publisher.read_all().unwrap_or_default();
            let names = slices
                .iter()
                .flat_map(|s| s.spec.devices.iter().map(|d| d.name.clone()))
                .collect();
            if done(&names) {
                return Ok(slices.iter().map(|s| s.spec.devices.len()).collect());
            }
            if start.elapsed() > timeout {
                anyhow::bail!(
                    "slices not as expected after {timeout:?}: {} devices in {} slices",
                    names.len(),
                    slices.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for NetnsDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A node drain through the real daemon and the NRI transport: 16 pods × 2 configured NICs
/// attached, then torn down at once in CRI-O order (every netns unmounted and unlinked, the
/// StopPodSandbox hooks in parallel a few ms later) and in containerd order (every hook at once,
/// the netns removed after): every device comes home with its name, MTU, MAC, alias, altname,
/// offload sizes, address and up state; no hook fails; no record or pin is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_drain_every_device_home() -> Result<()> {
    root_or_skip!("node_drain_every_device_home");
    const PODS: usize = 16;
    let nics: Vec<Nic> = (0..2 * PODS).map(|_| Nic::create()).collect::<Result<_>>()?;
    let before: Vec<_> = nics.iter().map(|n| view(&n.name, None)).collect::<Result<_>>()?;
    let mut node = dranet_sim::node::Node::start(dranet_sim::node::NodeOptions::default()).await?;
    for crio in [true, false] {
        node.runtime.set_flavor(if crio {
            dranet_sim::nri_runtime::Flavor::Crio
        } else {
            dranet_sim::nri_runtime::Flavor::Containerd
        });
        drain_once(&node, &nics, crio).await?;
        for (nic, b) in nics.iter().zip(&before) {
            let mut last = Ok(());
            for _ in 0..500 {
                last = view(&nic.name, None).and_then(|v| assert_same(b, &v));
                if last.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            last.map_err(|e| {
                anyhow::anyhow!(
                    "{} ({} order): {e}",
                    nic.name,
                    if crio { "CRI-O" } else { "containerd" }
                )
            })?;
        }
        wait_for("no record left", Duration::from_secs(10), || {
            node.records().is_ok_and(|r| r.is_empty())
        })
        .await?;
        assert!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    }
    node.stop()?;
    Ok(())
}

/// One drain of `nics` (two per pod) in CRI-O order (`crio`) or containerd order.
async fn drain_once(node: &dranet_sim::node::Node, nics: &[Nic], crio: bool) -> Result<()> {
    use dranet_sim::kubelet::Claim;
    use dranet_sim::node::sandbox;
    use futures::StreamExt;
    let mut pods = Vec::new();
    for pair in nics.chunks(2) {
        let uid = unique("drain-pod-");
        let claim = Claim::new("default", &format!("claim-{uid}"), &format!("cuid-{uid}"));
        let devices: Vec<(String, serde_json::Value)> = pair
            .iter()
            .enumerate()
            .map(|(i, n)| {
                (
                    dranet::inventory::netdev_device_name(&n.name),
                    serde_json::json!({"interface": {"name": format!("net{i}"), "mtu": 9000}}),
                )
            })
            .collect();
        node.write_claim(&claim, &uid, &devices)?;
        node.prepare(&claim).await?;
        let ns = PodNetns::create(&unique("dranet-drain-"))?;
        pods.push((uid, ns, claim));
    }
    let rt = &node.runtime;
    let started: Vec<_> = futures::stream::iter(pods.iter())
        .map(|(uid, ns, _)| async move { rt.run_pod_sandbox(&sandbox(uid, &ns.path)).await })
        .buffer_unordered(8)
        .collect()
        .await;
    for r in started {
        r?;
    }
    for n in nics {
        assert!(
            !host_has(&n.name),
            "{} still in the host after RunPodSandbox",
            n.name
        );
    }
    // At most 8 pods' hooks in flight (dranet refuses more than 16 on one connection; a real
    // runtime sends one plugin call at a time).
    let slots = &tokio::sync::Semaphore::new(8);
    let hooks = |i: usize| {
        let (uid, ns, _) = &pods[i];
        let sb = sandbox(uid, &ns.path);
        async move {
            let _slot = slots.acquire().await;
            rt.stop_pod_sandbox(&sb).await?;
            if !crio {
                let p = sb
                    .linux
                    .as_ref()
                    .map(|l| l.namespaces[0].path.clone())
                    .unwrap_or_default();
                let _ = nix::mount::umount2(p.as_str(), MntFlags::MNT_DETACH);
                let _ = std::fs::remove_file(&p);
            }
            rt.remove_pod_sandbox(&sb).await
        }
    };
    if crio {
        for (_, ns, _) in &pods {
            nix::mount::umount2(&ns.path, MntFlags::MNT_DETACH)?;
            std::fs::remove_file(&ns.path)?;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let done = futures::future::join_all((0..pods.len()).map(hooks)).await;
    for (r, (uid, _, _)) in done.into_iter().zip(&pods) {
        r.map_err(|e| anyhow::anyhow!("a hook of {uid} failed: {e:?}"))?;
    }
    for (_, _, claim) in &pods {
        node.unprepare(claim).await?;
    }
    Ok(())
}
