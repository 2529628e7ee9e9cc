//! A device's host state: the snapshot taken before a move (link, addresses, offloads,
//! sysctls) and the identity it carries.

use super::*;
use crate::mac::Mac;

/// A device's host state, taken before it moves and restored when it comes home.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkSnapshot {
    /// Its ifindex in the host when the snapshot was taken. 0: unknown (a record rebuilt from a
    /// pin has no snapshot from before the attach), valid in a record on disk; a device is then
    /// never looked up, asked for or recognised by a host ifindex.
    pub ifindex: u32,
    pub name: String,
    pub altnames: Vec<String>,
    pub alias: Option<String>,
    pub mtu: u32,
    pub mac: Option<String>,
    pub perm_mac: Option<String>,
    pub gso_max_size: Option<u32>,
    pub gso_max_segs: Option<u32>,
    pub gro_max_size: Option<u32>,
    pub gso_ipv4_max_size: Option<u32>,
    pub gro_ipv4_max_size: Option<u32>,
    /// Administratively up.
    pub up: bool,
    /// Addresses with everything a restore puts back (IPv6 link-local left out: the kernel
    /// recreates it). Checkpoint format 1 stored `ip/prefix` strings; they still load.
    pub addresses: Vec<AddrSnapshot>,
    /// Link kind (`IFLA_INFO_KIND`: `veth`, `dummy`, ...); `None` for a physical device, which
    /// has no `rtnl_link_ops`. Identity: a pod can only create links that have a kind.
    pub kind: Option<String>,
    /// Parent device, `<bus>/<name>` (`pci/0000:3b:00.1`, `virtio/virtio2`); `None` for virtual
    /// devices. Identity: set by the kernel, not by anything a pod or a claim can write.
    pub parent: Option<String>,
    /// `kind` and `parent` were read (false in a snapshot from checkpoint format 1, which had
    /// neither: such a device is identified by its permanent MAC alone).
    pub identified: bool,
    /// Wanted state of every changeable offload feature (`ethtool -k`, kernel names).
    pub features: BTreeMap<String, bool>,
    /// Every private flag (`ethtool --show-priv-flags`) of the driver.
    pub private_flags: BTreeMap<String, bool>,
    /// Per-device IP sysctls, `ipv4/<name>` / `ipv6/<name>` (see [`sysctl`]: a netns move
    /// resets them to the destination's defaults).
    pub sysctls: BTreeMap<String, i32>,
    /// The link flags a process with NET_ADMIN in the pod can set and a move keeps
    /// ([`SETTABLE_FLAGS`] of `ifi_flags`: NOARP, MULTICAST, PROMISC, ALLMULTI, DYNAMIC, ...;
    /// PROMISC and ALLMULTI as set by users, not the counts drivers hold). `None`: not
    /// recorded (a checkpoint from before they were), not restored.
    pub flags: Option<u32>,
    /// `IFLA_TXQLEN`; `None`: not recorded.
    pub txqlen: Option<u32>,
    /// `IFLA_GROUP`; `None`: not recorded.
    pub group: Option<u32>,
    /// `IFLA_LINK` of a device with a lower link in the host (a vlan/macvlan/ipvlan's parent, a
    /// veth's peer): that link's host ifindex. Identity in the pod: there the device must name
    /// it with `IFLA_LINK_NETNSID` pointing at the host netns, which a tenant cannot forge (see
    /// [`lower_is_in`]). `None`: no lower link, or a snapshot from before it was recorded.
    pub lower: Option<u32>,
}

/// The `ifi_flags` bits user space can change (`dev_change_flags`: IFF_DEBUG, IFF_NOTRAILERS,
/// IFF_NOARP, IFF_DYNAMIC, IFF_MULTICAST, IFF_PORTSEL, IFF_AUTOMEDIA, and, through the user
/// counts, IFF_PROMISC and IFF_ALLMULTI), less IFF_UP (the admin state is restored on its own).
/// A netns move keeps every one of them.
pub const SETTABLE_FLAGS: u32 = 0x4 | 0x20 | 0x80 | 0x100 | 0x200 | 0x1000 | 0x2000 | 0x4000 | 0x8000;

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

/// A kernel link-layer address as a snapshot records it ([`Mac::from_kernel`]).
pub(super) fn mac_string(b: &[u8]) -> Option<String> {
    Mac::from_kernel(b).map(|m| m.to_string())
}

