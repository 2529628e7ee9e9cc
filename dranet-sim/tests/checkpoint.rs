// Over 500 lines: every way a checkpoint fails to load shares the pod, NIC, corruption and wait helpers above its scenarios.
//! A checkpoint that does not load, and a second process beside the daemon, against the real
//! `dranet run` binary (NRI runtime harness + kubelet simulator), real netns and veth pairs
//! standing in for NICs:
//!
//! * each of a truncated, a garbage, an `{}` and a version-99 record file (format 3: one file per
//!   record in `<state-dir>/checkpoint/`), written while the daemon is down and a pod holds a
//!   device: the daemon starts, says what it did, and the device comes home at teardown —
//!   restored from the record's `.prev` when that loads, rebuilt from the pin when it does not
//!   (then home as `dn<ifindex>`, up, without addresses) — in containerd and in CRI-O order;
//!   `release-all` works from the pins alone; a rebuilt record loads again at the next start (its
//!   host ifindex unknown, 0) as it was, named, and is not rebuilt a second time;
//! * `release-all` and a second `dranet run` beside a running daemon refuse, naming it, and
//!   touch nothing; a `release-all` that waits gets the state dir once the daemon stops, with
//!   every record the daemon wrote meanwhile.
//!
//! `DRANET_BIN=<old build>/dranet cargo test -p dranet-sim --test checkpoint` runs them against
//! another build of the daemon.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dranet_sim::fixtures::{TestPod, nic_device};
use dranet_sim::kernel::{PodNetns, Veth, dranet_bin, sh};
use dranet_sim::nic::{Nic, view, wait_restored};
use dranet_sim::node::{Node, NodeOptions};
use dranet_sim::nri_runtime::Flavor;
use dranet_sim::root_or_skip;
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bad {
    Truncated,
    Garbage,
    EmptyObject,
    Version99,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// StopPodSandbox while the netns lives, then the netns goes, then RemovePodSandbox.
    Containerd,
    /// The netns is unmounted and unlinked first, the hooks come late.
    Crio,
}

fn opts() -> NodeOptions {
    NodeOptions {
        capture_log: true,
        ..NodeOptions::default()
    }
}

/// Overwrites a checkpoint file with a bad version of itself.
fn corrupt(path: &Path, bad: Bad) -> Result<()> {
    let good = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let bytes = match bad {
        Bad::Truncated => good[..good.len() / 2].to_vec(),
        Bad::Garbage => b"\x00\xff\x13 not a checkpoint \xfe".to_vec(),
        Bad::EmptyObject => b"{}".to_vec(),
        Bad::Version99 => {
            let mut v: Value = serde_json::from_slice(&good)?;
            v["version"] = json!(99);
            serde_json::to_vec(&v)?
        }
    };
    std::fs::write(path, bytes)?;
    Ok(())
}

/// The record files of the checkpoint (`checkpoint/*.json`), and of those the ones with a `.prev`.
fn record_files(node: &Node) -> Result<(Vec<std::path::PathBuf>, Vec<std::path::PathBuf>)> {
    let dir = node.state_dir().join("checkpoint");
    let mut files: Vec<_> = std::fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let with_prev = files.iter().filter(|p| prev_of(p).exists()).cloned().collect();
    Ok((files, with_prev))
}

fn prev_of(path: &Path) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".prev");
    p.into()
}

/// Every record file that has a `.prev` made bad (the `.prev` kept): the checkpoint is one save
/// behind, as a bad `state.json` with a good `state.json.prev` was.
fn corrupt_current(node: &Node, bad: Bad) -> Result<()> {
    let (_, with_prev) = record_files(node)?;
    if !with_prev.iter().any(|p| p.to_string_lossy().contains("/pod_")) {
        bail!("no pod record with a .prev: {with_prev:?}");
    }
    for p in &with_prev {
        corrupt(p, bad)?;
    }
    Ok(())
}

/// Every record file and every `.prev` made bad: the pin is all there is.
fn corrupt_all(node: &Node, bad: Bad) -> Result<()> {
    let (files, _) = record_files(node)?;
    for p in &files {
        corrupt(p, bad)?;
        let prev = prev_of(p);
        if prev.exists() {
            corrupt(&prev, bad)?;
        }
    }
    Ok(())
}

