//! Link operations over rtnetlink (fenced: touches the kernel): snapshot a device's host state,
//! attach (one `RTM_NEWLINK` that moves, renames and sets MTU/MAC/GSO/GRO together), detach
//! (move back through the pinned netns) and full restore, and repair of a device the kernel
//! returned by itself.
//!
//! Offload features and private flags (ethtool) are part of the snapshot and of the restore,
//! through [`crate::ethtool`]: the host's wanted state of every changeable feature is recorded
//! before the move, the claim's `ethtool` block is applied inside the pod after it, and every
//! feature or flag that differs from the snapshot when the device comes home is put back.
//!
//! Everything inside a pod netns goes through a [`Netlink`] whose socket was opened inside that
//! netns (on a throw-away thread, see [`crate::netns::in_netns`]): no tokio worker ever
//! `setns`es.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};

use futures::TryStreamExt;
use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage, Prop};
use netlink_packet_route::route::RouteScope;
use rtnetlink::{Handle, RouteMessageBuilder};
use serde::{Deserialize, Serialize};

use crate::config::RouteConfig;
use crate::ethtool::{self, Dev, Ethtool, EthtoolError};
use crate::netns::{Netns, NetnsError};
use crate::plan::DevicePlan;

pub mod address;
pub mod sysctl;
pub use address::AddrSnapshot;
pub use sysctl::PodSysctl;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("interface {0:?} not found")]
    NotFound(String),
    #[error(
        "link {index} is not device {device} by its kernel identity (kind, parent device, permanent MAC)"
    )]
    NotTheDevice { index: u32, device: String },
    #[error("device {name} (mac {mac:?}) is neither in the pod nor in the host")]
    Lost { name: String, mac: Option<String> },
    #[error("netlink {what}: {source}")]
    Netlink {
        what: &'static str,
        #[source]
        source: Box<rtnetlink::Error>,
    },
    #[error("opening an rtnetlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("invalid interface name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("invalid hardware address {0:?}")]
    InvalidMac(String),
    #[error("invalid address {0:?} (want CIDR like 10.0.0.2/24)")]
    InvalidAddress(String),
    #[error("invalid route {0}")]
    InvalidRoute(String),
    #[error("interface name {0:?} is already taken in the pod netns")]
    NameTaken(String),
    #[error("no rtnetlink socket inside the pod netns")]
    NoPodNetlink,
    #[error(transparent)]
    Ethtool(#[from] EthtoolError),
    #[error("ethtool.{field}: {reason}")]
    Offload { field: String, reason: String },
    #[error("sysctl {key}: {reason}")]
    Sysctl { key: String, reason: String },
    #[error("interface.vrf {name:?}: {reason}")]
    Vrf { name: String, reason: String },
    #[error(transparent)]
    Ebpf(#[from] crate::bpf::BpfError),
    #[error("{what}: no answer from the kernel within {after:?}")]
    Timeout {
        what: &'static str,
        after: std::time::Duration,
    },
}

impl LinkError {
    /// The kernel's errno for a netlink error, if this is one.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Netlink { source, .. } => errno_of(source),
            _ => None,
        }
    }
}

fn nl(what: &'static str) -> impl FnOnce(rtnetlink::Error) -> LinkError {
    move |source| LinkError::Netlink {
        what,
        source: Box::new(source),
    }
}

/// An rtnetlink connection bound to one netns. Cheap to clone; the connection task ends when
/// the last clone is dropped.
#[derive(Clone, Debug)]
pub struct Netlink {
    handle: Handle,
}

