//! Never past the runtime's request timeout (issue 36): a RunPodSandbox whose attach takes longer
//! than the runtime's 2 s, with the real daemon and the NRI runtime harness, veth pairs standing
//! in for NICs, as root.
//!
//! One pod claims many NICs (four claims: a claim holds at most 32 results). The moves queue on
//! RTNL, which a host program keeps busy meanwhile (it adds and deletes veth pairs in a netns of
//! its own, as a node creating and deleting pods does), so the attach runs past the 2 s the
//! runtimes give a plugin. Before, the runtime timed the hook out, closed dranet's connection
//! (fatal for the plugin) and ran the sandbox, its containers and every request until dranet
//! reconnected without it. Now the hook answers within its budget (1.5 s), the attach goes on,
//! and the sandbox's CreateContainer waits for it: the container is created only once every
//! device is in the sandbox (kubelet retries a container refused while the attach runs).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use dranet::nri::pb::nri as pb;
use dranet_sim::fixtures::{TestPod, nic_device, wait_for};
use dranet_sim::kernel::{PodNetns, host_has, unique};
use dranet_sim::kubelet::Claim;
use dranet_sim::nic::{Nic, wait_restored};
use dranet_sim::node::{Node, NodeOptions};
use dranet_sim::nri_runtime::{Flavor, RuntimeConfig};
use serde_json::json;

/// NICs of the pod: 4 claims of 24.
const CLAIMS: usize = 4;
const PER_CLAIM: usize = 24;

/// Keeps RTNL busy until dropped: veth pairs added and deleted in a netns of its own.
struct RtnlLoad {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
    _ns: PodNetns,
}

impl RtnlLoad {
    fn start() -> Result<Self> {
        let ns = PodNetns::create(&unique("dranet-rtnl-load"))?;
        let name = ns.name.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !s.load(Ordering::Relaxed) {
                let _ = std::process::Command::new("ip")
                    .args(["-n", &name, "-batch", "-"])
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .and_then(|mut c| {
                        use std::io::Write;
                        if let Some(mut i) = c.stdin.take() {
                            for k in 0..8 {
                                let _ = writeln!(i, "link add ld{k}a type veth peer name ld{k}b");
                            }
                            for k in 0..8 {
                                let _ = writeln!(i, "link del ld{k}a");
                            }
                        }
                        c.wait()
                    });
                rounds += 1;
            }
            rounds
        });
        Ok(Self {
            stop,
            thread: Some(thread),
            _ns: ns,
        })
    }
}

impl Drop for RtnlLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn slow_attach() -> Result<()> {
    let setup = Instant::now();
    let (nics, before) = Nic::many_with_views(CLAIMS * PER_CLAIM)?;
    eprintln!("{} NICs made in {:?}", nics.len(), setup.elapsed());
    let mut node = Node::start(NodeOptions {
        runtime: RuntimeConfig {
            flavor: Flavor::Containerd,
            ..RuntimeConfig::default()
        },
        ..NodeOptions::default()
    })
    .await?;
    eprintln!("node started after {:?}", setup.elapsed());
    let p = TestPod::new("budget-")?;
    let mut claims = Vec::new();
    for (c, chunk) in nics.chunks(PER_CLAIM).enumerate() {
        let claim = Claim::new(
            "default",
            &format!("claim-{}-{c}", p.uid),
            &format!("claim-uid-{}-{c}", p.uid),
        );
        let devices: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, n)| nic_device(n, json!({"interface": {"name": format!("net{c}x{i}")}})))
            .collect();
        node.write_claim(&claim, &p.uid, &devices)?;
        node.prepare(&claim).await?;
        eprintln!("claim {c} prepared after {:?}", setup.elapsed());
        claims.push(claim);
    }
    eprintln!("node started and claims prepared after {:?}", setup.elapsed());
    let sessions = node.runtime.sessions();
    let all_in = |p: &TestPod| nics.iter().all(|n| !host_has(&n.name)) && p.has("net3x23");

    let load = RtnlLoad::start()?;
    let t0 = Instant::now();
    let run = node.runtime.run_pod_sandbox(&p.sandbox).await;
    let answered = t0.elapsed();
    node.runtime.set_state(vec![p.sandbox.clone()], vec![]);
    run.with_context(|| {
        format!(
            "RunPodSandbox after {answered:?}; runtime errors: {:?}",
            node.runtime.errors()
        )
    })?;
    ensure!(
        answered < Duration::from_millis(1900),
        "RunPodSandbox answered after {answered:?}: too close to the runtime's 2 s"
    );
    ensure!(
        node.runtime.errors().is_empty() && node.runtime.sessions() == sessions,
        "the runtime dropped dranet: {:?}",
        node.runtime.errors()
    );
    // kubelet creates the container, and retries it while dranet refuses it.
    let c = pb::Container {
        id: format!("c-{}", p.sandbox.id),
        pod_sandbox_id: p.sandbox.id.clone(),
        name: "app".into(),
        ..Default::default()
    };
    let mut refused = 0;
    let created = loop {
        match node.runtime.create_container(&p.sandbox, &c).await {
            Ok(_) => break t0.elapsed(),
            Err(e) => {
                refused += 1;
                eprintln!("CreateContainer refused ({:?}): {e}", t0.elapsed());
                ensure!(t0.elapsed() < Duration::from_secs(60), "no container after 60 s");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let moved = nics.iter().filter(|n| !host_has(&n.name)).count();
    ensure!(
        all_in(&p),
        "CreateContainer answered ({created:?}) with {moved} of {} devices out of the host",
        nics.len()
    );
    drop(load);
    eprintln!(
        "{} devices: RunPodSandbox answered after {answered:?}, container created after {created:?} ({refused} refusals)",
        nics.len()
    );
    // The case is only a case if the attach ran past the hook's budget.
    ensure!(
        created > Duration::from_millis(1500),
        "the attach took {created:?}, within RunPodSandbox's budget: the test did not exercise it (more devices, more load)"
    );
    ensure!(
        node.runtime.errors().is_empty() && node.runtime.sessions() == sessions,
        "the runtime dropped dranet: {:?}",
        node.runtime.errors()
    );

    let teardown = Instant::now();
    p.stop_and_remove(&node).await?;
    node.runtime.set_state(vec![], vec![]);
    for (n, b) in nics.iter().zip(&before) {
        wait_restored(&n.name, b, Duration::from_secs(10)).await?;
    }
    for claim in &claims {
        node.unprepare(claim).await?;
    }
    wait_for("no pin left", Duration::from_secs(3), || node.pins().is_empty()).await?;
    node.stop()?;
    eprintln!("teardown took {:?}", teardown.elapsed());
    Ok(())
}

dranet_sim::root_tests! {
    a_run_pod_sandbox_attach_past_the_runtime_timeout_answers_in_time_and_the_container_waits => slow_attach();
}
