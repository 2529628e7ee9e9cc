//! The real containerd suite, as root: Debian's containerd of trixie (1.7) and of sid (2.x), each
//! started by the fixture with its own sockets, dirs, NRI socket and CNI bridge, the real `dranet
//! run` registered as its NRI plugin, and kubelet's side played over CRI (DRA Prepare,
//! RunPodSandbox with the pod's UID, CreateContainer/StartContainer of the pause image made here,
//! StopPodSandbox, RemovePodSandbox). veth pairs stand in for NICs. The runtimes come from `cargo
//! xtask runtimes` (run by `cargo xtask test`); under `CI=true` a missing runtime fails the test.
//! `cargo xtask e2e --runtime containerd` runs this file alone.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use dranet_sim::containerd::{self, Runtime};
use dranet_sim::cri::Cri;
use dranet_sim::fixtures::{nic_device, wait_for};
use dranet_sim::kernel::host_has;
use dranet_sim::nic::{Nic, wait_restored};
use dranet_sim::real_node::{
    CriPod, HOME_WITHIN, RealNode, assert_home, assert_in_pod, device_config, netns_has, node_on,
};
use dranet_sim::root_tests;
use serde_json::Value;

/// The NRI pod-event dialect each Debian containerd speaks, as measured: the dedicated
/// RunPodSandbox/StopPodSandbox/RemovePodSandbox RPCs came with NRI v0.12; both packaged
/// versions vendor an older NRI and send pod events as `StateChange`.
fn expected_dialect(suite: &str) -> &'static str {
    match suite {
        "trixie" | "sid" => "StateChange",
        _ => "RunPodSandbox",
    }
}

/// The NRI version each Debian containerd puts in Configure, as measured: their vendored NRI
/// predates the field (`NRI_version`, 6), so it arrives empty.
fn expected_nri_version(suite: &str) -> &'static str {
    match suite {
        "trixie" | "sid" => "",
        _ => "v0.12.0",
    }
}

/// A node on `suite`'s containerd with the CRI client, or `None` (skipped outside CI).
async fn node(test: &str, suite: &str) -> Result<Option<(RealNode, Cri, Runtime)>> {
    node_on(test, suite, "").await
}

/// containerd starts on its own sockets and reports its version; dranet connects to its NRI
/// socket, registers and is configured by it.
async fn registers(test: &str, suite: &str, want_major: u32) -> Result<()> {
    let Some(rt) = containerd::require(test, suite)? else {
        return Ok(());
    };
    let t0 = Instant::now();
    let node = RealNode::start(&rt).await?;
    let started = t0.elapsed();
    let server = node.containerd.server_version()?;
    println!(
        "containerd {} (Debian {suite}, package {}): server version {server}, node up in {started:?}",
        rt.upstream(),
        rt.version
    );
    ensure!(
        rt.major() == want_major,
        "{suite}: containerd {} is not {want_major}.x",
        rt.version
    );
    ensure!(
        server.starts_with(rt.upstream()),
        "the daemon reports {server}, the package is {}",
        rt.version
    );
    // dranet's side: the runtime's Configure names it and its version.
    let reg = node
        .wait_log("NRI plugin registered", 1, Duration::from_secs(10))
        .await?;
    println!("dranet: {reg}");
    ensure!(reg.contains("containerd"), "{reg}");
    ensure!(reg.contains(rt.upstream()), "{reg}");
    // The NRI version the runtime sends in Configure (field 6, NRI_version).
    let conf = node.wait_log("nri_version=", 1, Duration::from_secs(10)).await?;
    println!("dranet: {conf}");
    let nri_version = conf
        .split_once("nri_version=")
        .map(|(_, v)| v.split_whitespace().next().unwrap_or(""))
        .unwrap_or("");
    let nri_version = if nri_version.starts_with("request_timeout_ms") {
        ""
    } else {
        nri_version
    };
    println!(
        "containerd {}: NRI version in Configure: {nri_version:?}",
        rt.upstream()
    );
    // The request timeout it announces: the runtime's default (2 s) where its NRI sends it.
    let timeout_ms = conf
        .split_once("request_timeout_ms=")
        .and_then(|(_, v)| v.split_whitespace().next())
        .unwrap_or("");
    let want_timeout = if suite == "trixie" { "0" } else { "2000" };
    ensure!(
        timeout_ms == want_timeout,
        "containerd {} announces a request timeout of {timeout_ms} ms, expected {want_timeout}",
        rt.version
    );
    ensure!(
        nri_version == expected_nri_version(suite),
        "containerd {} sends NRI version {nri_version:?}, expected {:?}",
        rt.version,
        expected_nri_version(suite)
    );
    // containerd's side: it logged the plugin's connection.
    let log = node.containerd.log_text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("dranet") || l.contains("NRI") || l.contains("nri"))
        .collect();
    for l in &lines {
        println!("containerd: {l}");
    }
    ensure!(
        lines.iter().any(|l| l.contains("dranet")),
        "containerd never logged the plugin:\n{log}"
    );
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Driver {
    Alive,
    /// dranet SIGKILLed and restarted while the pod runs.
    KilledWhileRunning,
    /// dranet SIGKILLed before the teardown, started again after StopPodSandbox.
    DownDuringTeardown,
}

