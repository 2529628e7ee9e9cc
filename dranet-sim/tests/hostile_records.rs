//! Issue 38 #7, every field: record files under the state dir can be corrupt or hostile. Pin
//! paths are checked since 0c982ae; here every other field of a sandbox record gets a value no
//! kernel and no dranet ever wrote (a device name with `/`, a link name over 15 bytes, 100,000
//! altnames, an MTU of 2^32-1, an ifindex beyond the kernel's `int` (a snapshot's host ifindex
//! of 0 is dranet's own "unknown", which a rebuilt record writes), a sysctl key that climbs out of `/proc/sys`, a PCI
//! address that is a path, ...), one field per record, written while dranet is down. At the
//! restart each such record file must be moved aside as corrupt (`<file>.corrupt-<time>`), its
//! record must not be loaded, and nothing may be done on its basis: a host link one of them
//! names (as a device home under a temporary name, waiting for its own name back) is left as it
//! was. The record of a running pod written by dranet itself loads as ever: its device stays in
//! the pod and comes home at Stop.
//!
//! Run against the real `dranet run` binary on real netns and veth pairs.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use dranet_sim::fixtures::{nic_device, prepare_claim};
use dranet_sim::kernel::{PodNetns, Veth, host_has, sh, unique};
use dranet_sim::nic::{Nic, view};
use dranet_sim::node::{Node, NodeOptions, sandbox_with_id};
use serde_json::{Value, json};

/// A runtime-style sandbox id (64 hex digits), unique on this machine.
fn sandbox_id() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{:032x}{n:032x}", std::process::id() ^ 0x3c)
}

/// The record file of sandbox `sb` in the node's checkpoint dir.
fn record_file(node: &Node, sb: &str) -> Result<PathBuf> {
    let dir = node.state_dir().join("checkpoint");
    for e in std::fs::read_dir(&dir)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("pod_") && name.ends_with(&format!("_{sb}.json")) {
            return Ok(e.path());
        }
    }
    bail!("no record file of {sb} in {}", dir.display())
}

/// The MAC of host link `name`.
fn mac_of(name: &str) -> Result<String> {
    let v: Value = serde_json::from_str(&sh(&["ip", "-j", "link", "show", "dev", name])?)?;
    v[0]["address"].as_str().map(str::to_owned).context("no address")
}

/// The hostile cases: a name and what it does to a copy of a good record's `pod` object.
/// An edit of a record's `pod` object.
type Edit = Box<dyn Fn(&mut Value)>;
/// An edit of a plan's device.
type DeviceEdit = fn(&mut Value);

fn cases(victim: &str, victim_index: u32, victim_mac: &str) -> Vec<(&'static str, Edit)> {
    let (victim, victim_mac) = (victim.to_owned(), victim_mac.to_owned());
    let d = |f: fn(&mut Value)| -> Edit { Box::new(move |p: &mut Value| f(&mut p["devices"][0])) };
    vec![
        ("device name with '/'", d(|d| d["device"] = json!("a/../../b"))),
        (
            "pod interface name of 16 bytes",
            d(|d| d["pod_ifname"] = json!("abcdefghijklmnop")),
        ),
        (
            "snapshot name with '/'",
            d(|d| d["snapshot"]["name"] = json!("x/y")),
        ),
        (
            "100,000 altnames",
            d(|d| {
                d["snapshot"]["altnames"] =
                    json!((0..100_000).map(|i| format!("alt{i}")).collect::<Vec<_>>());
            }),
        ),
        ("MTU 2^32-1", d(|d| d["snapshot"]["mtu"] = json!(u32::MAX))),
        (
            "snapshot ifindex 2^31",
            d(|d| d["snapshot"]["ifindex"] = json!(1_u64 << 31)),
        ),
        (
            "place at ifindex 0",
            d(|d| d["at"] = json!({"ifindex": 0, "netns": {"cookie": 1, "inode": 2}})),
        ),
        ("temporary name with '/'", d(|d| d["temp_name"] = json!("../x"))),
        (
            "permanent MAC not a MAC",
            d(|d| d["permanent_mac"] = json!("zz:zz:zz")),
        ),
        (
            "PCI address that is a path",
            d(|d| d["pci_address"] = json!("../../../../etc")),
        ),
        (
            "sysctl key out of /proc/sys",
            d(|d| d["snapshot"]["sysctls"] = json!({"ipv4/../../../../tmp/dranet-hostile": 1})),
        ),
        (
            "address not a CIDR",
            d(|d| d["snapshot"]["addresses"] = json!(["not-an-address"])),
        ),
        (
            "link kind with '/'",
            d(|d| d["snapshot"]["kind"] = json!("../veth")),
        ),
        (
            "lower link at ifindex 0",
            d(|d| d["snapshot"]["lower"] = json!(0)),
        ),
        (
            "RDMA device with '/'",
            d(|d| d["rdma_device"] = json!("mlx5_0/../x")),
        ),
        (
            "pod namespace with '/'",
            Box::new(|p: &mut Value| p["namespace"] = json!("a/b")),
        ),
        (
            "relative netns path",
            Box::new(|p: &mut Value| p["netns_path"] = json!("run/netns/x")),
        ),
        (
            "a device home under a temporary name that is a host link's, with an MTU of 2^32-1",
            Box::new(move |p: &mut Value| {
                let d = &mut p["devices"][0];
                d["state"] = json!("home_name_busy");
                d["temp_name"] = json!(victim);
                d["at"] = Value::Null;
                d["snapshot"]["ifindex"] = json!(victim_index);
                d["snapshot"]["mac"] = json!(victim_mac);
                d["snapshot"]["name"] = json!(unique("dhv"));
                d["snapshot"]["mtu"] = json!(u32::MAX);
            }),
        ),
    ]
}

