//! Adoption on this host (no VM): what must *not* happen and what must not wait. A device can be
//! adopted only by its kernel identity (its parent PCI function), which a veth stand-in has not,
//! so the adoption of a real NIC runs in the qemu kernel matrix (`dranet-sim/tests/vm_nic.rs`).
//! Here, as root, on real netns and veth pairs:
//!
//! * a veth moved into a pod netns by hand is not adopted, whether its pod's devices come from a
//!   plan or from the node's claims and published slices: `NothingFound`, the device and why
//!   named in the log, no record, no pin, the veth left where it is;
//! * the same through the real daemon: prepared and attached, the daemon SIGKILLed, its state dir
//!   wiped, restarted: the runtime's Synchronize finds the sandbox, reads the claims dir and the
//!   slices published before the restart, and adopts nothing (counted in `/metrics`);
//! * the driver's Synchronize answers within the NRI budget while the node's claims are not
//!   known yet (kubelet side not up) or their source hangs; sandboxes with a plan are handled
//!   meanwhile, the others given up at the deadline.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use dranet::adoption::{Adopter, AllocationsCell, NodeAllocations, SandboxAdoption, Source};
use dranet::config::NetworkConfig;
use dranet::dra::{ClaimError, ClaimSource, MemoryClaimSource, ResourceClaim};
use dranet::nri::hooks::{Pod, PodHooks};
use dranet::pod::Driver;
use dranet::rescue::{AdoptOutcome, Engine};
use dranet::slices::PublishedDevices;
use dranet_sim::fixtures::{StateDir, TestPod, device_plan, engine, nic_device, pod_plan, wait_for};
use dranet_sim::kernel::{PodNetns, unique};
use dranet_sim::nic::Nic;
use dranet_sim::node::{Node, NodeOptions, free_port, http_get};
use dranet_sim::root_or_skip;
use futures::future::BoxFuture;
use serde_json::json;

/// containerd's default NRI request timeout.
const NRI_BUDGET: Duration = Duration::from_secs(2);

/// Log lines, as written.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
            .into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The log of this test binary: a global subscriber (a scoped one misses events whose callsite
/// another test's thread registered first), so each test picks its lines by its pod's UID.
fn log() -> &'static Captured {
    static LOG: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let out = Captured::default();
        let w = out.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        let _ = tracing::subscriber::set_global_default(sub);
        out
    })
}

fn pod(uid: &str, sandbox: &str, netns: &Path) -> Pod {
    Pod {
        uid: uid.into(),
        namespace: "default".into(),
        name: "p".into(),
        id: sandbox.into(),
        netns: Some(netns.to_owned()),
        ..Pod::default()
    }
}

/// A claim reserved for pod `uid`, allocating `device` of this driver in pool `node-a`.
fn claim(uid: &str, device: &str) -> Result<ResourceClaim> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("c-{uid}"), "namespace": "default", "uid": format!("cu-{uid}")},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "nic", "driver": "dra.net", "pool": "node-a", "device": device}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": uid}]
        }
    }))?)
}

/// What this node published for a veth stand-in: its name, no PCI address.
fn published_veth(device: &str) -> PublishedDevices {
    PublishedDevices::from_slices(
        &[json!({"spec": {"driver": "dra.net", "nodeName": "node-a",
                          "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                          "devices": [{"name": device, "attributes": {
                              "dra.net/ifName": {"string": device},
                              "dra.net/type": {"string": "veth"}}}]}})],
        "dra.net",
        "node-a",
    )
}

/// Waits until `adopter` has finished one more run than `seen`, and returns its report.
async fn next_run(adopter: &Adopter, seen: u64, timeout: Duration) -> Result<Vec<SandboxAdoption>> {
    let mut runs = adopter.runs();
    tokio::time::timeout(timeout, runs.wait_for(|n| *n > seen))
        .await
        .context("no adoption run finished")??;
    Ok(adopter.last())
}

