//! The checkpoint's own form of a device's host snapshot (format 2), apart from the kernel
//! fence's [`LinkSnapshot`]: a field added to or renamed in the link type changes nothing on
//! disk until it is added here, with a default that old checkpoints load with. Format 1's
//! `ip/prefix` address strings still load.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::sys::link::{AddrSnapshot, LinkSnapshot};

/// A device's snapshot as the checkpoint stores it.
#[derive(Serialize, Deserialize)]
struct Snapshot {
    ifindex: u32,
    name: String,
    #[serde(default)]
    altnames: Vec<String>,
    #[serde(default)]
    alias: Option<String>,
    mtu: u32,
    mac: Option<String>,
    #[serde(default)]
    perm_mac: Option<String>,
    #[serde(default)]
    gso_max_size: Option<u32>,
    #[serde(default)]
    gso_max_segs: Option<u32>,
    #[serde(default)]
    gro_max_size: Option<u32>,
    #[serde(default)]
    gso_ipv4_max_size: Option<u32>,
    #[serde(default)]
    gro_ipv4_max_size: Option<u32>,
    up: bool,
    #[serde(default)]
    addresses: Vec<Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent: Option<String>,
    /// False in format 1 (no `kind`, no `parent`: identified by permanent MAC alone).
    #[serde(default)]
    identified: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    features: BTreeMap<String, bool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    private_flags: BTreeMap<String, bool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    sysctls: BTreeMap<String, i32>,
    /// Settable link flags (absent before they were recorded: not restored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    flags: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    txqlen: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<u32>,
    /// Host ifindex of the lower link (absent before it was recorded: not checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lower: Option<u32>,
}

fn forever() -> u32 {
    crate::sys::link::address::FOREVER
}

/// An address as the checkpoint stores it: an object (format 2; always written), or an
/// `ip/prefix` string (format 1; still read).
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Addr {
    Cidr(String),
    Full(AddrFields),
}

#[derive(Serialize, Deserialize)]
struct AddrFields {
    cidr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    peer: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    broadcast: Option<Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    label: Option<String>,
    #[serde(default)]
    flags: u32,
    #[serde(default)]
    scope: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metric: Option<u32>,
    #[serde(default = "forever")]
    valid_lft: u32,
    #[serde(default = "forever")]
    preferred_lft: u32,
}

impl From<&AddrSnapshot> for Addr {
    fn from(a: &AddrSnapshot) -> Self {
        Addr::Full(AddrFields {
            cidr: a.cidr.clone(),
            peer: a.peer,
            broadcast: a.broadcast,
            label: a.label.clone(),
            flags: a.flags,
            scope: a.scope,
            metric: a.metric,
            valid_lft: a.valid_lft,
            preferred_lft: a.preferred_lft,
        })
    }
}

impl From<Addr> for AddrSnapshot {
    fn from(a: Addr) -> Self {
        match a {
            Addr::Cidr(cidr) => AddrSnapshot::plain(cidr),
            Addr::Full(f) => AddrSnapshot {
                cidr: f.cidr,
                peer: f.peer,
                broadcast: f.broadcast,
                label: f.label,
                flags: f.flags,
                scope: f.scope,
                metric: f.metric,
                valid_lft: f.valid_lft,
                preferred_lft: f.preferred_lft,
            },
        }
    }
}

impl From<&LinkSnapshot> for Snapshot {
    fn from(s: &LinkSnapshot) -> Self {
        Snapshot {
            ifindex: s.ifindex,
            name: s.name.clone(),
            altnames: s.altnames.clone(),
            alias: s.alias.clone(),
            mtu: s.mtu,
            mac: s.mac.clone(),
            perm_mac: s.perm_mac.clone(),
            gso_max_size: s.gso_max_size,
            gso_max_segs: s.gso_max_segs,
            gro_max_size: s.gro_max_size,
            gso_ipv4_max_size: s.gso_ipv4_max_size,
            gro_ipv4_max_size: s.gro_ipv4_max_size,
            up: s.up,
            addresses: s.addresses.iter().map(Addr::from).collect(),
            kind: s.kind.clone(),
            parent: s.parent.clone(),
            identified: s.identified,
            features: s.features.clone(),
            private_flags: s.private_flags.clone(),
            sysctls: s.sysctls.clone(),
            flags: s.flags,
            txqlen: s.txqlen,
            group: s.group,
            lower: s.lower,
        }
    }
}

