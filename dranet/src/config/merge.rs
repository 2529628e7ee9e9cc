//! Upstream's `MergeNetworkConfig` (`pkg/apis/config_merge.go`): a provider's config (the cloud's
//! `GetDeviceConfig`, a profile's `GetProfileConfig`) under the claim's. Scalars: the claim's
//! wins where it sets one. Lists: the provider's entries, then the claim's; addresses are made
//! unique, routes unique by (destination, table) and neighbours by destination, keeping the
//! last (the claim's) of each; rules are only appended. Maps (ethtool): key by key, the claim's
//! wins.
//!
//! One difference: upstream merges with mergo, which treats a zero value as unset, so a claim's
//! explicit `dhcp: false`, `disableEbpfPrograms: false` or `arpIgnore: 0` loses to a provider's
//! other value; here a value the claim sets wins, whatever it is.

use super::{EthtoolConfig, InterfaceConfig, NeighborConfig, NetworkConfig, RouteConfig, VrfConfig};

/// `user` over `provider`.
#[must_use]
pub fn merge(user: &NetworkConfig, provider: Option<&NetworkConfig>) -> NetworkConfig {
    let Some(p) = provider else {
        return user.clone();
    };
    let mut out = NetworkConfig {
        profile: pick_string(user.profile.as_ref(), p.profile.as_ref()),
        interface: merge_interface(&user.interface, &p.interface),
        routes: p.routes.iter().chain(&user.routes).cloned().collect(),
        rules: p.rules.iter().chain(&user.rules).cloned().collect(),
        neighbors: p.neighbors.iter().chain(&user.neighbors).cloned().collect(),
        ethtool: merge_ethtool(user.ethtool.as_ref(), p.ethtool.as_ref()),
    };
    out.interface.addresses = last_unique(&out.interface.addresses, |a| a.clone());
    out.routes = last_unique(&out.routes, |r: &RouteConfig| (r.destination.clone(), r.table));
    out.neighbors = last_unique(&out.neighbors, |n: &NeighborConfig| n.destination.clone());
    out
}

/// The claim's string when it sets a non-empty one (mergo's "empty is unset" for strings).
fn pick_string(user: Option<&String>, provider: Option<&String>) -> Option<String> {
    user.filter(|s| !s.is_empty()).or(provider).cloned()
}

fn pick<T: Clone>(user: Option<&T>, provider: Option<&T>) -> Option<T> {
    user.or(provider).cloned()
}

fn merge_interface(u: &InterfaceConfig, p: &InterfaceConfig) -> InterfaceConfig {
    InterfaceConfig {
        name: pick_string(u.name.as_ref(), p.name.as_ref()),
        addresses: p.addresses.iter().chain(&u.addresses).cloned().collect(),
        dhcp: pick(u.dhcp.as_ref(), p.dhcp.as_ref()),
        mtu: pick(u.mtu.as_ref(), p.mtu.as_ref()),
        hardware_addr: pick_string(u.hardware_addr.as_ref(), p.hardware_addr.as_ref()),
        gso_max_size: pick(u.gso_max_size.as_ref(), p.gso_max_size.as_ref()),
        gro_max_size: pick(u.gro_max_size.as_ref(), p.gro_max_size.as_ref()),
        gso_ipv4_max_size: pick(u.gso_ipv4_max_size.as_ref(), p.gso_ipv4_max_size.as_ref()),
        gro_ipv4_max_size: pick(u.gro_ipv4_max_size.as_ref(), p.gro_ipv4_max_size.as_ref()),
        disable_ebpf_programs: pick(u.disable_ebpf_programs.as_ref(), p.disable_ebpf_programs.as_ref()),
        forwarding: pick(u.forwarding.as_ref(), p.forwarding.as_ref()),
        arp_ignore: pick(u.arp_ignore.as_ref(), p.arp_ignore.as_ref()),
        arp_announce: pick(u.arp_announce.as_ref(), p.arp_announce.as_ref()),
        vrf: match (&u.vrf, &p.vrf) {
            (Some(u), Some(p)) => Some(VrfConfig {
                name: if u.name.is_empty() {
                    p.name.clone()
                } else {
                    u.name.clone()
                },
                table: u.table.or(p.table),
            }),
            (u, p) => u.clone().or_else(|| p.clone()),
        },
    }
}

