//! Netdevs, addresses, routes, rules, neighbours and attached eBPF programs of one network
//! namespace over rtnetlink. The socket is
//! opened on a dedicated thread that first joins the target netns (a netlink socket stays bound
//! to the netns it was created in), so tokio workers never change namespace.

use std::collections::{BTreeMap, BTreeSet};

use std::net::IpAddr;
use std::path::PathBuf;

use crate::mac::Mac;
use crate::sys::netns::{Netns, in_netns};
use futures::TryStreamExt;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkInfo, LinkLayerType, LinkMessage, State};
use netlink_packet_route::neighbour::NeighbourMessage;
use netlink_packet_route::route::RouteMessage;
use netlink_packet_route::rule::RuleMessage;
use rtnetlink::{Handle, IpVersion, RouteMessageBuilder};

use super::InventoryError;
use crate::config::{NeighborConfig, RouteConfig, RuleConfig};

/// Upstream's `DeviceAttributeMaxValueLength`.
pub const MAX_ATTRIBUTE_LEN: usize = 64;

/// One netdev as rtnetlink reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkRecord {
    pub index: u32,
    pub name: String,
    /// The MAC to identify the device with (`None` when absent or all zeros).
    pub mac: Option<String>,
    /// `dra.net/mac` as upstream publishes it (Go's `HardwareAddr.String()`): every byte of
    /// `IFLA_ADDRESS`, zeros included, or empty when the link has none.
    pub hardware_addr: String,
    pub perm_mac: Option<String>,
    pub mtu: Option<u32>,
    /// Go netlink `Link.Type()`: the `IFLA_INFO_KIND` (`veth`, `dummy`, `bond`, `ipoib`…; a
    /// `tun` is `tuntap`) or `device` for a link without one.
    pub kind: String,
    /// `ether`, `infiniband`, `loopback`, …
    pub encapsulation: String,
    pub alias: Option<String>,
    /// `up`, `down`, `unknown`, `lower-layer-down`, … (Go netlink `LinkOperState`).
    pub operstate: String,
    pub master: Option<u32>,
    pub loopback: bool,
    /// Global unicast addresses as CIDRs, sorted.
    pub ipv4: Vec<String>,
    pub ipv6: Vec<String>,
    /// Host routes through this link that a pod gets a copy of (upstream's filter: routes with
    /// a destination, not in the local table, no IPv6 link-local destination, no IPv6 `proto
    /// kernel`). The main table is written as table 0.
    pub routes: Vec<RouteConfig>,
    /// Permanent neighbour entries on this link (upstream copies them into the pod).
    pub neighbors: Vec<NeighborConfig>,
    /// A TC BPF filter (ingress or egress) or a TCX program is attached.
    pub ebpf: bool,
    /// Names of attached TC BPF filters (sorted, unique; unnamed classic filters count for
    /// [`LinkRecord::ebpf`] only).
    pub tc_filter_names: Vec<String>,
    /// Names of attached TCX programs (sorted, unique).
    pub tcx_program_names: Vec<String>,
}

/// The links of a netns and which of them carry the node's default routes (uplinks, with their
/// master descendants).
#[derive(Clone, Debug, Default)]
pub struct NetScan {
    pub links: Vec<LinkRecord>,
    pub uplinks: BTreeSet<u32>,
    /// Policy-routing rules that look up a table other than main, local or default.
    pub rules: Vec<RuleConfig>,
}

/// Which network namespace to read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NetnsTarget {
    /// The netns of the calling process (the host netns for the DaemonSet).
    #[default]
    Current,
    /// A bind-mounted netns file or `/proc/<pid>/ns/net`.
    Path(PathBuf),
}

/// Reads links, addresses and default routes of `target`. Blocking (runs its own thread).
pub fn scan(target: &NetnsTarget) -> Result<NetScan, InventoryError> {
    match target {
        NetnsTarget::Current => std::thread::spawn(scan_on_this_thread)
            .join()
            .map_err(|_| InventoryError::Thread)?,
        NetnsTarget::Path(p) => {
            let netns = Netns::open_path(p).map_err(|e| InventoryError::Io {
                what: "opening the netns file",
                source: std::io::Error::other(e),
            })?;
            in_netns(&netns, scan_on_this_thread).map_err(|e| InventoryError::Io {
                what: "entering the netns",
                source: std::io::Error::other(e),
            })?
        }
    }
}

fn scan_on_this_thread() -> Result<NetScan, InventoryError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| InventoryError::Io {
            what: "tokio runtime",
            source,
        })?;
    rt.block_on(async {
        let (conn, handle) = crate::sys::rtnl::connect().map_err(|source| InventoryError::Io {
            what: "rtnetlink socket",
            source,
        })?;
        let task = tokio::spawn(conn);
        let out = dump(&handle).await;
        task.abort();
        out
    })
}

