//! Issue 38, squatter bug 2 (the seeded soak, seed 7, steps 23-27): while a pod holds a NIC, a
//! host link (a veth) takes the NIC's host name; the tenant deletes the NIC in the pod (a veth:
//! its host peer goes with it); the sandbox is torn down, and dranet is SIGKILLed before, during
//! or after the StopPodSandbox hook or the rescue at the netns teardown; then it restarts. The
//! squatter, which only shares the NIC's name (the NIC is a veth stand-in: no parent device, no
//! permanent MAC, so only its ifindex tells it from any other veth), must stay in the host
//! untouched: same ifindex, name, MAC, MTU, up state, addresses. The sandbox's record ends, its
//! pin is released, and the operator is told once (a `NetworkDeviceVanished` Warning event).
//!
//! What these found: dranet never touched the squatter on any of these paths (the soak's
//! "squatter gone" was its own NIC guard deleting the old NIC's veth by name, a name the squatter
//! held by then). But a device found vanished by the start-up reconcile was never reported: the
//! reporter subscribed to the engine's activity only after the reconcile had run, so the event
//! (and the claim's status) went to no one.
//!
//! Run against the real `dranet run` binary on real netns and veth pairs.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use dranet_sim::fixtures::{nic_device, prepare_claim, until};
use dranet_sim::kernel::{PodNetns, Veth, host_has, sh, unique};
use dranet_sim::nic::{Nic, view};
use dranet_sim::node::{Node, NodeOptions, sandbox_id, sandbox_with_id};
use dranet_sim::nri_runtime::{Flavor, RuntimeConfig};
use serde_json::{Value, json};

/// When dranet is SIGKILLed relative to the StopPodSandbox hook.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// Not at all: Stop is answered.
    Never,
    /// Right before the hook: the runtime finds no plugin and goes on.
    BeforeStop,
    /// While it handles the hook, this many µs after the hook was sent.
    DuringStop(u64),
    /// While it brings the devices home at the netns teardown (the probes saw the runtime
    /// unmount it), this many µs after the umount; the Stop hook comes after the restart.
    DuringRescue(u64),
}

/// Which runtime's teardown order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// Stop hook, then the netns is unmounted and unlinked.
    Containerd,
    /// The netns is unmounted and unlinked, then the Stop hook.
    Crio,
}

fn node_opts(order: Order) -> NodeOptions {
    NodeOptions {
        runtime: RuntimeConfig {
            flavor: match order {
                Order::Containerd => Flavor::Containerd,
                Order::Crio => Flavor::Crio,
            },
            ..RuntimeConfig::default()
        },
        capture_log: true,
        ..NodeOptions::default()
    }
}

/// Everything about a host link that dranet must leave alone: its ifindex, its netns (the
/// host's: it is found there by index), and its [`view`] (name, MTU, MAC, up, addresses, ...).
fn host_link(name: &str) -> Result<(u32, Value)> {
    let index = Veth::ifindex(name)?;
    Ok((index, view(name, None)?))
}

/// The name of the host link at `index`, if the host has one there.
fn host_name_at(index: u32) -> Option<String> {
    let out = sh(&["ip", "-j", "link", "show"]).ok()?;
    let v: Value = serde_json::from_str(&out).ok()?;
    v.as_array()?
        .iter()
        .find(|l| l["ifindex"].as_u64() == Some(u64::from(index)))
        .and_then(|l| l["ifname"].as_str().map(str::to_owned))
}

