//! End to end, as root, on the real kernel: the `dranet run` binary between the kubelet simulator
//! and the NRI runtime harness, veth pairs standing in for NICs. Both teardown orders × {1, 4}
//! devices × {driver alive; driver SIGKILLed and restarted while the pod runs; driver down while
//! the pod is deleted}, plus a soak.

use std::time::Duration;

use anyhow::{Context, Result};
use dranet_sim::fixtures::{TestPod, nic_device, wait_for};
use dranet_sim::kernel::host_has;
use dranet_sim::nic::{Nic, view, wait_restored};
use dranet_sim::node::{Node, NodeOptions};
use dranet_sim::nri_runtime::{Flavor, RuntimeConfig};
use dranet_sim::root_or_skip;
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// StopPodSandbox while the netns lives, then the netns goes, then RemovePodSandbox.
    Containerd,
    /// The netns is unmounted and unlinked first; StopPodSandbox comes late.
    Crio,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Driver {
    Alive,
    /// SIGKILL + restart while the pod runs, before the teardown.
    RestartedWhileRunning,
    /// SIGKILL before the teardown; started again after it.
    DownDuringTeardown,
}

fn opts(order: Order) -> NodeOptions {
    let flavor = if order == Order::Crio {
        Flavor::Crio
    } else {
        Flavor::Containerd
    };
    NodeOptions {
        runtime: RuntimeConfig {
            flavor,
            ..RuntimeConfig::default()
        },
        ..NodeOptions::default()
    }
}

/// One pod with `nics`, through its whole life, in `order`, with the driver doing `driver`.
async fn life_cycle(node: &mut Node, nics: &[Nic], order: Order, driver: Driver) -> Result<()> {
    let before: Vec<Value> = nics.iter().map(|n| view(&n.name, None)).collect::<Result<_>>()?;
    let mut p = TestPod::new("e2e-pod-")?;
    let devices: Vec<(String, Value)> = nics
        .iter()
        .enumerate()
        .map(|(i, n)| {
            nic_device(
                n,
                json!({"interface": {"name": format!("net{i}"), "addresses": [format!("192.168.{}.2/24", 60 + i)]}}),
            )
        })
        .collect();
    p.prepare(node, &devices).await?;
    p.run(node).await?;
    for (i, n) in nics.iter().enumerate() {
        assert!(
            !host_has(&n.name),
            "{} still in the host after RunPodSandbox",
            n.name
        );
        let v = p.ns.ip(&["-j", "addr", "show", "dev", &format!("net{i}")])?;
        assert!(
            v.contains(&format!("192.168.{}.2", 60 + i)),
            "net{i} has no address in the pod: {v}"
        );
    }
    // Embedded mode: the claim's device status lands next to the claim files.
    let st = node.claim_status(&p.claim, Duration::from_secs(3)).await?;
    let devs = st["status"]["devices"].as_array().context("status.devices")?;
    assert_eq!(devs.len(), nics.len(), "{st}");
    for (i, n) in nics.iter().enumerate() {
        let name = dranet::inventory::netdev_device_name(&n.name);
        let d = devs
            .iter()
            .find(|d| d["device"] == name.as_str())
            .with_context(|| format!("no status for {name}: {st}"))?;
        assert_eq!(d["networkData"]["interfaceName"], format!("net{i}"), "{st}");
        assert_eq!(
            d["networkData"]["ips"][0],
            format!("192.168.{}.2/24", 60 + i),
            "{st}"
        );
        assert_eq!(d["conditions"][0]["reason"], "NetworkDeviceReady", "{st}");
    }
    if driver == Driver::RestartedWhileRunning {
        node.restart().await?;
        for i in 0..nics.len() {
            assert!(
                p.has(&format!("net{i}")),
                "restart must not disturb a running pod"
            );
        }
    }
    if driver == Driver::DownDuringTeardown {
        node.kill()?;
    }
    match order {
        Order::Containerd => {
            if driver != Driver::DownDuringTeardown {
                p.stop(node).await?;
                for n in nics {
                    assert!(host_has(&n.name), "{} not home after StopPodSandbox", n.name);
                }
            }
            p.ns.remove_crio_style()?;
            if driver == Driver::DownDuringTeardown {
                node.restart().await?;
            }
            p.remove(node).await?;
            node.runtime.set_state(vec![], vec![]);
        }
        Order::Crio => {
            p.ns.remove_crio_style()?;
            if driver == Driver::DownDuringTeardown {
                node.restart().await?;
            }
            // Before any hook: the rescue (or the restart's reconcile) brings them home.
            for n in nics {
                wait_for(
                    &format!("{} home before StopPodSandbox", n.name),
                    Duration::from_secs(5),
                    || host_has(&n.name),
                )
                .await?;
            }
            p.stop_and_remove(node).await?;
            node.runtime.set_state(vec![], vec![]);
        }
    }
    for (n, b) in nics.iter().zip(&before) {
        wait_restored(&n.name, b, Duration::from_secs(1)).await?;
    }
    node.unprepare(&p.claim).await?;
    assert!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    Ok(())
}

async fn case(order: Order, n: usize, driver: Driver) -> Result<()> {
    let test = format!("e2e {order:?} {n} {driver:?}");
    let nics: Vec<Nic> = (0..n).map(|_| Nic::create()).collect::<Result<_>>()?;
    let mut node = Node::start(opts(order)).await?;
    life_cycle(&mut node, &nics, order, driver)
        .await
        .with_context(|| test.clone())?;
    node.stop()?;
    Ok(())
}