fn nl_err(what: &'static str) -> impl Fn(rtnetlink::Error) -> InventoryError {
    move |e| InventoryError::Netlink {
        what,
        detail: e.to_string(),
    }
}

async fn dump(handle: &Handle) -> Result<NetScan, InventoryError> {
    // Each link message becomes its record as it is decoded (a decoded message is ~25 KiB: all
    // of them at once was the scan's whole peak). This thread is the scan's own: the blocking
    // dump holds no async worker.
    let mut records: Vec<LinkRecord> =
        crate::sys::rtnl::each_link(|m| Some(link_record(m))).map_err(InventoryError::Links)?;
    let addrs: Vec<AddressMessage> = handle
        .address()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(nl_err("address dump"))?;
    let mut routes: Vec<RouteMessage> = handle
        .route()
        .get(RouteMessageBuilder::<std::net::Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .map_err(nl_err("IPv4 route dump"))?;
    let v6: Vec<RouteMessage> = handle
        .route()
        .get(RouteMessageBuilder::<std::net::Ipv6Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .map_err(nl_err("IPv6 route dump"))?;
    routes.extend(v6);
    let mut rules: Vec<RuleMessage> = Vec::new();
    for v in [IpVersion::V4, IpVersion::V6] {
        let part: Vec<RuleMessage> = handle
            .rule()
            .get(v)
            .execute()
            .try_collect()
            .await
            .map_err(nl_err("rule dump"))?;
        rules.extend(part);
    }
    let neighbours: Vec<NeighbourMessage> = handle
        .neighbours()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(nl_err("neighbour dump"))?;

    let mut by_index: BTreeMap<u32, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for a in &addrs {
        if let Some((ip, cidr)) = address_cidr(a)
            && is_global_unicast(ip)
        {
            let e = by_index.entry(a.header.index).or_default();
            if ip.is_ipv4() {
                e.0.push(cidr)
            } else {
                e.1.push(cidr)
            }
        }
    }
    for r in &mut records {
        if let Some((mut v4, mut v6)) = by_index.remove(&r.index) {
            v4.sort();
            v6.sort();
            r.ipv4 = v4;
            r.ipv6 = v6;
        }
    }
    for route in &routes {
        if let Some((oif, rc)) = super::host_state::copyable_route(route)
            && let Some(r) = records.iter_mut().find(|r| r.index == oif)
        {
            r.routes.push(rc);
        }
    }
    for n in &neighbours {
        if let Some(nc) = super::host_state::permanent_neighbor(n)
            && let Some(r) = records.iter_mut().find(|r| r.index == n.header.ifindex)
        {
            r.neighbors.push(nc);
        }
    }
    let presence = super::tc::Presence::probe(handle).await;
    for r in records.iter_mut().filter(|r| !r.loopback) {
        super::tc::ebpf_programs(handle, r, &presence).await;
    }
    let uplinks = super::host_state::uplinks(&records, &routes);
    Ok(NetScan {
        links: records,
        uplinks,
        rules: rules.iter().filter_map(super::host_state::table_rule).collect(),
    })
}

/// A kernel link-layer address as the inventory publishes it ([`Mac::from_kernel`]).
pub(super) fn mac_string(bytes: &[u8]) -> Option<String> {
    Mac::from_kernel(bytes).map(|m| m.to_string())
}

/// Go's `net.HardwareAddr.String()`: `aa:bb:…` (what [`Mac`] writes), empty for no bytes.
fn hex_colon(bytes: &[u8]) -> String {
    Mac::from_bytes(bytes).map(|m| m.to_string()).unwrap_or_default()
}

/// Go netlink's `Link.Type()` for an `IFLA_INFO_KIND`: the kind, but for the one type it names
/// otherwise.
fn go_link_type(kind: &str) -> &str {
    match kind {
        "tun" => "tuntap",
        k => k,
    }
}

fn link_record(msg: &LinkMessage) -> LinkRecord {
    let mut r = LinkRecord {
        index: msg.header.index,
        kind: "device".to_owned(),
        encapsulation: encapsulation(msg.header.link_layer_type),
        loopback: msg.header.flags.contains(LinkFlags::Loopback)
            || msg.header.link_layer_type == LinkLayerType::Loopback,
        operstate: "unknown".to_owned(),
        ..LinkRecord::default()
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => r.name.clone_from(n),
            LinkAttribute::Address(a) => {
                r.mac = mac_string(a);
                r.hardware_addr = hex_colon(a);
            }
            LinkAttribute::PermAddress(a) => r.perm_mac = mac_string(a),
            LinkAttribute::Mtu(m) => r.mtu = Some(*m),
            LinkAttribute::IfAlias(a) => r.alias = Some(a.clone()),
            LinkAttribute::Controller(m) => r.master = Some(*m),
            LinkAttribute::OperState(s) => r.operstate = operstate(s),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Kind(k) = i {
                        r.kind = go_link_type(&k.to_string()).to_owned();
                    }
                }
            }
            _ => {}
        }
    }
    r
}