/// The scenario, with dranet killed as `kill` says, in the teardown order `order`.
async fn squatter_survives(kill: Kill, order: Order) -> Result<()> {
    let (nic, _) = Nic::with_view()?;
    let mut node = Node::start(node_opts(order)).await?;
    let uid = unique("sq2-");
    let dev = nic_device(&nic, json!({"interface": {"name": "net0"}}));
    let dev_name = dev.0.clone();
    let claim = prepare_claim(&node, &uid, &[dev]).await?;
    let mut ns = PodNetns::create(&unique("dranet-sq2-"))?;
    let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
    node.runtime.run_pod_sandbox(&sb).await.context("Run")?;
    node.runtime.set_state(vec![sb.clone()], vec![]);
    assert!(ns.has("net0"), "the pod did not get the device");
    assert!(!host_has(&nic.name));
    let pin = node
        .pins()
        .into_iter()
        .find(|p| p.to_string_lossy().contains(&sb.id))
        .context("no pin")?;

    // The host takes the NIC's free host name: a veth of its own, configured as a CNI would.
    let squatter = Veth::create(&nic.name, &unique("dsq"))?;
    sh(&["ip", "link", "set", &squatter.a, "mtu", "1280", "up"])?;
    let (sq_index, sq_view) = host_link(&squatter.a)?;

    // The tenant deletes its device (the NIC's veth; its host peer goes with it).
    ns.ip(&["link", "del", "dev", "net0"])?;
    assert!(!host_has(&nic.veth.b), "the NIC's host peer outlived it");

    // The teardown, dranet killed as asked.
    if matches!(kill, Kill::BeforeStop) {
        node.kill()?;
    }
    if let Kill::DuringRescue(us) = kill {
        ns.remove_crio_style()?;
        tokio::time::sleep(Duration::from_micros(us)).await;
        node.kill()?;
        node.restart().await.context("restart")?;
    }
    let stop = async {
        let call = node.runtime.stop_pod_sandbox(&sb);
        match kill {
            Kill::DuringStop(us) => {
                let pid = node.daemon_pid().context("no daemon")?;
                let killer = async {
                    tokio::time::sleep(Duration::from_micros(us)).await;
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(i32::try_from(pid)?),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    anyhow::Ok(())
                };
                let (res, k) = tokio::join!(call, killer);
                k?;
                Ok::<_, anyhow::Error>(format!("{res:?}"))
            }
            _ => Ok(format!("{:?}", call.await)),
        }
    };
    if order == Order::Crio {
        ns.remove_crio_style()?;
    }
    let stopped = stop.await?;
    if matches!(kill, Kill::DuringStop(_)) {
        node.kill()?;
    }
    if order == Order::Containerd {
        ns.remove_crio_style()?;
    }
    // The runtime keeps the stopped sandbox until RemovePodSandbox.
    node.runtime.set_state(vec![sb.clone()], vec![]);
    if matches!(kill, Kill::BeforeStop | Kill::DuringStop(_)) {
        node.restart().await.context("restart")?;
    }
    let ended = until(Duration::from_secs(8), || {
        node.records().is_ok_and(|r| r.iter().all(|(_, k)| *k != sb.id))
    })
    .await;
    // The squatter is where it was, as it was.
    let now = host_link(&squatter.a);
    let log = node.log();
    match &now {
        Ok((i, v)) if *i == sq_index && *v == sq_view => {}
        _ => bail!(
            "the host squatter {} (ifindex {sq_index}) was touched (Stop: {stopped}): now {now:?}, \
             ifindex {sq_index} is {:?}; before: {sq_view}\ndaemon log:\n{log}",
            squatter.a,
            host_name_at(sq_index)
        ),
    }
    let rt = node.runtime.remove_pod_sandbox(&sb).await;
    let ended = ended
        || until(Duration::from_secs(5), || {
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
    assert!(!node.pins().contains(&pin), "the pin stayed: {pin:?}");
    // Told once: a Warning event on the pod (written by the reporter, which may trail).
    let vanished_events = |node: &Node| {
        node.events()
            .lines()
            .filter(|l| l.contains("NetworkDeviceVanished"))
            .map(str::to_owned)
            .collect::<Vec<String>>()
    };
    until(Duration::from_secs(3), || !vanished_events(&node).is_empty()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let vanished = vanished_events(&node);
    // Exactly once, wherever the kill lands (the device's record says whether its report was
    // confirmed; a report sent again has the same Event name).
    if vanished.len() != 1 {
        bail!(
            "{} NetworkDeviceVanished events, want 1: {}\ndaemon log:\n{}",
            vanished.len(),
            node.events(),
            node.log()
        );
    }
    assert!(vanished[0].contains(&dev_name), "{}", vanished[0]);
    // Still untouched once everything is over.
    let (i, v) = host_link(&squatter.a)?;
    assert_eq!(
        (i, &v),
        (sq_index, &sq_view),
        "the squatter was touched at the end"
    );
    node.unprepare(&claim).await?;
    node.stop()?;
    // The squatter holds the NIC's name: its own guard deletes it; the NIC's must not run
    // first on a squatter the test still checks (it deletes by name).
    drop(squatter);
    drop(nic);
    Ok(())
}

/// [`Kill::DuringRescue`] at every delay of a spread (the kill lands before, during or after
/// the rescue's steps).
async fn kill_during_rescue() -> Result<()> {
    let delays: Vec<u64> = std::env::var("SQUATTER_DELAYS_US")
        .ok()
        .map(|v| v.split(',').filter_map(|d| d.parse().ok()).collect())
        .unwrap_or_else(|| vec![0, 150, 300, 600, 1000, 1500, 2200, 3000]);
    for us in delays {
        squatter_survives(Kill::DuringRescue(us), Order::Containerd)
            .await
            .with_context(|| format!("killed {us} µs after the umount"))?;
    }
    Ok(())
}

dranet_sim::root_tests! {
    squatter_survives_a_vanished_device_kill_during_the_rescue => kill_during_rescue();
    squatter_survives_a_vanished_device_kill_during_stop_containerd => squatter_survives(Kill::DuringStop(500), Order::Containerd);
    squatter_survives_a_vanished_device_kill_during_stop_crio => squatter_survives(Kill::DuringStop(500), Order::Crio);
    squatter_survives_a_vanished_device_kill_before_stop_containerd => squatter_survives(Kill::BeforeStop, Order::Containerd);
    squatter_survives_a_vanished_device_kill_before_stop_crio => squatter_survives(Kill::BeforeStop, Order::Crio);
    squatter_survives_a_vanished_device_no_kill_containerd => squatter_survives(Kill::Never, Order::Containerd);
    squatter_survives_a_vanished_device_no_kill_crio => squatter_survives(Kill::Never, Order::Crio);
}
