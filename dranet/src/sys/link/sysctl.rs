//! Per-device IP sysctls (`net/ipv4/conf/<if>/*`, `net/ipv6/conf/<if>/*`) and the few global
//! ones a claim can ask for (fenced: reads and writes procfs, inside a netns through a
//! dedicated thread).
//!
//! Why the snapshot needs them: a device that changes netns loses its `in_device` and
//! `inet6_dev` (NETDEV_UNREGISTER tears both down) and gets fresh ones from the *destination*
//! netns's `conf/default` when it registers there. So a NIC whose host `rp_filter`,
//! `arp_ignore`, `accept_ra`, `disable_ipv6`... were tuned comes home with the host defaults
//! instead. The values are read for free from the RTM_GETLINK the snapshot already makes
//! (`IFLA_AF_SPEC` carries `IFLA_INET_CONF` and `IFLA_INET6_CONF`), and the restore writes back
//! only what differs once the device is home.
//!
//! Inside the pod, `interface.arpIgnore`, `arpAnnounce` and `forwarding` are written before
//! the link comes up, and a VRF sets `tcp_l3mdev_accept`/`udp_l3mdev_accept`. procfs resolves
//! `/proc/sys/net` in the netns of the task that opens it, so those writes run on a throw-away
//! thread inside the pod netns ([`crate::sys::netns::in_netns`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use netlink_packet_route::link::{
    AfSpecInet, AfSpecInet6, AfSpecUnspec, Inet6DevConf, InetDevConf, LinkAttribute, LinkMessage,
};

use super::LinkError;
use crate::sys::netns::Netns;

/// A getter of one devconf value.
type Get<C> = fn(&C) -> i32;

/// IPv4 devconf: sysctl name → value (`IPV4_DEVCONF_*`; `mc_forwarding` is read-only and left
/// out).
const INET: &[(&str, Get<InetDevConf>)] = &[
    ("forwarding", |c| c.forwarding),
    ("proxy_arp", |c| c.proxy_arp),
    ("accept_redirects", |c| c.accept_redirects),
    ("secure_redirects", |c| c.secure_redirects),
    ("send_redirects", |c| c.send_redirects),
    ("shared_media", |c| c.shared_media),
    ("rp_filter", |c| c.rp_filter),
    ("accept_source_route", |c| c.accept_source_route),
    ("bootp_relay", |c| c.bootp_relay),
    ("log_martians", |c| c.log_martians),
    ("tag", |c| c.tag),
    ("arp_filter", |c| c.arpfilter),
    ("medium_id", |c| c.medium_id),
    ("disable_xfrm", |c| c.noxfrm),
    ("disable_policy", |c| c.nopolicy),
    ("force_igmp_version", |c| c.force_igmp_version),
    ("arp_announce", |c| c.arp_announce),
    ("arp_ignore", |c| c.arp_ignore),
    ("promote_secondaries", |c| c.promote_secondaries),
    ("arp_accept", |c| c.arp_accept),
    ("arp_notify", |c| c.arp_notify),
    ("accept_local", |c| c.accept_local),
    ("src_valid_mark", |c| c.src_vmark),
    ("proxy_arp_pvlan", |c| c.proxy_arp_pvlan),
    ("route_localnet", |c| c.route_localnet),
    ("igmpv2_unsolicited_report_interval", |c| {
        c.igmpv2_unsolicited_report_interval
    }),
    ("igmpv3_unsolicited_report_interval", |c| {
        c.igmpv3_unsolicited_report_interval
    }),
    ("ignore_routes_with_linkdown", |c| c.ignore_routes_with_linkdown),
    ("drop_unicast_in_l2_multicast", |c| c.drop_unicast_in_l2_multicast),
    ("drop_gratuitous_arp", |c| c.drop_gratuitous_arp),
    ("bc_forwarding", |c| c.bc_forwarding),
    ("arp_evict_nocarrier", |c| c.arp_evict_nocarrier),
];

