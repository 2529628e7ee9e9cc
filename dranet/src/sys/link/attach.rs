//! Attach: the one `RTM_NEWLINK` that moves, renames and configures a device into the pod,
//! then the pod-side settings, and the `disableEbpfPrograms` detach.

use super::*;

/// Moves the host device of `snap` into `netns` under the pod-side name, at ifindex
/// `pod_ifindex` (chosen by the caller and recorded before the move: the device's kernel identity
/// in the pod), with the spec's MTU/MAC/GSO/GRO in **one** RTM_NEWLINK, then (inside the pod,
/// through `pod_nl`) adds the addresses, sets it up and adds the routes. Returns the pod-side
/// ifindex (`pod_ifindex`, unless a kernel older than 5.17 ignored the request).
///
/// A failed RTM_NEWLINK may or may not have moved the device (the kernel moves first and can
/// fail a later setting); any failure leaves the device either in the host or in the pod at
/// `pod_ifindex`, where the caller's rollback looks for it.
pub async fn attach(
    host_nl: &Netlink,
    pod_nl: &Netlink,
    netns: &Netns,
    snap: &LinkSnapshot,
    spec: &AttachSpec,
    pod_ifindex: PodIfindex,
) -> Result<PodIfindex, LinkError> {
    // The device must still be the one we snapshotted.
    let cur = host_nl.link_by_index(snap.ifindex).await?;
    let same = cur.as_ref().is_some_and(|m| {
        same_device(m, snap)
            && m.attributes.iter().any(
                |a| matches!(a, LinkAttribute::IfName(n) if *n == snap.name || *n == temp_name(snap.ifindex)),
            )
    });
    if !same {
        return Err(LinkError::NotFound(snap.name.clone()));
    }
    // Refuse a pod-side name that is taken before anything moves (the kernel would move the
    // device and then fail the rename, leaving it in the pod under its host name).
    if pod_nl.link_by_name(&spec.pod_ifname).await?.is_some() {
        return Err(LinkError::NameTaken(spec.pod_ifname.clone()));
    }
    // Offload names are checked against the device before it moves.
    let (features, flags) = if spec.features.is_empty() && spec.private_flags.is_empty() {
        (BTreeMap::new(), BTreeMap::new())
    } else {
        let index = snap.ifindex;
        let (have, have_flags) =
            off_async("reading offloads", move || host_offloads(&Dev::Index(index))).await??;
        resolve_offloads(&have, &have_flags, &spec.features, &spec.private_flags).map_err(|p| {
            let (field, reason) = p.into_iter().next().unwrap_or_default();
            LinkError::Offload { field, reason }
        })?
    };
    let mut m = settings(snap.ifindex, spec.mtu, spec.mac.clone(), Sizes::of_spec(spec));
    m.attributes
        .insert(0, LinkAttribute::NetNsFd(netns.as_fd().as_raw_fd()));
    m.attributes
        .insert(1, LinkAttribute::IfName(spec.pod_ifname.clone()));
    m.attributes.insert(
        2,
        LinkAttribute::NewIfIndex(i32::try_from(pod_ifindex.get()).unwrap_or(0)),
    );
    host_nl.newlink(m, "move into the pod netns").await?;
    let index = match pod_nl.link_by_index(pod_ifindex.get()).await? {
        Some(m) if same_device(&m, snap) => pod_ifindex.get(),
        // A kernel before 5.17 ignores IFLA_NEW_IFINDEX. The move renamed the device in the same
        // request and nothing of the pod runs yet: the name is ours at this instant.
        _ => pod_nl
            .link_by_name(&spec.pod_ifname)
            .await?
            .filter(|m| same_device(m, snap))
            .map(|m| m.header.index)
            .ok_or_else(|| LinkError::NotFound(spec.pod_ifname.clone()))?,
    };
    // ARP and forwarding sysctls before the link comes up (the first ARP already obeys them).
    // `/proc/sys` writes from a thread inside the pod netns: on the blocking pool, as every
    // synchronous kernel call here (`off_async`).
    if !spec.sysctls.is_empty() {
        let (ns, name, items) = (netns.try_clone()?, spec.pod_ifname.clone(), spec.sysctls.clone());
        off_async("sysctls in the pod", move || {
            sysctl::set_in_pod(&ns, &name, &items)
        })
        .await??;
    }
    if spec.disable_ebpf {
        detach_ebpf(pod_nl, netns, index, &spec.pod_ifname).await?;
    }
    for (ip, len) in &spec.addresses {
        add_address(pod_nl, index, *ip, *len).await?;
    }
    set_up(pod_nl, index, true).await?;
    if !features.is_empty() || !flags.is_empty() {
        let ns = netns.try_clone()?;
        off_async(
            "applying offloads in the pod",
            move || -> Result<(), LinkError> {
                Ethtool::open_in(&ns)?.apply(&Dev::Index(index), &features, &flags)?;
                Ok(())
            },
        )
        .await??;
    }
    let vrf_table = match &spec.vrf {
        Some((name, table)) => Some(enslave_to_vrf(pod_nl, netns, index, name, *table).await?),
        None => None,
    };
    // Link-scope routes first: a universe route may go through a gateway only they make
    // reachable (upstream sorts the same way).
    let mut routes: Vec<&RouteConfig> = spec.routes.iter().collect();
    routes.sort_by_key(|r| std::cmp::Reverse(r.scope));
    for r in routes {
        let mut msg = route_message(r, index)?;
        // With a VRF every route of the device lives in the VRF's table (as upstream).
        if let Some(t) = vrf_table {
            set_route_table(&mut msg, t);
        }
        match pod_nl.handle.route().add(msg).execute().await {
            Ok(()) => {}
            Err(e) if errno_of(&e) == Some(libc::EEXIST) => {}
            Err(e) => return Err(nl_err("add route", e)),
        }
    }
    for r in &spec.rules {
        add_rule(pod_nl, r).await?;
    }
    for (ip, mac) in &spec.neighbors {
        add_neighbor(pod_nl, index, *ip, mac).await?;
    }
    Ok(PodIfindex::new(index))
}

/// `disableEbpfPrograms`, inside the pod, before the link is set up: every TC BPF filter and
/// TCX program of the device goes; one left over fails the attach (the caller rolls back).
/// What is detached here is not re-attached when the device comes home: dranet does not own
/// those programs (upstream does not re-attach them either).
pub(super) async fn detach_ebpf(
    pod_nl: &Netlink,
    netns: &Netns,
    index: u32,
    ifname: &str,
) -> Result<(), LinkError> {
    let done = crate::sys::bpf::detach_in_pod(&pod_nl.handle, netns, index).await?;
    if !done.is_empty() {
        tracing::info!(device = ifname, detached = ?done.describe(), "eBPF programs detached in the pod");
    }
    Ok(())
}
