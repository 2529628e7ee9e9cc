//! Root tests of the lifecycle watcher on the real kernel: netns teardown the way CRI-O does it,
//! observed through the eBPF probes and rtnetlink.

use std::os::fd::AsFd;
use std::time::Duration;

use anyhow::{Context, Result};
use dranet::sys::netns::NetnsId;
use dranet::watch::{
    EventKind, LifecycleEvent, ProbeState, Source, Subscription, Tier, Watcher, WatcherOptions,
};
use dranet_sim::kernel::{PodNetns, Veth, identity, sh, unique};
use dranet_sim::root_or_skip;

/// Collects events until `done` returns true for one of them, or the timeout passes.
async fn collect(
    sub: &mut Subscription,
    timeout: Duration,
    done: impl Fn(&LifecycleEvent) -> bool,
) -> Vec<LifecycleEvent> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, sub.recv()).await {
        let stop = done(&ev);
        out.push(ev);
        if stop {
            break;
        }
    }
    // Probe events (ring buffer) and rtnetlink events (socket) travel separately: take what is
    // still in flight for a moment, then order everything by kernel time.
    let tail = tokio::time::Instant::now() + Duration::from_millis(300);
    while let Ok(Some(ev)) = tokio::time::timeout_at(tail, sub.recv()).await {
        out.push(ev);
    }
    out.sort_by_key(|e| e.time);
    out
}

fn position(evs: &[LifecycleEvent], what: &str, pred: impl Fn(&LifecycleEvent) -> bool) -> Result<usize> {
    evs.iter()
        .position(pred)
        .with_context(|| format!("no {what} event in:\n{}", dump(evs)))
}

fn dump(evs: &[LifecycleEvent]) -> String {
    evs.iter().map(|e| format!("  {e:?}\n")).collect()
}

/// Sets up a pod netns with one end of a veth pair moved in and renamed; returns the guards, the
/// moved end's ifindex and the netns identity.
fn pod_with_veth(tag: &str) -> Result<(PodNetns, Veth, u32, NetnsId)> {
    let ns = PodNetns::create(&unique(&format!("dranet-t-{tag}-")))?;
    let veth = Veth::create(&unique("drw"), &unique("drp"))?;
    let ifindex = Veth::ifindex(&veth.b)?;
    let id = identity(&ns.open()?)?;
    Ok((ns, veth, ifindex, id))
}

async fn start() -> Result<Watcher> {
    // With the probes `dranet trace` adds (cleanup_net), so they are tested too.
    let w = Watcher::start(WatcherOptions {
        cleanup_probes: true,
        ..WatcherOptions::default()
    })
    .await?;
    for s in w.status() {
        eprintln!("{s}");
    }
    Ok(w)
}

