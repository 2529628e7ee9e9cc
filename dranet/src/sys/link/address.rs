//! A device's addresses as the host had them, restored exactly: the address and prefix, and also
//! the peer (point-to-point), the IPv4 broadcast address or its absence, the label, the flags an
//! administrator can set, the scope, the route metric and the lifetimes.
//!
//! A netns move flushes every address of a device, so a return re-adds them all. Re-adding only
//! `ip/prefix` is not enough: the rtnetlink builder gives an IPv4 address a broadcast address of
//! its own choosing, which the original may not have had.

use std::net::{IpAddr, Ipv4Addr};

use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressMessage, AddressScope, CacheInfo,
};

/// Lifetime meaning "forever" (`INFINITY_LIFE_TIME`).
pub const FOREVER: u32 = u32::MAX;

/// The flags an administrator sets (`ip addr add ... nodad noprefixroute ...`); the others
/// (secondary, tentative, deprecated, permanent, dadfailed, optimistic) are the kernel's state.
const SETTABLE: AddressFlags = AddressFlags::Nodad
    .union(AddressFlags::Homeaddress)
    .union(AddressFlags::Managetempaddr)
    .union(AddressFlags::Noprefixroute)
    .union(AddressFlags::Mcautojoin);

/// One address of a device, as snapshotted.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AddrSnapshot {
    /// `ip/prefix` (the local address).
    pub cidr: String,
    /// The peer of a point-to-point address (`IFA_ADDRESS` when it differs from the local one).
    pub peer: Option<IpAddr>,
    /// The IPv4 broadcast address; `None` when the address had none.
    pub broadcast: Option<Ipv4Addr>,
    /// The IPv4 label when it is not the device's name (`eth0:1`).
    pub label: Option<String>,
    /// Administrator-settable `IFA_F_*` flags.
    pub flags: u32,
    /// `RT_SCOPE_*` (0 universe, 253 link, 254 host).
    pub scope: u8,
    /// Metric of the prefix route (`IFA_RT_PRIORITY`).
    pub metric: Option<u32>,
    /// Valid and preferred lifetimes in seconds as they stood at the snapshot ([`FOREVER`]).
    pub valid_lft: u32,
    pub preferred_lft: u32,
}

impl AddrSnapshot {
    /// An address with nothing but `ip/prefix` (format 1, tests): no broadcast, universe scope,
    /// forever.
    #[must_use]
    pub fn plain(cidr: impl Into<String>) -> Self {
        Self {
            cidr: cidr.into(),
            peer: None,
            broadcast: None,
            label: None,
            flags: 0,
            scope: 0,
            metric: None,
            valid_lft: FOREVER,
            preferred_lft: FOREVER,
        }
    }

    /// Reads one address of device `ifname` from a dump; `None` for an IPv6 link-local address
    /// (the kernel recreates it) or a message without an address.
    #[must_use]
    pub fn of(a: &AddressMessage, ifname: &str) -> Option<Self> {
        let mut local = None;
        let mut address = None;
        let mut s = AddrSnapshot::plain(String::new());
        for x in &a.attributes {
            match x {
                AddressAttribute::Local(ip) => local = Some(*ip),
                AddressAttribute::Address(ip) => address = Some(*ip),
                AddressAttribute::Broadcast(b) => s.broadcast = Some(*b),
                AddressAttribute::Label(l) if l != ifname => s.label = Some(l.clone()),
                AddressAttribute::Flags(f) => s.flags = (*f & SETTABLE).bits(),
                AddressAttribute::RoutePriority(m) => s.metric = Some(*m),
                AddressAttribute::CacheInfo(c) => {
                    s.valid_lft = c.ifa_valid;
                    s.preferred_lft = c.ifa_preferred;
                }
                _ => {}
            }
        }
        let ip = local.or(address)?;
        if let IpAddr::V6(v6) = ip
            && v6.is_unicast_link_local()
        {
            return None;
        }
        s.peer = address.filter(|p| local.is_some() && *p != ip);
        s.cidr = format!("{ip}/{}", a.header.prefix_len);
        s.scope = u8::from(a.header.scope);
        Some(s)
    }

