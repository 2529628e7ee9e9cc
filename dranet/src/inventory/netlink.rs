//! Netdevs, addresses and default routes of one network namespace over rtnetlink. The socket is
//! opened on a dedicated thread that first joins the target netns (a netlink socket stays bound
//! to the netns it was created in), so tokio workers never change namespace.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use futures::TryStreamExt;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkInfo, LinkLayerType, LinkMessage, State};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteType};
use nix::sched::CloneFlags;
use rtnetlink::{Handle, RouteMessageBuilder};

use aya::programs::SchedClassifier;
use aya::programs::tc::TcAttachType;
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::tc::{TcAttribute, TcFilterBpfOption, TcMessage, TcOption};
use rtnetlink::IpVersion;

use super::InventoryError;
use crate::config::{NeighborConfig, RouteConfig, RuleConfig};

/// `RT_TABLE_MAIN`.
const MAIN_TABLE: u32 = 254;
/// `RT_TABLE_LOCAL`.
const LOCAL_TABLE: u32 = 255;
/// Upstream's `DeviceAttributeMaxValueLength`.
pub const MAX_ATTRIBUTE_LEN: usize = 64;

/// One netdev as rtnetlink reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkRecord {
    pub index: u32,
    pub name: String,
    pub mac: Option<String>,
    pub perm_mac: Option<String>,
    pub mtu: Option<u32>,
    /// Go netlink `Link.Type()`: the `IFLA_INFO_KIND` (`veth`, `dummy`, `bond`, `ipoib`…) or
    /// `device` for a link without one.
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
    let target = target.clone();
    std::thread::spawn(move || scan_on_this_thread(&target))
        .join()
        .map_err(|_| InventoryError::Thread)?
}

fn scan_on_this_thread(target: &NetnsTarget) -> Result<NetScan, InventoryError> {
    if let NetnsTarget::Path(p) = target {
        enter_netns(p)?;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| InventoryError::Io {
            what: "tokio runtime",
            source,
        })?;
    rt.block_on(async {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(|source| InventoryError::Io {
            what: "rtnetlink socket",
            source,
        })?;
        let task = tokio::spawn(conn);
        let out = dump(&handle).await;
        task.abort();
        out
    })
}

/// Joins the netns at `path` with this (dedicated, short-lived) thread.
fn enter_netns(path: &Path) -> Result<(), InventoryError> {
    let f = File::open(path).map_err(|source| InventoryError::Io {
        what: "opening the netns file",
        source,
    })?;
    nix::sched::setns(&f, CloneFlags::CLONE_NEWNET).map_err(|e| InventoryError::Io {
        what: "setns",
        source: e.into(),
    })
}

fn nl_err(what: &'static str) -> impl Fn(rtnetlink::Error) -> InventoryError {
    move |e| InventoryError::Netlink {
        what,
        detail: e.to_string(),
    }
}

async fn dump(handle: &Handle) -> Result<NetScan, InventoryError> {
    let links: Vec<LinkMessage> = handle
        .link()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(nl_err("link dump"))?;
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

    let mut records: Vec<LinkRecord> = links.iter().map(link_record).collect();
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
        if let Some((oif, rc)) = copyable_route(route)
            && let Some(r) = records.iter_mut().find(|r| r.index == oif)
        {
            r.routes.push(rc);
        }
    }
    for n in &neighbours {
        if let Some(nc) = permanent_neighbor(n)
            && let Some(r) = records.iter_mut().find(|r| r.index == n.header.ifindex)
        {
            r.neighbors.push(nc);
        }
    }
    for r in records.iter_mut().filter(|r| !r.loopback) {
        ebpf_programs(handle, r).await;
    }
    let uplinks = uplinks(&records, &routes);
    Ok(NetScan {
        links: records,
        uplinks,
        rules: rules.iter().filter_map(table_rule).collect(),
    })
}

