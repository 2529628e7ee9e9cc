//! Issue 38: a device that vanished while in its pod (the tenant deleted it) is reported exactly
//! once (the pod's `NetworkDeviceVanished` Warning event), even when dranet is SIGKILLed on the
//! way: right after the event was written (before the device's end reached the checkpoint), or
//! right after the device's end reached the checkpoint (before the event was written). The
//! restart must neither report it again nor never; the sandbox's record ends and its pin goes.
//!
//! Run against the real `dranet run` binary on real netns and veth pairs (containerd order: the
//! Stop hook brings the devices home, then the runtime removes the netns).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dranet_sim::fixtures::{health_stream, nic_device, prepare_claim, until};
use dranet_sim::kernel::{PodNetns, host_has, unique};
use dranet_sim::nic::Nic;
use dranet_sim::node::{Node, NodeOptions, sandbox_id, sandbox_with_id};
use serde_json::json;

/// When the daemon is killed.
#[derive(Clone, Copy, Debug)]
enum KillAt {
    /// As soon as the `NetworkDeviceVanished` event is in `events.jsonl`.
    EventWritten,
    /// As soon as a record file on disk says the device is `gone`.
    GoneSaved,
}

/// The `NetworkDeviceVanished` lines the daemon wrote (embedded mode).
fn vanished_events(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("NetworkDeviceVanished"))
        .map(str::to_owned)
        .collect()
}

/// Whether a record file in `dir` says a device is gone.
fn gone_on_disk(dir: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.starts_with("pod_")
            && name.ends_with(".json")
            && std::fs::read_to_string(e.path()).is_ok_and(|s| s.contains("\"state\":\"gone\""))
    })
}

