//! Root tests of `interface.disableEbpfPrograms` on the real kernel, with veth pairs standing in
//! for NICs and a two-instruction `SCHED_CLS` program loaded here: Prepare unpinning the
//! device's bpffs-pinned links (and nothing else), attach leaving no TC `bpf` filter and no TCX
//! program on the device in the pod, a refused detach rolling the device back home, and the
//! option absent leaving every program alone. The pod-side state is read back independently:
//! TC filters with `bpftool net` (7.1 here: it does not list TCX), TCX programs with aya's
//! `query_tcx` on a thread inside the netns.
//!
//! Found on 6.18: a device's clsact qdisc (with its TC filters) does not survive a netns move,
//! TCX programs do; the TC half of the detach is therefore also tested on a device created
//! inside the pod netns.

use std::os::fd::AsFd;
use std::path::Path;

use anyhow::{Context, Result, bail};
use dranet::config::NetworkConfig;
use dranet::plan::DevicePlan;
use dranet::rescue::{AttachOutcome, RescueError};
use dranet::state::{PodPhase, ReturnReason};
use dranet::sys::link::Netlink;
use dranet::sys::netns::Netns;
use dranet_sim::bpf::{
    BpffsDir, PrivateBpffs, bpftool_net, bpftool_tc_count, clsact, link_ifindex, load_noop_sched_cls,
    refuse_bpf_detach_on_this_thread, tc_bpf_filter, tcx_attach, tcx_link, tcx_programs,
};
use dranet_sim::fixtures::{
    device_plan, engine, engine_case, plan_for, pod_plan, pod_ref, sandbox_ref, stop_sandbox,
};
use dranet_sim::kernel::{PodNetns, Veth, unique};
use dranet_sim::nic::{Nic, assert_same, view};
use dranet_sim::root_or_skip;
use serde_json::json;

/// Prepare (the real `plan_claim`, host netns, default bpffs walk) of one claim for `nic`.
async fn prepare(nic: &Nic, interface: serde_json::Value) -> Result<Vec<DevicePlan>> {
    let planned = plan_for(nic, json!({"interface": interface}))
        .await?
        .context("a plan")?;
    Ok(planned.plans)
}

fn ifindex(nic: &Nic) -> Result<u32> {
    Veth::ifindex(&nic.name)
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// Pins `fd` at `path` (creating its directories) and closes it: the pin is the only holder.
fn pin(fd: std::os::fd::OwnedFd, path: &Path) -> Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    dranet::sys::bpf::sys::obj_pin(fd.as_fd(), path)
        .with_context(|| format!("pinning {}", path.display()))?;
    Ok(())
}