fn mac_string(bytes: &[u8]) -> Option<String> {
    (!bytes.is_empty() && bytes.iter().any(|b| *b != 0)).then(|| {
        bytes
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    })
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
            LinkAttribute::Address(a) => r.mac = mac_string(a),
            LinkAttribute::PermAddress(a) => r.perm_mac = mac_string(a),
            LinkAttribute::Mtu(m) => r.mtu = Some(*m),
            LinkAttribute::IfAlias(a) => r.alias = Some(a.clone()),
            LinkAttribute::Controller(m) => r.master = Some(*m),
            LinkAttribute::OperState(s) => r.operstate = operstate(s),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Kind(k) = i {
                        r.kind = k.to_string();
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

fn encapsulation(t: LinkLayerType) -> String {
    match t {
        LinkLayerType::Ether => "ether".to_owned(),
        LinkLayerType::Infiniband => "infiniband".to_owned(),
        LinkLayerType::Loopback => "loopback".to_owned(),
        LinkLayerType::None => "none".to_owned(),
        other => format!("{other:?}").to_ascii_lowercase(),
    }
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

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// A single-path unicast route worth copying into the pod, with its output interface.
fn copyable_route(r: &RouteMessage) -> Option<(u32, RouteConfig)> {
    if r.header.kind != RouteType::Unicast {
        return None;
    }
    let mut table = u32::from(r.header.table);
    let (mut dst, mut gw, mut src, mut oif) = (None, None, None, None);
    for a in &r.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(d) => dst = route_ip(d),
            RouteAttribute::Gateway(g) => gw = route_ip(g),
            RouteAttribute::PrefSource(p) => src = route_ip(p),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    let dst = dst?;
    if table == LOCAL_TABLE {
        return None;
    }
    if let IpAddr::V6(v6) = dst
        && ((v6.segments()[0] & 0xffc0) == 0xfe80 || r.header.protocol == RouteProtocol::Kernel)
    {
        return None;
    }
    Some((
        oif?,
        RouteConfig {
            destination: format!("{dst}/{}", r.header.destination_prefix_length),
            gateway: gw.map(|g| g.to_string()).unwrap_or_default(),
            source: src.map(|s| s.to_string()).unwrap_or_default(),
            scope: u8::from(r.header.scope),
            table: if table == MAIN_TABLE { 0 } else { i64::from(table) },
        },
    ))
}

/// TC BPF filters (ingress, egress) and TCX programs of a link, best effort: a link without a
/// clsact qdisc or a kernel without TCX simply has none.
async fn ebpf_programs(handle: &Handle, r: &mut LinkRecord) {
    let Ok(index) = i32::try_from(r.index) else {
        return;
    };
    let mut filters = Vec::new();
    for egress in [false, true] {
        let mut tf = handle.traffic_filter(index);
        let req = if egress {
            tf.get().egress()
        } else {
            tf.get().ingress()
        };
        if let Ok(msgs) = req.execute().try_collect::<Vec<TcMessage>>().await {
            filters.extend(msgs);
        }
    }
    let (any_filter, names) = bpf_filter_names(&filters);
    let mut tcx: Vec<String> = Vec::new();
    for at in [TcAttachType::Ingress, TcAttachType::Egress] {
        if let Ok((_, progs)) = SchedClassifier::query_tcx(&r.name, at) {
            tcx.extend(progs.iter().filter_map(|p| p.name_as_str().map(str::to_owned)));
        }
    }
    tcx.sort();
    tcx.dedup();
    r.ebpf = any_filter || !tcx.is_empty();
    r.tc_filter_names = names;
    r.tcx_program_names = tcx;
}

/// Whether any filter is a `bpf` one, and the program names of those that carry one.
fn bpf_filter_names(filters: &[TcMessage]) -> (bool, Vec<String>) {
    let mut any = false;
    let mut names = Vec::new();
    for f in filters {
        let is_bpf = f
            .attributes
            .iter()
            .any(|a| matches!(a, TcAttribute::Kind(k) if k == "bpf"));
        if !is_bpf {
            continue;
        }
        for a in &f.attributes {
            if let TcAttribute::Options(opts) = a {
                for o in opts {
                    if let TcOption::Bpf(TcFilterBpfOption::ProgName(n)) = o {
                        names.push(n.clone());
                    }
                }
            }
        }
        // A dump lists the chain head (kind only) and then each filter with its options.
        any = true;
    }
    names.sort();
    names.dedup();
    (any, names)
}

/// A permanent ARP/NDP entry with a MAC.
fn permanent_neighbor(n: &NeighbourMessage) -> Option<NeighborConfig> {
    if n.header.state != NeighbourState::Permanent {
        return None;
    }
    let mut dst = None;
    let mut mac = None;
    for a in &n.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => dst = Some(v4.to_string()),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => dst = Some(v6.to_string()),
            NeighbourAttribute::LinkLayerAddress(l) => mac = mac_string(l),
            _ => {}
        }
    }
    Some(NeighborConfig {
        destination: dst?,
        hardware_addr: mac?,
    })
}

/// A `lookup <table>` rule for a table other than main (254), local (255) or default (253).
fn table_rule(r: &RuleMessage) -> Option<RuleConfig> {
    if r.header.action != RuleAction::ToTable {
        return None;
    }
    let mut table = u32::from(r.header.table);
    let (mut prio, mut src, mut dst) = (0, None, None);
    for a in &r.attributes {
        match a {
            RuleAttribute::Table(t) => table = *t,
            RuleAttribute::Priority(p) => prio = *p,
            RuleAttribute::Source(ip) => src = Some(format!("{ip}/{}", r.header.src_len)),
            RuleAttribute::Destination(ip) => dst = Some(format!("{ip}/{}", r.header.dst_len)),
            _ => {}
        }
    }
    if table == 0 || (253..=255).contains(&table) {
        return None;
    }
    Some(RuleConfig {
        priority: i64::from(prio),
        source: src.unwrap_or_default(),
        destination: dst.unwrap_or_default(),
        table: i64::from(table),
    })
}

/// Holders of the lowest-metric default route per family in the main table (ECMP ties and
/// multipath next-hops included), plus all their master descendants (bond slaves, bridge
/// ports…). macvlan/ipvlan children are not descendants (they have a parent, not a master).
fn uplinks(links: &[LinkRecord], routes: &[RouteMessage]) -> BTreeSet<u32> {
    let mut best: BTreeMap<u8, (u32, BTreeSet<u32>)> = BTreeMap::new();
    for r in routes {
        if r.header.destination_prefix_length != 0 || r.header.kind != RouteType::Unicast {
            continue;
        }
        let mut table = u32::from(r.header.table);
        let mut metric = 0;
        let mut oifs = BTreeSet::new();
        for a in &r.attributes {
            match a {
                RouteAttribute::Table(t) => table = *t,
                RouteAttribute::Priority(p) => metric = *p,
                RouteAttribute::Oif(i) => {
                    oifs.insert(*i);
                }
                RouteAttribute::MultiPath(hops) => oifs.extend(hops.iter().map(|h| h.interface_index)),
                _ => {}
            }
        }
        if table != MAIN_TABLE || oifs.is_empty() {
            continue;
        }
        let fam = match r.header.address_family {
            AddressFamily::Inet => 4,
            AddressFamily::Inet6 => 6,
            _ => continue,
        };
        let e = best.entry(fam).or_insert((metric, BTreeSet::new()));
        if metric < e.0 {
            *e = (metric, oifs);
        } else if metric == e.0 {
            e.1.extend(oifs);
        }
    }
    let mut set: BTreeSet<u32> = best.into_values().flat_map(|(_, s)| s).collect();
    loop {
        let before = set.len();
        for l in links {
            if l.master.is_some_and(|m| set.contains(&m)) {
                set.insert(l.index);
            }
        }
        if set.len() == before {
            return set;
        }
    }
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

    #[test]
    fn bpf_filter_names_from_tc_dumps() {
        let msg = |kind: &str, name: Option<&str>| {
            let mut m = TcMessage::default();
            m.attributes.push(TcAttribute::Kind(kind.to_owned()));
            if let Some(n) = name {
                m.attributes.push(TcAttribute::Options(vec![TcOption::Bpf(
                    TcFilterBpfOption::ProgName(n.to_owned()),
                )]));
            }
            m
        };
        assert_eq!(bpf_filter_names(&[]), (false, vec![]));
        assert_eq!(bpf_filter_names(&[msg("u32", None)]), (false, vec![]));
        assert_eq!(bpf_filter_names(&[msg("bpf", None)]), (true, vec![]));
        assert_eq!(
            bpf_filter_names(&[
                msg("bpf", Some("tc_b")),
                msg("bpf", Some("tc_a")),
                msg("bpf", Some("tc_b"))
            ]),
            (true, vec!["tc_a".to_owned(), "tc_b".to_owned()])
        );
    }

    #[test]
    fn copyable_routes_follow_upstreams_filter() {
        use netlink_packet_route::route::{RouteHeader, RouteScope};
        use std::net::{Ipv4Addr, Ipv6Addr};
        let mk = |dst: Option<IpAddr>, len: u8, table: u8, proto: RouteProtocol| {
            let mut m = RouteMessage::default();
            m.header = RouteHeader {
                address_family: if dst.is_some_and(|d| d.is_ipv6()) {
                    AddressFamily::Inet6
                } else {
                    AddressFamily::Inet
                },
                destination_prefix_length: len,
                table,
                protocol: proto,
                scope: RouteScope::Universe,
                kind: RouteType::Unicast,
                ..RouteHeader::default()
            };
            m.attributes.push(RouteAttribute::Oif(7));
            if let Some(d) = dst {
                m.attributes.push(RouteAttribute::Destination(d.into()));
            }
            m.attributes.push(RouteAttribute::Gateway(
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)).into(),
            ));
            m
        };
        let v4 = Some(IpAddr::V4(Ipv4Addr::new(10, 1, 0, 0)));
        let (oif, rc) = copyable_route(&mk(v4, 16, 254, RouteProtocol::Boot)).unwrap();
        assert_eq!(oif, 7);
        assert_eq!(rc.destination, "10.1.0.0/16");
        assert_eq!(rc.gateway, "10.0.0.1");
        assert_eq!(rc.table, 0);
        assert_eq!(
            copyable_route(&mk(v4, 16, 100, RouteProtocol::Boot))
                .unwrap()
                .1
                .table,
            100
        );
        assert!(
            copyable_route(&mk(None, 0, 254, RouteProtocol::Boot)).is_none(),
            "default route"
        );
        assert!(
            copyable_route(&mk(v4, 16, 255, RouteProtocol::Boot)).is_none(),
            "local table"
        );
        let ll = Some(IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)));
        assert!(copyable_route(&mk(ll, 64, 254, RouteProtocol::Boot)).is_none());
        let v6 = Some(IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0)));
        assert!(copyable_route(&mk(v6, 64, 254, RouteProtocol::Kernel)).is_none());
        assert!(copyable_route(&mk(v6, 64, 254, RouteProtocol::Static)).is_some());
        assert!(copyable_route(&mk(v4, 24, 254, RouteProtocol::Kernel)).is_some());
    }

    #[test]
    fn uplinks_follow_lowest_metric_and_masters() {
        use netlink_packet_route::route::RouteHeader;
        let mk = |oif: u32, metric: u32| {
            let mut m = RouteMessage::default();
            m.header = RouteHeader {
                address_family: AddressFamily::Inet,
                table: 254,
                kind: RouteType::Unicast,
                ..RouteHeader::default()
            };
            m.attributes = vec![RouteAttribute::Oif(oif), RouteAttribute::Priority(metric)];
            m
        };
        let links = vec![
            LinkRecord {
                index: 2,
                ..Default::default()
            },
            LinkRecord {
                index: 3,
                master: Some(2),
                ..Default::default()
            },
            LinkRecord {
                index: 4,
                master: Some(3),
                ..Default::default()
            },
            LinkRecord {
                index: 5,
                ..Default::default()
            },
            LinkRecord {
                index: 6,
                ..Default::default()
            },
        ];
        let set = uplinks(&links, &[mk(5, 200), mk(2, 100)]);
        assert_eq!(set, BTreeSet::from([2, 3, 4]));
        let set = uplinks(&links, &[mk(5, 100), mk(6, 100)]);
        assert_eq!(set, BTreeSet::from([5, 6]));
        assert!(uplinks(&links, &[]).is_empty());
    }
}