dranet_sim::root_tests! {
    containerd_1_alive => case(Order::Containerd, 1, Driver::Alive);
    containerd_4_alive => case(Order::Containerd, 4, Driver::Alive);
    containerd_1_restarted_while_running => case(Order::Containerd, 1, Driver::RestartedWhileRunning);
    containerd_4_restarted_while_running => case(Order::Containerd, 4, Driver::RestartedWhileRunning);
    containerd_1_down_during_teardown => case(Order::Containerd, 1, Driver::DownDuringTeardown);
    containerd_4_down_during_teardown => case(Order::Containerd, 4, Driver::DownDuringTeardown);
    crio_1_alive => case(Order::Crio, 1, Driver::Alive);
    crio_4_alive => case(Order::Crio, 4, Driver::Alive);
    crio_1_restarted_while_running => case(Order::Crio, 1, Driver::RestartedWhileRunning);
    crio_4_restarted_while_running => case(Order::Crio, 4, Driver::RestartedWhileRunning);
    crio_1_down_during_teardown => case(Order::Crio, 1, Driver::DownDuringTeardown);
    crio_4_down_during_teardown => case(Order::Crio, 4, Driver::DownDuringTeardown);
}

/// A pod whose StopPodSandbox never comes: the rescue alone brings the devices home.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_hook_missing_entirely() -> Result<()> {
    root_or_skip!("stop_hook_missing_entirely");
    let (nic, before) = Nic::with_view()?;
    let node = Node::start(opts(Order::Crio)).await?;
    let mut p = TestPod::new("e2e-nostop-")?;
    p.prepare(&node, &[nic_device(&nic, json!({}))]).await?;
    node.runtime.run_pod_sandbox(&p.sandbox).await?;
    assert!(!host_has(&nic.name));
    p.ns.remove_crio_style()?;
    wait_for("device home without any hook", Duration::from_secs(5), || {
        host_has(&nic.name)
    })
    .await?;
    wait_restored(&nic.name, &before, Duration::from_secs(1)).await?;
    wait_for("pin released", Duration::from_secs(2), || node.pins().is_empty()).await?;
    Ok(())
}

/// The runtime drops the connection mid-run: the plugin reconnects and later pods still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_disconnect_then_later_pods_work() -> Result<()> {
    root_or_skip!("runtime_disconnect_then_later_pods_work");
    let nic = Nic::create()?;
    let mut node = Node::start(opts(Order::Containerd)).await?;
    node.runtime.disconnect();
    node.runtime.wait_ready(2, Duration::from_secs(10)).await?;
    life_cycle(
        &mut node,
        std::slice::from_ref(&nic),
        Order::Containerd,
        Driver::Alive,
    )
    .await?;
    Ok(())
}

/// 200 pod life cycles, random order, random driver restarts: nothing leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_200_life_cycles() -> Result<()> {
    root_or_skip!("soak_200_life_cycles");
    let rounds: usize = std::env::var("DRANET_SOAK_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let nics: Vec<Nic> = (0..2).map(|_| Nic::create()).collect::<Result<_>>()?;
    let mut node = Node::start(NodeOptions::default()).await?;
    // Warm up, then take the baseline footprint.
    life_cycle(&mut node, &nics, Order::Containerd, Driver::Alive).await?;
    let (mut fds0, mut rss0) = (node.daemon_fds_settled().await?, node.daemon_rss_kib()?);
    let mut kinds0 = node.daemon_fd_kinds()?;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id());
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut restarts = 0;
    for round in 0..rounds {
        let order = if rand() % 2 == 0 {
            Order::Containerd
        } else {
            Order::Crio
        };
        let driver = match rand() % 20 {
            0 => Driver::RestartedWhileRunning,
            1 => Driver::DownDuringTeardown,
            _ => Driver::Alive,
        };
        if driver != Driver::Alive {
            restarts += 1;
        }
        let n = 1 + (rand() % 2) as usize;
        life_cycle(&mut node, &nics[..n], order, driver)
            .await
            .with_context(|| format!("round {round}: {order:?} {n} {driver:?}"))?;
        if driver != Driver::Alive {
            // A new process: new baseline.
            life_cycle(&mut node, &nics, Order::Containerd, Driver::Alive).await?;
            (fds0, rss0) = (node.daemon_fds_settled().await?, node.daemon_rss_kib()?);
            kinds0 = node.daemon_fd_kinds()?;
        }
    }
    // A leak stays; what the last round still has in flight goes within seconds.
    let mut fds = node.daemon_fds_settled().await?;
    for _ in 0..5 {
        if fds <= fds0 + 2 {
            break;
        }
        fds = node.daemon_fds_settled().await?;
    }
    let rss = node.daemon_rss_kib()?;
    let netns_held = node.daemon_netns_fds()?;
    eprintln!("soak: {rounds} rounds, {restarts} restarts; fds {fds0} -> {fds}; rss {rss0} -> {rss} KiB");
    eprintln!("soak: fds by kind {kinds0:?} -> {:?}", node.daemon_fd_kinds()?);
    assert!(node.pins().is_empty(), "leaked pins: {:?}", node.pins());
    assert_eq!(netns_held, 0, "the daemon still holds pod netns open");
    assert!(fds <= fds0 + 2, "fd leak: {fds0} -> {fds}");
    assert!(rss <= rss0 + 8 * 1024, "memory grows: {rss0} -> {rss} KiB");
    for n in &nics {
        assert!(host_has(&n.name));
    }
    Ok(())
}