/// IPv6 devconf: sysctl name → value (`DEVCONF_*`). Left out: `mc_forwarding` (read-only),
/// `stable_secret` (not an integer), `mtu` (follows the link MTU, which the restore sets first),
/// and the ones newer than every kernel we run on (a 6.1 kernel reports them as 0).
const INET6: &[(&str, Get<Inet6DevConf>)] = &[
    ("forwarding", |c| c.forwarding),
    ("hop_limit", |c| c.hoplimit),
    ("accept_ra", |c| c.accept_ra),
    ("accept_redirects", |c| c.accept_redirects),
    ("autoconf", |c| c.autoconf),
    ("dad_transmits", |c| c.dad_transmits),
    ("router_solicitations", |c| c.rtr_solicits),
    ("router_solicitation_interval", |c| c.rtr_solicit_interval),
    ("router_solicitation_delay", |c| c.rtr_solicit_delay),
    ("use_tempaddr", |c| c.use_tempaddr),
    ("temp_valid_lft", |c| c.temp_valid_lft),
    ("temp_prefered_lft", |c| c.temp_prefered_lft),
    ("regen_max_retry", |c| c.regen_max_retry),
    ("max_desync_factor", |c| c.max_desync_factor),
    ("max_addresses", |c| c.max_addresses),
    ("force_mld_version", |c| c.force_mld_version),
    ("accept_ra_defrtr", |c| c.accept_ra_defrtr),
    ("accept_ra_pinfo", |c| c.accept_ra_pinfo),
    ("accept_ra_rtr_pref", |c| c.accept_ra_rtr_pref),
    ("router_probe_interval", |c| c.rtr_probe_interval),
    ("accept_ra_rt_info_max_plen", |c| c.accept_ra_rt_info_max_plen),
    ("proxy_ndp", |c| c.proxy_ndp),
    ("optimistic_dad", |c| c.optimistic_dad),
    ("accept_source_route", |c| c.accept_source_route),
    ("disable_ipv6", |c| c.disable_ipv6),
    ("accept_dad", |c| c.accept_dad),
    ("force_tllao", |c| c.force_tllao),
    ("ndisc_notify", |c| c.ndisc_notify),
    ("mldv1_unsolicited_report_interval", |c| {
        c.mldv1_unsolicited_report_interval
    }),
    ("mldv2_unsolicited_report_interval", |c| {
        c.mldv2_unsolicited_report_interval
    }),
    ("suppress_frag_ndisc", |c| c.suppress_frag_ndisc),
    ("accept_ra_from_local", |c| c.accept_ra_from_local),
    ("use_optimistic", |c| c.use_optimistic),
    ("accept_ra_mtu", |c| c.accept_ra_mtu),
    ("use_oif_addrs_only", |c| c.use_oif_addrs_only),
    ("accept_ra_min_hop_limit", |c| c.accept_ra_min_hop_limit),
    ("ignore_routes_with_linkdown", |c| c.ignore_routes_with_linkdown),
    ("drop_unicast_in_l2_multicast", |c| c.drop_unicast_in_l2_multicast),
    ("drop_unsolicited_na", |c| c.drop_unsolicited_na),
    ("keep_addr_on_down", |c| c.keep_addr_on_down),
    ("router_solicitation_max_interval", |c| c.rtr_solicit_max_interval),
    ("seg6_enabled", |c| c.seg6_enabled),
    ("seg6_require_hmac", |c| c.seg6_require_hmac),
    ("enhanced_dad", |c| c.enhanced_dad),
    ("addr_gen_mode", |c| c.addr_gen_mode),
    ("disable_policy", |c| c.disable_policy),
    ("accept_ra_rt_info_min_plen", |c| c.accept_ra_rt_info_min_plen),
    ("ndisc_tclass", |c| c.ndisc_tclass),
    ("rpl_seg_enabled", |c| c.rpl_seg_enabled),
];