/// A pod holding one NIC as `net0`, its sandbox reported by the runtime's Synchronize.
async fn start_pod(node: &Node, nic: &Nic) -> Result<TestPod> {
    let pod = TestPod::new("ck-")?;
    pod.prepare(
        node,
        &[nic_device(
            nic,
            json!({"interface": {"name": "net0", "addresses": ["192.168.77.2/24"]}}),
        )],
    )
    .await?;
    pod.run(node).await?;
    assert!(pod.has("net0"), "the NIC did not move into the pod");
    Ok(pod)
}

/// The NIC's ifindex inside the pod.
fn pod_ifindex(ns: &PodNetns) -> Result<u64> {
    let v: Value = serde_json::from_str(&ns.ip(&["-j", "link", "show", "dev", "net0"])?)?;
    v[0]["ifindex"].as_u64().context("no ifindex")
}

/// The host link that is the NIC, found through its veth peer (which stays home) whatever its
/// name: `None` while the NIC is elsewhere.
fn nic_at_home(nic: &Nic) -> Result<Option<Value>> {
    let peer = u64::from(Veth::ifindex(&nic.veth.b)?);
    let links: Value = serde_json::from_str(&sh(&["ip", "-j", "-d", "addr", "show"])?)?;
    // `ip` names the peer (`link`) when it is in the same netns, else gives its index and netns.
    Ok(links.as_array().and_then(|a| {
        a.iter()
            .find(|l| {
                l["link"] == nic.veth.b.as_str()
                    || (l["link_index"].as_u64() == Some(peer) && l.get("link_netnsid").is_none())
            })
            .cloned()
    }))
}

