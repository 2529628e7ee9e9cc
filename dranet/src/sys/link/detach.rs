//! Detach and restore: finding the device by kernel identity (in the pod, at home), moving it
//! back, and putting every snapshot field back; repair of a device the kernel returned.

use super::*;

/// How a device came home.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Returned {
    /// Back under its host name with every snapshot field restored.
    Restored,
    /// Back and restored, but its host name is taken: it keeps `temp_name` until the name frees
    /// (a later [`repair`] renames it).
    NameBusy { temp_name: String },
}

/// The temporary host name of a device whose name is taken: `dn<ifindex>` (≤ 12 bytes).
#[must_use]
pub fn temp_name(ifindex: u32) -> String {
    format!("dn{ifindex}")
}

/// Whether link `m` can be the device of `snap` by what only the kernel sets: the same link kind
/// (a pod can only create links that have one; a physical device has none), and the same parent
/// device and permanent MAC wherever the device has them. Names and MACs never identify a
/// device: a pod with NET_ADMIN or a claim sets those.
#[must_use]
pub fn same_device(m: &LinkMessage, snap: &LinkSnapshot) -> bool {
    let s = snapshot_of(m, &[]);
    (!snap.identified || s.kind == snap.kind)
        && snap.parent.as_ref().is_none_or(|p| s.parent.as_ref() == Some(p))
        && snap
            .perm_mac
            .as_deref()
            .is_none_or(|p| s.perm_mac.as_deref().is_some_and(|x| x.eq_ignore_ascii_case(p)))
}

/// [`same_device`] between a snapshot `s` of a host link and the recorded `snap`; a device with
/// neither parent nor permanent MAC must also be at its own host ifindex.
#[must_use]
pub fn same_identity(s: &LinkSnapshot, snap: &LinkSnapshot) -> bool {
    (!snap.identified || s.kind == snap.kind)
        && snap.parent.as_ref().is_none_or(|p| s.parent.as_ref() == Some(p))
        && snap
            .perm_mac
            .as_deref()
            .is_none_or(|p| s.perm_mac.as_deref().is_some_and(|x| x.eq_ignore_ascii_case(p)))
        && (has_strong_identity(snap) || snap.ifindex == 0 || snap.ifindex == s.ifindex)
}

/// Whether the device has an identity the kernel keeps across namespaces (a parent device or a
/// permanent MAC), so it can be recognised anywhere, not only at its ifindex in a netns we hold.
#[must_use]
pub fn has_strong_identity(snap: &LinkSnapshot) -> bool {
    snap.parent.is_some() || snap.perm_mac.is_some()
}

/// Finds the device of `snap` in the pod netns at `ifindex`, the index recorded for it there
/// (chosen before the move). The link found must pass [`same_device`]; a link that does not (an
/// impostor a pod made under the device's name, MAC or even ifindex) is never taken. `None` for
/// `ifindex` only comes from a checkpoint of format 1, which recorded no index: then the
/// pod-side name is the hint, still checked with [`same_device`].
///
/// A device with a lower link in the host (a veth's peer, a vlan/macvlan's parent: `snap.lower`)
/// must also name it there ([`lower_is_in`] with `host_nsid`, the id the pod netns gives the host
/// netns): a link a tenant made of the same kind at the same ifindex has its lower link in a netns
/// the tenant holds.
pub(super) async fn find_in_pod(
    pod_nl: &Netlink,
    snap: &LinkSnapshot,
    ifindex: Option<PodIfindex>,
    pod_ifname: &str,
    host_nsid: Option<i32>,
) -> Result<Option<LinkMessage>, LinkError> {
    let found = match ifindex {
        Some(i) => pod_nl.link_by_index(i.get()).await?,
        None => pod_nl.link_by_name(pod_ifname).await?,
    };
    Ok(found.filter(|m| same_device(m, snap) && lower_is_in(m, snap, host_nsid)))
}