/// The per-device sysctls of a link message, keyed `ipv4/<name>` and `ipv6/<name>`. Empty if the
/// kernel sent no `IFLA_AF_SPEC` (a device without IPv4/IPv6, e.g. `disable_ipv6` at the
/// netns level only drops the IPv6 half).
#[must_use]
pub fn of_link(m: &LinkMessage) -> BTreeMap<String, i32> {
    let mut out = BTreeMap::new();
    for a in &m.attributes {
        let LinkAttribute::AfSpecUnspec(specs) = a else {
            continue;
        };
        for s in specs {
            match s {
                AfSpecUnspec::Inet(v) => {
                    for x in v {
                        if let AfSpecInet::DevConf(c) = x {
                            out.extend(INET.iter().map(|(n, g)| (format!("ipv4/{n}"), g(c))));
                        }
                    }
                }
                AfSpecUnspec::Inet6(v) => {
                    for x in v {
                        if let AfSpecInet6::DevConf(c) = x {
                            out.extend(INET6.iter().map(|(n, g)| (format!("ipv6/{n}"), g(c))));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// `/proc/sys/net/<family>/conf/<ifname>/<name>` for a key `family/name`.
fn path_of(ifname: &str, key: &str) -> Result<PathBuf, LinkError> {
    let (family, name) = key
        .split_once('/')
        .filter(|(f, n)| matches!(*f, "ipv4" | "ipv6") && !n.is_empty() && !n.contains(['/', '.']))
        .ok_or_else(|| LinkError::Sysctl {
            key: key.to_owned(),
            reason: "not a per-device ipv4/ipv6 sysctl".into(),
        })?;
    super::validate_ifname(ifname)?;
    Ok(PathBuf::from(format!(
        "/proc/sys/net/{family}/conf/{ifname}/{name}"
    )))
}

fn write(path: &std::path::Path, key: &str, value: i32) -> Result<(), LinkError> {
    std::fs::write(path, format!("{value}\n")).map_err(|e| LinkError::Sysctl {
        key: key.to_owned(),
        reason: format!("writing {value} to {}: {e}", path.display()),
    })
}

/// Puts back, in the driver's own (host) netns, every per-device sysctl of `want` that differs
/// from `have` (both from [`of_link`]) on the device now named `ifname`. IPv4 first, then IPv6
/// with `disable_ipv6` last, since enabling IPv6 starts address configuration with whatever
/// the other values are at that moment. Returns the keys it wrote.
pub fn restore(
    ifname: &str,
    want: &BTreeMap<String, i32>,
    have: &BTreeMap<String, i32>,
) -> Result<Vec<String>, LinkError> {
    let mut keys: Vec<&String> = want
        .iter()
        .filter(|(k, v)| have.get(*k).is_some_and(|h| h != *v))
        .map(|(k, _)| k)
        .collect();
    keys.sort_by_key(|k| (k.starts_with("ipv6/"), k.as_str() == "ipv6/disable_ipv6"));
    let mut done = Vec::new();
    for k in keys {
        let v = want.get(k).copied().unwrap_or_default();
        write(&path_of(ifname, k)?, k, v)?;
        done.push(k.clone());
    }
    Ok(done)
}

/// A sysctl write inside a pod netns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodSysctl {
    /// `net/<family>/conf/<ifname>/<name>`, key `family/name`; an `optional` one is skipped
    /// when the file does not exist (IPv6 disabled on the device).
    Device { key: String, value: i32, optional: bool },
    /// A netns-wide one under `net/ipv4/` (`tcp_l3mdev_accept`...).
    Ipv4Global { name: &'static str, value: i32 },
}

/// Writes `items` inside `netns` (for the device named `ifname` there), in order, on a
/// dedicated thread. Stops at the first failure.
pub fn set_in_pod(netns: &Netns, ifname: &str, items: &[PodSysctl]) -> Result<(), LinkError> {
    if items.is_empty() {
        return Ok(());
    }
    let mut plan = Vec::with_capacity(items.len());
    for it in items {
        match it {
            PodSysctl::Device { key, value, optional } => {
                plan.push((path_of(ifname, key)?, key.clone(), *value, *optional));
            }
            PodSysctl::Ipv4Global { name, value } => plan.push((
                PathBuf::from(format!("/proc/sys/net/ipv4/{name}")),
                format!("ipv4/{name}"),
                *value,
                false,
            )),
        }
    }
    crate::sys::netns::in_netns(netns, move || -> Result<(), LinkError> {
        for (path, key, value, optional) in &plan {
            if *optional && !path.exists() {
                continue;
            }
            write(path, key, *value)?;
        }
        Ok(())
    })?
}

/// Reads `net/<family>/conf/<ifname>/<name>` inside `netns` (tests and checks).
pub fn get_in_netns(netns: &Netns, ifname: &str, key: &str) -> Result<i32, LinkError> {
    let path = path_of(ifname, key)?;
    let key = key.to_owned();
    crate::sys::netns::in_netns(netns, move || -> Result<i32, LinkError> {
        let s = std::fs::read_to_string(&path).map_err(|e| LinkError::Sysctl {
            key: key.clone(),
            reason: format!("reading {}: {e}", path.display()),
        })?;
        s.trim().parse().map_err(|_| LinkError::Sysctl {
            key,
            reason: format!("{} holds {s:?}, not an integer", path.display()),
        })
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_must_be_per_device_ipv4_or_ipv6() {
        assert!(path_of("eth1", "ipv4/arp_ignore").is_ok());
        assert_eq!(
            path_of("eth1", "ipv6/disable_ipv6").unwrap(),
            PathBuf::from("/proc/sys/net/ipv6/conf/eth1/disable_ipv6")
        );
        for bad in ["arp_ignore", "ipv5/x", "ipv4/", "ipv4/../../kernel/x", "ipv4/a/b"] {
            assert!(path_of("eth1", bad).is_err(), "{bad}");
        }
        assert!(path_of("../x", "ipv4/arp_ignore").is_err());
    }

    #[test]
    fn names_are_unique_per_family() {
        for table in [
            INET.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            INET6.iter().map(|(n, _)| *n).collect(),
        ] {
            let mut s = table.clone();
            s.sort_unstable();
            s.dedup();
            assert_eq!(s.len(), table.len());
        }
    }

    #[test]
    fn only_differing_values_are_restored_and_disable_ipv6_goes_last() {
        // A name that cannot exist: the first write fails, which shows the order and the
        // filter without touching a real device.
        let want: BTreeMap<String, i32> = [
            ("ipv4/arp_ignore", 1),
            ("ipv4/rp_filter", 2),
            ("ipv6/disable_ipv6", 0),
            ("ipv6/accept_ra", 0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let same = want.clone();
        assert_eq!(restore("dnnosuch0", &want, &same).unwrap(), Vec::<String>::new());
        let mut have = want.clone();
        have.insert("ipv6/disable_ipv6".into(), 1);
        let err = restore("dnnosuch0", &want, &have).unwrap_err();
        assert!(err.to_string().contains("ipv6/disable_ipv6"), "{err}");
        have.insert("ipv4/rp_filter".into(), 0);
        let err = restore("dnnosuch0", &want, &have).unwrap_err();
        assert!(err.to_string().contains("ipv4/rp_filter"), "{err}");
        // Keys missing on the device now (IPv6 disabled for good) are not written.
        let mut only4 = want.clone();
        only4.retain(|k, _| k.starts_with("ipv4/"));
        assert_eq!(restore("dnnosuch0", &want, &only4).unwrap(), Vec::<String>::new());
    }
}