/// One pod with `n` devices through kubelet's whole order; devices in the pod, then home.
async fn life_cycle(test: &str, suite: &str, n: usize, driver: Driver) -> Result<()> {
    let (nics, before) = Nic::many_with_views(n)?;
    let Some((mut node, cri, rt)) = node(test, suite).await? else {
        return Ok(());
    };
    let mut pod = CriPod::new("ctrd-");
    let devices: Vec<(String, Value)> = nics
        .iter()
        .enumerate()
        .map(|(i, nic)| nic_device(nic, device_config(i)))
        .collect();
    pod.prepare(&node, &devices).await?;
    let t = Instant::now();
    pod.run(&cri).await?;
    let ran = t.elapsed();
    assert_in_pod(&cri, &pod, &nics).await?;
    let netns = pod.netns(&cri).await?;
    // The dialect containerd speaks for pod events.
    let dialect = expected_dialect(suite);
    let seen = node
        .wait_log(&format!("method={dialect}"), 1, Duration::from_secs(5))
        .await
        .with_context(|| format!("containerd {} did not send {dialect}", rt.version))?;
    ensure!(
        !node.log().contains("method=RunPodSandbox") || dialect == "RunPodSandbox",
        "containerd {} sent RunPodSandbox",
        rt.version
    );
    println!("containerd {}: pod events as {dialect}: {seen}", rt.version);
    match driver {
        Driver::Alive => {}
        Driver::KilledWhileRunning => {
            node.restart().await?;
            assert_in_pod(&cri, &pod, &nics)
                .await
                .context("after dranet's restart")?;
        }
        Driver::DownDuringTeardown => node.kill()?,
    }
    let t = Instant::now();
    pod.stop(&cri).await?;
    if driver == Driver::DownDuringTeardown {
        node.restart().await?;
    }
    assert_home(&node, &nics, &before).await?;
    let home = t.elapsed();
    pod.remove(&cri).await?;
    node.unprepare(&pod.claim).await?;
    ensure!(
        !std::path::Path::new(&netns).exists(),
        "the pod netns {netns} outlived RemovePodSandbox"
    );
    println!(
        "containerd {} {n} device(s) {driver:?}: RunPodSandbox+container {ran:?}, StopPodSandbox to home {home:?}",
        rt.upstream()
    );
    ensure!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    Ok(())
}