/// The id the netns of `pod_nl` gives the host netns `host` (`RTM_GETNSID` with its fd); `None`
/// if it has none (then no lower link of a pod's link is in the host) or the request fails.
pub(super) async fn host_nsid_in(pod_nl: &Netlink, host: &Netns) -> Option<i32> {
    use netlink_packet_core::{NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
    use netlink_packet_route::RouteNetlinkMessage;
    use netlink_packet_route::nsid::{NsidAttribute, NsidMessage};
    let mut m = NsidMessage::default();
    m.attributes
        .push(NsidAttribute::Fd(u32::try_from(host.as_fd().as_raw_fd()).ok()?));
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetNsId(m));
    req.header.flags = NLM_F_REQUEST;
    let mut handle = pod_nl.handle().clone();
    let mut replies = handle.request(req).ok()?;
    let mut found = None;
    while let Some(msg) = futures::StreamExt::next(&mut replies).await {
        if let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNsId(n)) = msg.payload {
            found = n.attributes.iter().find_map(|a| match a {
                NsidAttribute::Id(id) if *id >= 0 => Some(*id),
                _ => None,
            });
        }
    }
    found
}

/// The device of `snap` where it started, if it never left (or is back): at its host ifindex in
/// the host netns, the same device by [`same_device`]. The host allocates ifindexes cyclically,
/// so another link does not get this one back while the device is away.
pub(super) async fn at_home(nl: &Netlink, snap: &LinkSnapshot) -> Result<Option<LinkMessage>, LinkError> {
    // 0: the host ifindex is unknown (rebuilt from a pin).
    if snap.ifindex == 0 {
        return Ok(None);
    }
    Ok(nl
        .link_by_index(snap.ifindex)
        .await?
        .filter(|m| same_device(m, snap)))
}

/// Finds the device of `snap` in the host netns by its kernel identity (parent device, permanent
/// MAC), preferring the one under its host name. `None` for a device without such an identity:
/// in the host it cannot be told from any other link of its kind.
pub(super) async fn find_in_host(
    nl: &Netlink,
    snap: &LinkSnapshot,
) -> Result<Option<LinkMessage>, LinkError> {
    if !has_strong_identity(snap) {
        return Ok(None);
    }
    let links = nl.links().await?;
    let named = |m: &&LinkMessage| u8::from(snapshot_of(m, &[]).name == snap.name);
    Ok(links
        .into_iter()
        .filter(|m| same_device(m, snap))
        .max_by_key(|m| named(&m)))
}

/// What [`detach`] needs to bring one device home.
pub struct DetachRequest<'a> {
    /// rtnetlink inside the pod netns (through the pin).
    pub pod_nl: &'a Netlink,
    /// rtnetlink in the host netns.
    pub host_nl: &'a Netlink,
    /// The host netns (the move's target).
    pub host: &'a Netns,
    /// The host state to restore; its kind, parent and permanent MAC identify the device.
    pub snap: &'a LinkSnapshot,
    /// The device's ifindex in the pod netns, as the record has it (written ahead of the move,
    /// `DeviceRecord::at`) when it names the netns we hold.
    pub pod_ifindex: Option<PodIfindex>,
    /// The name the move gave it (only consulted when `pod_ifindex` is unknown).
    pub pod_ifname: &'a str,
    /// The socket to send the move home on from a blocking-pool thread, one per return
    /// ([`MoveSocket`]); `None`: over `pod_nl`.
    pub move_from: Option<&'a std::sync::Arc<MoveSocket>>,
    /// The id the pod netns gives the host netns, once a device of the same return asked for
    /// it ([`host_nsid_in`]): it stays the same while both netns live, so the other devices of
    /// the return skip that round trip. `None`: asked for per device.
    pub host_nsid: Option<&'a std::sync::OnceLock<i32>>,
}

/// Moves the device of `req.snap` from the pod netns back to the host netns, under its host name
/// (or a temporary one if that is taken), then restores the snapshot. The device is taken by
/// its recorded ifindex and checked ([`same_device`]); an impostor stays in the pod and dies with
/// it. `moved_at` gets the monotonic time (if still `None`) when the move is sent.
///
/// Steps: [`HomeMove::plan`] (find it, pick its host name, what the move carries);
/// [`HomeMove::send`] (retried as the kernel's refusals require); then
/// [`HomeMove::restore`], or [`HomeMove::after_failure`] when no move went through.
pub async fn detach(
    req: &DetachRequest<'_>,
    moved_at: &mut Option<crate::clock::MonoTime>,
) -> Result<Returned, LinkError> {
    let Some(mv) = HomeMove::plan(req).await? else {
        // Not in the pod: it never left the host (an attach that failed before its move), it
        // came home earlier, or the kernel returned it. Look in the host.
        return find_and_repair(req.host_nl, req.snap).await;
    };
    moved_at.get_or_insert_with(crate::sys::os::mono_now);
    match mv.send().await {
        Ok(()) => mv.restore().await,
        Err(e) => mv.after_failure(e).await,
    }
}

