//! No pod runs without its devices (issue 36), with the real daemon and the NRI runtime harness,
//! veth pairs standing in for NICs, as root.
//!
//! kubelet prepares a pod's claims; then dranet is away (SIGKILL, or SIGTERM as a DaemonSet update
//! stops it) when the runtime runs the pod's sandbox, so the runtime completes RunPodSandbox
//! without it and the sandbox runs with its NIC still in the host. Measured on real containerd
//! 2.3 and CRI-O 1.36, 18 of 18 such pods kept running without their NICs for good.
//!
//! * Synchronize: when dranet is back, the runtime lists the running sandbox and dranet attaches
//!   its devices (within 1 s of its return), tells the operator (`dranet_late_attach_total`, a
//!   `NetworkDeviceLateAttach` Warning on the pod, the claim's status), and they come home
//!   restored at teardown.
//! * CreateContainer: a container of such a sandbox (kubelet retrying one the runtime's validator
//!   refused while dranet was away) starts only once the devices are in the sandbox: the hook
//!   attaches them before it answers.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use dranet::nri::pb::nri as pb;
use dranet_sim::fixtures::{TestPod, nic_device, wait_for};
use dranet_sim::kernel::host_has;
use dranet_sim::nic::{Nic, wait_restored};
use dranet_sim::node::{Node, NodeOptions, free_port, http_get};
use dranet_sim::nri_runtime::{Flavor, RuntimeConfig};
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Away {
    /// SIGKILL (a crash, an OOM kill).
    Killed,
    /// SIGTERM (a DaemonSet rolling update).
    Stopped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Learns {
    /// From the runtime's Synchronize at reconnection.
    Synchronize,
    /// From a CreateContainer of the sandbox (Synchronize did not list it).
    CreateContainer,
}

fn node_opts(port: u16) -> NodeOptions {
    NodeOptions {
        runtime: RuntimeConfig {
            flavor: Flavor::Crio,
            ..RuntimeConfig::default()
        },
        bind_address: format!("127.0.0.1:{port}"),
        capture_log: true,
        ..NodeOptions::default()
    }
}

/// The value of the sample `name` in a Prometheus text exposition, 0 if absent.
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

async fn case(away: Away, learns: Learns) -> Result<()> {
    let (nic, before) = Nic::with_view()?;
    let port = free_port()?;
    let mut node = Node::start(node_opts(port)).await?;
    // The sandbox's netns is made here: the pod runs without its devices from now on.
    let made_after = SystemTime::now();
    let mut p = TestPod::new("late-")?;
    let made_before = SystemTime::now();
    p.prepare(
        &node,
        &[nic_device(
            &nic,
            json!({"interface": {"name": "net0", "addresses": ["192.168.77.2/24"]}}),
        )],
    )
    .await?;
    match away {
        Away::Killed => node.kill()?,
        Away::Stopped => node.stop()?,
    }
    // The runtime runs the sandbox without the plugin: no hook reaches dranet.
    assert!(host_has(&nic.name), "the NIC left the host with dranet away");
    if learns == Learns::Synchronize {
        node.runtime.set_state(vec![p.sandbox.clone()], vec![]);
    }
    // The pod runs a while without its devices before dranet is back.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let restarted = SystemTime::now();
    node.restart().await?;
    let back = Instant::now();
    match learns {
        Learns::Synchronize => {
            wait_for(
                "the NIC in the sandbox within 1 s of dranet's return",
                Duration::from_secs(1),
                || p.has("net0"),
            )
            .await?;
        }
        Learns::CreateContainer => {
            let c = pb::Container {
                id: format!("c-{}", p.sandbox.id),
                pod_sandbox_id: p.sandbox.id.clone(),
                name: "app".into(),
                ..Default::default()
            };
            node.runtime
                .create_container(&p.sandbox, &c)
                .await
                .context("CreateContainer of a sandbox that ran without its devices")?;
            assert!(
                p.has("net0"),
                "CreateContainer answered before the NIC was in the sandbox"
            );
        }
    }
    eprintln!(
        "{away:?}/{learns:?}: NIC in the pod {:?} after dranet's return",
        back.elapsed()
    );
    let attached = SystemTime::now();
    assert!(!host_has(&nic.name));
    let addr = p.ns.ip(&["-j", "addr", "show", "dev", "net0"])?;
    assert!(
        addr.contains("192.168.77.2"),
        "net0 has not the claim's address: {addr}"
    );
    // The operator is told.
    let (_, metrics) = http_get(&format!("127.0.0.1:{port}"), "/metrics").await?;
    let trigger = match learns {
        Learns::Synchronize => "synchronize",
        Learns::CreateContainer => "create_container",
    };
    assert_eq!(
        sample(
            &metrics,
            &format!("dranet_late_attach_total{{trigger=\"{trigger}\"}}")
        ),
        1.0,
        "{metrics}"
    );
    wait_for("a NetworkDeviceLateAttach event", Duration::from_secs(3), || {
        node.events().contains("NetworkDeviceLateAttach")
    })
    .await?;
    // Both the event and the WARN say how long the pod ran without its devices: from when its
    // netns was made (between `made_after` and `made_before`) until the attach (between
    // `restarted` and `attached`), with a tick of the kernel's coarse clock to spare.
    let lo = restarted.duration_since(made_before)?.as_secs_f64() - 0.05;
    let hi = attached.duration_since(made_after)?.as_secs_f64() + 0.05;
    let evs = node.events();
    let said: f64 = evs
        .split("ran without them for ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no 'ran without them for <s>' in the event: {evs}"))?;
    assert!(
        said + 0.05 >= lo && said <= hi + 0.05,
        "event says {said} s without the devices; it was between {lo:.3} and {hi:.3} s: {evs}"
    );
    let log = node.log();
    let warn_line = log
        .lines()
        .find(|l| l.contains("late attach:") && l.contains("without_devices_ms"))
        .with_context(|| format!("no late attach WARN with without_devices_ms in:\n{log}"))?;
    let ms: f64 = warn_line
        .split("without_devices_ms")
        .nth(1)
        .map(|t| t.trim_start_matches(['=', ':', '"', ' ']))
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("without_devices_ms unreadable: {warn_line}"))?;
    assert!(
        ms / 1000.0 >= lo && ms / 1000.0 <= hi,
        "WARN says {ms} ms without the devices; it was between {lo:.3} and {hi:.3} s: {warn_line}"
    );
    let st = node.claim_status(&p.claim, Duration::from_secs(3)).await?;
    assert_eq!(
        st["status"]["devices"][0]["networkData"]["interfaceName"], "net0",
        "{st}"
    );
    // And it comes home at teardown (CRI-O order), restored.
    p.ns.remove_crio_style()?;
    wait_for(
        "the NIC home before StopPodSandbox",
        Duration::from_secs(5),
        || host_has(&nic.name),
    )
    .await?;
    p.stop_and_remove(&node).await?;
    node.runtime.set_state(vec![], vec![]);
    wait_restored(&nic.name, &before, Duration::from_secs(1)).await?;
    node.unprepare(&p.claim).await?;
    assert!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    node.stop()?;
    Ok(())
}

