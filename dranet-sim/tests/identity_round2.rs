// Over 500 lines: one root scenario per issue 38 finding, sharing the record, slice and wait helpers above them.
//! Issue 38 (device identity and state, round two), each failure reproduced as a tenant holding
//! NET_ADMIN in its pod netns, or the host, would, on real netns and veth pairs standing in for
//! NICs, against the real `dranet run` binary:
//!
//! * #7 record files are trusted: a record whose `pin` names a path outside `<state-dir>/pins`
//!   (directly, through `..`, through a symlink in the pins dir) or another sandbox's pin made
//!   dranet unmount and unlink it at start;
//! * #3 link state a pod can change (flags, txqueuelen, group) came home as the pod left it;
//! * #4 altnames added in the pod came home, or made the move home fail (EEXIST);
//! * #2 a device home under a temporary name kept it for good;
//! * #5 a device deleted in the pod (a tenant's `ip link del`) kept its record and its pin (and
//!   so the pod netns) for good, reported nowhere;
//! * a move home that keeps failing (host links hold every name it may take) was retried and
//!   then waited for in silence;
//! * #6 a device without a parent device or permanent MAC (a veth here) was known in the pod by
//!   ifindex + kind (or its name) alone: a tenant's own veth in its place came home as the device.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use dranet_sim::fixtures::{nic_device, prepare_claim, until};
use dranet_sim::kernel::{PodNetns, host_has, identity, sh, unique};
use dranet_sim::nic::{Nic, wait_restored};
use dranet_sim::node::{Node, NodeOptions, free_port, http_get, sandbox_id, sandbox_with_id};
use dranet_sim::nri_runtime::{Flavor, RuntimeConfig};
use serde_json::{Value, json};

fn node_opts() -> NodeOptions {
    NodeOptions {
        runtime: RuntimeConfig {
            flavor: Flavor::Crio,
            ..RuntimeConfig::default()
        },
        ..NodeOptions::default()
    }
}

/// The record file of sandbox `sb` in the node's checkpoint.
fn record_file(node: &Node, sb: &str) -> Result<PathBuf> {
    let dir = node.state_dir().join("checkpoint");
    for e in std::fs::read_dir(&dir)? {
        let p = e?.path();
        let name = p.file_name().context("file name")?.to_string_lossy().into_owned();
        if name.starts_with("pod_") && name.ends_with(".json") && name.contains(sb) {
            return Ok(p);
        }
    }
    bail!("no record file of {sb} in {}", dir.display())
}

/// Rewrites the `pin` of sandbox `sb`'s record as a hostile hand (or a bad disk) would.
fn set_pin(node: &Node, sb: &str, pin: &Path) -> Result<()> {
    let path = record_file(node, sb)?;
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    v["pod"]["pin"] = json!(pin);
    std::fs::write(&path, serde_json::to_vec(&v)?)?;
    // No `.prev` to fall back on: the hostile record is all there is.
    let _ = std::fs::remove_file(path.with_file_name(format!(
        "{}.prev",
        path.file_name().context("file name")?.to_string_lossy()
    )));
    Ok(())
}

/// Whether `path` still is a bind mount of the netns `id`.
fn holds(path: &Path, id: dranet::sys::netns::NetnsId) -> bool {
    dranet::sys::netns::Netns::open_path(path).is_ok_and(|ns| ns.id() == id)
}