#[tokio::test]
async fn prepare_unpins_the_links_of_the_device_and_nothing_else() -> Result<()> {
    root_or_skip!("prepare_unpins_the_links_of_the_device_and_nothing_else");
    let dir = BpffsDir::create("unpin")?;
    let private = PrivateBpffs::mount("unpin")?;
    let nic = Nic::create()?;
    let other = Nic::create()?;
    let (idx, other_idx) = (ifindex(&nic)?, ifindex(&other)?);
    let prog = load_noop_sched_cls("dranet_t1")?;
    let prog2 = load_noop_sched_cls("dranet_t1b")?;

    // The device's links: one in a nested directory, one at the top of our directory.
    let nested = dir.path.join("a/b/nic-ingress");
    pin(tcx_link(prog.as_fd(), idx, false)?, &nested)?;
    let top = dir.path.join("nic-egress");
    pin(tcx_link(prog.as_fd(), idx, true)?, &top)?;
    // Not the device's: another device's link, a pinned program, and a link of the device on
    // another bpffs reachable only through a symlink (never followed).
    let other_pin = dir.path.join("other-ingress");
    pin(tcx_link(prog.as_fd(), other_idx, false)?, &other_pin)?;
    let prog_pin = dir.path.join("prog");
    dranet::sys::bpf::sys::obj_pin(prog.as_fd(), &prog_pin)?;
    let outside = private.path.join("nic-ingress-2");
    pin(tcx_link(prog2.as_fd(), idx, false)?, &outside)?;
    let sym = dir.path.join("sym");
    std::os::unix::fs::symlink(&outside, &sym)?;
    assert_eq!(tcx_programs(idx)?.len(), 3);

    let plans = prepare(&nic, json!({"disableEbpfPrograms": true})).await?;
    assert_eq!(plans.len(), 1);
    assert_eq!(plans[0].config.interface.disable_ebpf_programs, Some(true));
    assert!(!exists(&nested), "nested pin of the device must be gone");
    assert!(!exists(&top), "pin of the device must be gone");
    assert!(exists(&other_pin), "another device's pin must stay");
    assert!(exists(&prog_pin), "a pinned program is not a link: it must stay");
    assert!(
        exists(&sym),
        "the symlink must stay (never followed, never removed)"
    );
    assert!(exists(&outside), "a pin on another bpffs must stay");
    // The two links held only by their pins are released (the kernel puts the last link
    // reference from a workqueue, so a moment later): their programs leave the device.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while tcx_programs(idx)?.len() > 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let left = tcx_programs(idx)?;
    assert_eq!(left.len(), 1, "{left:?}");
    let outside_link = dranet::sys::bpf::sys::obj_get(&outside)?;
    assert_eq!(
        left[0].link_id,
        dranet::sys::bpf::sys::link_info(outside_link.as_fd())?.id
    );
    assert_eq!(
        tcx_programs(other_idx)?.len(),
        1,
        "the other device keeps its program"
    );

    // A repeated Prepare finds nothing more to unpin and succeeds.
    prepare(&nic, json!({"disableEbpfPrograms": true})).await?;
    assert!(exists(&other_pin) && exists(&outside));
    Ok(())
}

#[tokio::test]
async fn attach_leaves_no_tc_filter_and_no_tcx_program_on_the_device_in_the_pod() -> Result<()> {
    root_or_skip!("attach_leaves_no_tc_filter_and_no_tcx_program_on_the_device_in_the_pod");
    let dir = BpffsDir::create("attach")?;
    let (state, ns, nic, _, _) = engine_case("ebpf-at")?;
    let idx = ifindex(&nic)?;
    let before = view(&nic.name, None)?;
    let prog = load_noop_sched_cls("dranet_t2")?;
    let prog2 = load_noop_sched_cls("dranet_t2b")?;
    // (a) a pinned TCX link that an agent also holds open (so unpinning alone does not
    // release it), (b) a plain TCX attachment, (c) clsact bpf filters on both sides.
    let link = tcx_link(prog.as_fd(), idx, false)?;
    let link_pin = dir.path.join("link");
    dranet::sys::bpf::sys::obj_pin(link.as_fd(), &link_pin)?;
    tcx_attach(prog2.as_fd(), idx, true)?;
    clsact(&nic.name, None)?;
    let host_nl = Netlink::host().await?;
    tc_bpf_filter(host_nl.handle(), idx, false, 7, prog.as_fd(), "dranet_t2").await?;
    tc_bpf_filter(host_nl.handle(), idx, true, 7, prog.as_fd(), "dranet_t2").await?;
    assert_eq!(
        bpftool_tc_count(&bpftool_net(&nic.name, None)?),
        2,
        "2 tc filters"
    );
    assert_eq!(aya_tcx(&nic.name, None)?.len(), 2, "2 tcx programs");

    let uid = unique("pod-ebpf-");
    let plans = prepare(&nic, json!({"disableEbpfPrograms": true, "name": "net1"})).await?;
    assert!(!exists(&link_pin), "Prepare unpins the device's link");
    assert_eq!(
        link_ifindex(link.as_fd())?,
        idx,
        "held open, the link is still attached"
    );

    let e = engine(&state, None).await?;
    e.set_plan(pod_plan(&uid, plans))?;
    let out = e.attach_pod(pod_ref(&uid), &ns.path).await?;
    assert!(matches!(out, AttachOutcome::Attached { .. }), "{out:?}");
    // Independent view: bpftool inside the pod netns.
    let in_pod = bpftool_net("net1", Some(&ns.name))?;
    assert_eq!(bpftool_tc_count(&in_pod), 0, "{in_pod}");
    let netns = Netns::open_path(&ns.path)?;
    let tcx = aya_tcx("net1", Some(&netns))?;
    assert!(tcx.is_empty(), "{tcx:?}");
    // dranet's own view, through a socket and a thread in the pod netns.
    let pod_nl = Netlink::in_netns(&netns).await?;
    let pod_idx = pod_nl
        .link_by_name("net1")
        .await?
        .context("net1 in the pod")?
        .header
        .index;
    let left = dranet::sys::bpf::attached_in(pod_nl.handle(), &netns, pod_idx).await?;
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(
        link_ifindex(link.as_fd())?,
        0,
        "the held link is detached (defunct)"
    );

    // Home again: restored, and nothing re-attached (dranet does not own the programs).
    stop_sandbox(&e, &uid, &ns.path).await?;
    assert_same(&before, &view(&nic.name, None)?)?;
    let home = bpftool_net(&nic.name, None)?;
    assert_eq!(bpftool_tc_count(&home), 0, "{home}");
    assert!(aya_tcx(&nic.name, None)?.is_empty());
    Ok(())
}