/// kubelet rebuilds the sandbox: Stop A, Run B under the same UID (attempt 1, no new Prepare),
/// Remove A later while B runs. The devices follow to B and stay there; B's teardown brings
/// them home.
async fn sandbox_recreation(test: &str, suite: &str) -> Result<()> {
    let (nics, before) = Nic::many_with_views(1)?;
    let Some((node, cri, _rt)) = node(test, suite).await? else {
        return Ok(());
    };
    let mut pod = CriPod::new("ctrd-re-");
    pod.prepare(&node, &[nic_device(&nics[0], device_config(0))])
        .await?;
    pod.run(&cri).await?;
    assert_in_pod(&cri, &pod, &nics).await?;
    let old_ns = pod.netns(&cri).await?;
    pod.recreate(&cri).await?;
    ensure!(pod.ident.attempt == 1);
    let new_ns = pod.netns(&cri).await?;
    ensure!(new_ns != old_ns, "the new sandbox has the old netns {old_ns}");
    assert_in_pod(&cri, &pod, &nics)
        .await
        .context("in the re-created sandbox")?;
    pod.remove_old(&cri).await?;
    ensure!(
        netns_has(&new_ns, "net0"),
        "RemovePodSandbox of the old sandbox took the device from the new one"
    );
    pod.stop(&cri).await?;
    assert_home(&node, &nics, &before).await?;
    pod.remove(&cri).await?;
    node.unprepare(&pod.claim).await?;
    Ok(())
}

/// containerd restarts with a pod running: it recovers the sandbox (no Stop/Remove for it),
/// dranet reconnects and gets it in Synchronize; the devices stay, and the pod's teardown after
/// the restart brings them home.
async fn containerd_restart(test: &str, suite: &str) -> Result<()> {
    let (nics, before) = Nic::many_with_views(1)?;
    let Some((mut node, cri, _rt)) = node(test, suite).await? else {
        return Ok(());
    };
    let mut pod = CriPod::new("ctrd-rs-");
    pod.prepare(&node, &[nic_device(&nics[0], device_config(0))])
        .await?;
    pod.run(&cri).await?;
    assert_in_pod(&cri, &pod, &nics).await?;
    node.containerd.restart().await?;
    node.wait_log("NRI plugin registered", 2, Duration::from_secs(30))
        .await
        .context("dranet did not register again after containerd's restart")?;
    assert_in_pod(&cri, &pod, &nics)
        .await
        .context("after containerd's restart")?;
    let sandboxes = cri.list_pod_sandboxes().await?;
    ensure!(
        sandboxes.iter().any(|s| Some(&s.id) == pod.sandbox.as_ref()),
        "containerd did not recover the sandbox: {sandboxes:?}"
    );
    pod.stop(&cri).await?;
    assert_home(&node, &nics, &before).await?;
    pod.remove(&cri).await?;
    node.unprepare(&pod.claim).await?;
    Ok(())
}

/// 8 pods, one device each, all running, then torn down at once.
async fn eight_at_once(test: &str, suite: &str) -> Result<()> {
    let (nics, before) = Nic::many_with_views(8)?;
    let Some((node, cri, rt)) = node(test, suite).await? else {
        return Ok(());
    };
    let mut pods: Vec<CriPod> = (0..8).map(|_| CriPod::new("ctrd-8-")).collect();
    for (p, nic) in pods.iter().zip(&nics) {
        p.prepare(&node, &[nic_device(nic, device_config(0))]).await?;
    }
    for p in &mut pods {
        p.run(&cri).await?;
    }
    for (p, nic) in pods.iter().zip(&nics) {
        assert_in_pod(&cri, p, std::slice::from_ref(nic)).await?;
    }
    let t = Instant::now();
    let stops = pods.iter().map(|p| p.stop(&cri));
    for r in futures::future::join_all(stops).await {
        r?;
    }
    assert_home(&node, &nics, &before).await?;
    println!(
        "containerd {}: 8 pods stopped at once, all devices home in {:?}",
        rt.upstream(),
        t.elapsed()
    );
    for p in &mut pods {
        p.remove(&cri).await?;
        node.unprepare(&p.claim).await?;
    }
    Ok(())
}