/// Under which name a device is in the host once it is back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HomeName {
    /// Its own: a restore renames it back to its snapshot name if it is not.
    Own,
    /// The temporary one it has (its own was taken): a restore keeps it.
    Temporary,
}

/// What a move home carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MoveKind {
    /// The host settings that differ and the device's own host ifindex, in the move itself.
    Full,
    /// Only the netns and the name, to any free ifindex: the restore applies the settings.
    Bare,
}

/// One device's move home, planned before it is sent.
struct HomeMove<'r> {
    req: &'r DetachRequest<'r>,
    /// Its ifindex in the pod.
    pod_index: PodIfindex,
    /// The name it comes home under ([`HomeMove::home_name`] says which it is).
    name: String,
    home_name: HomeName,
    /// Its host settings that differ in the pod (`None`: none, or one that cannot be parsed,
    /// which the restore reports with the device home).
    settings: Option<LinkMessage>,
    /// Its own host ifindex (free unless something asked for it; not looked up first: if it is
    /// taken the kernel refuses the move, see [`HomeMove::send`]).
    own_index: Option<u32>,
    /// Its altnames as they are in the pod.
    pod_altnames: Vec<String>,
}

impl<'r> HomeMove<'r> {
    /// Finds the device in the pod (`None`: not there) and its host name in the host, both at
    /// once (two sockets, two netns: a round trip less before the move, which is the rescue's
    /// reaction time, and each of them waits for RTNL behind the other returns' moves); picks
    /// the name it comes home under; drops the altnames the pod added.
    async fn plan(req: &'r DetachRequest<'r>) -> Result<Option<Self>, LinkError> {
        let snap = req.snap;
        let host_nsid = match (snap.lower, req.host_nsid.and_then(|c| c.get())) {
            (None, _) => None,
            (Some(_), Some(known)) => Some(*known),
            (Some(_), None) => {
                let asked = host_nsid_in(req.pod_nl, req.host).await;
                // Only an id is kept: the kernel may give one later, never take it back.
                if let (Some(id), Some(cache)) = (asked, req.host_nsid) {
                    let _ = cache.set(id);
                }
                asked
            }
        };
        let (in_pod, in_host) = futures::join!(
            find_in_pod(req.pod_nl, snap, req.pod_ifindex, req.pod_ifname, host_nsid),
            req.host_nl.link_by_name(&snap.name),
        );
        let Some(m) = in_pod? else {
            return Ok(None);
        };
        let pod_index = PodIfindex::new(m.header.index);
        // The kernel moves first and renames after (a rename clash fails the request with the
        // device already moved), so pick a free host name up front.
        let (name, home_name) = if in_host?.is_some() {
            (temp_name_of(snap, pod_index.get()), HomeName::Temporary)
        } else {
            (snap.name.clone(), HomeName::Own)
        };
        let in_pod_now = snapshot_of(&m, &[]);
        // Altnames the pod added: a free one would come home and squat a host name, one that
        // names a host link (or a host link's altname) makes the kernel refuse the move (EEXIST)
        // while the pod netns lives. Removed in the pod, through its netns, before the move.
        drop_altnames(
            req.pod_nl,
            pod_index.get(),
            in_pod_now.altnames.iter().filter(|a| !snap.altnames.contains(a)),
        )
        .await?;
        // The host settings (MTU, MAC, GSO/GRO limits, alias) go back in the move itself: the
        // kernel applies them in the host right after the netns change, under the same RTNL
        // hold (`do_setlink`), before anything can see the device there, and with it still
        // DOWN (a MAC change needs that). One RTNL round trip less per device, each of which
        // queues behind the other returns' moves.
        let settings = settings_diff(pod_index.get(), snap, &in_pod_now)
            .ok()
            .filter(changes_anything);
        Ok(Some(Self {
            req,
            pod_index,
            name,
            home_name,
            settings,
            own_index: (snap.ifindex > 0).then_some(snap.ifindex),
            pod_altnames: in_pod_now.altnames,
        }))
    }

