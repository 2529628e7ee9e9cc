//! No pod ever runs without its devices (issue 36) on the real containerd (Debian's 1.7.24 and
//! 2.1.9, as root): kubelet prepared a pod's claims, then dranet is away when containerd runs the
//! pod's sandbox and its first container —
//!
//! * **SIGTERM** (a DaemonSet update): dranet closes its NRI connection and exits;
//! * **SIGKILL** (a crash, an OOM kill): the kernel closes the connection;
//! * **stall** (SIGSTOP): the connection stays open and nothing answers. Both versions give a
//!   plugin request 2 s (`plugin_request_timeout`, NRI's `DefaultPluginRequestTimeout`; 1.7.24's
//!   NRI v0.6.1 has the same timeout, it only does not announce it in Configure): the request
//!   times out, containerd logs "closing plugin dranet", drops the plugin and completes
//!   RunPodSandbox without it; the CRI call takes those 2 s longer. Then SIGCONT.
//!
//! In every case containerd runs the sandbox and the container without the NIC (asserted: the gap
//! is real), and within 1 s of dranet's return (its restart, or SIGCONT) the NIC is in the running
//! sandbox; the operator is told (a WARN naming the pod, `dranet_late_attach_total`, a
//! `NetworkDeviceLateAttach` event); the teardown brings the NIC home restored. No NRI hook of
//! either daemon answered later than the runtime's 2 s (the hook latency histogram, printed).
//!
//! NRI's default validator ("required plugins"), which would refuse the container while dranet is
//! away, is not in either Debian build: containerd 2.1.9 is built with NRI v0.8.0 (the validator
//! came with NRI v0.10.0 and containerd 2.2's `default_validator` config), 1.7.24 with v0.6.1.
//! `validator_config_is_inert` shows that 2.1.9 takes the config table and still starts the
//! container without the NIC while dranet is away.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use dranet_sim::fixtures::{nic_device, wait_for};
use dranet_sim::kernel::host_has;
use dranet_sim::nic::Nic;
use dranet_sim::real_node::{
    CriPod, RealNode, assert_home, assert_in_pod, device_config, netns_has, node_on, sample, slowest_hook,
};
use dranet_sim::root_tests;

/// The runtime's plugin request timeout (both Debian builds: NRI's default).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How dranet is away when containerd runs the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Away {
    Term,
    Kill,
    Stall,
}

/// One daemon's slowest hook, checked against the runtime's timeout, printed.
async fn check_hooks(node: &RealNode, label: &str) -> Result<f64> {
    let (t, which) = slowest_hook(&node.metrics().await?);
    println!("slowest NRI hook answer ({label}): {:.1} ms {which}", t * 1000.0);
    ensure!(
        t < REQUEST_TIMEOUT.as_secs_f64(),
        "an NRI hook answered after {t} s ({which}), past the runtime's {REQUEST_TIMEOUT:?}"
    );
    Ok(t)
}