#[tokio::test]
async fn detach_in_pod_deletes_tc_filters_made_in_the_pod() -> Result<()> {
    root_or_skip!("detach_in_pod_deletes_tc_filters_made_in_the_pod");
    let ns = PodNetns::create(&unique("dranet-t-ebpftc-"))?;
    let name = unique("drp");
    ns.ip(&[
        "link",
        "add",
        &name,
        "type",
        "veth",
        "peer",
        "name",
        &unique("drr"),
    ])?;
    clsact(&name, Some(&ns.name))?;
    let netns = Netns::open_path(&ns.path)?;
    let pod_nl = Netlink::in_netns(&netns).await?;
    let idx = pod_nl
        .link_by_name(&name)
        .await?
        .context("veth in the pod")?
        .header
        .index;
    let prog = load_noop_sched_cls("dranet_t3")?;
    for (egress, prio) in [(false, 3), (false, 9), (true, 4)] {
        tc_bpf_filter(pod_nl.handle(), idx, egress, prio, prog.as_fd(), "dranet_t3").await?;
    }
    // A classic-BPF filter is a `bpf` filter too (upstream deletes those as well).
    sh_in(
        &ns,
        &[
            "tc",
            "filter",
            "add",
            "dev",
            &name,
            "egress",
            "prio",
            "5",
            "bpf",
            "bytecode",
            "1,6 0 0 0",
        ],
    )?;
    // A program attached by TCX inside the pod, on a thread in the pod netns.
    let fd = prog.try_clone()?;
    dranet::sys::netns::in_netns(&netns, move || tcx_attach(fd.as_fd(), idx, false))??;
    assert_eq!(bpftool_tc_count(&bpftool_net(&name, Some(&ns.name))?), 4);
    assert_eq!(aya_tcx(&name, Some(&netns))?, vec!["dranet_t3".to_owned()]);

    let done = dranet::sys::bpf::detach_in_pod(pod_nl.handle(), &netns, idx).await?;
    let said = done.describe();
    assert_eq!(done.tc_filters.len(), 4, "{said:?}");
    assert_eq!(done.tcx.len(), 1, "{said:?}");
    assert!(said.contains(&"egress bpf prio 5".to_owned()), "{said:?}");
    let after = bpftool_net(&name, Some(&ns.name))?;
    assert_eq!(bpftool_tc_count(&after), 0, "{after}");
    assert!(aya_tcx(&name, Some(&netns))?.is_empty());
    // The qdisc itself stays (only the bpf filters go); a second pass finds nothing.
    let q = sh_in(&ns, &["tc", "qdisc", "show", "dev", &name])?;
    assert!(q.contains("clsact"), "{q}");
    assert!(
        dranet::sys::bpf::detach_in_pod(pod_nl.handle(), &netns, idx)
            .await?
            .is_empty()
    );
    Ok(())
}