/// #7: hostile `pin` fields in a record of a returned sandbox: outside the pins dir, through
/// `..`, through a symlink in the pins dir, and the pin of another sandbox still running. None
/// is unmounted at start; the record is moved aside (or its pin dropped) and costs no other
/// record: the other sandbox's device comes home at its teardown.
async fn hostile_pins() -> Result<()> {
    let (nic, before) = Nic::with_view()?;
    let (nic_b, before_b) = Nic::with_view()?;
    let mut node = Node::start(node_opts()).await?;
    let uid = unique("hostile-");
    let claim = prepare_claim(&node, &uid, &[nic_device(&nic, json!({}))]).await?;
    let uid_b = unique("hostileb-");
    let claim_b = prepare_claim(&node, &uid_b, &[nic_device(&nic_b, json!({}))]).await?;
    let ns = PodNetns::create(&unique("dranet-r2h-"))?;
    let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
    node.runtime.run_pod_sandbox(&sb).await.context("Run(A)")?;
    let mut ns_b = PodNetns::create(&unique("dranet-r2b-"))?;
    let sb_b = sandbox_with_id(&uid_b, &sandbox_id(), &ns_b.path);
    node.runtime.run_pod_sandbox(&sb_b).await.context("Run(B)")?;
    node.runtime.set_state(vec![sb.clone(), sb_b.clone()], vec![]);
    node.runtime.stop_pod_sandbox(&sb).await.context("Stop(A)")?;
    wait_restored(&nic.name, &before, Duration::from_secs(5)).await?;
    let pins = node.state_dir().join("pins");
    let pin_b = node
        .pins()
        .into_iter()
        .find(|p| p.to_string_lossy().contains(&sb_b.id))
        .context("B's pin")?;
    let id_b = identity(&ns_b.open()?)?;
    let victim = PodNetns::create(&unique("dranet-r2v-"))?;
    let victim_id = identity(&victim.open()?)?;
    let link = pins.join(unique("evil"));
    std::os::unix::fs::symlink(&victim.path, &link)?;
    let dotdot = up_to_root(&pins).join(victim.path.strip_prefix("/")?);
    let cases: [(&str, PathBuf); 4] = [
        ("a path outside the pins dir", victim.path.clone()),
        ("a path through ..", dotdot),
        ("a symlink in the pins dir", link.clone()),
        ("another sandbox's pin", pin_b.clone()),
    ];
    for (what, hostile) in cases {
        node.kill()?;
        set_pin(&node, &sb.id, &hostile).with_context(|| what.to_owned())?;
        node.restart().await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if !holds(&victim.path, victim_id) {
            bail!("{what}: dranet unmounted {} at start", victim.path.display());
        }
        if !holds(&pin_b, id_b) {
            bail!("{what}: dranet unmounted the pin of sandbox B at start");
        }
        if what != "another sandbox's pin" {
            let aside = std::fs::read_dir(node.state_dir().join("checkpoint"))?
                .filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().contains(".corrupt-"));
            assert!(aside, "{what}: the hostile record was not moved aside");
        }
        // Put A's record back for the next case, as a fresh Run/Stop does.
        if record_file(&node, &sb.id).is_err() {
            node.runtime.run_pod_sandbox(&sb).await.context("Run(A) again")?;
            node.runtime
                .stop_pod_sandbox(&sb)
                .await
                .context("Stop(A) again")?;
            wait_restored(&nic.name, &before, Duration::from_secs(5)).await?;
        }
    }
    let _ = std::fs::remove_file(&link);
    // B was not harmed: its teardown brings its device home.
    ns_b.remove_crio_style()?;
    wait_restored(&nic_b.name, &before_b, Duration::from_secs(5)).await?;
    node.runtime.stop_pod_sandbox(&sb_b).await?;
    node.runtime.remove_pod_sandbox(&sb_b).await?;
    node.runtime.remove_pod_sandbox(&sb).await?;
    node.unprepare(&claim).await?;
    node.unprepare(&claim_b).await?;
    assert!(holds(&victim.path, victim_id));
    node.stop()?;
    drop(ns);
    Ok(())
}

/// `dir/../../..` up to `/`: a path that starts in `dir` and leaves it.
fn up_to_root(dir: &Path) -> PathBuf {
    let mut p = dir.to_owned();
    for _ in 0..dir.components().count() - 1 {
        p.push("..");
    }
    p
}

/// What `ip -j -d link` says of the link state a pod can change and [`view`] does not cover:
/// flags (less UP and the carrier ones), txqueuelen, group, altnames.
fn link_state(name: &str) -> Result<Value> {
    let v: Value = serde_json::from_str(&sh(&["ip", "-j", "-d", "link", "show", "dev", name])?)?;
    let l = v.get(0).context("no such link")?;
    let mut flags: Vec<String> = l["flags"]
        .as_array()
        .context("flags")?
        .iter()
        .filter_map(|f| f.as_str().map(str::to_owned))
        .filter(|f| !["UP", "LOWER_UP", "NO-CARRIER", "M-DOWN", "RUNNING"].contains(&f.as_str()))
        .collect();
    flags.sort();
    Ok(json!({
        "flags": flags,
        "txqlen": l["txqlen"],
        "group": l["group"],
        "promiscuity": l["promiscuity"],
        "allmulti": l["allmulti"],
        "altnames": l["altnames"],
    }))
}

/// Runs a pod with the NIC as `net0`, lets `tenant` act in the pod netns, then tears the pod
/// down CRI-O style and waits for the NIC to come home restored. Returns the NIC and its
/// [`link_state`] before and after.
async fn tenant_case<F>(tag: &str, tenant: F) -> Result<(Nic, Value, Value)>
where
    F: FnOnce(&PodNetns) -> Result<()>,
{
    let (nic, before) = Nic::with_view()?;
    let state = link_state(&nic.name)?;
    let mut node = Node::start(node_opts()).await?;
    let uid = unique(tag);
    let claim = prepare_claim(
        &node,
        &uid,
        &[nic_device(&nic, json!({"interface": {"name": "net0"}}))],
    )
    .await?;
    let mut ns = PodNetns::create(&unique("dranet-r2t-"))?;
    let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
    node.runtime.run_pod_sandbox(&sb).await.context("Run")?;
    node.runtime.set_state(vec![sb.clone()], vec![]);
    assert!(ns.has("net0"));
    tenant(&ns)?;
    ns.remove_crio_style()?;
    let home = wait_restored(&nic.name, &before, Duration::from_secs(8)).await;
    let log = node.log();
    let _ = node.runtime.stop_pod_sandbox(&sb).await;
    let _ = node.runtime.remove_pod_sandbox(&sb).await;
    let _ = node.unprepare(&claim).await;
    node.stop()?;
    home.with_context(|| format!("daemon log:\n{log}"))?;
    let after = link_state(&nic.name)?;
    Ok((nic, state, after))
}