impl Netlink {
    /// rtnetlink in the driver's own (host) netns.
    pub async fn host() -> Result<Self, LinkError> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(LinkError::Socket)?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    /// rtnetlink inside `netns`: the socket is created on a thread inside it.
    pub async fn in_netns(netns: &Netns) -> Result<Self, LinkError> {
        let fd = crate::netns::socket_in(netns, netlink_sys::constants::NETLINK_ROUTE)?
            .map_err(LinkError::Socket)?;
        let raw = fd.into_raw_fd();
        // SAFETY: `raw` is an owned, non-blocking netlink socket we just released from its
        // OwnedFd; TokioSocket takes over its ownership (and closes it on drop).
        let sock = unsafe { netlink_sys::TokioSocket::from_raw_fd(raw) };
        let (conn, handle, _) = rtnetlink::from_socket(sock);
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    /// The raw handle (for the watcher and tests).
    #[must_use]
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// A link by name.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<LinkMessage>, LinkError> {
        let mut s = self.handle.link().get().match_name(name.to_owned()).execute();
        match s.try_next().await {
            Ok(m) => Ok(m),
            Err(e) if errno_of(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(nl("get link by name")(e)),
        }
    }

    /// A link by index.
    pub async fn link_by_index(&self, index: u32) -> Result<Option<LinkMessage>, LinkError> {
        let mut s = self.handle.link().get().match_index(index).execute();
        match s.try_next().await {
            Ok(m) => Ok(m),
            Err(e) if errno_of(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(nl("get link by index")(e)),
        }
    }

    /// Every link.
    pub async fn links(&self) -> Result<Vec<LinkMessage>, LinkError> {
        self.handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(nl("dump links"))
    }

    async fn addresses(&self, index: u32) -> Result<Vec<AddressMessage>, LinkError> {
        self.handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(nl("dump addresses"))
    }

    /// Sends one RTM_NEWLINK modifying an existing link (no NLM_F_CREATE/EXCL: `do_setlink`).
    async fn newlink(&self, msg: LinkMessage, what: &'static str) -> Result<(), LinkError> {
        let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewLink(msg));
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        let mut h = self.handle.clone();
        let mut resp = h.request(req).map_err(nl(what))?;
        while let Some(m) = futures::StreamExt::next(&mut resp).await {
            if let NetlinkPayload::Error(e) = m.payload
                && e.code.is_some()
            {
                return Err(LinkError::Netlink {
                    what,
                    source: Box::new(rtnetlink::Error::NetlinkError(e)),
                });
            }
        }
        Ok(())
    }
}

fn errno_of(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

/// A device's host state, taken before it moves and restored when it comes home.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkSnapshot {
    pub ifindex: u32,
    pub name: String,
    #[serde(default)]
    pub altnames: Vec<String>,
    #[serde(default)]
    pub alias: Option<String>,
    pub mtu: u32,
    pub mac: Option<String>,
    #[serde(default)]
    pub perm_mac: Option<String>,
    #[serde(default)]
    pub gso_max_size: Option<u32>,
    #[serde(default)]
    pub gso_max_segs: Option<u32>,
    #[serde(default)]
    pub gro_max_size: Option<u32>,
    #[serde(default)]
    pub gso_ipv4_max_size: Option<u32>,
    #[serde(default)]
    pub gro_ipv4_max_size: Option<u32>,
    /// Administratively up.
    pub up: bool,
    /// Addresses with everything a restore puts back (IPv6 link-local left out: the kernel
    /// recreates it). Checkpoint format 1 stored `ip/prefix` strings; they still load.
    #[serde(default)]
    pub addresses: Vec<AddrSnapshot>,
    /// Link kind (`IFLA_INFO_KIND`: `veth`, `dummy`, ...); `None` for a physical device, which
    /// has no `rtnl_link_ops`. Identity: a pod can only create links that have a kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Parent device, `<bus>/<name>` (`pci/0000:3b:00.1`, `virtio/virtio2`); `None` for virtual
    /// devices. Identity: set by the kernel, not by anything a pod or a claim can write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// `kind` and `parent` were read (false in a snapshot from checkpoint format 1, which had
    /// neither: such a device is identified by its permanent MAC alone).
    #[serde(default)]
    pub identified: bool,
    /// Wanted state of every changeable offload feature (`ethtool -k`, kernel names).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub features: BTreeMap<String, bool>,
    /// Every private flag (`ethtool --show-priv-flags`) of the driver.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub private_flags: BTreeMap<String, bool>,
    /// Per-device IP sysctls, `ipv4/<name>` / `ipv6/<name>` (see [`sysctl`]: a netns move
    /// resets them to the destination's defaults).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sysctls: BTreeMap<String, i32>,
}

impl LinkSnapshot {
    /// The fields a restore puts back, for comparisons (ifindex may legitimately change).
    #[must_use]
    pub fn restorable(&self) -> Self {
        let mut s = self.clone();
        s.ifindex = 0;
        s.altnames.sort();
        s.addresses.sort();
        s
    }
}

fn mac_string(b: &[u8]) -> Option<String> {
    (!b.is_empty() && b.iter().any(|x| *x != 0))
        .then(|| b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(":"))
}

/// Parses a MAC in any form Go's `net.ParseMAC` accepts (`aa:bb:…`, `aa-bb-…`, `aabb.ccdd.…`)
/// into its octets.
pub fn parse_mac(s: &str) -> Result<Vec<u8>, LinkError> {
    crate::config::mac_bytes(s).ok_or_else(|| LinkError::InvalidMac(s.to_owned()))
}

/// Parses `ip/prefix`.
pub fn parse_cidr(s: &str) -> Result<(IpAddr, u8), LinkError> {
    let bad = || LinkError::InvalidAddress(s.to_owned());
    let (ip, len) = s.split_once('/').ok_or_else(bad)?;
    let ip: IpAddr = ip.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(bad());
    }
    Ok((ip, len))
}

