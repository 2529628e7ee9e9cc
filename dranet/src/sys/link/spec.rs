//! How a device looks inside the pod: the claim's config turned into netlink settings, routes,
//! rules, neighbours and sysctls ([`AttachSpec`]).

use super::*;

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

pub(super) fn prefix(s: &str) -> Result<Option<(IpAddr, u8)>, LinkError> {
    if s.is_empty() {
        return Ok(None);
    }
    if s.contains('/') {
        return parse_cidr(s).map(Some);
    }
    let ip: IpAddr = s.parse().map_err(|_| LinkError::InvalidAddress(s.to_owned()))?;
    Ok(Some((ip, if ip.is_ipv4() { 32 } else { 128 })))
}

pub(super) fn rule_of(r: &crate::config::RuleConfig) -> Result<Rule, LinkError> {
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

pub(super) async fn add_rule(nl: &Netlink, r: &Rule) -> Result<(), LinkError> {
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

pub(super) async fn add_neighbor(nl: &Netlink, index: u32, ip: IpAddr, mac: &[u8]) -> Result<(), LinkError> {
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

pub(super) fn positive(v: Option<i32>) -> Option<u32> {
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
pub(super) fn pod_sysctls(i: &crate::config::InterfaceConfig) -> Result<Vec<PodSysctl>, LinkError> {
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

pub(super) fn route_message(
    r: &RouteConfig,
    oif: u32,
) -> Result<netlink_packet_route::route::RouteMessage, LinkError> {
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

/// The GSO/GRO limits one `RTM_NEWLINK` sets, by name (as four `Option<u32>` in a row they
/// could be passed in the wrong order and still compile). `None`: that limit is left alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Sizes {
    pub gso_max_size: Option<u32>,
    pub gro_max_size: Option<u32>,
    pub gso_ipv4_max_size: Option<u32>,
    pub gro_ipv4_max_size: Option<u32>,
}

impl Sizes {
    /// The limits a claim asks for inside the pod.
    pub(super) fn of_spec(spec: &AttachSpec) -> Self {
        Self {
            gso_max_size: spec.gso_max_size,
            gro_max_size: spec.gro_max_size,
            gso_ipv4_max_size: spec.gso_ipv4_max_size,
            gro_ipv4_max_size: spec.gro_ipv4_max_size,
        }
    }

    /// The limits a device had (or has) in the host.
    pub(super) fn of_snapshot(snap: &LinkSnapshot) -> Self {
        Self {
            gso_max_size: snap.gso_max_size,
            gro_max_size: snap.gro_max_size,
            gso_ipv4_max_size: snap.gso_ipv4_max_size,
            gro_ipv4_max_size: snap.gro_ipv4_max_size,
        }
    }

    /// The limits of `self` that `cur` does not have (each one that is equal: `None`).
    pub(super) fn differing_from(self, cur: Self) -> Self {
        let diff = |want: Option<u32>, have: Option<u32>| if want != have { want } else { None };
        Self {
            gso_max_size: diff(self.gso_max_size, cur.gso_max_size),
            gro_max_size: diff(self.gro_max_size, cur.gro_max_size),
            gso_ipv4_max_size: diff(self.gso_ipv4_max_size, cur.gso_ipv4_max_size),
            gro_ipv4_max_size: diff(self.gro_ipv4_max_size, cur.gro_ipv4_max_size),
        }
    }
}

pub(super) fn settings(index: u32, mtu: Option<u32>, mac: Option<Vec<u8>>, sizes: Sizes) -> LinkMessage {
    let mut m = LinkMessage::default();
    m.header.index = index;
    if let Some(v) = mtu {
        m.attributes.push(LinkAttribute::Mtu(v));
    }
    if let Some(v) = mac {
        m.attributes.push(LinkAttribute::Address(v));
    }
    let Sizes {
        gso_max_size,
        gro_max_size,
        gso_ipv4_max_size,
        gro_ipv4_max_size,
    } = sizes;
    if let Some(v) = gso_max_size {
        m.attributes.push(LinkAttribute::GsoMaxSize(v));
    }
    if let Some(v) = gro_max_size {
        m.attributes.push(LinkAttribute::GroMaxSize(v));
    }
    if let Some(v) = gso_ipv4_max_size {
        m.attributes.push(LinkAttribute::GsoIpv4MaxSize(v));
    }
    if let Some(v) = gro_ipv4_max_size {
        m.attributes.push(LinkAttribute::GroIpv4MaxSize(v));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_size_goes_to_its_own_attribute_and_only_a_differing_one_is_restored() {
        let want = Sizes {
            gso_max_size: Some(1),
            gro_max_size: Some(2),
            gso_ipv4_max_size: Some(3),
            gro_ipv4_max_size: Some(4),
        };
        let m = settings(7, None, None, want);
        assert_eq!(m.header.index, 7);
        assert_eq!(
            m.attributes,
            vec![
                LinkAttribute::GsoMaxSize(1),
                LinkAttribute::GroMaxSize(2),
                LinkAttribute::GsoIpv4MaxSize(3),
                LinkAttribute::GroIpv4MaxSize(4),
            ]
        );
        let have = Sizes {
            gro_max_size: Some(9),
            ..want
        };
        let back = want.differing_from(have);
        assert_eq!(
            back,
            Sizes {
                gro_max_size: Some(2),
                ..Sizes::default()
            }
        );
        assert_eq!(
            settings(7, None, None, back).attributes,
            vec![LinkAttribute::GroMaxSize(2)]
        );
    }
}