/// #3: `ip link set net0 arp off multicast off promisc on allmulticast on dynamic on txqueuelen
/// 7 group 9` in the pod: the NIC comes home with the host's flags, txqueuelen and group.
async fn pod_link_state() -> Result<()> {
    let (_nic, before, after) = tenant_case("flags-", |ns| {
        ns.ip(&[
            "link",
            "set",
            "dev",
            "net0",
            "arp",
            "off",
            "multicast",
            "off",
            "promisc",
            "on",
            "allmulticast",
            "on",
            "dynamic",
            "on",
            "txqueuelen",
            "7",
            "group",
            "9",
        ])?;
        Ok(())
    })
    .await?;
    if before != after {
        bail!("link state not restored:\n before: {before}\n after:  {after}");
    }
    Ok(())
}

/// #4: altnames a tenant adds in the pod: a free one, and one that names an existing host link
/// (a veth made for the test). The NIC comes home (no EEXIST from the move), without either;
/// the host dummy is untouched.
async fn pod_altnames() -> Result<()> {
    // A host link of the host's own (this kernel has no dummy driver: a veth pair).
    let host_link = unique("drx");
    let _guard = dranet_sim::kernel::Veth::create(&host_link, &unique("dry"))?;
    let host_before = sh(&["ip", "-j", "-d", "link", "show", "dev", &host_link])?;
    let free = unique("drf");
    let (nic, before, after) = tenant_case("altn-", |ns| {
        ns.ip(&["link", "property", "add", "dev", "net0", "altname", &free])?;
        ns.ip(&["link", "property", "add", "dev", "net0", "altname", &host_link])?;
        Ok(())
    })
    .await?;
    if before != after {
        bail!("altnames not restored:\n before: {before}\n after:  {after}");
    }
    assert!(host_has(&host_link));
    assert_eq!(
        sh(&["ip", "-j", "-d", "link", "show", "dev", &host_link])?,
        host_before,
        "the host link was touched"
    );
    // The free altname squats nothing in the host.
    let squat = sh(&["ip", "-j", "link", "show", "dev", &free]);
    assert!(squat.is_err(), "{free} names a host link: {squat:?}");
    drop(nic);
    Ok(())
}