    /// The `RTM_NEWLINK` of the move.
    fn message(&self, kind: MoveKind) -> LinkMessage {
        let full = kind == MoveKind::Full;
        let mut msg = self.settings.clone().filter(|_| full).unwrap_or_else(|| {
            let mut bare = LinkMessage::default();
            bare.header.index = self.pod_index.get();
            bare
        });
        msg.attributes
            .insert(0, LinkAttribute::NetNsFd(self.req.host.as_fd().as_raw_fd()));
        msg.attributes.insert(1, LinkAttribute::IfName(self.name.clone()));
        if let Some(i) = self.own_index.filter(|_| full) {
            msg.attributes
                .push(LinkAttribute::NewIfIndex(i32::try_from(i).unwrap_or(0)));
        }
        msg
    }

    /// Sends the move, full first.
    ///
    /// Retried once without altnames when one of the device's own was taken in the host
    /// meanwhile, and once bare when the kernel refused the full request with the device
    /// still in the pod: the kernel checks a request before it moves anything (its attributes
    /// in `validate_linkmsg`, the new index in `dev_index_reserve`), so a setting it refuses,
    /// or the old index taken by another link, must not keep the device in the pod. The restore
    /// then applies the settings, and reports the one refused, with the device home.
    async fn send(&self) -> Result<(), LinkError> {
        let (req, snap) = (self.req, self.req.snap);
        let mut sent = send_move(req, self.message(MoveKind::Full)).await;
        if let Err(e) = &sent
            && e.errno() == Some(libc::EEXIST)
            && snap.altnames.iter().any(|a| self.pod_altnames.contains(a))
            && still_in_pod(req, snap, self.pod_index).await
        {
            tracing::warn!(device = %snap.name, error = %e, "the move home collides with a host name: moving without altnames");
            drop_altnames(req.pod_nl, self.pod_index.get(), snap.altnames.iter()).await?;
            sent = send_move(req, self.message(MoveKind::Full)).await;
        }
        match sent {
            Ok(()) => Ok(()),
            Err(_)
                if (self.settings.is_some() || self.own_index.is_some())
                    && still_in_pod(req, snap, self.pod_index).await =>
            {
                send_move(req, self.message(MoveKind::Bare)).await
            }
            Err(e) => Err(e),
        }
    }

    /// No move went through: the error stands while the device is still in the pod (the
    /// caller retries); if it moved anyway, it is in the host under the name asked for.
    async fn after_failure(&self, e: LinkError) -> Result<Returned, LinkError> {
        let (req, snap) = (self.req, self.req.snap);
        if still_in_pod(req, snap, self.pod_index).await {
            return Err(e);
        }
        match moved_home(req.host_nl, &self.name, snap).await {
            Ok(Some(m)) => restore_moved(req.host_nl, &m, snap, self.home_name).await,
            _ => Err(e),
        }
    }

    /// The device is home: found under its name (checked), then restored. Its offloads are
    /// read in the restore's one blocking call, right before they are put back, at the index
    /// found here. (They were read in a blocking call of their own beside this lookup, to
    /// share a wait for RTNL with it; the kernels this runs on answer the lookup,
    /// `RTM_GETLINK`, without RTNL, so that only cost a pool thread's wake-up and an ethtool
    /// socket per device.)
    async fn restore(&self) -> Result<Returned, LinkError> {
        let (req, snap) = (self.req, self.req.snap);
        let m = moved_home(req.host_nl, &self.name, snap)
            .await?
            .ok_or_else(|| LinkError::NotFound(self.name.clone()))?;
        restore_moved(req.host_nl, &m, snap, self.home_name).await
    }
}

/// Sends the move home: from a pool thread with `req.move_from`, else over `req.pod_nl`.
async fn send_move(req: &DetachRequest<'_>, msg: LinkMessage) -> Result<(), LinkError> {
    const MOVE: &str = "move back to the host netns";
    match req.move_from {
        Some(sock) => {
            let sock = std::sync::Arc::clone(sock);
            off_async(MOVE, move || sock.newlink(msg, MOVE))
                .await
                .and_then(|r| r)
        }
        None => req.pod_nl.newlink(msg, MOVE).await,
    }
}

/// Whether the device is still in the pod at `pod_index` (a lookup that fails counts as no). It
/// was found there by its identity before the move was sent ([`find_in_pod`]).
async fn still_in_pod(req: &DetachRequest<'_>, snap: &LinkSnapshot, pod_index: PodIfindex) -> bool {
    req.pod_nl
        .link_by_index(pod_index.get())
        .await
        .is_ok_and(|m| m.is_some_and(|m| same_device(&m, snap)))
}