/// Kernel rules for interface names (`dev_valid_name`): 1–15 bytes, not `.`/`..`, no `/`,
/// `:` or whitespace; and no `%`, which the kernel expands as a template (`eth%d` → `eth0`).
pub fn validate_ifname(name: &str) -> Result<(), LinkError> {
    let bad = |reason| {
        Err(LinkError::InvalidName {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > 15 {
        return bad("longer than 15 bytes");
    }
    if name == "." || name == ".." {
        return bad("reserved");
    }
    if name.contains('/') {
        return bad("contains '/'");
    }
    if name.contains(':') {
        return bad("contains ':'");
    }
    if name.contains('%') {
        return bad("contains '%' (the kernel takes it as a name template)");
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("contains whitespace or control characters");
    }
    Ok(())
}

fn snapshot_of(m: &LinkMessage, addrs: &[AddressMessage]) -> LinkSnapshot {
    let mut s = LinkSnapshot {
        ifindex: m.header.index,
        up: m.header.flags.contains(LinkFlags::Up),
        ..LinkSnapshot::default()
    };
    let (mut bus, mut parent) = (None, None);
    s.identified = true;
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => s.name.clone_from(n),
            LinkAttribute::Mtu(v) => s.mtu = *v,
            LinkAttribute::Address(b) => s.mac = mac_string(b),
            LinkAttribute::PermAddress(b) => s.perm_mac = mac_string(b),
            LinkAttribute::IfAlias(v) if !v.is_empty() => s.alias = Some(v.clone()),
            LinkAttribute::PropList(props) => {
                for p in props {
                    if let Prop::AltIfName(n) = p {
                        s.altnames.push(n.clone());
                    }
                }
            }
            LinkAttribute::GsoMaxSize(v) => s.gso_max_size = Some(*v),
            LinkAttribute::GsoMaxSegs(v) => s.gso_max_segs = Some(*v),
            LinkAttribute::GroMaxSize(v) => s.gro_max_size = Some(*v),
            LinkAttribute::GsoIpv4MaxSize(v) => s.gso_ipv4_max_size = Some(*v),
            LinkAttribute::GroIpv4MaxSize(v) => s.gro_ipv4_max_size = Some(*v),
            LinkAttribute::LinkInfo(infos) => s.kind = kind_of(infos),
            LinkAttribute::ParentDevBusName(b) => bus = Some(b.clone()),
            LinkAttribute::ParentDevName(n) => parent = Some(n.clone()),
            _ => {}
        }
    }
    s.parent = parent.map(|p| format!("{}/{p}", bus.unwrap_or_default()));
    s.addresses = addrs
        .iter()
        .filter_map(|a| AddrSnapshot::of(a, &s.name))
        .collect();
    s.altnames.sort();
    s.addresses.sort();
    s
}

/// What a link message says of a device (no addresses, no sysctls): its name, MTU, MACs, link
/// kind and parent device.
#[must_use]
pub fn snapshot_of_message(m: &LinkMessage) -> LinkSnapshot {
    snapshot_of(m, &[])
}

/// Whether link `m` started life outside the netns it is in: it has a parent bus device (no
/// pod or CNI creates one), or its peer or lower device lives in another netns
/// (`IFLA_LINK_NETNSID`). A link a pod made in its own netns has neither.
#[must_use]
pub fn came_from_elsewhere(m: &LinkMessage) -> bool {
    m.attributes
        .iter()
        .any(|a| matches!(a, LinkAttribute::ParentDevName(_) | LinkAttribute::LinkNetNsId(_)))
}

/// The temporary host name of the device of `snap` now at `index`: `dn<host ifindex>`, or
/// `dn<index>` when its host ifindex is unknown (a record rebuilt from a pin).
fn temp_name_of(snap: &LinkSnapshot, index: u32) -> String {
    temp_name(if snap.ifindex > 0 { snap.ifindex } else { index })
}

fn kind_of(infos: &[netlink_packet_route::link::LinkInfo]) -> Option<String> {
    use netlink_packet_route::link::LinkInfo;
    infos.iter().find_map(|i| match i {
        LinkInfo::Kind(k) => Some(k.to_string()),
        _ => None,
    })
}

/// The host state of the device named `name`.
pub async fn snapshot(nl: &Netlink, name: &str) -> Result<LinkSnapshot, LinkError> {
    let m = nl
        .link_by_name(name)
        .await?
        .ok_or_else(|| LinkError::NotFound(name.to_owned()))?;
    let addrs = nl.addresses(m.header.index).await?;
    let mut s = snapshot_of(&m, &addrs);
    // Not in `snapshot_of`: device lookups by MAC call that for every link.
    s.sysctls = sysctl::of_link(&m);
    match host_offloads(&Dev::Index(s.ifindex)) {
        Ok((features, flags)) => {
            s.features = features.changeable_wanted();
            s.private_flags = flags;
        }
        // A kernel without ethtool netlink: nothing to snapshot (nor to apply: a config that
        // asks for offloads fails at Prepare and at attach).
        Err(EthtoolError::NoFamily) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(s)
}

/// The features and private flags of a device in the driver's (host) netns.
pub fn host_offloads(dev: &Dev) -> Result<(ethtool::Features, BTreeMap<String, bool>), EthtoolError> {
    let mut e = Ethtool::open()?;
    Ok((e.features(dev)?, e.private_flags(dev)?))
}

/// Kernel feature names to set and private flags to set, each name → wanted state.
pub type ResolvedOffloads = (BTreeMap<String, bool>, BTreeMap<String, bool>);

/// Checks a claim's `ethtool` block against a device's `features` and `flags`: features by
/// kernel name or ethtool(8) alias (aliases expanded, explicit kernel names winning), private
/// flags by name. Returns the kernel feature names to set and the flags, or one problem per
/// bad entry (`features.<name>: why`, `privateFlags.<name>: why`).
pub fn resolve_offloads(
    features: &ethtool::Features,
    flags: &BTreeMap<String, bool>,
    want_features: &BTreeMap<String, bool>,
    want_flags: &BTreeMap<String, bool>,
) -> Result<ResolvedOffloads, Vec<(String, String)>> {
    let mut problems = Vec::new();
    let mut out = BTreeMap::new();
    // Aliases first, so that a kernel name given as well overrides what an alias expanded to.
    let (exact, aliases): (Vec<_>, Vec<_>) = want_features.iter().partition(|(n, _)| features.knows(n));
    for (name, on) in aliases.into_iter().chain(exact) {
        match ethtool::resolve_feature(features, name, *on) {
            Ok(m) => out.extend(m),
            Err(p) => problems.push((format!("features.{name}"), p.to_string())),
        }
    }
    for name in want_flags.keys().filter(|n| !flags.contains_key(n.as_str())) {
        let have = if flags.is_empty() {
            "the device has none".to_owned()
        } else {
            format!(
                "the device has {}",
                flags.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
            )
        };
        problems.push((
            format!("privateFlags.{name}"),
            format!("unknown private flag ({have})"),
        ));
    }
    problems.sort();
    if problems.is_empty() {
        Ok((out, want_flags.clone()))
    } else {
        Err(problems)
    }
}

/// The state of the device with `index`, or `None` if there is none.
pub async fn snapshot_index(nl: &Netlink, index: u32) -> Result<Option<LinkSnapshot>, LinkError> {
    let Some(m) = nl.link_by_index(index).await? else {
        return Ok(None);
    };
    let addrs = nl.addresses(index).await?;
    let mut s = snapshot_of(&m, &addrs);
    s.sysctls = sysctl::of_link(&m);
    Ok(Some(s))
}

/// How a device looks inside the pod (from the claim's config).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttachSpec {
    pub pod_ifname: String,
    pub mtu: Option<u32>,
    pub mac: Option<Vec<u8>>,
    pub gso_max_size: Option<u32>,
    pub gro_max_size: Option<u32>,
    pub gso_ipv4_max_size: Option<u32>,
    pub gro_ipv4_max_size: Option<u32>,
    pub addresses: Vec<(IpAddr, u8)>,
    pub routes: Vec<RouteConfig>,
    pub rules: Vec<Rule>,
    /// Permanent neighbour entries: IP → MAC.
    pub neighbors: Vec<(IpAddr, Vec<u8>)>,
    /// Offload features to set inside the pod (kernel names or ethtool(8) aliases; resolved
    /// against the device before it moves).
    pub features: BTreeMap<String, bool>,
    /// Private flags to set inside the pod.
    pub private_flags: BTreeMap<String, bool>,
    /// Per-device sysctls written in the pod before the link comes up (`arpIgnore`,
    /// `arpAnnounce`, `forwarding`).
    pub sysctls: Vec<PodSysctl>,
    /// `interface.vrf`: the VRF (name, table) the device is enslaved to in the pod; every route
    /// of the device then goes to that table.
    pub vrf: Option<(String, u32)>,
    /// `interface.disableEbpfPrograms`: detach the device's TC BPF filters and TCX programs
    /// inside the pod right after the move (never re-attached when it comes home).
    pub disable_ebpf: bool,
}

/// A policy routing rule inside the pod (validated from `RuleConfig`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    pub priority: Option<u32>,
    pub source: Option<(IpAddr, u8)>,
    pub destination: Option<(IpAddr, u8)>,
    pub table: u32,
}

