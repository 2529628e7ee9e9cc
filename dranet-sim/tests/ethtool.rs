//! Root tests of the `ethtool` block and of offload restore on the real kernel, with veth pairs
//! standing in for NICs: real ethtool netlink calls, read back over a fresh genetlink socket
//! (not the one that set them), in the pod netns and at home.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use dranet::config::{EthtoolConfig, NetworkConfig};
use dranet::plan::DevicePlan;
use dranet::rescue::{AttachOutcome, DetachOutcome, RescueError};
use dranet::sys::ethtool::{Dev, Ethtool, Features};
use dranet::sys::netns::Netns;
use dranet::watch::{Watcher, WatcherOptions};
use dranet_sim::kernel::{PodNetns, host_has, unique};
use dranet_sim::nic::{Nic, assert_same, view};
use dranet_sim::root_or_skip;
use serde_json::json;

use dranet_sim::fixtures::{
    engine, engine_case, plan_for, pod_plan as plan, pod_ref as pod, stop_sandbox, wait_for, watched_engine,
};

fn device(nic: &Nic, pod_if: &str, uid: &str, features: &[(&str, bool)]) -> DevicePlan {
    let mut config = NetworkConfig::default();
    if !features.is_empty() {
        config.ethtool = Some(EthtoolConfig {
            features: features.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            private_flags: BTreeMap::new(),
        });
    }
    dranet_sim::fixtures::device_plan(nic, pod_if, uid, config)
}

/// The features of `name` in the host, over a fresh genetlink socket.
fn host_features(name: &str) -> Result<Features> {
    Ok(Ethtool::open()?.features(&Dev::Name(name.into()))?)
}

/// The features of `name` inside the pod netns, over a fresh genetlink socket opened there.
fn pod_features(ns: &PodNetns, name: &str) -> Result<Features> {
    let netns = Netns::open_path(&ns.path)?;
    Ok(Ethtool::open_in(&netns)?.features(&Dev::Name(name.into()))?)
}

fn set_in_pod(ns: &PodNetns, name: &str, wanted: &[(&str, bool)]) -> Result<()> {
    let netns = Netns::open_path(&ns.path)?;
    let w: BTreeMap<String, bool> = wanted.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
    Ethtool::open_in(&netns)?.set_features(&Dev::Name(name.into()), &w)?;
    Ok(())
}

/// What dranet promises to restore of the offloads: wanted and active state of every
/// changeable feature.
/// The NIC's offloads are `before` again (restored at home).
fn assert_offloads(nic: &Nic, before: &(BTreeMap<String, bool>, BTreeMap<String, bool>)) -> Result<()> {
    assert_eq!(
        &offload_view(&host_features(&nic.name)?),
        before,
        "offloads restored"
    );
    Ok(())
}

fn offload_view(f: &Features) -> (BTreeMap<String, bool>, BTreeMap<String, bool>) {
    let active =
        f.hw.keys()
            .filter(|n| f.changeable(n))
            .map(|n| (n.clone(), f.active.contains(n)))
            .collect();
    (f.changeable_wanted(), active)
}