async fn hostile_fields_are_refused() -> Result<()> {
    let nic = Nic::create()?;
    let victim = Veth::create(&unique("dhv"), &unique("dhw"))?;
    let victim_index = Veth::ifindex(&victim.a)?;
    let victim_view = view(&victim.a, None)?;
    let victim_mac = mac_of(&victim.a)?;
    let mut node = Node::start(NodeOptions {
        capture_log: true,
        ..NodeOptions::default()
    })
    .await?;
    let uid = unique("hr-");
    let dev = nic_device(&nic, json!({"interface": {"name": "net0"}}));
    let claim = prepare_claim(&node, &uid, &[dev]).await?;
    let ns = PodNetns::create(&unique("dranet-hr-"))?;
    let sb = sandbox_with_id(&uid, &sandbox_id(), &ns.path);
    node.runtime.run_pod_sandbox(&sb).await.context("Run")?;
    node.runtime.set_state(vec![sb.clone()], vec![]);
    assert!(ns.has("net0"), "the pod did not get the device");
    node.kill()?;

    // While dranet is down: one hostile record per case, each a copy of the pod's own record
    // under a sandbox of its own (no pin, returned: nothing of the real pod's).
    let good_path = record_file(&node, &sb.id)?;
    let good: Value = serde_json::from_slice(&std::fs::read(&good_path)?)?;
    let mut written = Vec::new();
    for (i, (what, edit)) in cases(&victim.a, victim_index, &victim_mac)
        .into_iter()
        .enumerate()
    {
        let (huid, hsb) = (unique("hostile-"), sandbox_id());
        let mut v = good.clone();
        let p = &mut v["pod"];
        p["pod_uid"] = json!(huid);
        p["sandbox_id"] = json!(hsb);
        p["pin"] = Value::Null;
        p["phase"] = json!({"returned": "hook"});
        p["netns_path"] = json!(format!("/var/run/netns/dranet-hostile-gone-{i}"));
        p["devices"][0]["state"] = json!("home");
        p["devices"][0]["at"] = Value::Null;
        edit(p);
        let file = good_path.with_file_name(format!("pod_{huid}_{hsb}.json"));
        std::fs::write(&file, serde_json::to_vec(&v)?)?;
        written.push((what, file, format!("{huid}/{hsb}")));
    }
    // Plans are records too: a character device that is not an RDMA node (a disk given to the
    // pod's containers), a host link name that is a path.
    let plan_path = good_path.with_file_name(format!("plan_{uid}.json"));
    let plan: Value = serde_json::from_slice(&std::fs::read(&plan_path).context("the pod's plan file")?)?;
    let plan_cases: [(&str, DeviceEdit); 2] = [
        ("plan: character device /dev/sda", |d| {
            d["char_devices"] = json!([{"path": "/dev/sda", "kind": "c", "major": 8, "minor": 0}]);
        }),
        ("plan: host interface name with '/'", |d| {
            d["host_ifname"] = json!("../eth0")
        }),
    ];
    for (what, edit) in plan_cases {
        let huid = unique("hostile-plan-");
        let mut v = plan.clone();
        v["plan"]["pod_uid"] = json!(huid);
        edit(&mut v["plan"]["devices"][0]);
        let file = good_path.with_file_name(format!("plan_{huid}.json"));
        std::fs::write(&file, serde_json::to_vec(&v)?)?;
        written.push((what, file, format!("plan {huid}")));
    }
    node.restart().await.context("restart")?;

    let records = node.records()?;
    let mut failures = Vec::new();
    for (what, file, key) in &written {
        let name = file
            .file_name()
            .context("file name")?
            .to_string_lossy()
            .into_owned();
        let aside = std::fs::read_dir(file.parent().context("dir")?)?
            .flatten()
            .any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{name}.corrupt-"))
            });
        let loaded = records.iter().any(|(u, s)| format!("{u}/{s}") == *key)
            || node.checkpoint()?["plans"]
                .as_object()
                .is_some_and(|m| m.keys().any(|u| format!("plan {u}") == *key));
        if !aside || loaded || file.exists() {
            failures.push(format!(
                "{what}: moved aside {aside}, loaded {loaded}, file still there {}",
                file.exists()
            ));
        }
    }
    let victim_now = view(&victim.a, None);
    let untouched = Veth::ifindex(&victim.a).ok() == Some(victim_index)
        && victim_now.as_ref().is_ok_and(|v| *v == victim_view);
    if !untouched {
        failures.push(format!(
            "the host link {} (ifindex {victim_index}) a hostile record names was touched: now {victim_now:?}, before {victim_view}",
            victim.a
        ));
    }
    if std::path::Path::new("/tmp/dranet-hostile").exists() {
        failures.push("a hostile sysctl key wrote /tmp/dranet-hostile".into());
    }
    // The pod's own record loads as ever: adopted, its device still in the pod.
    if !records.iter().any(|(_, s)| *s == sb.id) {
        failures.push("the pod's own record did not load".into());
    }
    if !ns.has("net0") {
        failures.push("the pod lost its device".into());
    }
    if !failures.is_empty() {
        bail!(
            "{} of {} hostile records (or their effects) not refused:\n  {}\ndaemon log:\n{}",
            failures.len(),
            written.len(),
            failures.join("\n  "),
            node.log()
        );
    }
    node.runtime.stop_pod_sandbox(&sb).await.context("Stop")?;
    assert!(host_has(&nic.name), "the device did not come home at Stop");
    node.unprepare(&claim).await?;
    node.stop()?;
    drop(ns);
    Ok(())
}

dranet_sim::root_tests! {
    hostile_record_fields_are_refused_at_load_and_cost_no_other_record => hostile_fields_are_refused();
}