fn prefix(s: &str) -> Result<Option<(IpAddr, u8)>, LinkError> {
    if s.is_empty() {
        return Ok(None);
    }
    if s.contains('/') {
        return parse_cidr(s).map(Some);
    }
    let ip: IpAddr = s.parse().map_err(|_| LinkError::InvalidAddress(s.to_owned()))?;
    Ok(Some((ip, if ip.is_ipv4() { 32 } else { 128 })))
}

fn rule_of(r: &crate::config::RuleConfig) -> Result<Rule, LinkError> {
    let bad = |why: &str| LinkError::InvalidRoute(format!("rule {r:?}: {why}"));
    let source = prefix(&r.source).map_err(|_| bad("source"))?;
    let destination = prefix(&r.destination).map_err(|_| bad("destination"))?;
    if let (Some((a, _)), Some((b, _))) = (source, destination)
        && a.is_ipv4() != b.is_ipv4()
    {
        return Err(bad("source and destination of different families"));
    }
    let table = if r.table == 0 {
        254
    } else {
        u32::try_from(r.table).map_err(|_| bad("table"))?
    };
    let priority = if r.priority == 0 {
        None
    } else {
        Some(u32::try_from(r.priority).map_err(|_| bad("priority"))?)
    };
    Ok(Rule {
        priority,
        source,
        destination,
        table,
    })
}

async fn add_rule(nl: &Netlink, r: &Rule) -> Result<(), LinkError> {
    use netlink_packet_route::rule::RuleAction;
    let v6 = r.source.or(r.destination).is_some_and(|(ip, _)| ip.is_ipv6());
    let res = if v6 {
        let mut q = nl
            .handle
            .rule()
            .add()
            .v6()
            .table_id(r.table)
            .action(RuleAction::ToTable);
        if let Some(p) = r.priority {
            q = q.priority(p);
        }
        if let Some((IpAddr::V6(ip), len)) = r.source {
            q = q.source_prefix(ip, len);
        }
        if let Some((IpAddr::V6(ip), len)) = r.destination {
            q = q.destination_prefix(ip, len);
        }
        q.execute().await
    } else {
        let mut q = nl
            .handle
            .rule()
            .add()
            .v4()
            .table_id(r.table)
            .action(RuleAction::ToTable);
        if let Some(p) = r.priority {
            q = q.priority(p);
        }
        if let Some((IpAddr::V4(ip), len)) = r.source {
            q = q.source_prefix(ip, len);
        }
        if let Some((IpAddr::V4(ip), len)) = r.destination {
            q = q.destination_prefix(ip, len);
        }
        q.execute().await
    };
    match res {
        Ok(()) => Ok(()),
        Err(e) if errno_of(&e) == Some(libc::EEXIST) => Ok(()),
        Err(e) => Err(nl_err("add rule", e)),
    }
}

async fn add_neighbor(nl: &Netlink, index: u32, ip: IpAddr, mac: &[u8]) -> Result<(), LinkError> {
    use netlink_packet_route::neighbour::NeighbourState;
    match nl
        .handle
        .neighbours()
        .add(index, ip)
        .link_layer_address(mac)
        .state(NeighbourState::Permanent)
        .replace()
        .execute()
        .await
    {
        Ok(()) => Ok(()),
        Err(e) => Err(nl_err("add neighbour", e)),
    }
}

fn positive(v: Option<i32>) -> Option<u32> {
    v.and_then(|x| u32::try_from(x).ok()).filter(|x| *x > 0)
}