dranet_sim::root_tests! {
    killed_then_synchronize_attaches_late => case(Away::Killed, Learns::Synchronize);
    stopped_then_synchronize_attaches_late => case(Away::Stopped, Learns::Synchronize);
    killed_then_create_container_waits_for_the_devices => case(Away::Killed, Learns::CreateContainer);
}

/// The uninstall (issue 36): `dranet release-all` beside the running daemon (the DaemonSet pod
/// always holds the state dir, so it used to refuse) asks that daemon over its root-only control
/// socket; the daemon brings every device home restored, drops its pins, and refuses every later
/// attach, so a pod started afterwards does not pull a NIC back out of the host.
async fn release_all_beside_the_daemon() -> Result<()> {
    let (nic, before) = Nic::with_view()?;
    let (nic2, _) = Nic::with_view()?;
    let port = free_port()?;
    let node = Node::start(node_opts(port)).await?;
    let p = TestPod::new("uninst-")?;
    p.prepare(&node, &[nic_device(&nic, json!({"interface": {"name": "net0"}}))])
        .await?;
    p.run(&node).await?;
    assert!(p.has("net0"), "not attached");
    let out = node.cli(&["release-all"])?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "release-all failed:\n{stdout}\n{stderr}");
    assert!(
        stderr.contains("asking the running daemon"),
        "not through the daemon: {stderr}"
    );
    assert!(stdout.contains("returned 1 pod(s), failed 0"), "{stdout}");
    wait_restored(&nic.name, &before, Duration::from_secs(2)).await?;
    assert!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    // The daemon still runs, and attaches nothing any more.
    let q = TestPod::new("uninst-late-")?;
    q.prepare(
        &node,
        &[nic_device(&nic2, json!({"interface": {"name": "net0"}}))],
    )
    .await?;
    assert!(
        node.runtime.run_pod_sandbox(&q.sandbox).await.is_err(),
        "RunPodSandbox attached a device after release-all"
    );
    assert!(host_has(&nic2.name), "a NIC left the host after release-all");
    assert!(
        node.pins().is_empty(),
        "pins after release-all: {:?}",
        node.pins()
    );
    Ok(())
}

dranet_sim::root_tests! {
    release_all_beside_the_running_daemon_brings_every_device_home_and_stops_attaching =>
        release_all_beside_the_daemon();
}