/// A test that fails with a pod running: dropping the node (dranet, then the containerd fixture)
/// brings the device home and leaves no containerd, shim, sandbox process, mount, cgroup, bridge
/// or directory behind.
async fn drop_cleans_up(test: &str, suite: &str) -> Result<()> {
    let (nics, before) = Nic::many_with_views(1)?;
    let Some((node, cri, _rt)) = node(test, suite).await? else {
        return Ok(());
    };
    let mut pod = CriPod::new("ctrd-drop-");
    pod.prepare(&node, &[nic_device(&nics[0], device_config(0))])
        .await?;
    pod.run(&cri).await?;
    assert_in_pod(&cri, &pod, &nics).await?;
    let dir = node.containerd.layout.dir.clone();
    let bridge = node.containerd.layout.bridge.clone();
    let cgroup = node.containerd.layout.cgroup.clone();
    let address = node.containerd.layout.address().display().to_string();
    let pid = node.containerd.pid().context("containerd pid")?;
    drop(cri);
    drop(node);
    wait_restored(&nics[0].name, &before[0], HOME_WITHIN).await?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    ensure!(
        !mounts.contains(&dir.display().to_string()),
        "mounts left under {}",
        dir.display()
    );
    ensure!(!dir.exists(), "{} left", dir.display());
    ensure!(!host_has(&bridge), "bridge {bridge} left");
    ensure!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "containerd {pid} still runs"
    );
    for e in std::fs::read_dir("/proc")?.flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            ensure!(
                !String::from_utf8_lossy(&c).contains(&address),
                "a process of that containerd is left: {}",
                e.path().display()
            );
        }
    }
    for ctl in std::fs::read_dir("/sys/fs/cgroup")?.flatten() {
        let left = ctl.path().join(cgroup.trim_start_matches('/'));
        ensure!(!left.exists(), "cgroup {} left", left.display());
    }
    Ok(())
}

/// Issue 36 on the real runtime: kubelet prepared the pod's claims, then dranet is away (killed)
/// when containerd runs the pod's sandbox and container, so containerd completes them without
/// the plugin and the NIC stays in the host. When dranet is back, containerd's Synchronize lists
/// the running sandbox and dranet attaches the NIC within 1 s of its registration (late attach);
/// the pod's teardown brings it home restored.
async fn late_attach(test: &str, suite: &str) -> Result<()> {
    let (nics, before) = Nic::many_with_views(1)?;
    let Some((mut node, cri, rt)) = node(test, suite).await? else {
        return Ok(());
    };
    let mut pod = CriPod::new("ctrd-late-");
    pod.prepare(&node, &[nic_device(&nics[0], device_config(0))])
        .await?;
    node.kill()?;
    pod.run(&cri).await?;
    ensure!(
        host_has(&nics[0].name),
        "the NIC left the host while dranet was away"
    );
    node.restart().await?;
    let back = Instant::now();
    let ns = pod.netns(&cri).await?;
    wait_for(
        "the NIC in the running sandbox within 1 s of dranet's return",
        Duration::from_secs(1),
        || netns_has(&ns, "net0"),
    )
    .await
    .with_context(|| format!("daemon log:\n{}", node.log()))?;
    let took = back.elapsed();
    assert_in_pod(&cri, &pod, &nics).await?;
    node.wait_log("late attach", 1, Duration::from_secs(5)).await?;
    println!(
        "containerd {}: pod run while dranet was away; NIC in it {took:?} after dranet registered again",
        rt.upstream()
    );
    pod.stop(&cri).await?;
    assert_home(&node, &nics, &before).await?;
    pod.remove(&cri).await?;
    node.unprepare(&pod.claim).await?;
    ensure!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    Ok(())
}

/// The uninstall on the real runtime (issue 36): with a pod running on containerd and dranet
/// running, `dranet release-all` asks the daemon over its control socket; every device comes home
/// restored, no pin is left, and a pod started afterwards gets no device (its sandbox fails, as
/// the NRI plugin refuses the attach) while the NIC stays in the host.
async fn uninstall(test: &str, suite: &str) -> Result<()> {
    let (nics, before) = Nic::many_with_views(2)?;
    let Some((node, cri, rt)) = node(test, suite).await? else {
        return Ok(());
    };
    let mut pod = CriPod::new("ctrd-uninst-");
    pod.prepare(&node, &[nic_device(&nics[0], device_config(0))])
        .await?;
    pod.run(&cri).await?;
    assert_in_pod(&cri, &pod, &nics[..1]).await?;
    let out = std::process::Command::new(dranet_sim::kernel::dranet_bin()?)
        .arg("release-all")
        .arg("--state-dir")
        .arg(node.state_dir())
        .output()?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    ensure!(out.status.success(), "release-all failed:\n{stdout}\n{stderr}");
    ensure!(
        stderr.contains("asking the running daemon") && stdout.contains("returned 1 pod(s), failed 0"),
        "{stdout}\n{stderr}"
    );
    assert_home(&node, &nics[..1], &before[..1]).await?;
    let mut late = CriPod::new("ctrd-uninst-late-");
    late.prepare(&node, &[nic_device(&nics[1], device_config(0))])
        .await?;
    ensure!(
        late.run(&cri).await.is_err(),
        "containerd {} ran a pod with dranet claims after release-all",
        rt.upstream()
    );
    ensure!(host_has(&nics[1].name), "a NIC left the host after release-all");
    ensure!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    pod.stop(&cri).await?;
    pod.remove(&cri).await?;
    node.unprepare(&pod.claim).await?;
    node.unprepare(&late.claim).await?;
    Ok(())
}

