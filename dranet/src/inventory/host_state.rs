//! What a pod gets a copy of from the host (routes, policy rules, permanent neighbours), and
//! which links are uplinks, from rtnetlink dumps.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use netlink_packet_route::AddressFamily;
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteType};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};

use super::netlink::{LinkRecord, mac_string};
use crate::config::{NeighborConfig, RouteConfig, RuleConfig};

/// `RT_TABLE_MAIN`.
const MAIN_TABLE: u32 = 254;
/// `RT_TABLE_LOCAL`.
const LOCAL_TABLE: u32 = 255;

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// A single-path unicast route worth copying into the pod, with its output interface.
pub(super) fn copyable_route(r: &RouteMessage) -> Option<(u32, RouteConfig)> {
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

/// A permanent ARP/NDP entry with a MAC.
pub(super) fn permanent_neighbor(n: &NeighbourMessage) -> Option<NeighborConfig> {
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
pub(super) fn table_rule(r: &RuleMessage) -> Option<RuleConfig> {
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
pub(super) fn uplinks(links: &[LinkRecord], routes: &[RouteMessage]) -> BTreeSet<u32> {
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