/// The host link of the device a move just brought home under `name` (the move renamed it in
/// the same request, so the name is ours at this instant), checked with [`same_device`].
pub(super) async fn moved_home(
    nl: &Netlink,
    name: &str,
    snap: &LinkSnapshot,
) -> Result<Option<LinkMessage>, LinkError> {
    Ok(nl.link_by_name(name).await?.filter(|m| same_device(m, snap)))
}

/// [`restore`] of a device a move just brought home, from the link message of that lookup
/// (not asked for again). Its addresses are not dumped either: leaving a netns unregisters the
/// device there (`NETDEV_UNREGISTER`: `inetdev_destroy`, `addrconf_ifdown`), so it arrives with
/// none, and DOWN, without even an IPv6 link-local. Every snapshot address is put back
/// (`NLM_F_REPLACE`: one that something added meanwhile is simply kept).
async fn restore_moved(
    nl: &Netlink,
    m: &LinkMessage,
    snap: &LinkSnapshot,
    home_name: HomeName,
) -> Result<Returned, LinkError> {
    let mut cur = snapshot_of(m, &[]);
    cur.sysctls = sysctl::of_link(m);
    restore_from(nl, m.header.index, snap, &cur, home_name).await
}

/// Restores a host device (found at `index`) to `snap`: name (see [`HomeName`]), MTU, MAC,
/// GSO/GRO sizes, alias, altnames, addresses, offload features and private flags, admin state.
/// `nl` is the driver's own (host) netns, where the ethtool socket is opened too.
pub(super) async fn restore(
    nl: &Netlink,
    index: u32,
    snap: &LinkSnapshot,
    home_name: HomeName,
) -> Result<Returned, LinkError> {
    let cur = snapshot_index(nl, index)
        .await?
        .ok_or_else(|| LinkError::NotFound(snap.name.clone()))?;
    restore_from(nl, index, snap, &cur, home_name).await
}

/// [`restore`] from the device's current state `cur`.
async fn restore_from(
    nl: &Netlink,
    index: u32,
    snap: &LinkSnapshot,
    cur: &LinkSnapshot,
    home_name: HomeName,
) -> Result<Returned, LinkError> {
    let result = restore_name(nl, index, snap, cur, home_name).await?;
    restore_settings(nl, index, snap, cur).await?;
    restore_altnames(nl, index, snap, cur).await?;
    // Phase 4: the addresses the move dropped.
    for a in snap
        .addresses
        .iter()
        .filter(|a| !cur.addresses.iter().any(|c| c.same_as(a)))
    {
        restore_address(nl, index, a).await?;
    }
    let now_name = match &result {
        Returned::NameBusy { temp_name } => temp_name.as_str(),
        Returned::Restored => snap.name.as_str(),
    };
    // Phase 7, the admin state: last.
    let up = if snap.up {
        Some(true)
    } else {
        cur.up.then_some(false)
    };
    if !(snap.sysctls.is_empty() && snap.features.is_empty() && snap.private_flags.is_empty()) {
        // Phases 5 to 7 in one blocking call (one pool thread's wake-up per device, not one
        // per phase): the admin state is set from that thread, on a socket of its own in the
        // host netns, which every pool thread is in.
        let (now_name, snap, cur_sysctls) = (now_name.to_owned(), snap.clone(), cur.sysctls.clone());
        super::off_async("restoring sysctls, offloads and the admin state", move || {
            restore_sysctls(&now_name, &snap, &cur_sysctls);
            restore_offloads(index, &snap)?;
            up.map_or(Ok(()), |up| set_up_blocking(index, up))
        })
        .await??;
    } else if let Some(up) = up {
        set_up(nl, index, up).await?;
    }
    Ok(result)
}