#[tokio::test]
async fn genetlink_reads_and_sets_features_of_a_veth() -> Result<()> {
    root_or_skip!("genetlink_reads_and_sets_features_of_a_veth");
    let nic = Nic::create()?;
    let dev = Dev::Name(nic.name.clone());
    let mut e = Ethtool::open()?;
    let f = e.features(&dev)?;
    // veth: GRO is a changeable software feature, off by default; loopback and LRO are fixed off.
    assert!(f.changeable("rx-gro"), "{f:?}");
    assert!(!f.active.contains("rx-gro") && !f.wanted.contains("rx-gro"));
    assert!(f.knows("loopback") && !f.changeable("loopback"));
    assert!(f.knows("rx-lro") && !f.changeable("rx-lro"));
    assert!(f.active.contains("tx-tcp-segmentation"));
    // veth has no private flags: an empty set, not an error.
    assert!(e.private_flags(&dev)?.is_empty());

    let on = BTreeMap::from([
        ("rx-gro".to_owned(), true),
        ("tx-tcp-segmentation".to_owned(), false),
    ]);
    e.set_features(&dev, &on)?;
    let after = host_features(&nic.name)?;
    assert!(after.wanted.contains("rx-gro") && after.active.contains("rx-gro"));
    assert!(!after.active.contains("tx-tcp-segmentation"));
    // Nothing else changed.
    assert_eq!(
        after.active.contains("tx-tcp6-segmentation"),
        f.active.contains("tx-tcp6-segmentation")
    );
    // By ifindex too.
    let idx = dranet_sim::kernel::Veth::ifindex(&nic.name)?;
    let by_index = e.features(&Dev::Index(idx))?;
    assert_eq!(by_index, after);
    // A fixed feature asked to change: the kernel says yes and changes nothing (it masks the
    // request with hw_features), which is why dranet checks names before and reads back after.
    let bad = BTreeMap::from([("loopback".to_owned(), true)]);
    e.set_features(&dev, &bad)?;
    assert!(!host_features(&nic.name)?.active.contains("loopback"));
    let err = e.apply(&dev, &bad, &BTreeMap::new());
    assert!(
        err.as_ref().is_err_and(|e| e
            .to_string()
            .contains("\"loopback\" is false after setting it true")),
        "{err:?}"
    );
    // An unknown private flag on a driver without any: refused.
    let flags = BTreeMap::from([("legacy-rx".to_owned(), true)]);
    assert!(e.set_private_flags(&dev, &flags).is_err());
    Ok(())
}

#[tokio::test]
async fn prepare_checks_ethtool_names_against_the_host_nic() -> Result<()> {
    root_or_skip!("prepare_checks_ethtool_names_against_the_host_nic");
    let nic = Nic::create()?;
    // No `interface.dhcp` here, so the lease source is never asked.
    let run = |ethtool| plan_for(&nic, json!({"ethtool": ethtool}));

    // Aliases become the kernel names they stand for; a kernel name given too wins.
    let ok = run(json!({"features": {"gro": true, "tso": false, "tx-tcp6-segmentation": true}}))
        .await?
        .context("a plan")?;
    let got = ok.plans[0]
        .config
        .ethtool
        .clone()
        .context("ethtool kept")?
        .features;
    assert_eq!(got.get("rx-gro"), Some(&true), "{got:?}");
    assert_eq!(got.get("tx-tcp-segmentation"), Some(&false), "{got:?}");
    assert_eq!(got.get("tx-tcp6-segmentation"), Some(&true), "{got:?}");
    assert!(!got.contains_key("gro") && !got.contains_key("tso"), "{got:?}");
    // A fixed feature asked for the state it has: fine, nothing to do.
    assert!(run(json!({"features": {"loopback": false}})).await.is_ok());

    // Each bad entry: the config, what the error says.
    for (ethtool, says) in [
        (
            json!({"features": {"no-such-offload": true}}),
            "ethtool.features.no-such-offload: unknown feature",
        ),
        (
            json!({"features": {"loopback": true}}),
            "ethtool.features.loopback: feature loopback is fixed",
        ),
        (
            json!({"features": {"large-receive-offload": true}}),
            "ethtool.features.large-receive-offload: feature rx-lro is fixed",
        ),
        (
            json!({"privateFlags": {"legacy-rx": true}}),
            "ethtool.privateFlags.legacy-rx: unknown private flag (the device has none)",
        ),
    ] {
        let err = run(ethtool.clone())
            .await
            .err()
            .with_context(|| format!("{ethtool} accepted"))?
            .to_string();
        assert!(err.contains(says), "{ethtool}: {err}");
        assert!(err.contains(&nic.name), "names the device: {err}");
    }
    // Every bad entry is reported at once.
    let err = run(json!({"features": {"bogus1": true, "loopback": true}, "privateFlags": {"x": true}}))
        .await
        .err()
        .context("several")?
        .to_string();
    for f in [
        "ethtool.features.bogus1",
        "ethtool.features.loopback",
        "ethtool.privateFlags.x",
    ] {
        assert!(err.contains(f), "{f} missing: {err}");
    }
    // Nothing was changed on the NIC by Prepare.
    assert!(!host_features(&nic.name)?.wanted.contains("rx-gro"));
    Ok(())
}