impl From<Snapshot> for LinkSnapshot {
    fn from(s: Snapshot) -> Self {
        LinkSnapshot {
            ifindex: s.ifindex,
            name: s.name,
            altnames: s.altnames,
            alias: s.alias,
            mtu: s.mtu,
            mac: s.mac,
            perm_mac: s.perm_mac,
            gso_max_size: s.gso_max_size,
            gso_max_segs: s.gso_max_segs,
            gro_max_size: s.gro_max_size,
            gso_ipv4_max_size: s.gso_ipv4_max_size,
            gro_ipv4_max_size: s.gro_ipv4_max_size,
            up: s.up,
            addresses: s.addresses.into_iter().map(AddrSnapshot::from).collect(),
            kind: s.kind,
            parent: s.parent,
            identified: s.identified,
            features: s.features,
            private_flags: s.private_flags,
            sysctls: s.sysctls,
            flags: s.flags,
            txqlen: s.txqlen,
            group: s.group,
            lower: s.lower,
        }
    }
}

/// `#[serde(with = "disk::snapshot")]` for a [`LinkSnapshot`] field of the checkpoint.
pub mod snapshot {
    use super::{Deserialize, Deserializer, LinkSnapshot, Serialize, Serializer, Snapshot};

    pub fn serialize<S: Serializer>(s: &LinkSnapshot, ser: S) -> Result<S::Ok, S::Error> {
        Snapshot::from(s).serialize(ser)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<LinkSnapshot, D::Error> {
        Snapshot::deserialize(de).map(LinkSnapshot::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::link::address::FOREVER;

    #[derive(Serialize, Deserialize)]
    struct OnDisk(#[serde(with = "snapshot")] LinkSnapshot);

    fn round_trip(s: &LinkSnapshot) -> LinkSnapshot {
        let json = serde_json::to_string(&OnDisk(s.clone())).unwrap();
        serde_json::from_str::<OnDisk>(&json).unwrap().0
    }

    #[test]
    fn format_1_address_strings_and_full_records_both_load() {
        let v: Vec<Addr> =
            serde_json::from_str(r#"["10.1.2.3/24", {"cidr": "10.9.0.1/16", "broadcast": "10.9.255.255", "label": "x:1", "flags": 512, "scope": 253}]"#)
                .unwrap();
        let v: Vec<AddrSnapshot> = v.into_iter().map(AddrSnapshot::from).collect();
        assert_eq!(v[0], AddrSnapshot::plain("10.1.2.3/24"));
        assert_eq!(v[1].broadcast, Some("10.9.255.255".parse().unwrap()));
        assert_eq!(
            (v[1].label.as_deref(), v[1].flags, v[1].scope),
            (Some("x:1"), 512, 253)
        );
        assert_eq!((v[1].valid_lft, v[1].preferred_lft), (FOREVER, FOREVER));
        let s = LinkSnapshot {
            addresses: v,
            ..LinkSnapshot::default()
        };
        assert_eq!(round_trip(&s), s);
    }

    #[test]
    fn snapshots_from_before_offloads_still_load_and_round_trip() {
        // A checkpointed snapshot written before the offload fields existed.
        let old = r#"{"ifindex": 7, "name": "eth1", "mtu": 1500, "mac": "02:00:00:00:00:01", "up": true}"#;
        let s = serde_json::from_str::<OnDisk>(old).unwrap().0;
        assert!(s.features.is_empty() && s.private_flags.is_empty() && !s.identified);
        assert_eq!(s.name, "eth1");
        let mut s = s;
        s.features.insert("rx-gro".into(), false);
        s.private_flags.insert("legacy-rx".into(), true);
        assert_eq!(round_trip(&s), s);
    }

    #[test]
    fn snapshots_from_before_link_flags_load_with_nothing_to_restore_and_new_ones_round_trip() {
        let old = r#"{"ifindex": 7, "name": "eth1", "mtu": 1500, "mac": null, "up": true}"#;
        let s = serde_json::from_str::<OnDisk>(old).unwrap().0;
        assert_eq!((s.flags, s.txqlen, s.group), (None, None, None));
        let json = serde_json::to_string(&OnDisk(s.clone())).unwrap();
        assert!(
            !json.contains("flags") && !json.contains("txqlen") && !json.contains("group"),
            "{json}"
        );
        let s = LinkSnapshot {
            flags: Some(0x1000),
            txqlen: Some(1000),
            group: Some(0),
            ..s
        };
        assert_eq!(round_trip(&s), s);
    }
}