impl AttachSpec {
    /// Builds and validates the spec of one planned device: every parse error surfaces before
    /// anything moves.
    pub fn from_plan(d: &DevicePlan, pod_ifname: &str) -> Result<Self, LinkError> {
        validate_ifname(pod_ifname)?;
        let i = &d.config.interface;
        let mac = match i.hardware_addr.as_deref().filter(|m| !m.is_empty()) {
            Some(m) => Some(parse_mac(m)?),
            None => None,
        };
        let addresses = i
            .addresses
            .iter()
            .map(|a| parse_cidr(a))
            .collect::<Result<Vec<_>, _>>()?;
        for r in &d.config.routes {
            route_message(r, 0)?;
        }
        let rules = d
            .config
            .rules
            .iter()
            .map(rule_of)
            .collect::<Result<Vec<_>, _>>()?;
        let neighbors = d
            .config
            .neighbors
            .iter()
            .map(|n| {
                let ip: IpAddr = n
                    .destination
                    .parse()
                    .map_err(|_| LinkError::InvalidAddress(n.destination.clone()))?;
                Ok((ip, parse_mac(&n.hardware_addr)?))
            })
            .collect::<Result<Vec<_>, LinkError>>()?;
        let sysctls = pod_sysctls(i)?;
        let vrf = match &i.vrf {
            None => None,
            Some(v) => {
                let bad = |reason: &str| LinkError::Vrf {
                    name: v.name.clone(),
                    reason: reason.to_owned(),
                };
                validate_ifname(&v.name).map_err(|_| bad("not a valid interface name"))?;
                if v.name == pod_ifname {
                    return Err(bad("has the name of the device itself"));
                }
                let mut cfg = d.config.clone();
                cfg.apply_defaults();
                let table = cfg
                    .interface
                    .vrf
                    .and_then(|v| v.table)
                    .and_then(|t| u32::try_from(t).ok())
                    .filter(|t| *t > 0 && !(253..=255).contains(t))
                    .ok_or_else(|| bad("table must be > 0 and not 253, 254 or 255"))?;
                Some((v.name.clone(), table))
            }
        };
        Ok(Self {
            sysctls,
            vrf,
            pod_ifname: pod_ifname.to_owned(),
            mtu: positive(i.mtu),
            mac,
            gso_max_size: positive(i.gso_max_size),
            gro_max_size: positive(i.gro_max_size),
            gso_ipv4_max_size: positive(i.gso_ipv4_max_size),
            gro_ipv4_max_size: positive(i.gro_ipv4_max_size),
            addresses,
            routes: d.config.routes.clone(),
            rules,
            neighbors,
            features: d
                .config
                .ethtool
                .as_ref()
                .map(|e| e.features.clone())
                .unwrap_or_default(),
            private_flags: d
                .config
                .ethtool
                .as_ref()
                .map(|e| e.private_flags.clone())
                .unwrap_or_default(),
            disable_ebpf: i.disable_ebpf_programs == Some(true),
        })
    }
}

/// The per-device sysctls an interface config asks for, checked against upstream's ranges.
fn pod_sysctls(i: &crate::config::InterfaceConfig) -> Result<Vec<PodSysctl>, LinkError> {
    let mut out = Vec::new();
    let mut one = |key: &str, v: i32, ok: bool| {
        if ok {
            out.push(PodSysctl::Device {
                key: key.to_owned(),
                value: v,
                optional: false,
            });
            Ok(())
        } else {
            Err(LinkError::Sysctl {
                key: key.to_owned(),
                reason: format!("{v} is out of range"),
            })
        }
    };
    if let Some(v) = i.arp_ignore {
        one("ipv4/arp_ignore", v, matches!(v, 0..=3 | 8))?;
    }
    if let Some(v) = i.arp_announce {
        one("ipv4/arp_announce", v, (0..=2).contains(&v))?;
    }
    if i.forwarding == Some(true) {
        one("ipv4/forwarding", 1, true)?;
        // Without IPv6 on the device there is nothing to forward.
        out.push(PodSysctl::Device {
            key: "ipv6/forwarding".into(),
            value: 1,
            optional: true,
        });
    }
    Ok(out)
}

fn route_message(r: &RouteConfig, oif: u32) -> Result<netlink_packet_route::route::RouteMessage, LinkError> {
    let bad = |why: &str| LinkError::InvalidRoute(format!("{r:?}: {why}"));
    let mut b = RouteMessageBuilder::<IpAddr>::new();
    if !r.destination.is_empty() {
        let (ip, len) = if r.destination.contains('/') {
            parse_cidr(&r.destination).map_err(|_| bad("destination"))?
        } else {
            let ip: IpAddr = r.destination.parse().map_err(|_| bad("destination"))?;
            (ip, if ip.is_ipv4() { 32 } else { 128 })
        };
        b = b.destination_prefix(ip, len).map_err(|e| bad(&e.to_string()))?;
    }
    if !r.gateway.is_empty() {
        let gw: IpAddr = r.gateway.parse().map_err(|_| bad("gateway"))?;
        b = b.gateway(gw).map_err(|e| bad(&e.to_string()))?;
    }
    if !r.source.is_empty() {
        let src: IpAddr = r.source.parse().map_err(|_| bad("source"))?;
        b = b.pref_source(src).map_err(|e| bad(&e.to_string()))?;
    }
    if r.destination.is_empty() && r.gateway.is_empty() {
        return Err(bad("needs a destination or a gateway"));
    }
    if r.scope != 0 {
        b = b.scope(RouteScope::from(r.scope));
    }
    if r.table != 0 {
        b = b.table_id(u32::try_from(r.table).map_err(|_| bad("table"))?);
    }
    Ok(b.output_interface(oif).build())
}

fn settings(
    index: u32,
    mtu: Option<u32>,
    mac: Option<Vec<u8>>,
    gso: Option<u32>,
    gro: Option<u32>,
    gso4: Option<u32>,
    gro4: Option<u32>,
) -> LinkMessage {
    let mut m = LinkMessage::default();
    m.header.index = index;
    if let Some(v) = mtu {
        m.attributes.push(LinkAttribute::Mtu(v));
    }
    if let Some(v) = mac {
        m.attributes.push(LinkAttribute::Address(v));
    }
    if let Some(v) = gso {
        m.attributes.push(LinkAttribute::GsoMaxSize(v));
    }
    if let Some(v) = gro {
        m.attributes.push(LinkAttribute::GroMaxSize(v));
    }
    if let Some(v) = gso4 {
        m.attributes.push(LinkAttribute::GsoIpv4MaxSize(v));
    }
    if let Some(v) = gro4 {
        m.attributes.push(LinkAttribute::GroIpv4MaxSize(v));
    }
    m
}