#[tokio::test]
async fn attach_applies_features_in_the_pod_and_detach_restores_them() -> Result<()> {
    root_or_skip!("attach_applies_features_in_the_pod_and_detach_restores_them");
    let (state, ns, nic, before, uid) = engine_case("apply")?;
    let before_off = offload_view(&host_features(&nic.name)?);
    let e = engine(&state, None).await?;
    e.set_plan(plan(
        &uid,
        vec![device(&nic, "net1", &uid, &[("gro", true), ("tso", false)])],
    ))?;
    let out = e.attach_pod(pod(&uid), &ns.path).await?;
    assert_eq!(
        out,
        AttachOutcome::Attached {
            devices: vec!["net1".into()]
        }
    );
    let inside = pod_features(&ns, "net1")?;
    assert!(
        inside.active.contains("rx-gro"),
        "gro on in the pod: {:?}",
        inside.active
    );
    for f in [
        "tx-tcp-segmentation",
        "tx-tcp6-segmentation",
        "tx-tcp-ecn-segmentation",
    ] {
        assert!(!inside.active.contains(f), "{f} off in the pod");
    }
    // The snapshot recorded the host's wanted state, checkpointed.
    let cp = e.checkpoint();
    let snap = &cp.pods[&dranet_sim::fixtures::sandbox_key(&uid)].devices[0].snapshot;
    assert_eq!(snap.features.get("rx-gro"), Some(&false));
    assert_eq!(snap.features, before_off.0);

    let out = stop_sandbox(&e, &uid, &ns.path).await?;
    assert!(matches!(out, DetachOutcome::Returned { .. }), "{out:?}");
    assert_same(&before, &view(&nic.name, None)?)?;
    assert_offloads(&nic, &before_off)?;
    Ok(())
}

#[tokio::test]
async fn features_the_pod_flipped_are_restored_on_detach() -> Result<()> {
    root_or_skip!("features_the_pod_flipped_are_restored_on_detach");
    let (state, ns, nic, _, uid) = engine_case("flip")?;
    let before_off = offload_view(&host_features(&nic.name)?);
    let e = engine(&state, None).await?;
    // No ethtool block at all: the pod changes offloads by itself.
    e.set_plan(plan(&uid, vec![device(&nic, "net1", &uid, &[])]))?;
    e.attach_pod(pod(&uid), &ns.path).await?;
    set_in_pod(
        &ns,
        "net1",
        &[
            ("rx-gro", true),
            ("tx-scatter-gather", false),
            ("tx-checksum-ip-generic", false),
        ],
    )?;
    let flipped = pod_features(&ns, "net1")?;
    assert!(flipped.active.contains("rx-gro") && !flipped.active.contains("tx-scatter-gather"));
    stop_sandbox(&e, &uid, &ns.path).await?;
    assert_offloads(&nic, &before_off)?;
    Ok(())
}