async fn wait_home(nic: &Nic, what: &str) -> Result<Value> {
    let start = Instant::now();
    loop {
        if let Some(l) = nic_at_home(nic)? {
            return Ok(l);
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("{what}: {} not home after 10 s", nic.name);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pod's teardown in `order`; returns the NIC as it came home.
async fn teardown(node: &Node, pod: &mut TestPod, nic: &Nic, order: Order) -> Result<Value> {
    let home = match order {
        Order::Containerd => {
            node.runtime.set_flavor(Flavor::Containerd);
            pod.stop(node).await?;
            let home = nic_at_home(nic)?.context("not home after StopPodSandbox")?;
            pod.ns.remove_crio_style()?;
            pod.remove(node).await?;
            home
        }
        Order::Crio => {
            node.runtime.set_flavor(Flavor::Crio);
            pod.ns.remove_crio_style()?;
            // Before any hook: the rescue brings it home.
            let home = wait_home(nic, "CRI-O order").await?;
            pod.stop_and_remove(node).await?;
            home
        }
    };
    node.runtime.set_state(vec![], vec![]);
    node.unprepare(&pod.claim).await?;
    Ok(home)
}

/// Waits until the NIC is home as a device of a record rebuilt from its pin comes home:
/// `dn<its pod ifindex>`, up, without an IPv4 address (its snapshot from before the attach is
/// unknown). The rename comes with the move; the rest right after it.
async fn rebuilt_home(nic: &Nic, pod_ifindex: u64) -> Result<Value> {
    let start = Instant::now();
    loop {
        let last = match nic_at_home(nic)? {
            Some(home) => match rebuilt_return(&home, pod_ifindex) {
                Ok(()) => return Ok(home),
                Err(e) => e,
            },
            None => anyhow::anyhow!("{} not home", nic.name),
        };
        if start.elapsed() > Duration::from_secs(5) {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn rebuilt_return(home: &Value, pod_ifindex: u64) -> Result<()> {
    let name = home["ifname"].as_str().unwrap_or_default();
    if name != format!("dn{pod_ifindex}") {
        bail!("came home as {name:?}, not dn{pod_ifindex}: {home}");
    }
    let up = home["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == "UP"));
    let inet = home["addr_info"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x["family"] == "inet"));
    if !up || inet {
        bail!("a rebuilt device must come home up and without addresses: {home}");
    }
    Ok(())
}

/// The files of `checkpoint/` whose name contains `part`.
fn state_files(node: &Node, part: &str) -> Result<Vec<String>> {
    Ok(std::fs::read_dir(node.state_dir().join("checkpoint"))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(part))
        .collect())
}

async fn wait_log(node: &Node, needle: &str) -> Result<()> {
    let start = Instant::now();
    while !node.log().contains(needle) {
        if start.elapsed() > Duration::from_secs(5) {
            bail!("the daemon never logged {needle:?}; its log:\n{}", node.log());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// `bad` while a pod holds a NIC: (1) the record files bad, their `.prev` fine: restored from
/// `.prev`, home fully restored at teardown in `prev_order`; (2) every file bad: rebuilt from the
/// pin, home as `dn<ifindex>` in `pins_order`; (3) every file bad, daemon down: `release-all`
/// brings it home.
async fn corrupt_checkpoint(bad: Bad, prev_order: Order, pins_order: Order) -> Result<()> {
    let nic = Nic::create()?;
    let mut node = Node::start(opts()).await?;
    let res = scenarios(&mut node, &nic, bad, prev_order, pins_order).await;
    res.with_context(|| format!("the daemon's log:\n{}", node.log()))
}

async fn scenarios(node: &mut Node, nic: &Nic, bad: Bad, prev_order: Order, pins_order: Order) -> Result<()> {
    let before = view(&nic.name, None)?;

    // (1) The record files bad, their .prev fine.
    let mut pod = start_pod(node, nic).await?;
    node.kill()?;
    corrupt_current(node, bad)?;
    let (_, with_prev) = record_files(node)?;
    node.restart().await.context("restart on bad record files")?;
    wait_log(node, "checkpoint records do not load: using their .prev").await?;
    let aside = state_files(node, ".corrupt-")?;
    assert_eq!(
        aside.len(),
        with_prev.len(),
        "the bad files are kept aside: {aside:?}"
    );
    assert!(pod.ns.has("net0"), "the running pod lost its NIC");
    teardown(node, &mut pod, nic, prev_order).await?;
    wait_restored(&nic.name, &before, Duration::from_secs(5))
        .await
        .context("after the fallback to .prev")?;
    assert!(node.pins().is_empty(), "pins left: {:?}", node.pins());

    // (2) Both bad: the pin is all there is.
    let mut pod = start_pod(node, nic).await?;
    let idx = pod_ifindex(&pod.ns)?;
    node.kill()?;
    corrupt_all(node, bad)?;
    node.restart().await.context("restart with no record loading")?;
    wait_log(
        node,
        "checkpoint records load from neither their file nor their .prev",
    )
    .await?;
    wait_log(node, "record rebuilt from the pin").await?;
    assert!(pod.ns.has("net0"), "the running pod lost its NIC");
    teardown(node, &mut pod, nic, pins_order).await?;
    let home = rebuilt_home(nic, idx).await?;
    wait_log(node, "are home under these names").await?;
    assert!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    let renamed = home["ifname"].as_str().unwrap_or_default().to_owned();
    sh(&["ip", "link", "set", &renamed, "down"])?;
    sh(&["ip", "link", "set", &renamed, "name", &nic.name])?;
    sh(&["ip", "link", "set", &nic.name, "up"])?;
    sh(&["ip", "addr", "add", &nic.addr, "dev", &nic.name])?;
    wait_restored(&nic.name, &before, Duration::from_secs(5))
        .await
        .context("putting the NIC back by hand")?;

    // (3) Both bad, daemon down: release-all from the pins alone.
    let pod = start_pod(node, nic).await?;
    let idx = pod_ifindex(&pod.ns)?;
    node.kill()?;
    corrupt_all(node, bad)?;
    let out = node.cli(&["release-all", "--filter", ""])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "release-all failed: {stdout}\n{stderr}");
    assert!(stdout.contains("rebuilt from pins 1"), "{stdout}\n{stderr}");
    assert!(!pod.ns.has("net0"), "release-all left the NIC in the pod");
    let home = rebuilt_home(nic, idx).await.context("after release-all")?;
    assert!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    let renamed = home["ifname"].as_str().unwrap_or_default().to_owned();
    sh(&["ip", "link", "set", &renamed, "down"])?;
    sh(&["ip", "link", "set", &renamed, "name", &nic.name])?;
    Ok(())
}

/// A record rebuilt from a pin lives on: rebuilt at one start (every file bad), named by the
/// runtime's Synchronize, it loads again at the next start (a second restart on the same state
/// dir) as it was — not moved aside as corrupt, not rebuilt from the pin a second time — and the
/// device comes home at teardown under the name the record gives it. Its snapshot's host ifindex
/// is 0 (unknown): the load once refused that as a hostile field, so a rebuilt record with no
/// loadable `.prev` lost its naming (pod, plan host names) at every start.
async fn rebuilt_record_survives_a_second_restart() -> Result<()> {
    let nic = Nic::create()?;
    let mut node = Node::start(opts()).await?;
    let res = rebuilt_then_restarted(&mut node, &nic).await;
    res.with_context(|| format!("the daemon's log:\n{}", node.log()))
}

/// The pod's record as it is on disk: (file name, its `pod` object).
fn pod_record(node: &Node, uid: &str) -> Result<(String, Value)> {
    let mut found = Vec::new();
    for name in state_files(node, "pod_")? {
        if !name.ends_with(".json") {
            continue;
        }
        let v: Value =
            serde_json::from_slice(&std::fs::read(node.state_dir().join("checkpoint").join(&name))?)?;
        if v["pod"]["pod_uid"] == uid {
            found.push((name, v["pod"].clone()));
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        n => bail!("{n} records of pod {uid}: {found:?}"),
    }
}

async fn rebuilt_then_restarted(node: &mut Node, nic: &Nic) -> Result<()> {
    const REBUILT: &str = "record rebuilt from the pin:";
    let mut pod = start_pod(node, nic).await?;
    let idx = pod_ifindex(&pod.ns)?;
    node.kill()?;
    corrupt_all(node, Bad::Garbage)?;
    node.restart().await.context("first restart, no record loading")?;
    wait_log(node, REBUILT).await?;
    // Synchronize names the rebuilt record: re-keyed under the pod's UID.
    let start = Instant::now();
    let (file, named) = loop {
        match pod_record(node, &pod.uid) {
            Ok(r) => break r,
            Err(e) if start.elapsed() > Duration::from_secs(5) => {
                return Err(e.context("the rebuilt record was never named"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    assert!(named["recovered"].is_object(), "not a rebuilt record: {named}");
    assert_eq!(named["devices"][0]["snapshot"]["name"], format!("dn{idx}"));
    let aside = state_files(node, ".corrupt-")?;

    // The second restart: the record loads as it was written.
    node.kill()?;
    node.restart().await.context("second restart")?;
    let log = node.log();
    assert_eq!(
        log.matches(REBUILT).count(),
        1,
        "the record was rebuilt from the pin again at the second restart"
    );
    assert_eq!(
        log.matches("checkpoint records load from neither").count(),
        1,
        "a record did not load at the second restart"
    );
    let aside_now = state_files(node, ".corrupt-")?;
    assert_eq!(
        aside_now.len(),
        aside.len(),
        "moved aside at the second restart: {aside_now:?} (before: {aside:?})"
    );
    let (file_now, record_now) = pod_record(node, &pod.uid)?;
    assert_eq!(file_now, file, "the record changed its key");
    assert_eq!(record_now, named, "the record lost what it was");
    assert!(pod.ns.has("net0"), "the running pod lost its NIC");

    teardown(node, &mut pod, nic, Order::Containerd).await?;
    let home = rebuilt_home(nic, idx).await?;
    assert!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    let renamed = home["ifname"].as_str().unwrap_or_default().to_owned();
    sh(&["ip", "link", "set", &renamed, "down"])?;
    sh(&["ip", "link", "set", &renamed, "name", &nic.name])?;
    Ok(())
}

dranet_sim::root_tests! {
    a_rebuilt_record_survives_a_second_restart => rebuilt_record_survives_a_second_restart();
    truncated_checkpoint => corrupt_checkpoint(Bad::Truncated, Order::Containerd, Order::Crio);
    garbage_checkpoint => corrupt_checkpoint(Bad::Garbage, Order::Crio, Order::Containerd);
    empty_object_checkpoint => corrupt_checkpoint(Bad::EmptyObject, Order::Containerd, Order::Crio);
    version_99_checkpoint => corrupt_checkpoint(Bad::Version99, Order::Crio, Order::Containerd);
}

/// Runs `dranet <args>` with `env`, waiting at most `timeout` for it to exit (killed after).
fn run_bounded(args: &[&str], env: &[(&str, &str)], timeout: Duration) -> Result<(bool, String)> {
    let mut child = Command::new(dranet_bin()?)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let start = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            let out = child.wait_with_output()?;
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return Ok((out.status.success(), text));
        }
        if start.elapsed() > timeout {
            child.kill()?;
            let out = child.wait_with_output()?;
            bail!(
                "dranet {args:?} still running after {timeout:?} beside the daemon:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `release-all --no-daemon` (which takes the state dir's lock itself instead of asking the
/// daemon over its control socket) and a second daemon beside a running one: both refuse, naming
/// the daemon's pid, and touch nothing; the daemon keeps serving hooks; a `release-all
/// --no-daemon` that waits runs once the daemon stops and finds every record the daemon wrote
/// meanwhile. (`release-all` without the flag asks the daemon: `late_attach.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_all_and_a_second_daemon_beside_a_running_daemon() -> Result<()> {
    root_or_skip!("release_all_and_a_second_daemon_beside_a_running_daemon");
    let (nics, before) = Nic::many_with_views(2)?;
    let mut node = Node::start(opts()).await?;
    let pid = node.daemon_pid().context("daemon pid")?.to_string();
    let a = start_pod(&node, &nics[0]).await?;
    let state = node.state_dir();
    let state = state.to_string_lossy().into_owned();
    let records = node.records()?;

    let (ok, text) = run_bounded(
        &["release-all", "--no-daemon", "--state-dir", &state],
        &[("DRANET_LOCK_WAIT_SECONDS", "1")],
        Duration::from_secs(20),
    )?;
    assert!(!ok, "release-all ran beside the daemon:\n{text}");
    assert!(
        text.contains("in use by another dranet") && text.contains(&format!("pid {pid}")),
        "release-all must say which process holds the state dir:\n{text}"
    );
    assert!(a.ns.has("net0"), "release-all took the NIC from a running pod");

    let (ok, text) = run_bounded(
        &[
            "run",
            "--node-name",
            "second",
            "--state-dir",
            &state,
            "--no-nri",
            "--no-dra",
            "--no-probes",
            "--bind-address",
            "127.0.0.1:0",
        ],
        &[("DRANET_STATE_LOCK_WAIT_SECONDS", "1"), ("RUST_LOG", "warn")],
        Duration::from_secs(20),
    )?;
    assert!(!ok, "a second daemon ran on the same state dir:\n{text}");
    assert!(
        text.contains("in use by another dranet") && text.contains(&format!("pid {pid}")),
        "the second daemon must say which process holds the state dir:\n{text}"
    );
    assert!(a.ns.has("net0"));
    assert_eq!(
        node.records()?,
        records,
        "the refused processes changed the checkpoint"
    );

    // The daemon still serves hooks; a release-all that waits gets the state dir once it stops.
    let b = start_pod(&node, &nics[1]).await?;
    node.runtime
        .set_state(vec![a.sandbox.clone(), b.sandbox.clone()], vec![]);
    let waiting = Command::new(dranet_bin()?)
        .args(["release-all", "--no-daemon", "--json", "--state-dir", &state])
        .env("DRANET_LOCK_WAIT_SECONDS", "30")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        a.ns.has("net0") && b.ns.has("net0"),
        "release-all did not wait for the daemon"
    );
    node.stop()?;
    let out = tokio::task::spawn_blocking(move || waiting.wait_with_output()).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim())?;
    assert_eq!(
        report["returned"].as_array().map(Vec::len),
        Some(2),
        "release-all must see both pods' records: {report}"
    );
    for (n, b) in nics.iter().zip(&before) {
        wait_restored(&n.name, b, Duration::from_secs(5)).await?;
    }
    assert!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    Ok(())
}