/// TCX program names on `ifname` (ingress and egress) through aya, in `netns` or the host.
fn aya_tcx(ifname: &str, netns: Option<&Netns>) -> Result<Vec<String>> {
    use aya::programs::SchedClassifier;
    use aya::programs::tc::TcAttachType;
    let ifname = ifname.to_owned();
    let query = move || -> Result<Vec<String>> {
        let mut names = Vec::new();
        for at in [TcAttachType::Ingress, TcAttachType::Egress] {
            let (_, progs) = SchedClassifier::query_tcx(&ifname, at)?;
            names.extend(progs.iter().map(|p| p.name_as_str().unwrap_or("?").to_owned()));
        }
        Ok(names)
    };
    match netns {
        Some(n) => dranet::sys::netns::in_netns(n, query)?,
        None => query(),
    }
}

fn sh_in(ns: &PodNetns, args: &[&str]) -> Result<String> {
    let mut full = vec!["ip", "netns", "exec", ns.name.as_str()];
    full.extend_from_slice(args);
    dranet_sim::kernel::sh(&full)
}

/// The kernel refuses the detach (a seccomp filter on the attaching thread makes
/// `BPF_PROG_DETACH`/`BPF_LINK_DETACH` fail with EPERM): the programs remain, the attach fails
/// and the device is rolled back home, restored, its programs still attached.
#[test]
fn a_refused_detach_fails_the_attach_and_rolls_the_device_back() -> Result<()> {
    root_or_skip!("a_refused_detach_fails_the_attach_and_rolls_the_device_back");
    let (state, ns, nic, _, _) = engine_case("ebpf-rb")?;
    let idx = ifindex(&nic)?;
    let before = view(&nic.name, None)?;
    let prog = load_noop_sched_cls("dranet_t4")?;
    tcx_attach(prog.as_fd(), idx, false)?;
    let link = tcx_link(prog.as_fd(), idx, true)?;
    let uid = unique("pod-ebpfrb-");
    let mut config = NetworkConfig::default();
    config.interface.disable_ebpf_programs = Some(true);
    let plan = pod_plan(&uid, vec![device_plan(&nic, "net1", &uid, config)]);
    let ns_path = ns.path.clone();
    let uid2 = uid.clone();
    // A thread of its own: the seccomp filter stays on it (and on the threads it starts).
    let (err, phase) = std::thread::spawn(move || -> Result<(RescueError, PodPhase)> {
        refuse_bpf_detach_on_this_thread()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let e = engine(&state, None).await?;
            e.set_plan(plan)?;
            let Err(err) = e.attach_pod(pod_ref(&uid2), &ns_path).await else {
                bail!("attach succeeded although the kernel refused every detach");
            };
            let phase = e.checkpoint().pods[&dranet_sim::fixtures::sandbox_key(&uid2)].phase;
            Ok((err, phase))
        })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("attach thread panicked"))??;
    let msg = format!("{err:#}");
    assert!(matches!(err, RescueError::Link { .. }), "{msg}");
    let chain: Vec<String> = std::iter::successors(Some(&err as &dyn std::error::Error), |e| e.source())
        .map(ToString::to_string)
        .collect();
    assert!(
        chain.iter().any(|m| m.contains("still attached")),
        "the error names the remaining programs: {chain:?}"
    );
    assert_eq!(phase, PodPhase::Returned(ReturnReason::Rollback));
    assert_same(&before, &view(&nic.name, None)?)?;
    assert!(
        ns.ip(&["link", "show", "dev", "net1"]).is_err(),
        "nothing left in the pod"
    );
    // Refused, so still attached, now home again.
    assert_eq!(tcx_programs(idx)?.len(), 2);
    assert_eq!(aya_tcx(&nic.name, None)?.len(), 2);
    assert_eq!(link_ifindex(link.as_fd())?, idx);
    Ok(())
}