#[tokio::test]
async fn a_feature_the_kernel_will_not_turn_on_rolls_the_attach_back() -> Result<()> {
    root_or_skip!("a_feature_the_kernel_will_not_turn_on_rolls_the_attach_back");
    let (state, ns, nic, before, uid) = engine_case("rb")?;
    let before_off = offload_view(&host_features(&nic.name)?);
    let e = engine(&state, None).await?;
    // TSO needs scatter-gather: with SG off the kernel keeps TSO off, so the request cannot be
    // met (found only after the move, by reading back).
    e.set_plan(plan(
        &uid,
        vec![device(&nic, "net1", &uid, &[("sg", false), ("tso", true)])],
    ))?;
    let err = e
        .attach_pod(pod(&uid), &ns.path)
        .await
        .err()
        .context("attach must fail")?;
    assert!(matches!(err, RescueError::Link { .. }), "{err}");
    let err = dranet::telemetry::chain(&err).to_string();
    assert!(err.contains("after setting it"), "{err}");
    assert!(host_has(&nic.name), "rolled back home");
    assert_same(&before, &view(&nic.name, None)?)?;
    assert_offloads(&nic, &before_off)?;
    assert!(!e.checkpoint().pods[&dranet_sim::fixtures::sandbox_key(&uid)].has_devices_out());

    // An unknown name fails before anything moves.
    let uid2 = unique("pod-ethr2-");
    e.set_plan(plan(
        &uid2,
        vec![device(&nic, "net1", &uid2, &[("bogus-offload", true)])],
    ))?;
    let err = e
        .attach_pod(pod(&uid2), &ns.path)
        .await
        .err()
        .context("attach must fail")?;
    let err = dranet::telemetry::chain(&err).to_string();
    assert!(err.contains("ethtool.features.bogus-offload"), "{err}");
    assert_same(&before, &view(&nic.name, None)?)?;
    Ok(())
}

#[tokio::test]
async fn rescue_on_netns_teardown_restores_offloads() -> Result<()> {
    root_or_skip!("rescue_on_netns_teardown_restores_offloads");
    let (state, mut ns, nic, before, uid) = engine_case("crio")?;
    let before_off = offload_view(&host_features(&nic.name)?);
    let watcher = Watcher::start(WatcherOptions::default()).await?;
    let (e, events) = watched_engine(&state, watcher).await?;
    e.set_plan(plan(&uid, vec![device(&nic, "net1", &uid, &[("gro", true)])]))?;
    e.attach_pod(pod(&uid), &ns.path).await?;
    assert!(pod_features(&ns, "net1")?.active.contains("rx-gro"));
    // And the pod turns something else off by itself.
    set_in_pod(&ns, "net1", &[("tx-generic-segmentation", false)])?;

    ns.remove_crio_style()?;
    // Its netns is gone: once the device is home the sandbox's record goes too.
    wait_for("the rescue", Duration::from_secs(3), || {
        e.counters().rescued_by_teardown == 1 && e.checkpoint().pods.is_empty()
    })
    .await?;
    assert_same(&before, &view(&nic.name, None)?)?;
    assert_offloads(&nic, &before_off)?;
    drop(events);
    Ok(())
}

#[tokio::test]
async fn kernel_returned_device_gets_its_offloads_back() -> Result<()> {
    root_or_skip!("kernel_returned_device_gets_its_offloads_back");
    let (state, ns, nic, before, uid) = engine_case("repair")?;
    let before_off = offload_view(&host_features(&nic.name)?);
    let watcher = Watcher::start(WatcherOptions {
        ebpf: false,
        ..WatcherOptions::default()
    })
    .await?;
    let (e, events) = watched_engine(&state, watcher).await?;
    e.set_plan(plan(&uid, vec![device(&nic, "net1", &uid, &[("gro", true)])]))?;
    e.attach_pod(pod(&uid), &ns.path).await?;
    set_in_pod(&ns, "net1", &[("rx-udp-gro-forwarding", true)])?;
    // As the kernel returns a physical NIC whose netns dies: DOWN, under the pod-side name.
    ns.ip(&["link", "set", "net1", "down"])?;
    ns.ip(&["link", "set", "net1", "netns", "1"])?;
    wait_for("the repair", Duration::from_secs(3), || {
        e.checkpoint()
            .pods
            .get(&dranet_sim::fixtures::sandbox_key(&uid))
            .is_some_and(|p| !p.has_devices_out())
    })
    .await?;
    assert_same(&before, &view(&nic.name, None)?)?;
    assert_offloads(&nic, &before_off)?;
    drop(events);
    Ok(())
}