fn merge_ethtool(u: Option<&EthtoolConfig>, p: Option<&EthtoolConfig>) -> Option<EthtoolConfig> {
    match (u, p) {
        (Some(u), Some(p)) => {
            let mut out = p.clone();
            out.features.extend(u.features.clone());
            out.private_flags.extend(u.private_flags.clone());
            Some(out)
        }
        (u, p) => u.or(p).cloned(),
    }
}

/// Keeps the last entry of each key, in the order of those last entries.
fn last_unique<T: Clone, K: Eq + std::hash::Hash>(items: &[T], key: impl Fn(&T) -> K) -> Vec<T> {
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<T> = items
        .iter()
        .rev()
        .filter(|i| seen.insert(key(i)))
        .cloned()
        .collect();
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RuleConfig;

    fn route(dst: &str, gw: &str, table: i64) -> RouteConfig {
        RouteConfig {
            destination: dst.into(),
            gateway: gw.into(),
            table,
            ..RouteConfig::default()
        }
    }

    /// Upstream's `config_merge_test.go` cases, in one config each.
    #[test]
    fn user_wins_lists_are_joined_and_deduplicated() {
        let provider = NetworkConfig {
            profile: Some("gold".into()),
            interface: InterfaceConfig {
                name: Some("cloud0".into()),
                mtu: Some(8896),
                addresses: vec!["10.0.0.2/24".into(), "10.0.0.3/24".into()],
                ..InterfaceConfig::default()
            },
            routes: vec![
                route("0.0.0.0/0", "10.0.0.1", 100),
                route("0.0.0.0/0", "10.0.0.1", 0),
            ],
            rules: vec![RuleConfig {
                source: "10.0.0.0/24".into(),
                table: 100,
                ..RuleConfig::default()
            }],
            neighbors: vec![NeighborConfig {
                destination: "10.0.0.1".into(),
                hardware_addr: "00:00:00:00:00:01".into(),
            }],
            ..NetworkConfig::default()
        };
        let user = NetworkConfig {
            interface: InterfaceConfig {
                name: Some("net1".into()),
                addresses: vec!["10.0.0.2/24".into(), "192.168.0.2/24".into()],
                ..InterfaceConfig::default()
            },
            routes: vec![route("0.0.0.0/0", "10.0.0.254", 0)],
            neighbors: vec![NeighborConfig {
                destination: "10.0.0.1".into(),
                hardware_addr: "00:00:00:00:00:02".into(),
            }],
            ..NetworkConfig::default()
        };
        let m = merge(&user, Some(&provider));
        assert_eq!(m.profile.as_deref(), Some("gold"));
        assert_eq!(m.interface.name.as_deref(), Some("net1"), "user wins");
        assert_eq!(m.interface.mtu, Some(8896), "provider fills in");
        assert_eq!(
            m.interface.addresses,
            ["10.0.0.3/24", "10.0.0.2/24", "192.168.0.2/24"],
            "unique, last occurrence kept"
        );
        // Same destination in another table is another route; the user's default route wins.
        assert_eq!(
            m.routes,
            [
                route("0.0.0.0/0", "10.0.0.1", 100),
                route("0.0.0.0/0", "10.0.0.254", 0)
            ]
        );
        assert_eq!(m.rules.len(), 1);
        assert_eq!(m.neighbors.len(), 1);
        assert_eq!(m.neighbors[0].hardware_addr, "00:00:00:00:00:02");
        assert_eq!(merge(&user, None), user);
    }
}