#[tokio::test]
async fn without_disable_ebpf_programs_nothing_is_unpinned_or_detached() -> Result<()> {
    root_or_skip!("without_disable_ebpf_programs_nothing_is_unpinned_or_detached");
    let dir = BpffsDir::create("keep")?;
    let (state, ns, nic, _, _) = engine_case("ebpf-keep")?;
    let idx = ifindex(&nic)?;
    let prog = load_noop_sched_cls("dranet_t5")?;
    let link_pin = dir.path.join("link");
    pin(tcx_link(prog.as_fd(), idx, false)?, &link_pin)?;
    tcx_attach(prog.as_fd(), idx, true)?;

    for interface in [
        json!({"name": "net1"}),
        json!({"name": "net1", "disableEbpfPrograms": false}),
    ] {
        let plans = prepare(&nic, interface).await?;
        assert!(
            exists(&link_pin),
            "no unpinning without disableEbpfPrograms: true"
        );
        assert_eq!(tcx_programs(idx)?.len(), 2);
        let uid = unique("pod-ebpfk-");
        let e = engine(&state, None).await?;
        e.set_plan(pod_plan(&uid, plans))?;
        e.attach_pod(pod_ref(&uid), &ns.path).await?;
        let netns = Netns::open_path(&ns.path)?;
        let in_pod = aya_tcx("net1", Some(&netns))?;
        assert_eq!(in_pod.len(), 2, "both TCX programs move along: {in_pod:?}");
        stop_sandbox(&e, &uid, &ns.path).await?;
        assert_eq!(
            tcx_programs(ifindex(&nic)?)?.len(),
            2,
            "and come home with the device"
        );
        e.forget_sandbox(sandbox_ref(&uid, None)).await?;
    }
    Ok(())
}

/// The inventory reports `dra.net/ebpf` from one qdisc dump and one listing of loaded programs
/// per scan, asking links one by one only where something can be: a device with only a TCX
/// program, one with only a clsact `bpf` filter, and one with neither, all in the host scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventory_sees_tcx_programs_and_tc_filters_of_a_link() -> Result<()> {
    root_or_skip!("inventory_sees_tcx_programs_and_tc_filters_of_a_link");
    let (with_tcx, with_tc, plain) = (Nic::create()?, Nic::create()?, Nic::create()?);
    let prog = load_noop_sched_cls("dranet_t_inv")?;
    let _link = tcx_link(prog.as_fd(), ifindex(&with_tcx)?, false)?;
    clsact(&with_tc.name, None)?;
    let host_nl = Netlink::host().await?;
    tc_bpf_filter(
        host_nl.handle(),
        ifindex(&with_tc)?,
        true,
        7,
        prog.as_fd(),
        "dranet_t_inv",
    )
    .await?;
    let devices =
        tokio::task::spawn_blocking(|| dranet::inventory::scan(&dranet::inventory::ScanOptions::default()))
            .await??;
    let ebpf = |nic: &Nic| -> Result<Option<dranet::inventory::AttrValue>> {
        let name = dranet::inventory::netdev_device_name(&nic.name);
        let d = devices
            .iter()
            .find(|d| d.name == name)
            .with_context(|| format!("{name} not in the inventory"))?;
        Ok(d.attributes.get("dra.net/ebpf").cloned())
    };
    use dranet::inventory::AttrValue::Bool;
    assert_eq!(ebpf(&with_tcx)?, Some(Bool(true)), "TCX program");
    assert_eq!(ebpf(&with_tc)?, Some(Bool(true)), "clsact bpf filter");
    assert_eq!(ebpf(&plain)?, Some(Bool(false)), "nothing attached");
    Ok(())
}