/// `(name, parent)` of every link of the netns of `nl`, the parent as the kernel's link message
/// gives it (`IFLA_PARENT_DEV_BUS_NAME/IFLA_PARENT_DEV_NAME`).
async fn parents_by_rtnetlink(nl: &dranet::sys::link::Netlink) -> Result<Vec<(u32, String, Option<String>)>> {
    Ok(nl
        .links()
        .await?
        .iter()
        .map(|m| {
            let s = dranet::sys::link::snapshot_of_message(m);
            (m.header.index, s.name, s.parent)
        })
        .collect())
}

/// The parent of link `name` at `index` through ethtool on `sock` (`None` if it moved away
/// meanwhile: links of other tests come and go in the host).
fn parent_by_ethtool(sock: &std::os::fd::OwnedFd, name: &str, index: u32) -> Result<Option<Option<String>>> {
    use dranet::sys::link::parent::{ParentError, parent_by_ethtool};
    use std::os::fd::AsFd;
    match parent_by_ethtool(sock.as_fd(), name, index, std::path::Path::new("/sys")) {
        Ok(p) => Ok(Some(p.map(|(bus, dev)| format!("{bus}/{dev}")))),
        Err(ParentError::Gone { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Linux before 5.15 names no parent device in link messages, so there dranet reads a physical
/// link's parent through ethtool (`ETHTOOL_GDRVINFO`'s bus_info, on a socket of the link's
/// netns, and sysfs for its bus). On this kernel both exist: for every link of the host (its
/// virtio or PCI NICs included) the fallback names the parent rtnetlink names, and the links
/// with one are exactly those with a `device` in sysfs; in a pod netns, veth, ifb and
/// loopback have none either way, also through a `Netlink` forced to use the fallback.
#[tokio::test]
async fn the_ethtool_parent_fallback_names_the_parent_rtnetlink_names() -> Result<()> {
    root_or_skip!("the_ethtool_parent_fallback_names_the_parent_rtnetlink_names");
    use dranet::sys::link::Netlink;
    let host_sock = dranet::sys::netns::socket_in(&Netns::host()?, 0)??;
    let (mut compared, mut with_parent) = (0, 0);
    for (index, name, by_rtnl) in parents_by_rtnetlink(&Netlink::host().await?).await? {
        let Some(by_ethtool) = parent_by_ethtool(&host_sock, &name, index)? else {
            continue;
        };
        assert_eq!(by_ethtool, by_rtnl, "host link {name}");
        let in_sysfs = std::path::Path::new("/sys/class/net")
            .join(&name)
            .join("device")
            .exists();
        assert_eq!(
            by_rtnl.is_some(),
            in_sysfs,
            "host link {name}: parent {by_rtnl:?}, sysfs device {in_sysfs}"
        );
        compared += 1;
        with_parent += usize::from(by_rtnl.is_some());
    }
    eprintln!("host: {compared} links compared, {with_parent} with a parent device");
    assert!(compared > 0);
    let ns = PodNetns::create(&unique("vmt-parent-"))?;
    ns.ip(&["link", "add", "pa0", "type", "veth", "peer", "name", "pa1"])?;
    ns.ip(&["link", "add", "pd0", "type", "ifb"])?;
    let netns = Netns::open_path(&ns.path)?;
    let pod_sock = dranet::sys::netns::socket_in(&netns, 0)??;
    let forced = Netlink::in_netns(&netns)
        .await?
        .with_parent_fallback(dranet::sys::netns::socket_in(&netns, 0)??);
    let links = parents_by_rtnetlink(&forced).await?;
    assert_eq!(links.len(), 4, "{links:?}");
    for (index, name, parent) in links {
        assert_eq!(parent, None, "pod link {name} (through the forced fallback)");
        assert_eq!(
            parent_by_ethtool(&pod_sock, &name, index)?,
            Some(None),
            "pod link {name}"
        );
    }
    Ok(())
}