fn probe_active(w: &Watcher, name: &str) -> bool {
    w.status()
        .iter()
        .any(|s| s.name == name && s.state == ProbeState::Active)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crio_style_teardown_is_seen_in_order() -> Result<()> {
    root_or_skip!("crio_style_teardown_is_seen_in_order");
    let w = start().await?;
    assert!(
        probe_active(&w, "umount") && probe_active(&w, "unlink"),
        "tier A syscall probes must load here"
    );
    let (mut ns, veth, ifindex, id) = pod_with_veth("order")?;
    {
        let f = ns.open()?;
        w.watch_netns(&ns.path, id, f.as_fd()).await?;
    }
    let mut sub = w.subscribe();
    sh(&["ip", "link", "set", &veth.b, "netns", &ns.name])?;
    ns.ip(&["link", "set", &veth.b, "name", "eth7"])?;
    ns.remove_crio_style()?;
    let path = ns.path.display().to_string();
    let peer = veth.a.clone();
    let evs = collect(
        &mut sub,
        Duration::from_secs(5),
        |e| matches!(&e.kind, EventKind::LinkDeleted { name, .. } if *name == peer),
    )
    .await;

    let moved = position(
        &evs,
        "move",
        |e| matches!(&e.kind, EventKind::LinkLeftHost { ifindex: i, to, .. } if *i == ifindex && *to == Some(id)),
    )?;
    let umount = position(&evs, "umount", |e| {
        matches!(&e.kind, EventKind::NetnsUnmounted { path: p, ret: 0, netns, flags, task, .. }
            if *p == path && *netns == Some(id) && *flags == 2 && task.pid == std::process::id())
    })?;
    let unlink = position(
        &evs,
        "unlink",
        |e| matches!(&e.kind, EventKind::NetnsUnlinked { path: p, ret: 0, netns, .. } if *p == path && *netns == Some(id)),
    )?;
    let death = position(
        &evs,
        "death",
        |e| matches!(&e.kind, EventKind::NsidRemoved { netns, .. } if *netns == Some(id)),
    )?;
    let peer_gone = position(
        &evs,
        "peer deletion",
        |e| matches!(&e.kind, EventKind::LinkDeleted { name, .. } if *name == veth.a),
    )?;
    assert!(
        moved < umount && umount < unlink && unlink < death && death < peer_gone,
        "order:\n{}",
        dump(&evs)
    );
    for pair in evs.windows(2) {
        assert!(
            pair[0].time.since(pair[1].time) <= std::time::Duration::from_millis(2),
            "timestamps go backwards:\n{}",
            dump(&evs)
        );
    }
    if probe_active(&w, "netns_cleanup") {
        // Our netns joins the cleanup list at the umount. If another netns already queued
        // cleanup_net (parallel tests), no second "queued" fires, but the batch that destroys
        // ours necessarily starts after our umount (cleanup_net takes the list when it starts).
        let cleanup = position(&evs, "cleanup_net queued or started", |e| {
            matches!(
                e.kind,
                EventKind::NetnsCleanupQueued { .. } | EventKind::NetnsCleanupStarted { .. }
            ) && e.time >= evs[umount].time
        })?;
        assert!(umount < cleanup, "order:\n{}", dump(&evs));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_fd_keeps_the_netns_alive_until_closed() -> Result<()> {
    root_or_skip!("an_open_fd_keeps_the_netns_alive_until_closed");
    let w = start().await?;
    let (mut ns, veth, _ifindex, id) = pod_with_veth("pinned")?;
    let holder = ns.open()?;
    w.watch_netns(&ns.path, id, holder.as_fd()).await?;
    sh(&["ip", "link", "set", &veth.b, "netns", &ns.name])?;
    let mut sub = w.subscribe();
    ns.remove_crio_style()?;
    let path = ns.path.display().to_string();
    let evs = collect(&mut sub, Duration::from_millis(800), |_| false).await;
    position(
        &evs,
        "umount",
        |e| matches!(&e.kind, EventKind::NetnsUnmounted { path: p, netns, .. } if *p == path && *netns == Some(id)),
    )?;
    position(
        &evs,
        "unlink",
        |e| matches!(&e.kind, EventKind::NetnsUnlinked { path: p, .. } if *p == path),
    )?;
    let died =
        |e: &LifecycleEvent| matches!(&e.kind, EventKind::NsidRemoved { netns, .. } if *netns == Some(id));
    assert!(
        !evs.iter().any(died),
        "netns died while an fd held it:\n{}",
        dump(&evs)
    );
    assert!(
        dranet_sim::kernel::host_has(&veth.a),
        "peer must live while the netns is held"
    );
    drop(holder);
    let evs = collect(&mut sub, Duration::from_secs(5), died).await;
    position(&evs, "death after close", died)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrelated_unlinks_produce_no_event() -> Result<()> {
    root_or_skip!("unrelated_unlinks_produce_no_event");
    let w = start().await?;
    let mut sub = w.subscribe();
    let dir = std::env::temp_dir().join(unique("dranet-unrelated-"));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("netns-lookalike");
    std::fs::write(&file, b"x")?;
    std::fs::remove_file(&file)?;
    std::fs::remove_dir(&dir)?;
    let needle = dir.display().to_string();
    let evs = collect(&mut sub, Duration::from_millis(500), |_| false).await;
    assert!(
        !evs.iter()
            .any(|e| e.path().is_some_and(|p| p.starts_with(&needle))),
        "unrelated unlink reported:\n{}",
        dump(&evs)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tier_b_programs_are_in_the_object_and_reported() -> Result<()> {
    root_or_skip!("tier_b_programs_are_in_the_object_and_reported");
    let obj = aya_obj_programs();
    for name in [
        "dranet_dev_netns",
        "dranet_dev_netns_legacy",
        "dranet_put_net",
        "dranet_nsfs_put",
        "dranet_lsm_sb_umount",
        "dranet_fentry_sb_umount",
    ] {
        assert!(
            obj.iter().any(|p| p == name),
            "{name} missing from the object: {obj:?}"
        );
    }
    let w = start().await?;
    let tier_b: Vec<_> = w.status().iter().filter(|s| s.tier == Tier::B).collect();
    assert_eq!(tier_b.len(), 6, "{tier_b:?}");
    let refuses_trampolines = std::fs::read_to_string("/proc/sys/kernel/osrelease")?.contains("-fc-");
    for s in tier_b {
        match &s.state {
            ProbeState::Active => assert!(
                !refuses_trampolines,
                "{} active on a kernel without trampolines",
                s.name
            ),
            ProbeState::Unsupported(reason) => {
                assert!(!reason.is_empty());
                if refuses_trampolines && s.name != "nsfs_umount_fentry" {
                    assert!(reason.contains("EPERM"), "{}: {reason}", s.name);
                }
            }
            ProbeState::Failed(e) => panic!("{} failed instead of being classified: {e}", s.name),
        }
    }
    Ok(())
}

/// Program names in the embedded object.
fn aya_obj_programs() -> Vec<String> {
    let Some(object) = dranet::sys::probes::object() else {
        panic!("this build has no eBPF object (feature `ebpf` off)");
    };
    match aya::Ebpf::load(object) {
        Ok(e) => e.programs().map(|(n, _)| n.to_owned()).collect(),
        Err(e) => panic!("object does not load: {e}"),
    }
}

#[test]
fn trace_json_subprocess_prints_parseable_teardown() -> Result<()> {
    root_or_skip!("trace_json_subprocess_prints_parseable_teardown");
    let (mut ns, veth, _ifindex, id) = pod_with_veth("trace")?;
    let mut child = std::process::Command::new(dranet_sim::kernel::dranet_bin()?)
        .args(["trace", "--json", "--duration", "3"])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    // The first line (probe status) is printed once the watcher is live; act only then.
    let mut reader = std::io::BufReader::new(child.stdout.take().context("child stdout")?);
    let mut text = String::new();
    std::io::BufRead::read_line(&mut reader, &mut text)?;
    sh(&["ip", "link", "set", &veth.b, "netns", &ns.name])?;
    ns.remove_crio_style()?;
    std::io::Read::read_to_string(&mut reader, &mut text)?;
    let status = child.wait()?;
    assert!(status.success());
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| format!("unparseable output:\n{text}"))?;
    assert_eq!(lines[0]["type"], "probes", "{text}");
    let path = ns.path.display().to_string();
    let has = |kind: &str| {
        lines
            .iter()
            .any(|l| l["kind"] == kind && (l["path"] == path.as_str() || l["path"].is_null()))
    };
    for kind in [
        "link_left_host",
        "netns_unmounted",
        "netns_unlinked",
        "nsid_removed",
        "link_deleted",
    ] {
        assert!(has(kind), "no {kind} in:\n{text}");
    }
    let umount = lines
        .iter()
        .find(|l| l["kind"] == "netns_unmounted" && l["path"] == path.as_str())
        .context("umount line")?;
    assert_eq!(umount["netns"]["inode"], id.inode, "{umount}");
    assert!(umount["t_us"].as_i64().is_some());
    Ok(())
}

/// Scheduling policy (field 41) and nice value (field 19) of the calling thread.
fn sched_of_this_thread() -> Result<(u32, i32)> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat")?;
    // Fields after the command (which may hold spaces), counted from field 3.
    let rest = stat.rsplit_once(')').context("stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Ok((f[41 - 3].parse()?, f[19 - 3].parse()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ring_is_read_on_a_raised_reactor_whose_threads_run_normally() -> Result<()> {
    root_or_skip!("the_ring_is_read_on_a_raised_reactor_whose_threads_run_normally");
    let w = start().await?;
    let rt = w.reactor().context("no reactor")?.clone();
    let (policy, nice) = rt.spawn(async { sched_of_this_thread() }).await??;
    // Root: SCHED_FIFO (1) where the kernel allows real-time tasks, else a negative nice value.
    assert!(policy == 1 || nice < 0, "reactor at policy {policy}, nice {nice}");
    // Threads it starts (its blocking pool) run at the normal priority.
    let (policy, nice) = rt
        .spawn(async { tokio::task::spawn_blocking(sched_of_this_thread).await })
        .await???;
    assert_eq!((policy, nice), (0, 0));
    // Events still arrive: a watched netns torn down CRI-O style.
    let mut sub = w.subscribe();
    let (mut ns, _veth, _ifindex, id) = pod_with_veth("reactor")?;
    let fd = ns.open()?;
    w.watch_netns(&ns.path, id, fd.as_fd()).await?;
    let path = ns.path.display().to_string();
    ns.remove_crio_style()?;
    let evs = collect(
        &mut sub,
        Duration::from_secs(5),
        |e| matches!(&e.kind, EventKind::NetnsUnmounted { path: p, .. } if *p == path),
    )
    .await;
    position(
        &evs,
        "umount",
        |e| matches!(&e.kind, EventKind::NetnsUnmounted { path: p, .. } if *p == path),
    )?;
    drop(fd);
    Ok(())
}

/// The ring buffer is read late (a loaded node: the reactor thread waits for a core) while the
/// rtnetlink monitor keeps up, so the netns's death (`nsid_removed`) is handled before its
/// umount record is decoded. The umount still carries the identity of the netns it unmounted:
/// found by `dranet trace` in CI, where the `--json` umount line came out with `"netns": null`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_ring_reader_still_labels_the_umount_of_a_netns_that_died() -> Result<()> {
    root_or_skip!("a_late_ring_reader_still_labels_the_umount_of_a_netns_that_died");
    let (mut ns, veth, _ifindex, id) = pod_with_veth("late")?;
    let w = Watcher::start(WatcherOptions {
        learn_dirs: true,
        prefixes: dranet::watch::DEFAULT_PREFIXES
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        ring_reader_delay: Some(Duration::from_millis(1500)),
        ..WatcherOptions::default()
    })
    .await?;
    if !probe_active(&w, "umount") {
        anyhow::bail!("the umount probe is not active: {:?}", w.status());
    }
    let mut sub = w.subscribe();
    sh(&["ip", "link", "set", &veth.b, "netns", &ns.name])?;
    ns.remove_crio_style()?;
    let path = ns.path.display().to_string();
    let evs = collect(
        &mut sub,
        Duration::from_secs(8),
        |e| matches!(&e.kind, EventKind::NetnsUnmounted { path: p, .. } if *p == path),
    )
    .await;
    // Other tests of this binary run beside this one and their netns die too (CI saw
    // `NsidRemoved { nsid: 0, netns: None }` of a netns this watcher never learned first):
    // this netns's death is the one labelled with its identity, among all deaths seen.
    let removed: Vec<_> = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::NsidRemoved { .. }))
        .collect();
    assert!(!removed.is_empty(), "no nsid_removed: the netns did not die");
    assert!(
        removed
            .iter()
            .any(|e| matches!(e.kind, EventKind::NsidRemoved { netns: Some(n), .. } if n == id)),
        "no nsid_removed labelled {id:?}: {removed:?}"
    );
    let umount = evs
        .iter()
        .find(|e| matches!(&e.kind, EventKind::NetnsUnmounted { path: p, .. } if *p == path))
        .context("no umount event")?;
    assert!(
        matches!(umount.kind, EventKind::NetnsUnmounted { netns: Some(n), .. } if n == id),
        "{umount:?}"
    );
    Ok(())
}

/// The probes drop events while the ring buffer is full (a reader that is late: a loaded node).
/// The loss is reported as a `Lost` event from the probes (which the engine answers with a
/// reconcile: `rescue::decide`), found when the reader drains the full buffer: the daemon polls
/// no counter on an idle node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_ring_buffer_is_reported_as_lost_without_a_poll() -> Result<()> {
    root_or_skip!("a_full_ring_buffer_is_reported_as_lost_without_a_poll");
    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Dir(std::path::PathBuf::from(format!(
        "/run/dranet-lost-{}",
        std::process::id()
    )));
    std::fs::create_dir_all(&dir.0)?;
    let w = Watcher::start(WatcherOptions {
        prefixes: vec![format!("{}/", dir.0.display())],
        ring_reader_delay: Some(Duration::from_millis(1500)),
        ..WatcherOptions::default()
    })
    .await?;
    if !probe_active(&w, "unlink") {
        anyhow::bail!("the unlink probe is not active: {:?}", w.status());
    }
    let mut sub = w.subscribe();
    // Far more unlinks under the watched prefix than the 256 KiB ring buffer holds.
    for i in 0..6000 {
        let f = dir.0.join(i.to_string());
        std::fs::File::create(&f)?;
        std::fs::remove_file(&f)?;
    }
    let probe_lost =
        |e: &LifecycleEvent| e.source == Source::Probe && matches!(e.kind, EventKind::Lost { .. });
    let evs = collect(&mut sub, Duration::from_secs(8), probe_lost).await;
    let lost = evs
        .iter()
        .find(|e| probe_lost(e))
        .context("a full ring buffer was never reported")?;
    let EventKind::Lost { count } = lost.kind else {
        unreachable!()
    };
    assert!(count > 0, "{lost:?}");
    eprintln!("{count} probe events lost, reported");
    Ok(())
}

/// A ring-buffer loss still leads to a reconcile: the engine follows a watcher whose ring reader
/// is late (1.5 s), the probes drop the unlinks of 6,000 files under a watched prefix, and the
/// engine answers the `Lost` event with a reconcile (`dranet_lost_events`, counted as the
/// reconcile starts), with no poll of the loss counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_buffer_loss_leads_to_a_reconcile() -> Result<()> {
    root_or_skip!("a_ring_buffer_loss_leads_to_a_reconcile");
    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Dir(std::path::PathBuf::from(format!(
        "/run/dranet-lost-rec-{}",
        std::process::id()
    )));
    std::fs::create_dir_all(&dir.0)?;
    let w = Watcher::start(WatcherOptions {
        prefixes: vec![format!("{}/", dir.0.display())],
        ring_reader_delay: Some(Duration::from_millis(1500)),
        ..WatcherOptions::default()
    })
    .await?;
    if !probe_active(&w, "unlink") {
        anyhow::bail!("the unlink probe is not active: {:?}", w.status());
    }
    let state = dranet_sim::fixtures::StateDir::new("lost-reconcile");
    let (engine, _events) = dranet_sim::fixtures::watched_engine(&state, w).await?;
    let before = engine.metrics().lost_events.get();
    for i in 0..6000 {
        let f = dir.0.join(i.to_string());
        std::fs::File::create(&f)?;
        std::fs::remove_file(&f)?;
    }
    let until = std::time::Instant::now() + Duration::from_secs(8);
    while engine.metrics().lost_events.get() == before {
        anyhow::ensure!(
            std::time::Instant::now() < until,
            "no reconcile within 8 s of a full ring buffer"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "reconciles after lost events: {}",
        engine.metrics().lost_events.get() - before
    );
    Ok(())
}