/// One pod, its device deleted by the tenant, the Stop hook, dranet SIGKILLed at `at` (by a
/// thread polling every 100 µs), the netns removed, dranet restarted, RemovePodSandbox.
async fn reported_once(at: KillAt) -> Result<()> {
    let nic = Nic::create()?;
    let mut node = Node::start(NodeOptions {
        capture_log: true,
        ..NodeOptions::default()
    })
    .await?;
    let uid = unique("vo-");
    let dev = nic_device(&nic, json!({"interface": {"name": "net0"}}));
    let dev_name = dev.0.clone();
    let claim = prepare_claim(&node, &uid, &[dev]).await?;
    let mut ns = PodNetns::create(&unique("dranet-vo-"))?;
    let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
    node.runtime.run_pod_sandbox(&sb).await.context("Run")?;
    node.runtime.set_state(vec![sb.clone()], vec![]);
    assert!(ns.has("net0"), "the pod did not get the device");
    // The tenant deletes its device (the NIC's veth; its host peer goes with it).
    ns.ip(&["link", "del", "dev", "net0"])?;
    assert!(!host_has(&nic.veth.b), "the NIC's host peer outlived it");

    let pid = i32::try_from(node.daemon_pid().context("no daemon")?)?;
    let (events, records) = (node.events_path(), node.state_dir().join("checkpoint"));
    let killer = std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            let seen = match at {
                KillAt::EventWritten => !vanished_events(&events).is_empty(),
                KillAt::GoneSaved => gone_on_disk(&records),
            };
            if seen {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                return true;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        false
    });
    let stopped = node.runtime.stop_pod_sandbox(&sb).await;
    let killed = tokio::task::spawn_blocking(move || killer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the killer thread panicked"))?;
    if !killed {
        bail!(
            "{at:?} never happened (Stop: {stopped:?})\ndaemon log:\n{}",
            node.log()
        );
    }
    node.kill()?;
    let before_restart = vanished_events(&node.events_path()).len();
    ns.remove_crio_style()?;
    node.runtime.set_state(vec![sb.clone()], vec![]);
    node.restart().await.context("restart")?;
    let rt = node.runtime.remove_pod_sandbox(&sb).await;
    let ended = until(Duration::from_secs(10), || {
        node.records().is_ok_and(|r| r.iter().all(|(_, k)| *k != sb.id))
    })
    .await;
    if !ended {
        bail!(
            "the record of the sandbox stayed (Remove: {rt:?}): {}\ndaemon log:\n{}",
            node.checkpoint()?,
            node.log()
        );
    }
    assert!(
        !node.pins().iter().any(|p| p.to_string_lossy().contains(&sb.id)),
        "the pin stayed"
    );
    // The reporter may trail the record's end by a moment.
    until(Duration::from_secs(3), || {
        !vanished_events(&node.events_path()).is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let vanished = vanished_events(&node.events_path());
    if vanished.len() != 1 {
        bail!(
            "{at:?}: {} NetworkDeviceVanished events ({before_restart} before the restart), want 1: {vanished:#?}\ndaemon log:\n{}",
            vanished.len(),
            node.log()
        );
    }
    assert!(vanished[0].contains(&dev_name), "{}", vanished[0]);
    node.unprepare(&claim).await?;
    node.stop()?;
    Ok(())
}

/// [`reported_once`] `runs` times (each kill lands wherever the race puts it).
async fn repeatedly(at: KillAt, runs: usize) -> Result<()> {
    let runs = std::env::var("VANISHED_ONCE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(runs);
    for run in 0..runs {
        reported_once(at).await.with_context(|| format!("run {run}"))?;
    }
    Ok(())
}

dranet_sim::root_tests! {
    a_vanished_device_killed_right_after_its_event_is_reported_once => repeatedly(KillAt::EventWritten, 4);
    a_vanished_device_killed_right_after_its_end_was_saved_is_reported_once => repeatedly(KillAt::GoneSaved, 4);
}

/// Device `device`'s health in kubelet's stream of the daemon's DRA socket (v1alpha1, as kubelet
/// 1.34–1.36 calls it): waits up to `within` for a list that names it, `None` if none did.
async fn health_of(node: &Node, device: &str, within: Duration) -> Result<Option<(i32, String)>> {
    let mut stream = health_stream(node).await?;
    let found = tokio::time::timeout(within, async {
        while let Ok(Some(r)) = stream.message().await {
            let hit = r.devices.iter().find_map(|d| {
                let id = d.device.as_ref()?;
                (id.device_name == device).then(|| (d.health, d.message.clone()))
            });
            if hit.is_some() {
                return hit;
            }
        }
        None
    })
    .await;
    Ok(found.ok().flatten())
}

/// A device the tenant deleted while dranet was down, found gone by the start-up reconcile:
/// kubelet's health stream (opened after the restart, as kubelet does when the plugin registers
/// again) lists it UNHEALTHY, not at all before the fix (the health follower subscribed to the
/// engine's activity only after the reconcile, and the device is in neither the host nor a pod).
async fn gone_at_restart_is_unhealthy() -> Result<()> {
    let nic = Nic::create()?;
    let mut node = Node::start(NodeOptions {
        capture_log: true,
        ..NodeOptions::default()
    })
    .await?;
    let uid = unique("vh-");
    let dev = nic_device(&nic, json!({"interface": {"name": "net0"}}));
    let dev_name = dev.0.clone();
    let claim = prepare_claim(&node, &uid, &[dev]).await?;
    let mut ns = PodNetns::create(&unique("dranet-vh-"))?;
    let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
    node.runtime.run_pod_sandbox(&sb).await.context("Run")?;
    node.runtime.set_state(vec![sb.clone()], vec![]);
    assert!(ns.has("net0"), "the pod did not get the device");
    // Healthy while in its pod.
    let before = health_of(&node, &dev_name, Duration::from_secs(5)).await?;
    assert!(matches!(before, Some((h, _)) if h == 1), "before: {before:?}");
    node.kill()?;
    // While dranet is down: the tenant deletes its device, the runtime removes the sandbox's
    // netns (dranet's pin keeps it alive).
    ns.ip(&["link", "del", "dev", "net0"])?;
    ns.remove_crio_style()?;
    node.runtime.set_state(vec![], vec![]);
    node.restart().await.context("restart")?;
    let after = health_of(&node, &dev_name, Duration::from_secs(5)).await?;
    let log = node.log();
    match &after {
        // HealthStatus::Unhealthy = 2.
        Some((2, message)) if !message.is_empty() => {}
        other => bail!(
            "kubelet's health stream after the restart says {other:?} for {dev_name}, which the reconcile found gone (want UNHEALTHY)\ndaemon log:\n{log}"
        ),
    }
    node.unprepare(&claim).await?;
    node.stop()?;
    Ok(())
}

dranet_sim::root_tests! {
    a_device_found_gone_at_the_restart_is_unhealthy_in_kubelets_health_stream => gone_at_restart_is_unhealthy();
}