/// A pod run while dranet is `away` gets its NIC within 1 s of dranet's return; the operator is
/// told; the NIC comes home restored at teardown.
async fn away_case(test: &str, suite: &str, away: Away) -> Result<()> {
    let (nics, before) = Nic::many_with_views(2)?;
    let Some((mut node, cri, rt)) = node_on(test, suite, "").await? else {
        return Ok(());
    };
    let version = rt.upstream().to_owned();
    // A pod run with dranet there (its hooks are timed too); it keeps its NIC throughout.
    let mut present = CriPod::new("ctrd-here-");
    present
        .prepare(&node, &[nic_device(&nics[1], device_config(0))])
        .await?;
    present.run(&cri).await?;
    assert_in_pod(&cri, &present, &nics[1..]).await?;
    let mut pod = CriPod::new("ctrd-away-");
    pod.prepare(&node, &[nic_device(&nics[0], device_config(0))])
        .await?;
    let mut slowest = check_hooks(&node, &format!("{version} {away:?}, first daemon")).await?;
    match away {
        Away::Term => {
            let st = node.terminate().await?;
            ensure!(st.success(), "dranet exited {st} on SIGTERM");
        }
        Away::Kill => node.kill()?,
        Away::Stall => node.pause()?,
    }
    // kubelet's SyncPod: the sandbox, then its first container, while dranet is away.
    let t = Instant::now();
    let run = tokio::time::timeout(Duration::from_secs(60), pod.run(&cri)).await;
    let ran = t.elapsed();
    let run = match run {
        Ok(r) => r,
        Err(_) => {
            if away == Away::Stall {
                node.resume()?;
            }
            anyhow::bail!(
                "containerd {version}: RunPodSandbox + container still blocked after 60 s with dranet {away:?}"
            );
        }
    };
    run.with_context(|| format!("containerd {version} with dranet {away:?}"))?;
    ensure!(
        host_has(&nics[0].name),
        "the NIC left the host while dranet was away ({away:?})"
    );
    let ns = pod.netns(&cri).await?;
    ensure!(!netns_has(&ns, "net0"), "net0 in the pod while dranet was away");
    if away == Away::Stall {
        // containerd waited for its request timeout, then dropped the plugin.
        ensure!(
            ran >= REQUEST_TIMEOUT,
            "containerd {version} ran the pod in {ran:?} with dranet stalled: no request timeout?"
        );
        let closing = node
            .containerd
            .wait_log("closing plugin", Duration::from_secs(5))
            .await
            .with_context(|| {
                format!(
                    "containerd {version} never closed the stalled plugin:\n{}",
                    node.containerd.log_text()
                )
            })?;
        println!("containerd {version}: {closing}");
    }
    println!(
        "containerd {version}: sandbox + container run with dranet {away:?} in {ran:?}, NIC still in the host"
    );
    let back = match away {
        Away::Term | Away::Kill => {
            let spawned = Instant::now();
            node.restart().await?;
            println!(
                "containerd {version}: dranet restarted (ready, registered with kubelet) in {:?}",
                spawned.elapsed()
            );
            Instant::now()
        }
        Away::Stall => {
            node.resume()?;
            Instant::now()
        }
    };
    wait_for(
        "the NIC in the running sandbox within 1 s of dranet's return",
        Duration::from_secs(1),
        || netns_has(&ns, "net0"),
    )
    .await
    .with_context(|| format!("daemon log:\n{}", node.log()))?;
    let took = back.elapsed();
    assert_in_pod(&cri, &pod, &nics[..1]).await?;
    assert_in_pod(&cri, &present, &nics[1..])
        .await
        .context("the pod run with dranet there, after dranet's return")?;
    // What the returning daemon saw of the runtime (a stalled one: the request it never answered).
    for l in node.log().lines().filter(|l| {
        [
            "NRI connection lost",
            "method=StateChange",
            "method=RunPodSandbox",
            "late attach",
            "Synchronize",
        ]
        .iter()
        .any(|k| l.contains(k))
    }) {
        println!("dranet: {l}");
    }
    println!(
        "RESULT containerd {version} {away:?}: NIC in the pod {:.1} ms after dranet's return",
        took.as_secs_f64() * 1000.0
    );
    // The operator is told: a WARN naming the pod, the metric, an event on the pod.
    let warn = node.wait_log("late attach", 1, Duration::from_secs(5)).await?;
    ensure!(warn.contains("WARN") && warn.contains(&pod.ident.name), "{warn}");
    println!("dranet: {warn}");
    let m = node.metrics().await?;
    let late: f64 = ["synchronize", "create_container", "late_answer"]
        .iter()
        .map(|t| sample(&m, &format!("dranet_late_attach_total{{trigger=\"{t}\"}}")))
        .sum();
    ensure!(late >= 1.0, "dranet_late_attach_total is {late}:\n{m}");
    wait_for("the late-attach event", Duration::from_secs(5), || {
        let ev = node.events();
        ev.contains("NetworkDeviceLateAttach") && ev.contains(&pod.ident.name)
    })
    .await
    .with_context(|| format!("events:\n{}", node.events()))?;
    pod.stop(&cri).await?;
    present.stop(&cri).await?;
    assert_home(&node, &nics, &before).await?;
    pod.remove(&cri).await?;
    present.remove(&cri).await?;
    node.unprepare(&pod.claim).await?;
    node.unprepare(&present.claim).await?;
    ensure!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    slowest = slowest.max(check_hooks(&node, &format!("{version} {away:?}, after the return")).await?);
    println!(
        "RESULT containerd {version} {away:?}: slowest hook {:.1} ms",
        slowest * 1000.0
    );
    Ok(())
}