/// Sets the admin state (IFF_UP) of link `index` in `nl`'s netns, nothing else.
pub async fn set_admin_state(nl: &Netlink, index: u32, up: bool) -> Result<(), LinkError> {
    set_up(nl, index, up).await
}

async fn set_up(nl: &Netlink, index: u32, up: bool) -> Result<(), LinkError> {
    let mut m = LinkMessage::default();
    m.header.index = index;
    m.header.change_mask = LinkFlags::Up;
    if up {
        m.header.flags = LinkFlags::Up;
    }
    nl.newlink(m, if up { "set link up" } else { "set link down" })
        .await
}

async fn add_address(nl: &Netlink, index: u32, ip: IpAddr, len: u8) -> Result<(), LinkError> {
    match nl.handle.address().add(index, ip, len).execute().await {
        Ok(()) => Ok(()),
        Err(e) if errno_of(&e) == Some(libc::EEXIST) => Ok(()),
        Err(e) => Err(nl_err("add address", e)),
    }
}

/// Adds (or replaces, when only its details differ) one snapshotted address exactly as it was.
async fn restore_address(nl: &Netlink, index: u32, a: &AddrSnapshot) -> Result<(), LinkError> {
    let (ip, len) = a.ip_prefix()?;
    let mut req = nl.handle.address().add(index, ip, len).replace();
    a.shape(req.message_mut());
    req.execute().await.map_err(|e| nl_err("restore address", e))
}

fn nl_err(what: &'static str, source: rtnetlink::Error) -> LinkError {
    LinkError::Netlink {
        what,
        source: Box::new(source),
    }
}

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
    pod_ifindex: u32,
) -> Result<u32, LinkError> {
    // The device must still be the one we snapshotted.
    let cur = host_nl.link_by_index(snap.ifindex).await?;
    let same = cur.as_ref().is_some_and(|m| {
        same_device(m, snap)
            && m.attributes
                .iter()
                .any(|a| matches!(a, LinkAttribute::IfName(n) if *n == snap.name))
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
        let (have, have_flags) = host_offloads(&Dev::Index(snap.ifindex))?;
        resolve_offloads(&have, &have_flags, &spec.features, &spec.private_flags).map_err(|p| {
            let (field, reason) = p.into_iter().next().unwrap_or_default();
            LinkError::Offload { field, reason }
        })?
    };
    let mut m = settings(
        snap.ifindex,
        spec.mtu,
        spec.mac.clone(),
        spec.gso_max_size,
        spec.gro_max_size,
        spec.gso_ipv4_max_size,
        spec.gro_ipv4_max_size,
    );
    m.attributes
        .insert(0, LinkAttribute::NetNsFd(netns.as_fd().as_raw_fd()));
    m.attributes
        .insert(1, LinkAttribute::IfName(spec.pod_ifname.clone()));
    m.attributes.insert(
        2,
        LinkAttribute::NewIfIndex(i32::try_from(pod_ifindex).unwrap_or(0)),
    );
    host_nl.newlink(m, "move into the pod netns").await?;
    let index = match pod_nl.link_by_index(pod_ifindex).await? {
        Some(m) if same_device(&m, snap) => pod_ifindex,
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
    sysctl::set_in_pod(netns, &spec.pod_ifname, &spec.sysctls)?;
    if spec.disable_ebpf {
        detach_ebpf(pod_nl, netns, index, &spec.pod_ifname).await?;
    }
    for (ip, len) in &spec.addresses {
        add_address(pod_nl, index, *ip, *len).await?;
    }
    set_up(pod_nl, index, true).await?;
    if !features.is_empty() || !flags.is_empty() {
        Ethtool::open_in(netns)?.apply(&Dev::Index(index), &features, &flags)?;
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
    Ok(index)
}

fn set_route_table(msg: &mut netlink_packet_route::route::RouteMessage, table: u32) {
    use netlink_packet_route::route::RouteAttribute;
    msg.attributes.retain(|a| !matches!(a, RouteAttribute::Table(_)));
    msg.header.table = u8::try_from(table).unwrap_or(0);
    msg.attributes.push(RouteAttribute::Table(table));
}

/// The table of a VRF link, `None` if `m` is not a VRF.
fn vrf_table_of(m: &LinkMessage) -> Option<u32> {
    use netlink_packet_route::link::{InfoData, InfoKind, InfoVrf, LinkInfo};
    let infos = m.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(v) => Some(v),
        _ => None,
    })?;
    if !infos.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Vrf))) {
        return None;
    }
    infos.iter().find_map(|i| match i {
        LinkInfo::Data(InfoData::Vrf(v)) => v.iter().find_map(|x| match x {
            InfoVrf::TableId(t) => Some(*t),
            _ => None,
        }),
        _ => None,
    })
}

