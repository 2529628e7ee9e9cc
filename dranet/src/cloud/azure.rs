//! Azure (upstream `pkg/cloudprovider/azure`): the instance metadata service at
//! `/metadata/instance` (API version 2025-11-11, header `Metadata: true`). Node-level
//! attributes on every device: `azure.dra.net/vmSize`, `placementGroupId`,
//! `interconnectGroupId`, `interconnectSubgroupId` (those that are not empty).
//!
//! Its device config (upstream's `GetDeviceConfig`, merged under a claim's at Prepare): per-NIC
//! policy routing from `/metadata/instance/network` for the NIC with the device's MAC, in table
//! 100 + the NIC's index: a rule `from <subnet>` and a default route via the subnet's first
//! address. Not done: upstream's IPv6 rule and route (they need the interface's IPv6 default
//! gateway, which upstream looks up by the device's name, so only for devices named as their
//! interface).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{CloudError, CloudOptions, CloudTiming, Endpoint, string};
use crate::inventory::AttrValue;

pub const VM_SIZE: &str = "azure.dra.net/vmSize";
pub const PLACEMENT_GROUP_ID: &str = "azure.dra.net/placementGroupId";
pub const INTERCONNECT_GROUP_ID: &str = "azure.dra.net/interconnectGroupId";
pub const INTERCONNECT_SUBGROUP_ID: &str = "azure.dra.net/interconnectSubgroupId";

const API: &str = "api-version=2025-11-11";
const HEADERS: [(&str, &str); 1] = [("Metadata", "true")];

/// The compute metadata dranet reads.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Azure {
    #[serde(default)]
    pub vm_size: String,
    #[serde(default)]
    pub placement_group_id: String,
    #[serde(default)]
    pub interconnect_group_id: String,
    #[serde(default)]
    pub interconnect_subgroup_id: String,
    /// From `/metadata/instance/network` (empty when it could not be read).
    #[serde(skip)]
    pub interfaces: Vec<Nic>,
}

/// One NIC of `/metadata/instance/network` (the fields dranet reads).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Nic {
    #[serde(default)]
    pub mac_address: String,
    #[serde(default)]
    pub ipv4: Ipv4,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Ipv4 {
    #[serde(default)]
    pub subnet: Vec<Subnet>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Subnet {
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub prefix: String,
}

#[derive(Debug, Default, Deserialize)]
struct Network {
    #[serde(default)]
    interface: Vec<Nic>,
}

pub(super) async fn probe(ep: &Endpoint, timing: CloudTiming) -> Result<(), CloudError> {
    super::get_ok(
        ep,
        &format!("/metadata/instance?{API}&format=text"),
        &HEADERS,
        timing,
    )
    .await
    .map(|_| ())
}

pub(super) async fn instance(ep: &Endpoint, opts: &CloudOptions) -> Result<Azure, CloudError> {
    let t = opts.timing;
    let path = format!("/metadata/instance/compute?{API}&format=json");
    let mut a: Azure = super::retry(t, t.fetch_for, || async {
        let r = super::get_ok(ep, &path, &HEADERS, t).await?;
        super::decode(ep, &path, &r.body)
    })
    .await?;
    let path = format!("/metadata/instance/network?{API}&format=json");
    match super::retry(t, t.fetch_for, || async {
        let r = super::get_ok(ep, &path, &HEADERS, t).await?;
        super::decode::<Network>(ep, &path, &r.body)
    })
    .await
    {
        Ok(n) => a.interfaces = n.interface,
        Err(e) => {
            tracing::warn!(error = %crate::telemetry::chain(&e), "Azure network metadata unavailable: no per-NIC policy routing")
        }
    }
    Ok(a)
}

/// Table of the NIC at `index`.
const TABLE_BASE: i64 = 100;

/// `aa:bb:cc:dd:ee:ff`, `AA-BB-...` and `AABBCC...` compare equal.
fn normalize_mac(mac: &str) -> String {
    mac.chars()
        .filter(|c| *c != ':' && *c != '-')
        .collect::<String>()
        .to_ascii_lowercase()
}

/// The subnet's first address, if `address/prefix` is an IPv4 network base.
fn first_address(address: &str, prefix: &str) -> Option<std::net::Ipv4Addr> {
    let ip: std::net::Ipv4Addr = address.parse().ok()?;
    let len: u32 = prefix.parse().ok().filter(|l| *l <= 32)?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    let base = u32::from(ip);
    if base & mask != base {
        return None;
    }
    let first = base.checked_add(1)?;
    (first & mask == base).then(|| std::net::Ipv4Addr::from(first))
}

impl Azure {
    /// The NIC's policy routing (see the module docs), if the metadata lists its MAC.
    #[must_use]
    pub fn device_config(&self, ids: &crate::inventory::DeviceIds) -> Option<crate::config::NetworkConfig> {
        if ids.mac.is_empty() {
            return None;
        }
        let mac = normalize_mac(&ids.mac);
        let (index, nic) = self
            .interfaces
            .iter()
            .enumerate()
            .find(|(_, n)| normalize_mac(&n.mac_address) == mac)?;
        let table = TABLE_BASE + i64::try_from(index).ok()?;
        let subnet = nic.ipv4.subnet.first()?;
        let Some(gateway) = first_address(&subnet.address, &subnet.prefix) else {
            tracing::warn!(subnet = %format!("{}/{}", subnet.address, subnet.prefix), "Azure subnet is not an IPv4 network: no policy routing");
            return None;
        };
        Some(crate::config::NetworkConfig {
            rules: vec![crate::config::RuleConfig {
                source: format!("{}/{}", subnet.address, subnet.prefix),
                table,
                ..crate::config::RuleConfig::default()
            }],
            routes: vec![crate::config::RouteConfig {
                destination: "0.0.0.0/0".to_owned(),
                gateway: gateway.to_string(),
                table,
                ..crate::config::RouteConfig::default()
            }],
            ..crate::config::NetworkConfig::default()
        })
    }

    pub(super) fn device_attributes(&self) -> BTreeMap<String, AttrValue> {
        [
            (VM_SIZE, &self.vm_size),
            (PLACEMENT_GROUP_ID, &self.placement_group_id),
            (INTERCONNECT_GROUP_ID, &self.interconnect_group_id),
            (INTERCONNECT_SUBGROUP_ID, &self.interconnect_subgroup_id),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_owned(), string(v)))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_addresses() {
        assert_eq!(first_address("10.9.255.0", "24"), Some([10, 9, 255, 1].into()));
        assert_eq!(first_address("10.0.0.5", "24"), None, "not the network base");
        assert_eq!(first_address("10.0.0.0", "32"), None, "no room");
        assert_eq!(first_address("fd00::", "64"), None);
        assert_eq!(
            normalize_mac("00-11-AA-FF-BB-22"),
            normalize_mac("00:11:aa:ff:bb:22")
        );
        assert_eq!(normalize_mac("0011AAFFBB22"), "0011aaffbb22");
    }
}