/// Phase 1: the host name back; under a temporary name when it is taken (or kept as it is when
/// it came home under one: [`HomeName::Temporary`]).
async fn restore_name(
    nl: &Netlink,
    index: u32,
    snap: &LinkSnapshot,
    cur: &LinkSnapshot,
    home_name: HomeName,
) -> Result<Returned, LinkError> {
    if cur.name == snap.name {
        return Ok(Returned::Restored);
    }
    if home_name == HomeName::Temporary {
        return Ok(Returned::NameBusy {
            temp_name: cur.name.clone(),
        });
    }
    // Renaming needs the device down.
    set_up(nl, index, false).await?;
    let mut m = LinkMessage::default();
    m.header.index = index;
    m.attributes.push(LinkAttribute::IfName(snap.name.clone()));
    match nl.newlink(m, "rename").await {
        Ok(()) => Ok(Returned::Restored),
        Err(e) if e.errno() == Some(libc::EEXIST) => {
            let tmp = temp_name_of(snap, index);
            if cur.name != tmp {
                let mut m = LinkMessage::default();
                m.header.index = index;
                m.attributes.push(LinkAttribute::IfName(tmp.clone()));
                nl.newlink(m, "rename to the temporary name").await?;
            }
            Ok(Returned::NameBusy { temp_name: tmp })
        }
        Err(e) => Err(e),
    }
}

/// Phase 2: MTU, MAC, GSO/GRO limits and alias, in one `RTM_NEWLINK` of what differs.
async fn restore_settings(
    nl: &Netlink,
    index: u32,
    snap: &LinkSnapshot,
    cur: &LinkSnapshot,
) -> Result<(), LinkError> {
    let m = settings_diff(index, snap, cur)?;
    if changes_anything(&m) {
        nl.newlink(m, "restore settings").await?;
    }
    Ok(())
}

/// The settings of `snap` (MTU, MAC, GSO/GRO limits, alias) that differ in `cur`, as one
/// `RTM_NEWLINK` for link `index` (no attribute: none differs).
fn settings_diff(index: u32, snap: &LinkSnapshot, cur: &LinkSnapshot) -> Result<LinkMessage, LinkError> {
    let diff = |a: Option<u32>, b: Option<u32>| if a != b { a } else { None };
    let mac = match (&snap.mac, &cur.mac) {
        (Some(want), Some(have)) if !want.eq_ignore_ascii_case(have) => Some(parse_mac(want)?),
        _ => None,
    };
    let mut m = settings(
        index,
        (snap.mtu != cur.mtu && snap.mtu > 0).then_some(snap.mtu),
        mac,
        Sizes::of_snapshot(snap).differing_from(Sizes::of_snapshot(cur)),
    );
    if snap.alias != cur.alias {
        m.attributes
            .push(LinkAttribute::IfAlias(snap.alias.clone().unwrap_or_default()));
    }
    if let Some(v) = diff(snap.txqlen, cur.txqlen) {
        m.attributes.push(LinkAttribute::TxQueueLen(v));
    }
    if let Some(v) = diff(snap.group, cur.group) {
        m.attributes.push(LinkAttribute::Group(v));
    }
    // Flags: `ifi_change` names the ones that differ, `ifi_flags` their host values.
    if let (Some(want), Some(have)) = (snap.flags, cur.flags) {
        let change = (want ^ have) & SETTABLE_FLAGS;
        if change != 0 {
            m.header.change_mask = LinkFlags::from_bits_retain(change);
            m.header.flags = LinkFlags::from_bits_retain(want & change);
        }
    }
    Ok(m)
}

/// Whether a settings message of [`settings_diff`] changes anything.
fn changes_anything(m: &LinkMessage) -> bool {
    !m.attributes.is_empty() || !m.header.change_mask.is_empty()
}

/// A device home under the temporary name `temp` (its host name was taken): if that name is
/// free now, gives it back and restores the rest of `snap` (the rename takes the device down).
/// `None`: no link of that name is the device by its kernel identity (gone, or renamed by
/// someone else). The squatter is never touched: a name still taken leaves it `NameBusy`.
pub async fn reclaim_name(
    nl: &Netlink,
    temp: &str,
    snap: &LinkSnapshot,
) -> Result<Option<Returned>, LinkError> {
    let Some(m) = nl.link_by_name(temp).await?.filter(|m| same_device(m, snap)) else {
        return Ok(None);
    };
    if nl.link_by_name(&snap.name).await?.is_some() {
        return Ok(Some(Returned::NameBusy {
            temp_name: temp.to_owned(),
        }));
    }
    restore(nl, m.header.index, snap, HomeName::Own).await.map(Some)
}

/// Removes altnames `alts` of link `index` (in the netns of `nl`); one already gone is fine.
async fn drop_altnames<'a>(
    nl: &Netlink,
    index: u32,
    alts: impl Iterator<Item = &'a String>,
) -> Result<(), LinkError> {
    for alt in alts {
        match nl
            .handle
            .link()
            .property_del(index)
            .alt_ifname(&[alt.as_str()])
            .execute()
            .await
        {
            Ok(()) => {}
            Err(e) if matches!(errno_of(&e), Some(libc::ENOENT | libc::ENODEV)) => {}
            Err(e) => return Err(nl_err("remove an altname added in the pod", e)),
        }
    }
    Ok(())
}