/// Creates the VRF `name` with `table` in the pod (or takes the one a previous device of the
/// pod created: devices may share it), sets it up, enslaves device `index` to it and turns on
/// `tcp_l3mdev_accept`/`udp_l3mdev_accept` so unbound sockets of the pod work across it.
/// Returns the table. A kernel without VRF support (`CONFIG_NET_VRF`) is a clear error.
async fn enslave_to_vrf(
    nl: &Netlink,
    netns: &Netns,
    index: u32,
    name: &str,
    table: u32,
) -> Result<u32, LinkError> {
    let bad = |reason: String| LinkError::Vrf {
        name: name.to_owned(),
        reason,
    };
    let m = match nl.link_by_name(name).await? {
        Some(m) => m,
        None => {
            match nl
                .handle
                .link()
                .add(rtnetlink::LinkVrf::new(name, table).build())
                .execute()
                .await
            {
                Ok(()) => {}
                Err(e) if errno_of(&e) == Some(libc::EEXIST) => {}
                Err(e) if errno_of(&e) == Some(libc::EOPNOTSUPP) => {
                    return Err(bad("this kernel has no VRF support (CONFIG_NET_VRF)".into()));
                }
                Err(e) => return Err(bad(format!("creating it: {e}"))),
            }
            nl.link_by_name(name)
                .await?
                .ok_or_else(|| bad("vanished right after it was created".into()))?
        }
    };
    match vrf_table_of(&m) {
        Some(t) if t == table => {}
        Some(t) => return Err(bad(format!("exists in the pod with table {t}, not {table}"))),
        None => return Err(bad("a device of that name in the pod is not a VRF".into())),
    }
    let vrf_index = m.header.index;
    set_up(nl, vrf_index, true).await?;
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg.attributes.push(LinkAttribute::Controller(vrf_index));
    nl.newlink(msg, "enslave to the VRF").await?;
    sysctl::set_in_pod(
        netns,
        name,
        &[
            PodSysctl::Ipv4Global {
                name: "tcp_l3mdev_accept",
                value: 1,
            },
            PodSysctl::Ipv4Global {
                name: "udp_l3mdev_accept",
                value: 1,
            },
        ],
    )?;
    Ok(table)
}

/// `disableEbpfPrograms`, inside the pod, before the link is set up: every TC BPF filter and
/// TCX program of the device goes; one left over fails the attach (the caller rolls back).
/// What is detached here is not re-attached when the device comes home: dranet does not own
/// those programs (upstream does not re-attach them either).
async fn detach_ebpf(pod_nl: &Netlink, netns: &Netns, index: u32, ifname: &str) -> Result<(), LinkError> {
    let done = crate::bpf::detach_in_pod(&pod_nl.handle, netns, index).await?;
    if !done.is_empty() {
        tracing::info!(device = ifname, detached = ?done.describe(), "eBPF programs detached in the pod");
    }
    Ok(())
}

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
async fn find_in_pod(
    pod_nl: &Netlink,
    snap: &LinkSnapshot,
    ifindex: Option<u32>,
    pod_ifname: &str,
) -> Result<Option<LinkMessage>, LinkError> {
    let found = match ifindex {
        Some(i) => pod_nl.link_by_index(i).await?,
        None => pod_nl.link_by_name(pod_ifname).await?,
    };
    Ok(found.filter(|m| same_device(m, snap)))
}

