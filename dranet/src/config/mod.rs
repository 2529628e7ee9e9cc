//! The opaque device configuration of a claim (`opaque.parameters` for driver `dra.net`),
//! JSON-compatible with upstream dranet (`pkg/apis/types.go`), and its validation
//! ([`parse_and_validate`], [`validate_rdma_only`]; rules in `validate.rs`).

mod validate;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `NetworkConfig`: the whole opaque config of one device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NetworkConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "InterfaceConfig::is_empty"
    )]
    pub interface: InterfaceConfig,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub routes: Vec<RouteConfig>,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub rules: Vec<RuleConfig>,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub neighbors: Vec<NeighborConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ethtool: Option<EthtoolConfig>,
}

/// `InterfaceConfig`: how the netdev looks inside the pod.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InterfaceConfig {
    /// Pod-side name (renamed in the same RTM_NEWLINK as the move); empty = keep the host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// CIDRs added after the move.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gso_max_size: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gro_max_size: Option<i32>,
    #[serde(default, rename = "gsoIPv4MaxSize", skip_serializing_if = "Option::is_none")]
    pub gso_ipv4_max_size: Option<i32>,
    #[serde(default, rename = "groIPv4MaxSize", skip_serializing_if = "Option::is_none")]
    pub gro_ipv4_max_size: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_ebpf_programs: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arp_ignore: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arp_announce: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrf: Option<VrfConfig>,
}

impl InterfaceConfig {
    /// True when no field is set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// `VRFConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VrfConfig {
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<i64>,
}

/// `RouteConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RouteConfig {
    #[serde(default, deserialize_with = "null_default")]
    pub destination: String,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub gateway: String,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub source: String,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_zero_u8"
    )]
    pub scope: u8,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_zero_i64"
    )]
    pub table: i64,
}

/// `RuleConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuleConfig {
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_zero_i64"
    )]
    pub priority: i64,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub source: String,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub destination: String,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_zero_i64"
    )]
    pub table: i64,
}

/// `NeighborConfig` (permanent ARP/NDP entry).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NeighborConfig {
    #[serde(default, deserialize_with = "null_default")]
    pub destination: String,
    #[serde(default, deserialize_with = "null_default")]
    pub hardware_addr: String,
}

/// `EthtoolConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EthtoolConfig {
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub features: BTreeMap<String, bool>,
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub private_flags: BTreeMap<String, bool>,
}

/// JSON `null` decodes to the zero value, as Go's `encoding/json` does for non-pointer fields.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

fn is_zero_u8(v: &u8) -> bool {
    *v == 0
}

fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

pub use validate::{
    ConfigError, FieldError, MAX_INTERFACE_NAME_LEN, MIN_MTU, is_valid_mac, mac_bytes, not_a_station_address,
    parse_and_validate, validate, validate_rdma_only,
};

impl NetworkConfig {
    /// Applies upstream's defaults (`defaults.go`): a VRF with a name and no table gets table
    /// `FNV-32a(name) % 1000 + 1000`.
    pub fn apply_defaults(&mut self) {
        if let Some(vrf) = self.interface.vrf.as_mut()
            && !vrf.name.is_empty()
            && vrf.table.is_none()
        {
            vrf.table = Some(i64::from(fnv32a(vrf.name.as_bytes()) % 1000 + 1000));
        }
    }
}

/// 32-bit FNV-1a, as Go's `hash/fnv.New32a`.
pub(crate) fn fnv32a(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in data {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}