/// Parses a MAC in any form Go's `net.ParseMAC` accepts (`aa:bb:…`, `aa-bb-…`, `aabb.ccdd.…`;
/// [`Mac::parse`]) into its octets.
pub fn parse_mac(s: &str) -> Result<Vec<u8>, LinkError> {
    Mac::parse(s)
        .map(|m| m.as_bytes().to_vec())
        .ok_or_else(|| LinkError::InvalidMac(s.to_owned()))
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

pub(super) fn snapshot_of(m: &LinkMessage, addrs: &[AddressMessage]) -> LinkSnapshot {
    let mut s = LinkSnapshot {
        ifindex: m.header.index,
        up: m.header.flags.contains(LinkFlags::Up),
        flags: Some(m.header.flags.bits() & SETTABLE_FLAGS),
        ..LinkSnapshot::default()
    };
    let (mut bus, mut parent) = (None, None);
    let (mut lower, mut lower_elsewhere) = (None, false);
    s.identified = true;
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => s.name.clone_from(n),
            LinkAttribute::Mtu(v) => s.mtu = *v,
            LinkAttribute::TxQueueLen(v) => s.txqlen = Some(*v),
            LinkAttribute::Group(v) => s.group = Some(*v),
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
            // The kernel sends IFLA_LINK only when it differs from the device's own index.
            LinkAttribute::Link(l) if *l != 0 && *l != m.header.index => lower = Some(*l),
            LinkAttribute::LinkNetNsId(_) => lower_elsewhere = true,
            _ => {}
        }
    }
    // Only a lower link in the same netns (the host, when snapshotted there) is recorded, and
    // only for kinds whose link messages name its netns once it is elsewhere (`get_link_net`).
    s.lower = lower
        .filter(|_| !lower_elsewhere && s.kind.as_deref().is_some_and(|k| LOWER_NETNS_KINDS.contains(&k)));
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

/// Link kinds whose lower link (peer, parent) the kernel names with `IFLA_LINK_NETNSID` when it
/// is in another netns (their `rtnl_link_ops` have `get_link_net`).
pub const LOWER_NETNS_KINDS: [&str; 6] = ["veth", "vlan", "macvlan", "macvtap", "ipvlan", "ipvtap"];

/// Whether link `m` (seen in a pod netns) has the lower link of `snap` in the host: `IFLA_LINK`
/// is the recorded host ifindex and `IFLA_LINK_NETNSID` is `host_nsid`, the id the pod netns
/// gives the host netns. A tenant with NET_ADMIN can create a veth, vlan or macvlan at the
/// device's ifindex with its name and MAC, but only with a lower link in a netns it holds, never
/// the host. True for a device without a recorded lower link (nothing to check).
#[must_use]
pub fn lower_is_in(m: &LinkMessage, snap: &LinkSnapshot, host_nsid: Option<i32>) -> bool {
    let Some(want) = snap.lower else {
        return true;
    };
    let link = m.attributes.iter().find_map(|a| match a {
        LinkAttribute::Link(l) => Some(*l),
        _ => None,
    });
    let nsid = m.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkNetNsId(n) => Some(*n),
        _ => None,
    });
    link == Some(want) && nsid.is_some() && nsid == host_nsid
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
pub(super) fn temp_name_of(snap: &LinkSnapshot, index: u32) -> String {
    temp_name(if snap.ifindex > 0 { snap.ifindex } else { index })
}

pub(super) fn kind_of(infos: &[netlink_packet_route::link::LinkInfo]) -> Option<String> {
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
    let index = m.header.index;
    // The addresses, features and private flags at once: the two ethtool reads each wait for
    // RTNL (behind every move in flight during a drain), on sockets of their own, so side by
    // side; the address dumps need no RTNL.
    let features = super::off_async("reading offloads", move || {
        Ethtool::open().and_then(|mut e| e.features(&Dev::Index(index)))
    });
    let flags = super::off_async("reading private flags", move || {
        Ethtool::open().and_then(|mut e| e.private_flags(&Dev::Index(index)))
    });
    let (addrs, features, flags) = futures::join!(nl.addresses(index), features, flags);
    let mut s = snapshot_of(&m, &addrs?);
    // Not in `snapshot_of`: device lookups by MAC call that for every link.
    s.sysctls = sysctl::of_link(&m);
    match (features?, flags?) {
        (Ok(features), Ok(flags)) => {
            s.features = features.changeable_wanted();
            s.private_flags = flags;
        }
        // A kernel without ethtool netlink: nothing to snapshot (nor to apply: a config that
        // asks for offloads fails at Prepare and at attach).
        (Err(EthtoolError::NoFamily), _) | (_, Err(EthtoolError::NoFamily)) => {}
        (Err(e), _) | (_, Err(e)) => return Err(e.into()),
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