/// containerd 2.1.9 with `[plugins.'io.containerd.nri.v1.nri'.default_validator]` enabled and
/// dranet required: Debian's build has no default validator (NRI v0.8.0), so the table is
/// ignored and a pod run while dranet is away starts its container without its NIC (late attach
/// puts it there once dranet is back). Documents that the refusal cannot be had on this version.
async fn validator_config_is_inert(test: &str, suite: &str) -> Result<()> {
    const VALIDATOR: &str = "\n  [plugins.'io.containerd.nri.v1.nri'.default_validator]\n    enable = true\n    required_plugins = [\"dranet\"]\n";
    let (nics, before) = Nic::many_with_views(1)?;
    let Some((mut node, cri, rt)) = node_on(test, suite, VALIDATOR).await? else {
        return Ok(());
    };
    let config = std::fs::read_to_string(node.containerd.layout.config())?;
    ensure!(config.contains("required_plugins = [\"dranet\"]"), "{config}");
    let mut pod = CriPod::new("ctrd-val-");
    pod.prepare(&node, &[nic_device(&nics[0], device_config(0))])
        .await?;
    node.kill()?;
    pod.run(&cri).await.with_context(|| {
        format!(
            "containerd {} refused the pod: a validator after all?",
            rt.upstream()
        )
    })?;
    ensure!(
        host_has(&nics[0].name),
        "the NIC left the host while dranet was away"
    );
    println!(
        "containerd {}: default_validator {{enable, required_plugins=[dranet]}} configured; the pod's container started without dranet (no validator in NRI v0.8.0)",
        rt.upstream()
    );
    node.restart().await?;
    let ns = pod.netns(&cri).await?;
    wait_for(
        "the NIC in the pod after dranet's return",
        Duration::from_secs(1),
        || netns_has(&ns, "net0"),
    )
    .await?;
    pod.stop(&cri).await?;
    assert_home(&node, &nics, &before).await?;
    pod.remove(&cri).await?;
    node.unprepare(&pod.claim).await?;
    Ok(())
}