    /// The local address and prefix.
    pub fn ip_prefix(&self) -> Result<(IpAddr, u8), super::LinkError> {
        super::parse_cidr(&self.cidr)
    }

    /// The same address, ignoring what the kernel changes by itself over time (lifetimes count
    /// down): what "already there" means when restoring.
    #[must_use]
    pub fn same_as(&self, other: &Self) -> bool {
        self.cidr == other.cidr
            && self.peer == other.peer
            && self.broadcast == other.broadcast
            && self.label == other.label
            && self.flags == other.flags
            && self.scope == other.scope
            && self.metric == other.metric
    }

    /// Rewrites an `RTM_NEWADDR` request (built for `ip/prefix` by the rtnetlink builder, which
    /// adds a broadcast address to IPv4 on its own) to carry exactly this snapshot.
    pub fn shape(&self, m: &mut AddressMessage) {
        m.attributes.retain(|a| {
            !matches!(
                a,
                AddressAttribute::Broadcast(_)
                    | AddressAttribute::Label(_)
                    | AddressAttribute::Flags(_)
                    | AddressAttribute::CacheInfo(_)
                    | AddressAttribute::RoutePriority(_)
            )
        });
        if let Some(peer) = self.peer {
            for a in &mut m.attributes {
                if let AddressAttribute::Address(ip) = a {
                    *ip = peer;
                }
            }
        }
        if let Some(b) = self.broadcast
            && m.header.family == AddressFamily::Inet
        {
            m.attributes.push(AddressAttribute::Broadcast(b));
        }
        if let Some(l) = &self.label
            && m.header.family == AddressFamily::Inet
        {
            m.attributes.push(AddressAttribute::Label(l.clone()));
        }
        if self.flags != 0 {
            m.attributes
                .push(AddressAttribute::Flags(AddressFlags::from_bits_retain(
                    self.flags,
                )));
        }
        if let Some(metric) = self.metric {
            m.attributes.push(AddressAttribute::RoutePriority(metric));
        }
        if self.valid_lft != FOREVER || self.preferred_lft != FOREVER {
            let mut c = CacheInfo::default();
            c.ifa_preferred = self.preferred_lft.min(self.valid_lft);
            c.ifa_valid = self.valid_lft;
            m.attributes.push(AddressAttribute::CacheInfo(c));
        }
        m.header.scope = AddressScope::from(self.scope);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_removes_the_builders_broadcast_when_the_original_had_none() {
        let mut m = AddressMessage::default();
        m.header.family = AddressFamily::Inet;
        m.attributes
            .push(AddressAttribute::Local("10.1.2.3".parse().unwrap()));
        m.attributes
            .push(AddressAttribute::Address("10.1.2.3".parse().unwrap()));
        m.attributes
            .push(AddressAttribute::Broadcast("10.1.2.255".parse().unwrap()));
        AddrSnapshot::plain("10.1.2.3/24").shape(&mut m);
        assert!(
            !m.attributes
                .iter()
                .any(|a| matches!(a, AddressAttribute::Broadcast(_)))
        );
        let mut s = AddrSnapshot::plain("10.1.2.3/24");
        s.broadcast = Some("10.1.2.7".parse().unwrap());
        s.label = Some("eth9:a".into());
        s.valid_lft = 300;
        s.preferred_lft = 100;
        s.shape(&mut m);
        assert!(
            m.attributes
                .contains(&AddressAttribute::Broadcast("10.1.2.7".parse().unwrap()))
        );
        assert!(m.attributes.contains(&AddressAttribute::Label("eth9:a".into())));
        assert!(m.attributes.iter().any(
            |a| matches!(a, AddressAttribute::CacheInfo(c) if c.ifa_valid == 300 && c.ifa_preferred == 100)
        ));
    }
}