fn operstate(s: &State) -> String {
    match s {
        State::Up => "up",
        State::Down => "down",
        State::Dormant => "dormant",
        State::Testing => "testing",
        State::NotPresent => "not-present",
        State::LowerLayerDown => "lower-layer-down",
        _ => "unknown",
    }
    .to_owned()
}

/// Go netlink's `EncapType()`: the name of the link's ARPHRD type.
fn encapsulation(t: LinkLayerType) -> String {
    let name = match u16::from(t) {
        0 => "generic",
        1 => "ether",
        2 => "eether",
        3 => "ax25",
        4 => "pronet",
        5 => "chaos",
        6 => "ieee802",
        7 => "arcnet",
        8 => "atalk",
        15 => "dlci",
        19 => "atm",
        23 => "metricom",
        24 => "ieee1394",
        32 => "infiniband",
        256 => "slip",
        257 => "cslip",
        258 => "slip6",
        259 => "cslip6",
        260 => "rsrvd",
        264 => "adapt",
        270 => "rose",
        271 => "x25",
        272 => "hwx25",
        512 => "ppp",
        513 => "hdlc",
        516 => "lapb",
        517 => "ddcmp",
        518 => "rawhdlc",
        768 => "ipip",
        769 => "tunnel6",
        770 => "frad",
        771 => "skip",
        772 => "loopback",
        773 => "ltalk",
        774 => "fddi",
        775 => "bif",
        776 => "sit",
        777 => "ip/ddp",
        778 => "gre",
        779 => "pimreg",
        780 => "hippi",
        781 => "ash",
        782 => "econet",
        783 => "irda",
        784 => "fcpp",
        785 => "fcal",
        786 => "fcpl",
        787..=799 => return format!("fcfb{}", u16::from(t) - 787),
        800 => "tr",
        801 => "ieee802.11",
        802 => "ieee802.11/prism",
        803 => "ieee802.11/radiotap",
        804 => "ieee802.15.4",
        65534 => "none",
        65535 => "void",
        other => return format!("unknown{other}"),
    };
    name.to_owned()
}

fn address_cidr(a: &AddressMessage) -> Option<(IpAddr, String)> {
    let mut addr = None;
    let mut local = None;
    for attr in &a.attributes {
        match attr {
            AddressAttribute::Address(ip) => addr = Some(*ip),
            AddressAttribute::Local(ip) => local = Some(*ip),
            _ => {}
        }
    }
    let ip = local.or(addr)?;
    Some((ip, format!("{ip}/{}", a.header.prefix_len)))
}

/// Go's `IP.IsGlobalUnicast`.
#[must_use]
pub fn is_global_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_link_local())
        }
        IpAddr::V6(v6) => {
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80)
        }
    }
}

/// Comma-joined list that stays within [`MAX_ATTRIBUTE_LEN`] bytes (whole entries only).
#[must_use]
pub fn capped_join(items: &[String]) -> String {
    let mut out = String::new();
    for it in items {
        let extra = if out.is_empty() { it.len() } else { it.len() + 1 };
        if out.len() + extra > MAX_ATTRIBUTE_LEN {
            break;
        }
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(it);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_unicast() {
        for (ip, want) in [
            ("10.0.0.1", true),
            ("8.8.8.8", true),
            ("127.0.0.1", false),
            ("169.254.1.1", false),
            ("224.0.0.1", false),
            ("0.0.0.0", false),
            ("fd00::1", true),
            ("2001:db8::1", true),
            ("fe80::1", false),
            ("::1", false),
            ("ff02::1", false),
        ] {
            assert_eq!(is_global_unicast(ip.parse().unwrap()), want, "{ip}");
        }
    }

    #[test]
    fn capped_join_keeps_whole_entries() {
        let items: Vec<String> = (0..10).map(|i| format!("10.0.0.{i}/24")).collect();
        let s = capped_join(&items);
        assert!(s.len() <= MAX_ATTRIBUTE_LEN, "{s}");
        assert!(s.starts_with("10.0.0.0/24,10.0.0.1/24"));
        assert!(s.split(',').all(|e| items.contains(&e.to_owned())));
        assert_eq!(capped_join(&["a".into(), "b".into()]), "a,b");
        assert_eq!(capped_join(&[]), "");
    }
}