/// The stall seen from dranet's side, with the simulated runtime (its timeouts are settable):
/// RunPodSandbox reaches dranet, but the runtime's request timeout passes before dranet answers
/// (here 1 ms; on a node, a daemon stalled past the runtime's 2 s). The runtime drops the plugin
/// and runs the sandbox without it; the hook's attach, which finishes after that, is a late
/// attach: `dranet_late_attach_total{trigger="late_answer"}`, a WARN naming the pod, a
/// `NetworkDeviceLateAttach` event; dranet registers again, the runtime's Synchronize lists the
/// sandbox, the devices stay; the teardown brings them home restored.
async fn answer_past_the_timeout_is_a_late_attach() -> Result<()> {
    use dranet_sim::fixtures::TestPod;
    use dranet_sim::node::{Node, NodeOptions, free_port};
    let (nic, before) = Nic::with_view()?;
    let port = free_port()?;
    let node = Node::start(NodeOptions {
        bind_address: format!("127.0.0.1:{port}"),
        ..NodeOptions::default()
    })
    .await?;
    let p = TestPod::new("late-answer-")?;
    p.prepare(
        &node,
        &[nic_device(
            &nic,
            serde_json::json!({"interface": {"name": "net0", "addresses": ["192.168.78.2/24"]}}),
        )],
    )
    .await?;
    // The next Synchronize lists the sandbox (the runtime ran it).
    node.runtime.set_state(vec![p.sandbox.clone()], vec![]);
    node.runtime.set_request_timeout(Duration::from_millis(1));
    let sessions = node.runtime.sessions();
    let r = node.runtime.run_pod_sandbox(&p.sandbox).await;
    node.runtime.set_request_timeout(REQUEST_TIMEOUT);
    ensure!(r.is_err(), "RunPodSandbox answered within 1 ms");
    ensure!(
        node.runtime.errors().iter().any(|e| e.contains("RunPodSandbox")),
        "the runtime did not drop the plugin: {:?}",
        node.runtime.errors()
    );
    wait_for("the NIC in the sandbox", Duration::from_secs(5), || p.has("net0")).await?;
    node.runtime
        .wait_ready(sessions + 1, Duration::from_secs(10))
        .await
        .context("dranet did not register again")?;
    let metrics = || async {
        dranet_sim::node::http_get(&format!("127.0.0.1:{port}"), "/metrics")
            .await
            .map(|(_, m)| m)
    };
    let mut m = String::new();
    for _ in 0..100 {
        m = metrics().await?;
        if sample(&m, "dranet_late_attach_total{trigger=\"late_answer\"}") >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ensure!(
        sample(&m, "dranet_late_attach_total{trigger=\"late_answer\"}") == 1.0,
        "{m}"
    );
    // (The WARN naming the pod goes to this test's stderr: the simulated node logs there.)
    wait_for("the late-attach event", Duration::from_secs(5), || {
        let ev = dranet_sim::real_node::events_under(&node.dir);
        ev.contains("NetworkDeviceLateAttach") && ev.contains("stopped waiting")
    })
    .await?;
    // Synchronize after the reconnection listed the sandbox: the NIC stays, no second attach.
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(p.has("net0"), "the NIC left the sandbox after the reconnection");
    let m = metrics().await?;
    ensure!(
        sample(&m, "dranet_late_attach_total{trigger=\"synchronize\"}") == 0.0,
        "attached twice: {m}"
    );
    p.stop_and_remove(&node).await?;
    node.runtime.set_state(vec![], vec![]);
    dranet_sim::nic::wait_restored(&nic.name, &before, Duration::from_secs(5)).await?;
    node.unprepare(&p.claim).await?;
    ensure!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    Ok(())
}

root_tests! {
    simulated_runtime_an_attach_answered_past_the_request_timeout_is_reported_late =>
        answer_past_the_timeout_is_a_late_attach();
    containerd_1_7_pod_run_while_dranet_sigtermed_gets_its_nic_within_1s_of_the_return =>
        away_case("containerd_1_7_pod_run_while_dranet_sigtermed_gets_its_nic_within_1s_of_the_return", "trixie", Away::Term);
    containerd_2_pod_run_while_dranet_sigtermed_gets_its_nic_within_1s_of_the_return =>
        away_case("containerd_2_pod_run_while_dranet_sigtermed_gets_its_nic_within_1s_of_the_return", "sid", Away::Term);
    containerd_1_7_pod_run_while_dranet_sigkilled_gets_its_nic_within_1s_of_the_return =>
        away_case("containerd_1_7_pod_run_while_dranet_sigkilled_gets_its_nic_within_1s_of_the_return", "trixie", Away::Kill);
    containerd_2_pod_run_while_dranet_sigkilled_gets_its_nic_within_1s_of_the_return =>
        away_case("containerd_2_pod_run_while_dranet_sigkilled_gets_its_nic_within_1s_of_the_return", "sid", Away::Kill);
    containerd_1_7_pod_run_while_dranet_stalled_past_the_timeout_gets_its_nic_within_1s_of_sigcont =>
        away_case("containerd_1_7_pod_run_while_dranet_stalled_past_the_timeout_gets_its_nic_within_1s_of_sigcont", "trixie", Away::Stall);
    containerd_2_pod_run_while_dranet_stalled_past_the_timeout_gets_its_nic_within_1s_of_sigcont =>
        away_case("containerd_2_pod_run_while_dranet_stalled_past_the_timeout_gets_its_nic_within_1s_of_sigcont", "sid", Away::Stall);
    containerd_2_default_validator_config_is_inert_in_debians_2_1_9 =>
        validator_config_is_inert("containerd_2_default_validator_config_is_inert_in_debians_2_1_9", "sid");
}