/// Phase 3: the alternative names the device lost, and none it gained (a device repaired in
/// the host after the kernel returned it may carry altnames the pod added).
async fn restore_altnames(
    nl: &Netlink,
    index: u32,
    snap: &LinkSnapshot,
    cur: &LinkSnapshot,
) -> Result<(), LinkError> {
    drop_altnames(
        nl,
        index,
        cur.altnames.iter().filter(|a| !snap.altnames.contains(a)),
    )
    .await?;
    for alt in snap.altnames.iter().filter(|a| !cur.altnames.contains(a)) {
        match nl
            .handle
            .link()
            .property_add(index)
            .alt_ifname(&[alt.as_str()])
            .execute()
            .await
        {
            Ok(()) => {}
            Err(e) if errno_of(&e) == Some(libc::EEXIST) => {}
            Err(e) => return Err(nl_err("restore altname", e)),
        }
    }
    Ok(())
}

/// Phase 5: IP sysctls the move reset to the host defaults. A value the kernel refuses does not
/// undo a return that otherwise worked: it is logged.
fn restore_sysctls(now_name: &str, snap: &LinkSnapshot, cur: &BTreeMap<String, i32>) {
    if snap.sysctls.is_empty() {
        return;
    }
    match sysctl::restore(now_name, &snap.sysctls, cur) {
        Ok(done) if !done.is_empty() => {
            tracing::info!(device = snap.name, sysctls = ?done, "sysctls restored");
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(device = snap.name, error = %crate::telemetry::chain(&e), "restoring a sysctl");
        }
    }
}

/// Phase 6: offloads, whatever differs from the snapshot, whether dranet or the pod changed it
/// (read here first).
fn restore_offloads(index: u32, snap: &LinkSnapshot) -> Result<(), LinkError> {
    if snap.features.is_empty() && snap.private_flags.is_empty() {
        return Ok(());
    }
    let done =
        Ethtool::open()?.restore_from(&Dev::Index(index), None, &snap.features, &snap.private_flags)?;
    if !done.features.is_empty() || !done.private_flags.is_empty() {
        tracing::info!(
            device = snap.name,
            features = ?done.features,
            private_flags = ?done.private_flags,
            "offloads restored"
        );
    }
    Ok(())
}

/// A managed device appeared in the host netns by itself (the kernel returned it, DOWN, under
/// the pod-side name or `devN`): rename it back and restore the snapshot. The link at `index`
/// must be the device by its kernel identity: back at its own host ifindex, or carrying its
/// parent device or permanent MAC ([`has_strong_identity`]), and [`same_device`]. Any other link
/// is refused, whatever its name or MAC.
pub async fn repair(nl: &Netlink, index: u32, snap: &LinkSnapshot) -> Result<Returned, LinkError> {
    let m = nl
        .link_by_index(index)
        .await?
        .ok_or_else(|| LinkError::NotFound(format!("ifindex {index}")))?;
    // Its own host ifindex (0: unknown, never a match), or an identity that travels (parent
    // device, permanent MAC).
    let identified = (snap.ifindex > 0 && index == snap.ifindex) || has_strong_identity(snap);
    if !identified || !same_device(&m, snap) {
        return Err(LinkError::NotTheDevice {
            index,
            device: snap.name.clone(),
        });
    }
    restore(nl, index, snap, HomeName::Own).await
}

/// Looks for the device of `snap` in the host by its kernel identity (at its host ifindex, or
/// anywhere by parent device or permanent MAC) and restores it. [`LinkError::Lost`] if it is not
/// there: no host link is ever taken for it on the strength of a name or a MAC.
pub async fn find_and_repair(nl: &Netlink, snap: &LinkSnapshot) -> Result<Returned, LinkError> {
    let found = match at_home(nl, snap).await? {
        Some(m) => Some(m),
        None => find_in_host(nl, snap).await?,
    };
    match found {
        Some(m) => restore(nl, m.header.index, snap, HomeName::Own).await,
        None => Err(LinkError::Lost {
            name: snap.name.clone(),
            mac: snap.mac.clone(),
        }),
    }
}