/// #2: a host link takes the device's name while the pod holds it; the device comes home under
/// a temporary name. Once the squatter is deleted the device gets its own name back (the
/// squatter itself never touched), and a later sandbox of the pod gets the device again.
async fn names_come_back() -> Result<()> {
    let (nic, before) = Nic::with_view()?;
    let mut node = Node::start(node_opts()).await?;
    let uid = unique("name-");
    let claim = prepare_claim(
        &node,
        &uid,
        &[nic_device(&nic, json!({"interface": {"name": "net0"}}))],
    )
    .await?;
    let mut ns = PodNetns::create(&unique("dranet-r2n-"))?;
    let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
    node.runtime.run_pod_sandbox(&sb).await.context("Run(A)")?;
    node.runtime.set_state(vec![sb.clone()], vec![]);
    assert!(ns.has("net0"));
    // The host (a CNI, udev, an operator) takes the free name.
    let squatter = dranet_sim::kernel::Veth::create(&nic.name, &unique("drs"))?;
    ns.remove_crio_style()?;
    let temp = {
        let start = std::time::Instant::now();
        loop {
            let cp = node.checkpoint()?;
            let t = cp["pods"]
                .as_object()
                .and_then(|m| m.values().next())
                .and_then(|r| r["devices"][0]["temp_name"].as_str().map(str::to_owned));
            if let Some(t) = t {
                break t;
            }
            if start.elapsed() > Duration::from_secs(5) {
                bail!("the device did not come home under a temporary name: {cp}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    assert!(host_has(&temp), "{temp} not in the host");
    // The squatter goes: the name is free.
    drop(squatter);
    let home = wait_restored(&nic.name, &before, Duration::from_secs(5)).await;
    home.with_context(|| format!("the device kept {temp}; daemon log:\n{}", node.log()))?;
    assert!(!host_has(&temp));
    // A later sandbox of the pod gets the device.
    let ns_b = PodNetns::create(&unique("dranet-r2n-"))?;
    let sb_b = sandbox_with_id(&uid, &sandbox_id(), &ns_b.path);
    node.runtime.stop_pod_sandbox(&sb).await.context("Stop(A)")?;
    node.runtime.remove_pod_sandbox(&sb).await.context("Remove(A)")?;
    node.runtime.run_pod_sandbox(&sb_b).await.context("Run(B)")?;
    node.runtime.set_state(vec![sb_b.clone()], vec![]);
    assert!(ns_b.has("net0"), "a later sandbox did not get the device");
    node.runtime.stop_pod_sandbox(&sb_b).await.context("Stop(B)")?;
    wait_restored(&nic.name, &before, Duration::from_secs(5)).await?;
    node.runtime.remove_pod_sandbox(&sb_b).await?;
    node.unprepare(&claim).await?;
    node.stop()?;
    Ok(())
}

/// #1: while pod A holds the device a host link takes its free name; the device comes home
/// under a temporary name. kubelet re-creates the sandbox (B, same pod UID, no new Prepare):
/// B gets the device (found by kernel identity under its temporary name), never the squatter,
/// which stays in the host untouched. When B ends and the squatter goes, the device gets its
/// name back.
async fn attach_by_identity() -> Result<()> {
    let (nic, before) = Nic::with_view()?;
    let mut node = Node::start(node_opts()).await?;
    let uid = unique("ident-");
    let claim = prepare_claim(
        &node,
        &uid,
        &[nic_device(&nic, json!({"interface": {"name": "net0"}}))],
    )
    .await?;
    let mut ns_a = PodNetns::create(&unique("dranet-r2i-"))?;
    let a = sandbox_with_id(&uid, &sandbox_id(), &ns_a.path);
    node.runtime.run_pod_sandbox(&a).await.context("Run(A)")?;
    node.runtime.set_state(vec![a.clone()], vec![]);
    assert!(ns_a.has("net0"));
    let squatter = dranet_sim::kernel::Veth::create(&nic.name, &unique("drs"))?;
    let squatter_index = dranet_sim::kernel::Veth::ifindex(&nic.name)?;
    let squatter_view = dranet_sim::nic::view(&nic.name, None)?;
    ns_a.remove_crio_style()?;
    node.runtime.stop_pod_sandbox(&a).await.context("Stop(A)")?;
    let ns_b = PodNetns::create(&unique("dranet-r2i-"))?;
    let b = sandbox_with_id(&uid, &sandbox_id(), &ns_b.path);
    let run_b = node.runtime.run_pod_sandbox(&b).await;
    node.runtime.set_state(vec![b.clone()], vec![]);
    assert_eq!(
        dranet_sim::kernel::Veth::ifindex(&nic.name).ok(),
        Some(squatter_index),
        "the squatter left the host (Run(B): {run_b:?})"
    );
    assert_eq!(
        dranet_sim::nic::view(&nic.name, None)?,
        squatter_view,
        "the squatter was touched"
    );
    run_b.context("Run(B)")?;
    assert!(ns_b.has("net0"), "B did not get the device");
    node.runtime.stop_pod_sandbox(&b).await.context("Stop(B)")?;
    drop(squatter);
    wait_restored(&nic.name, &before, Duration::from_secs(5))
        .await
        .with_context(|| format!("daemon log:\n{}", node.log()))?;
    node.runtime.remove_pod_sandbox(&a).await?;
    node.runtime.remove_pod_sandbox(&b).await?;
    node.unprepare(&claim).await?;
    node.stop()?;
    Ok(())
}

/// The attributes of device `name` in the daemon's published ResourceSlices (`--slices-dir`),
/// and the `dra.net/ifName` of every published device.
fn published(node: &Node, name: &str) -> (Option<Value>, Vec<String>) {
    let mut found = None;
    let mut ifnames = Vec::new();
    let files = std::fs::read_dir(node.dir.join("slices"))
        .into_iter()
        .flatten()
        .flatten();
    for f in files {
        let Some(s) = std::fs::read(f.path())
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        else {
            continue;
        };
        for d in s["spec"]["devices"].as_array().into_iter().flatten() {
            if let Some(i) = d["attributes"]["dra.net/ifName"]["string"].as_str() {
                ifnames.push(i.to_owned());
            }
            if d["name"] == name {
                found = Some(d["attributes"].clone());
            }
        }
    }
    (found, ifnames)
}

/// For `within`: the slices publish device `name` as the NIC (its host name `ifname`, its MAC
/// `mac`), never with another link's MAC, and no device under `temp` (the NIC home under a
/// temporary name is that device, not another one).
async fn published_as_the_nic(
    node: &Node,
    name: &str,
    ifname: &str,
    mac: &str,
    temp: Option<&str>,
    within: Duration,
) -> Result<()> {
    let start = std::time::Instant::now();
    while start.elapsed() < within {
        let (attrs, ifnames) = published(node, name);
        let attrs = attrs.with_context(|| format!("{name} not published"))?;
        let got = |k: &str| attrs[k]["string"].as_str().map(str::to_ascii_lowercase);
        if got("dra.net/mac").as_deref() != Some(mac) || got("dra.net/ifName").as_deref() != Some(ifname) {
            bail!("{name} is published as another link: {attrs}");
        }
        if let Some(t) = temp.filter(|t| ifnames.iter().any(|i| i == t)) {
            bail!("the NIC home as {t} is published as a device of its own: {ifnames:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The `temp_name` of a device of any record, waiting up to `within` for one.
async fn temp_name(node: &Node, within: Duration) -> Result<String> {
    let start = std::time::Instant::now();
    loop {
        let cp = node.checkpoint()?;
        let t = cp["pods"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
            .find_map(|r| {
                r["devices"]
                    .as_array()?
                    .iter()
                    .find_map(|d| d["temp_name"].as_str().map(str::to_owned))
            });
        if let Some(t) = t {
            return Ok(t);
        }
        if start.elapsed() > within {
            bail!("the device did not come home under a temporary name: {cp}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Squatter bug 1 (soak seed 20261204, steps 42-49): pod A holds the NIC, a host link (the
/// squatter) takes its free host name, A ends and the NIC comes home as `dn<ifindex>`, A's claim
/// is unprepared. The slices publish the device as the NIC all along, never with the squatter's
/// MAC, and the NIC under its temporary name is no device of its own. (a) While the squatter
/// holds the name, a new pod B's claim on the device is prepared: either B gets the NIC, or
/// Prepare fails saying that another link holds the device's name; the squatter is never moved
/// or touched. (b) The squatter goes, the NIC gets its name back, and at once a new pod C's
/// claim on it is prepared and run: C gets the NIC (its MAC), which comes home restored.
async fn prepare_by_identity() -> Result<()> {
    use dranet_sim::kernel::Veth;
    let (nic, before) = Nic::with_view()?;
    let mut node = Node::start(node_opts()).await?;
    let dev = nic_device(&nic, json!({"interface": {"name": "net0"}}));
    let dev_name = dev.0.clone();
    let mac = nic.mac.to_ascii_lowercase();
    node.wait_published(&nic.name, &nic.mac, Duration::from_secs(5))
        .await?;
    let uid_a = unique("sqa-");
    let claim_a = prepare_claim(&node, &uid_a, std::slice::from_ref(&dev)).await?;
    let mut ns_a = PodNetns::create(&unique("dranet-r2q-"))?;
    let a = sandbox_with_id(&uid_a, &sandbox_id(), &ns_a.path);
    node.runtime.run_pod_sandbox(&a).await.context("Run(A)")?;
    node.runtime.set_state(vec![a.clone()], vec![]);
    assert!(ns_a.has("net0"));
    let squatter = Veth::create(&nic.name, &unique("drs"))?;
    let squatter_index = Veth::ifindex(&nic.name)?;
    let squatter_view = dranet_sim::nic::view(&nic.name, None)?;
    // While the NIC is in pod A: published as it was, not as the squatter.
    published_as_the_nic(&node, &dev_name, &nic.name, &mac, None, Duration::from_secs(2))
        .await
        .context("NIC in pod A, squatter in the host")?;
    ns_a.remove_crio_style()?;
    let temp = temp_name(&node, Duration::from_secs(5)).await?;
    node.runtime.stop_pod_sandbox(&a).await.context("Stop(A)")?;
    node.runtime.remove_pod_sandbox(&a).await.context("Remove(A)")?;
    node.runtime.set_state(vec![], vec![]);
    node.unprepare(&claim_a).await?;
    assert!(host_has(&temp), "{temp} not in the host");
    published_as_the_nic(
        &node,
        &dev_name,
        &nic.name,
        &mac,
        Some(&temp),
        Duration::from_secs(2),
    )
    .await
    .with_context(|| format!("NIC home as {temp}, squatter in the host"))?;
    // (a) A new pod's claim while the squatter holds the name.
    let uid_b = unique("sqb-");
    let claim_b = dranet_sim::fixtures::pod_claim(&uid_b);
    node.write_claim(&claim_b, &uid_b, std::slice::from_ref(&dev))?;
    let prep_b = node.prepare(&claim_b).await;
    let mut ns_b = PodNetns::create(&unique("dranet-r2q-"))?;
    let b = sandbox_with_id(&uid_b, &sandbox_id(), &ns_b.path);
    let run_b = match &prep_b {
        Ok(()) => {
            let r = node.runtime.run_pod_sandbox(&b).await;
            node.runtime.set_state(vec![b.clone()], vec![]);
            Some(r)
        }
        Err(e) => {
            let e = format!("{e:#}");
            assert!(
                e.contains(&dev_name) && e.contains("held by another link"),
                "Prepare(B) failed without saying why: {e}"
            );
            None
        }
    };
    assert_eq!(
        Veth::ifindex(&nic.name).ok(),
        Some(squatter_index),
        "the squatter left the host (Prepare(B): {prep_b:?}, Run(B): {run_b:?})"
    );
    assert_eq!(
        dranet_sim::nic::view(&nic.name, None)?,
        squatter_view,
        "the squatter was touched"
    );
    if let Some(run_b) = run_b {
        run_b.with_context(|| {
            format!(
                "Run(B), prepared while the squatter held the name; daemon log:\n{}",
                node.log()
            )
        })?;
        let got: Value = serde_json::from_str(&ns_b.ip(&["-j", "link", "show", "dev", "net0"])?)?;
        assert_eq!(
            got[0]["address"].as_str(),
            Some(mac.as_str()),
            "B got another link"
        );
        ns_b.remove_crio_style()?;
        node.runtime.stop_pod_sandbox(&b).await.context("Stop(B)")?;
        node.runtime.remove_pod_sandbox(&b).await.context("Remove(B)")?;
        node.runtime.set_state(vec![], vec![]);
    }
    let _ = node.unprepare(&claim_b).await;
    // (b) The squatter goes; the NIC gets its name back; a new pod's claim at once.
    drop(squatter);
    wait_restored(&nic.name, &before, Duration::from_secs(5))
        .await
        .with_context(|| format!("the device kept {temp}; daemon log:\n{}", node.log()))?;
    let uid_c = unique("sqc-");
    let claim_c = prepare_claim(&node, &uid_c, std::slice::from_ref(&dev))
        .await
        .context("Prepare(C), the NIC home under its name")?;
    let mut ns_c = PodNetns::create(&unique("dranet-r2q-"))?;
    let c = sandbox_with_id(&uid_c, &sandbox_id(), &ns_c.path);
    node.runtime
        .run_pod_sandbox(&c)
        .await
        .with_context(|| format!("Run(C); daemon log:\n{}", node.log()))?;
    node.runtime.set_state(vec![c.clone()], vec![]);
    let got: Value = serde_json::from_str(&ns_c.ip(&["-j", "link", "show", "dev", "net0"])?)?;
    assert_eq!(
        got[0]["address"].as_str(),
        Some(mac.as_str()),
        "C got another link"
    );
    ns_c.remove_crio_style()?;
    wait_restored(&nic.name, &before, Duration::from_secs(5))
        .await
        .with_context(|| format!("daemon log:\n{}", node.log()))?;
    node.runtime.stop_pod_sandbox(&c).await.context("Stop(C)")?;
    node.runtime.remove_pod_sandbox(&c).await.context("Remove(C)")?;
    node.unprepare(&claim_c).await?;
    published_as_the_nic(
        &node,
        &dev_name,
        &nic.name,
        &mac,
        None,
        Duration::from_millis(500),
    )
    .await?;
    node.stop()?;
    drop(ns_b);
    Ok(())
}

/// [`node_opts`] with `/metrics` on a port of its own.
fn node_opts_with_metrics() -> Result<(NodeOptions, u16)> {
    let port = free_port()?;
    Ok((
        NodeOptions {
            bind_address: format!("127.0.0.1:{port}"),
            ..node_opts()
        },
        port,
    ))
}

/// The value of sample `name` (with its labels, as printed) in the daemon's `/metrics`.
async fn metric(port: u16, name: &str) -> Result<f64> {
    let (_, body) = http_get(&format!("127.0.0.1:{port}"), "/metrics").await?;
    Ok(body
        .lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .filter(|v| v.starts_with(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0.0))
}

/// The `Ready` condition of `device` in a claim status apply body: `(status, reason)`.
fn ready_of(st: &Value, device: &str) -> Option<(String, String)> {
    st["status"]["devices"]
        .as_array()?
        .iter()
        .find(|d| d["device"] == device)?["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

/// #5: a tenant deletes one of its pod's two devices (`ip link del net0`: the veth "NIC", and
/// with it its host peer). At the CRI-O-order teardown the other device comes home restored;
/// the deleted one is found nowhere (not at its index in the pin, not in the host by identity,
/// no move recorded) and is reported once: a Warning `NetworkDeviceVanished` event on the pod,
/// the claim's status (`Ready` False, `NetworkDeviceVanished`), `dranet_devices_vanished_total`.
/// Its record ends and the pin is released: the pod netns is not kept alive.
async fn vanished_device() -> Result<()> {
    let (gone, _) = Nic::with_view()?;
    let (kept, kept_before) = Nic::with_view()?;
    let (opts, port) = node_opts_with_metrics()?;
    let mut node = Node::start(opts).await?;
    let uid = unique("gone-");
    let gone_dev = nic_device(&gone, json!({"interface": {"name": "net0"}}));
    let gone_name = gone_dev.0.clone();
    let claim = prepare_claim(
        &node,
        &uid,
        &[
            gone_dev,
            nic_device(&kept, json!({"interface": {"name": "net1"}})),
        ],
    )
    .await?;
    let mut ns = PodNetns::create(&unique("dranet-r2g-"))?;
    let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
    node.runtime.run_pod_sandbox(&sb).await.context("Run")?;
    node.runtime.set_state(vec![sb.clone()], vec![]);
    assert!(ns.has("net0") && ns.has("net1"));
    let pin = node
        .pins()
        .into_iter()
        .find(|p| p.to_string_lossy().contains(&sb.id))
        .context("no pin")?;
    let ns_id = identity(&ns.open()?)?;
    // The tenant deletes its device (a veth: its host peer goes with it).
    ns.ip(&["link", "del", "dev", "net0"])?;
    assert!(!host_has(&gone.veth.b));
    ns.remove_crio_style()?;
    wait_restored(&kept.name, &kept_before, Duration::from_secs(5)).await?;
    let ended = until(Duration::from_secs(8), || {
        node.records().is_ok_and(|r| r.iter().all(|(_, k)| *k != sb.id)) && !node.pins().contains(&pin)
    })
    .await;
    let log = node.log();
    if !ended {
        bail!(
            "the record or the pin of the sandbox stayed (pin holds its netns: {}): {}\ndaemon log:\n{log}",
            holds(&pin, ns_id),
            node.checkpoint()?
        );
    }
    assert!(!holds(&pin, ns_id), "the pin still holds the pod netns");
    let ev = node.events();
    let vanished: Vec<&str> = ev
        .lines()
        .filter(|l| l.contains("NetworkDeviceVanished"))
        .collect();
    assert_eq!(vanished.len(), 1, "one NetworkDeviceVanished event: {ev}");
    assert!(
        vanished[0].contains(&gone_name) && vanished[0].contains(&uid),
        "{}",
        vanished[0]
    );
    assert_eq!(metric(port, "dranet_devices_vanished_total").await?, 1.0);
    let st = node.claim_status(&claim, Duration::from_secs(3)).await?;
    let ok = until(Duration::from_secs(3), || {
        std::fs::read(node.claim_status_path(&claim))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|st| ready_of(&st, &gone_name))
            == Some(("False".into(), "NetworkDeviceVanished".into()))
    })
    .await;
    assert!(ok, "claim status: {st}");
    let _ = node.runtime.stop_pod_sandbox(&sb).await;
    let _ = node.runtime.remove_pod_sandbox(&sb).await;
    node.unprepare(&claim).await?;
    node.stop()?;
    drop(kept);
    Ok(())
}

/// A move home that keeps failing is reported, not waited for in silence: while the pod holds
/// the device, host links take its host name, its temporary name (`dn<ifindex>`) and its pod-side
/// name, so the kernel refuses every move home (EEXIST). After the rescue's retries: a Warning
/// `NetworkDeviceReturnFailed` event on the pod, the claim's status (`Ready` False,
/// `NetworkDeviceReturnFailed`), `dranet_return_stuck_total{reason="name_taken"}`, and `dranet
/// status` names the device and why. Once the names are free, StopPodSandbox brings it home.
async fn stuck_return() -> Result<()> {
    let (nic, before) = Nic::with_view()?;
    let (opts, port) = node_opts_with_metrics()?;
    let mut node = Node::start(opts).await?;
    let uid = unique("stuck-");
    let pod_if = unique("drp");
    let dev = nic_device(&nic, json!({"interface": {"name": pod_if}}));
    let dev_name = dev.0.clone();
    let claim = prepare_claim(&node, &uid, &[dev]).await?;
    let index = dranet_sim::kernel::Veth::ifindex(&nic.name)?;
    let mut ns = PodNetns::create(&unique("dranet-r2s-"))?;
    let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
    node.runtime.run_pod_sandbox(&sb).await.context("Run")?;
    node.runtime.set_state(vec![sb.clone()], vec![]);
    assert!(ns.has(&pod_if));
    // The host takes every name the move home may use.
    let squatters = [
        dranet_sim::kernel::Veth::create(&nic.name, &unique("drs"))?,
        dranet_sim::kernel::Veth::create(&format!("dn{index}"), &unique("drs"))?,
        dranet_sim::kernel::Veth::create(&pod_if, &unique("drs"))?,
    ];
    ns.remove_crio_style()?;
    let reported = until(Duration::from_secs(30), || {
        node.events().contains("NetworkDeviceReturnFailed")
    })
    .await;
    let log = node.log();
    assert!(reported, "no NetworkDeviceReturnFailed event; daemon log:\n{log}");
    let ev = node.events();
    let failed: Vec<&str> = ev
        .lines()
        .filter(|l| l.contains("NetworkDeviceReturnFailed"))
        .collect();
    assert_eq!(failed.len(), 1, "reported once: {ev}");
    assert!(failed[0].contains(&dev_name), "{}", failed[0]);
    assert_eq!(
        metric(port, "dranet_return_stuck_total{reason=\"name_taken\"}").await?,
        1.0
    );
    let st_ok = until(Duration::from_secs(3), || {
        std::fs::read(node.claim_status_path(&claim))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|st| ready_of(&st, &dev_name))
            == Some(("False".into(), "NetworkDeviceReturnFailed".into()))
    })
    .await;
    assert!(st_ok, "claim status not updated");
    let status = node.cli(&["status"])?;
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(
        status.contains("not home:") && status.contains(&nic.name),
        "dranet status: {status}"
    );
    // The names are free again: the next hook brings the device home.
    drop(squatters);
    node.runtime.stop_pod_sandbox(&sb).await.context("Stop")?;
    wait_restored(&nic.name, &before, Duration::from_secs(5))
        .await
        .with_context(|| format!("daemon log:\n{}", node.log()))?;
    node.runtime.remove_pod_sandbox(&sb).await?;
    node.unprepare(&claim).await?;
    node.stop()?;
    Ok(())
}

/// #6: the tenant moves its device (a veth "NIC": no parent device, no permanent MAC) into a
/// netns of its own and makes a veth of its own in its place: same name, same MAC, same ifindex.
/// At the CRI-O-order teardown that link stays in the pod (its peer is in the pod, not the
/// device's peer in the host: `IFLA_LINK` + `IFLA_LINK_NETNSID`); nothing takes the device's
/// host name.
async fn virtual_impostor() -> Result<()> {
    let (nic, _) = Nic::with_view()?;
    let mut node = Node::start(NodeOptions {
        capture_log: true,
        ..node_opts()
    })
    .await?;
    let uid = unique("imp-");
    let claim = prepare_claim(
        &node,
        &uid,
        &[nic_device(&nic, json!({"interface": {"name": "net0"}}))],
    )
    .await?;
    let mut ns = PodNetns::create(&unique("dranet-r2m-"))?;
    let nested = PodNetns::create(&unique("dranet-r2x-"))?;
    let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
    node.runtime.run_pod_sandbox(&sb).await.context("Run")?;
    node.runtime.set_state(vec![sb.clone()], vec![]);
    let shown: Value = serde_json::from_str(&ns.ip(&["-j", "link", "show", "dev", "net0"])?)?;
    let index = shown[0]["ifindex"].as_u64().context("ifindex")?.to_string();
    // The tenant: the device into a netns of its own, a veth of its own in its place.
    ns.ip(&["link", "set", "dev", "net0", "netns", &nested.name])?;
    let peer = unique("dri");
    ns.ip(&[
        "link", "add", "net0", "index", &index, "address", &nic.mac, "type", "veth", "peer", "name", &peer,
    ])?;
    let pod_fd = ns.open()?;
    ns.remove_crio_style()?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = node.log();
    assert!(
        !host_has(&nic.name),
        "the tenant's veth came home as {}: {}\ndaemon log:\n{log}",
        nic.name,
        sh(&["ip", "-d", "link", "show", "dev", &nic.name]).unwrap_or_default()
    );
    assert!(!host_has(&peer), "the tenant's peer left the pod");
    assert_eq!(
        ns_link_count(&pod_fd)?,
        2,
        "the tenant's veth pair is not in the pod any more"
    );
    // The device itself is in the tenant's netns: where no probe reports device moves (tier B),
    // it is nowhere dranet can see, and reported gone; elsewhere it is waited for.
    drop(nested);
    let _ = node.runtime.stop_pod_sandbox(&sb).await;
    let _ = node.runtime.remove_pod_sandbox(&sb).await;
    node.unprepare(&claim).await?;
    node.stop()?;
    drop(pod_fd);
    Ok(())
}

/// Links other than `lo` in the netns of `f` (an fd of it, read through `/proc`).
fn ns_link_count(f: &std::fs::File) -> Result<usize> {
    use std::os::fd::AsRawFd;
    let path = format!("/proc/{}/fd/{}", std::process::id(), f.as_raw_fd());
    let out = sh(&["nsenter", &format!("--net={path}"), "ip", "-j", "link", "show"])?;
    let v: Value = serde_json::from_str(&out)?;
    Ok(v.as_array()
        .map_or(0, |a| a.iter().filter(|l| l["ifname"] != "lo").count()))
}

dranet_sim::root_tests! {
    records_naming_pins_outside_the_pins_dir_or_of_other_sandboxes_are_never_unmounted => hostile_pins();
    flags_txqueuelen_and_group_set_in_the_pod_are_restored_at_home => pod_link_state();
    altnames_added_in_the_pod_neither_block_the_move_home_nor_come_home => pod_altnames();
    a_device_home_under_a_temporary_name_gets_its_name_back_once_free => names_come_back();
    a_recreated_sandbox_gets_the_device_by_identity_never_the_host_link_that_took_its_name => attach_by_identity();
    a_device_deleted_in_the_pod_is_reported_once_and_its_record_and_pin_end => vanished_device();
    a_move_home_that_keeps_failing_is_reported_not_waited_for_silently => stuck_return();
    a_tenants_own_veth_in_the_devices_place_never_comes_home_as_the_device => virtual_impostor();
    a_claim_on_a_device_whose_name_a_host_link_took_is_prepared_by_identity_never_as_that_link => prepare_by_identity();
}