/// Moves `nic` into `ns` as `net1`, addressed and up, as upstream dranet (or a human) would.
fn move_by_hand(nic: &Nic, ns: &PodNetns) -> Result<()> {
    dranet_sim::kernel::sh(&["ip", "link", "set", &nic.name, "netns", &ns.name])?;
    ns.ip(&["link", "set", &nic.name, "name", "net1"])?;
    ns.ip(&["addr", "add", "198.51.100.2/24", "dev", "net1"])?;
    ns.ip(&["link", "set", "net1", "up"])?;
    Ok(())
}

fn assert_not_adopted(e: &Engine, state: &StateDir, ns: &PodNetns, uid: &str) -> Result<()> {
    assert!(
        e.checkpoint().records_of(uid).next().is_none(),
        "a record for an unadopted pod: {:?}",
        e.checkpoint().pods
    );
    let pins = dranet::sys::netns::Pin::list(&state.0.join("pins"))?;
    assert!(pins.is_empty(), "pinned: {pins:?}");
    ensure!(ns.has("net1"), "the veth left its pod netns");
    Ok(())
}

#[tokio::test]
async fn a_veth_moved_into_a_pod_netns_by_hand_is_not_adopted() -> Result<()> {
    root_or_skip!("a_veth_moved_into_a_pod_netns_by_hand_is_not_adopted");
    let log = log();
    let state = StateDir::new("adopt-veth");
    let e = engine(&state, None).await?;
    let nic = Nic::create()?;
    let ns = PodNetns::create(&unique("dnadopt"))?;
    move_by_hand(&nic, &ns)?;
    let uid = unique("pod-adopt-");
    let sb = format!("sb-{uid}");
    let claims = MemoryClaimSource::new();
    claims.insert(claim(&uid, &nic.name)?);
    let cell = AllocationsCell::default();
    cell.set(NodeAllocations::new(
        Arc::new(claims),
        "dra.net",
        "node-a",
        published_veth(&nic.name),
    ));
    let adopter = Adopter::new(e.clone(), cell);
    let driver = Driver::new(e.clone()).with_adoption(adopter.clone());

    // 1. From the node's claims and published slices (no plan: a lost checkpoint, upstream).
    driver.synchronize(vec![pod(&uid, &sb, &ns.path)], vec![]).await;
    let report = next_run(&adopter, 0, Duration::from_secs(10)).await?;
    assert_eq!(report.len(), 1, "{report:?}");
    assert_eq!(report[0].from, Source::Claims);
    assert_eq!(
        report[0].outcome,
        Ok(AdoptOutcome::NothingFound {
            unidentified: vec![nic.name.clone()]
        })
    );
    assert!(
        report[0].unidentified[0].1.contains("no PCI address"),
        "{report:?}"
    );
    assert_not_adopted(&e, &state, &ns, &uid)?;

    // 2. From a plan that names the veth (no PCI address in it either).
    e.set_plan(pod_plan(
        &uid,
        vec![device_plan(&nic, "net1", &uid, NetworkConfig::default())],
    ))?;
    driver.synchronize(vec![pod(&uid, &sb, &ns.path)], vec![]).await;
    let report = next_run(&adopter, 1, Duration::from_secs(10)).await?;
    assert_eq!(report.len(), 1, "{report:?}");
    assert_eq!(report[0].from, Source::Plan);
    assert!(
        matches!(&report[0].outcome, Ok(AdoptOutcome::NothingFound { unidentified }) if *unidentified == [nic.name.clone()]),
        "{report:?}"
    );
    assert_not_adopted(&e, &state, &ns, &uid)?;

    let text = log.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("not adopted") && l.contains(&uid))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    for l in lines {
        assert!(
            l.contains(&uid) && l.contains(&nic.name) && l.contains("no PCI address"),
            "{l}"
        );
    }
    Ok(())
}

/// A claim source whose list never answers.
struct Hung;

impl ClaimSource for Hung {
    fn get<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<ResourceClaim, ClaimError>> {
        Box::pin(futures::future::pending())
    }
    fn list<'a>(&'a self) -> BoxFuture<'a, Result<Vec<ResourceClaim>, ClaimError>> {
        Box::pin(futures::future::pending())
    }
}