/// The device of `snap` where it started, if it never left (or is back): at its host ifindex in
/// the host netns, the same device by [`same_device`]. The host allocates ifindexes cyclically,
/// so another link does not get this one back while the device is away.
async fn at_home(nl: &Netlink, snap: &LinkSnapshot) -> Result<Option<LinkMessage>, LinkError> {
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
async fn find_in_host(nl: &Netlink, snap: &LinkSnapshot) -> Result<Option<LinkMessage>, LinkError> {
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
    /// The device's ifindex in the pod netns, recorded once the move was confirmed.
    pub pod_ifindex: Option<u32>,
    /// The name the move gave it (only consulted when `pod_ifindex` is unknown).
    pub pod_ifname: &'a str,
}

/// Moves the device of `req.snap` from the pod netns back to the host netns, under its host name
/// (or a temporary one if that is taken), then restores the snapshot. The device is taken by
/// its recorded ifindex and checked ([`same_device`]); an impostor stays in the pod and dies with
/// it. `moved_at` gets CLOCK_MONOTONIC ns (if still `None`) when the move is sent.
pub async fn detach(req: &DetachRequest<'_>, moved_at: &mut Option<u64>) -> Result<Returned, LinkError> {
    let snap = req.snap;
    // Both lookups at once (two sockets, two netns): one round trip less before the move,
    // which is the rescue's reaction time.
    let (in_pod, in_host) = futures::join!(
        find_in_pod(req.pod_nl, snap, req.pod_ifindex, req.pod_ifname),
        req.host_nl.link_by_name(&snap.name)
    );
    let Some(m) = in_pod? else {
        // Not in the pod: it never left the host (an attach that failed before its move), it
        // came home earlier, or the kernel returned it. Look in the host.
        return find_and_repair(req.host_nl, snap).await;
    };
    let pod_index = m.header.index;
    // The kernel moves first and renames after (a rename clash fails the request with the
    // device already moved), so pick a free host name up front.
    let host_busy = in_host?.is_some();
    let name = if host_busy {
        temp_name_of(snap, pod_index)
    } else {
        snap.name.clone()
    };
    let mut msg = LinkMessage::default();
    msg.header.index = pod_index;
    msg.attributes
        .push(LinkAttribute::NetNsFd(req.host.as_fd().as_raw_fd()));
    msg.attributes.push(LinkAttribute::IfName(name.clone()));
    // Back at its own host ifindex when that is free (it is, unless something asked for it).
    if snap.ifindex > 0 && req.host_nl.link_by_index(snap.ifindex).await?.is_none() {
        msg.attributes.push(LinkAttribute::NewIfIndex(
            i32::try_from(snap.ifindex).unwrap_or(0),
        ));
    }
    moved_at.get_or_insert_with(crate::watch::monotonic_ns);
    if let Err(e) = req.pod_nl.newlink(msg, "move back to the host netns").await {
        // Still in the pod: the error stands (the caller retries).
        if find_in_pod(req.pod_nl, snap, Some(pod_index), req.pod_ifname)
            .await
            .is_ok_and(|m| m.is_some())
        {
            return Err(e);
        }
        // It moved anyway: it is in the host under the name we asked for.
        return match moved_home(req.host_nl, &name, snap).await {
            Ok(Some(index)) => restore(req.host_nl, index, snap, host_busy).await,
            _ => Err(e),
        };
    }
    let index = moved_home(req.host_nl, &name, snap)
        .await?
        .ok_or(LinkError::NotFound(name))?;
    restore(req.host_nl, index, snap, host_busy).await
}

/// The host ifindex of the device a move just brought home under `name` (the move renamed it
/// in the same request, so the name is ours at this instant), checked with [`same_device`].
async fn moved_home(nl: &Netlink, name: &str, snap: &LinkSnapshot) -> Result<Option<u32>, LinkError> {
    Ok(nl
        .link_by_name(name)
        .await?
        .filter(|m| same_device(m, snap))
        .map(|m| m.header.index))
}

/// Restores a host device (found at `index`) to `snap`: name (unless `keep_name`), MTU, MAC,
/// GSO/GRO sizes, alias, altnames, addresses, offload features and private flags, admin state.
/// `nl` is the driver's own (host) netns, where the ethtool socket is opened too.
async fn restore(
    nl: &Netlink,
    index: u32,
    snap: &LinkSnapshot,
    keep_name: bool,
) -> Result<Returned, LinkError> {
    let cur = snapshot_index(nl, index)
        .await?
        .ok_or_else(|| LinkError::NotFound(snap.name.clone()))?;
    let mut result = Returned::Restored;
    if cur.name != snap.name {
        if keep_name {
            result = Returned::NameBusy {
                temp_name: cur.name.clone(),
            };
        } else {
            // Renaming needs the device down.
            set_up(nl, index, false).await?;
            let mut m = LinkMessage::default();
            m.header.index = index;
            m.attributes.push(LinkAttribute::IfName(snap.name.clone()));
            match nl.newlink(m, "rename").await {
                Ok(()) => {}
                Err(e) if e.errno() == Some(libc::EEXIST) => {
                    let tmp = temp_name_of(snap, index);
                    if cur.name != tmp {
                        let mut m = LinkMessage::default();
                        m.header.index = index;
                        m.attributes.push(LinkAttribute::IfName(tmp.clone()));
                        nl.newlink(m, "rename to the temporary name").await?;
                    }
                    result = Returned::NameBusy { temp_name: tmp };
                }
                Err(e) => return Err(e),
            }
        }
    }
    let diff = |a: Option<u32>, b: Option<u32>| if a != b { a } else { None };
    let mac = match (&snap.mac, &cur.mac) {
        (Some(want), Some(have)) if !want.eq_ignore_ascii_case(have) => Some(parse_mac(want)?),
        _ => None,
    };
    let mut m = settings(
        index,
        (snap.mtu != cur.mtu && snap.mtu > 0).then_some(snap.mtu),
        mac,
        diff(snap.gso_max_size, cur.gso_max_size),
        diff(snap.gro_max_size, cur.gro_max_size),
        diff(snap.gso_ipv4_max_size, cur.gso_ipv4_max_size),
        diff(snap.gro_ipv4_max_size, cur.gro_ipv4_max_size),
    );
    if snap.alias != cur.alias {
        m.attributes
            .push(LinkAttribute::IfAlias(snap.alias.clone().unwrap_or_default()));
    }
    if !m.attributes.is_empty() {
        nl.newlink(m, "restore settings").await?;
    }
    let missing: Vec<&str> = snap
        .altnames
        .iter()
        .filter(|a| !cur.altnames.contains(a))
        .map(String::as_str)
        .collect();
    for alt in missing {
        match nl
            .handle
            .link()
            .property_add(index)
            .alt_ifname(&[alt])
            .execute()
            .await
        {
            Ok(()) => {}
            Err(e) if errno_of(&e) == Some(libc::EEXIST) => {}
            Err(e) => return Err(nl_err("restore altname", e)),
        }
    }
    for a in snap
        .addresses
        .iter()
        .filter(|a| !cur.addresses.iter().any(|c| c.same_as(a)))
    {
        restore_address(nl, index, a).await?;
    }
    // IP sysctls the move reset to the host defaults. A value the kernel refuses does not undo
    // a return that otherwise worked: it is logged.
    if !snap.sysctls.is_empty() {
        let now_name = match &result {
            Returned::NameBusy { temp_name } => temp_name.as_str(),
            Returned::Restored => snap.name.as_str(),
        };
        match sysctl::restore(now_name, &snap.sysctls, &cur.sysctls) {
            Ok(done) if !done.is_empty() => {
                tracing::info!(device = snap.name, sysctls = ?done, "sysctls restored")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(device = snap.name, error = %e, "restoring a sysctl"),
        }
    }
    // Offloads: whatever differs from the snapshot, whether dranet or the pod changed it.
    if !snap.features.is_empty() || !snap.private_flags.is_empty() {
        let done = Ethtool::open()?.restore(&Dev::Index(index), &snap.features, &snap.private_flags)?;
        if !done.features.is_empty() || !done.private_flags.is_empty() {
            tracing::info!(
                device = snap.name,
                features = ?done.features,
                private_flags = ?done.private_flags,
                "offloads restored"
            );
        }
    }
    if snap.up {
        set_up(nl, index, true).await?;
    } else if cur.up {
        set_up(nl, index, false).await?;
    }
    Ok(result)
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
    // Its own host ifindex, or an identity that travels (parent device, permanent MAC).
    let identified = index == snap.ifindex || has_strong_identity(snap);
    if !identified || !same_device(&m, snap) {
        return Err(LinkError::NotTheDevice {
            index,
            device: snap.name.clone(),
        });
    }
    restore(nl, index, snap, false).await
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
        Some(m) => restore(nl, m.header.index, snap, false).await,
        None => Err(LinkError::Lost {
            name: snap.name.clone(),
            mac: snap.mac.clone(),
        }),
    }
}

#[cfg(test)]
mod tests;