root_tests! {
    containerd_2_fixture_drop_cleans_up_a_running_pod =>
        drop_cleans_up("containerd_2_fixture_drop_cleans_up_a_running_pod", "sid");
    containerd_1_7_starts_and_dranet_registers_over_nri =>
        registers("containerd_1_7_starts_and_dranet_registers_over_nri", "trixie", 1);
    containerd_2_starts_and_dranet_registers_over_nri =>
        registers("containerd_2_starts_and_dranet_registers_over_nri", "sid", 2);
    containerd_1_7_pod_with_1_device =>
        life_cycle("containerd_1_7_pod_with_1_device", "trixie", 1, Driver::Alive);
    containerd_2_pod_with_1_device =>
        life_cycle("containerd_2_pod_with_1_device", "sid", 1, Driver::Alive);
    containerd_1_7_pod_with_4_devices =>
        life_cycle("containerd_1_7_pod_with_4_devices", "trixie", 4, Driver::Alive);
    containerd_2_pod_with_4_devices =>
        life_cycle("containerd_2_pod_with_4_devices", "sid", 4, Driver::Alive);
    containerd_1_7_dranet_killed_while_pod_runs =>
        life_cycle("containerd_1_7_dranet_killed_while_pod_runs", "trixie", 1, Driver::KilledWhileRunning);
    containerd_2_dranet_killed_while_pod_runs =>
        life_cycle("containerd_2_dranet_killed_while_pod_runs", "sid", 1, Driver::KilledWhileRunning);
    containerd_1_7_dranet_down_during_teardown =>
        life_cycle("containerd_1_7_dranet_down_during_teardown", "trixie", 1, Driver::DownDuringTeardown);
    containerd_2_dranet_down_during_teardown =>
        life_cycle("containerd_2_dranet_down_during_teardown", "sid", 1, Driver::DownDuringTeardown);
    containerd_1_7_sandbox_recreation =>
        sandbox_recreation("containerd_1_7_sandbox_recreation", "trixie");
    containerd_2_sandbox_recreation =>
        sandbox_recreation("containerd_2_sandbox_recreation", "sid");
    containerd_1_7_restarted_with_pod_running =>
        containerd_restart("containerd_1_7_restarted_with_pod_running", "trixie");
    containerd_2_restarted_with_pod_running =>
        containerd_restart("containerd_2_restarted_with_pod_running", "sid");
    containerd_1_7_eight_pods_torn_down_at_once =>
        eight_at_once("containerd_1_7_eight_pods_torn_down_at_once", "trixie");
    containerd_2_eight_pods_torn_down_at_once =>
        eight_at_once("containerd_2_eight_pods_torn_down_at_once", "sid");
    containerd_1_7_pod_run_while_dranet_away_gets_its_nic_late =>
        late_attach("containerd_1_7_pod_run_while_dranet_away_gets_its_nic_late", "trixie");
    containerd_2_pod_run_while_dranet_away_gets_its_nic_late =>
        late_attach("containerd_2_pod_run_while_dranet_away_gets_its_nic_late", "sid");
    containerd_2_release_all_beside_the_daemon_brings_every_device_home =>
        uninstall("containerd_2_release_all_beside_the_daemon_brings_every_device_home", "sid");
}