#[tokio::test]
async fn synchronize_answers_within_the_nri_budget_while_the_claims_hang() -> Result<()> {
    root_or_skip!("synchronize_answers_within_the_nri_budget_while_the_claims_hang");
    let state = StateDir::new("adopt-hang");
    let e = engine(&state, None).await?;
    let nic = Nic::create()?;
    let with_plan = PodNetns::create(&unique("dnadpl"))?;
    let without_plan = PodNetns::create(&unique("dnadnp"))?;
    move_by_hand(&nic, &with_plan)?;
    let (planned, other) = (unique("pod-adpl-"), unique("pod-adnp-"));
    e.set_plan(pod_plan(
        &planned,
        vec![device_plan(&nic, "net1", &planned, NetworkConfig::default())],
    ))?;
    let pods = || {
        vec![
            pod(&planned, &format!("sb-{planned}"), &with_plan.path),
            pod(&other, &format!("sb-{other}"), &without_plan.path),
        ]
    };
    let deadline = Duration::from_millis(800);
    // The kubelet side never comes up (the cell is never set), then it does but its claims
    // source hangs.
    for hung_source in [false, true] {
        let cell = AllocationsCell::default();
        if hung_source {
            cell.set(NodeAllocations::new(
                Arc::new(Hung),
                "dra.net",
                "node-a",
                PublishedDevices::default(),
            ));
        }
        let adopter = Adopter::new(e.clone(), cell).with_deadline(deadline);
        let driver = Driver::new(e.clone()).with_adoption(adopter.clone());
        let t0 = Instant::now();
        driver.synchronize(pods(), vec![]).await;
        let answered = t0.elapsed();
        eprintln!("hung source {hung_source}: Synchronize answered in {answered:?}");
        assert!(answered < NRI_BUDGET, "Synchronize took {answered:?}");
        let report = next_run(&adopter, 0, deadline * 10).await?;
        let took = t0.elapsed();
        assert!(took >= deadline, "gave up after {took:?}, before the deadline");
        // The sandbox with a plan was handled from it; the other is given up.
        assert_eq!(report.len(), 1, "{report:?}");
        assert_eq!(
            (report[0].pod_uid.as_str(), report[0].from),
            (planned.as_str(), Source::Plan)
        );
        assert!(e.checkpoint().records_of(&other).next().is_none());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_with_a_wiped_state_dir_does_not_adopt_a_veth() -> Result<()> {
    root_or_skip!("the_daemon_with_a_wiped_state_dir_does_not_adopt_a_veth");
    let nic = Nic::create()?;
    let http = format!("127.0.0.1:{}", free_port()?);
    let mut node = Node::start(NodeOptions {
        bind_address: http.clone(),
        ..NodeOptions::default()
    })
    .await?;
    let pod = TestPod::new("pod-add-")?;
    let (device, config) = nic_device(&nic, json!({"interface": {"name": "net1"}}));
    pod.prepare(&node, &[(device.clone(), config)]).await?;
    pod.run(&node).await?;
    ensure!(pod.has("net1"), "the veth did not move into its pod");
    // What the daemon published (the veth, with no PCI address) stays in the slices dir.
    let slices = node.dir.join("slices");
    let published = || {
        std::fs::read_dir(&slices)
            .into_iter()
            .flatten()
            .flatten()
            .any(|f| std::fs::read_to_string(f.path()).is_ok_and(|t| t.contains(&format!("\"{device}\""))))
    };
    wait_for(
        "the veth in the published slices",
        Duration::from_secs(10),
        published,
    )
    .await?;
    node.kill()?;
    node.wipe_state()?;
    node.restart().await?;
    // The runtime's Synchronize on connect started an adoption run: wait for its verdict.
    let start = Instant::now();
    loop {
        let (_, metrics) = http_get(&http, "/metrics").await?;
        if metrics.contains("dranet_adoption_sandboxes_total{outcome=\"nothing_found\"} 1") {
            assert!(!metrics.contains("outcome=\"adopted\""), "{metrics}");
            break;
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("no adoption verdict after 30 s: {metrics}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(node.records()?.is_empty(), "{:?}", node.records()?);
    assert!(node.pins().is_empty(), "{:?}", node.pins());
    ensure!(pod.has("net1"), "the veth left its pod netns");
    Ok(())
}
