//! GCE (upstream `pkg/cloudprovider/gce`): the metadata server at
//! `/computeMetadata/v1/` with `Metadata-Flavor: Google`.
//!
//! * every device: `gce.dra.net/machineType` (the last part of `instance/machine-type`) and,
//!   when `instance/attributes/physical_host` is `/block/subBlock/host`, `gce.dra.net/block`,
//!   `subBlock` and `host`;
//! * the device whose MAC is one of `instance/network-interfaces/`: `gce.dra.net/networkName`
//!   and `networkProjectNumber` (int) from its `projects/<number>/networks/<name>`, and
//!   `ipAliases` (comma-joined) when it has some. A network path that does not read so drops all
//!   of that device's attributes, as upstream.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{CloudError, CloudOptions, CloudTiming, Endpoint, get_ok, retry, string};
use crate::inventory::{AttrValue, DeviceIds};

pub const MACHINE_TYPE: &str = "gce.dra.net/machineType";
pub const BLOCK: &str = "gce.dra.net/block";
pub const SUB_BLOCK: &str = "gce.dra.net/subBlock";
pub const HOST: &str = "gce.dra.net/host";
pub const NETWORK_NAME: &str = "gce.dra.net/networkName";
pub const NETWORK_PROJECT_NUMBER: &str = "gce.dra.net/networkProjectNumber";
pub const IP_ALIASES: &str = "gce.dra.net/ipAliases";

const FLAVOR: [(&str, &str); 1] = [("Metadata-Flavor", "Google")];
const BASE: &str = "/computeMetadata/v1/";

/// One entry of `instance/network-interfaces/?recursive=true`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Interface {
    #[serde(default)]
    pub mac: String,
    #[serde(default)]
    pub network: String,
    #[serde(default, rename = "ipAliases")]
    pub ip_aliases: Vec<String>,
    #[serde(default)]
    pub mtu: i64,
}

/// What GCE says about this VM.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gce {
    pub name: String,
    pub machine_type: String,
    pub interfaces: Vec<Interface>,
    /// `physical_host`, when the VM has one.
    pub topology: Option<String>,
}

/// GCE's metadata server answers with `Metadata-Flavor: Google` (as Google's `OnGCE`).
pub(super) async fn probe(ep: &Endpoint, timing: CloudTiming) -> Result<(), CloudError> {
    let r = super::http::send(ep, http::Method::GET, "/", &FLAVOR, None, timing.request).await?;
    match r.headers.get("Metadata-Flavor").and_then(|v| v.to_str().ok()) {
        Some("Google") => Ok(()),
        other => Err(CloudError::Invalid {
            what: "GCE probe",
            why: format!("Metadata-Flavor is {other:?}, not Google"),
        }),
    }
}

async fn get(ep: &Endpoint, suffix: &str, timing: CloudTiming) -> Result<String, CloudError> {
    Ok(get_ok(ep, &format!("{BASE}{suffix}"), &FLAVOR, timing)
        .await?
        .text())
}

pub(super) async fn instance(ep: &Endpoint, opts: &CloudOptions) -> Result<Gce, CloudError> {
    let t = opts.timing;
    let mut g = retry(t, t.fetch_for, || async {
        let name = get(ep, "instance/name", t).await?.trim().to_owned();
        let machine_type = get(ep, "instance/machine-type", t).await?;
        let machine_type = machine_type.rsplit('/').next().unwrap_or_default().to_owned();
        let path = "instance/network-interfaces/?recursive=true&alt=json";
        let raw = get(ep, path, t).await?;
        let interfaces: Vec<Interface> = super::decode(ep, &format!("{BASE}{path}"), raw.as_bytes())?;
        Ok(Gce {
            name,
            machine_type,
            interfaces,
            topology: None,
        })
    })
    .await?;
    // Not every VM has a physical host; its absence is not an error.
    match get(ep, "instance/attributes/physical_host", t).await {
        Ok(topo) => g.topology = Some(topo),
        Err(e) => tracing::info!(vm = %g.name, error = %crate::telemetry::chain(&e),
            "GCE VM without physical_host: no block/subBlock/host attributes (normal for many machine types)"),
    }
    Ok(g)
}

impl Gce {
    pub(super) fn device_attributes(&self, ids: &DeviceIds) -> BTreeMap<String, AttrValue> {
        let mut out = BTreeMap::from([(MACHINE_TYPE.to_owned(), string(&self.machine_type))]);
        if let Some(topo) = self.topology.as_deref().filter(|t| !t.is_empty()) {
            let parts: Vec<&str> = topo.strip_prefix('/').unwrap_or(topo).splitn(3, '/').collect();
            if let [block, sub, host] = parts[..] {
                out.insert(BLOCK.to_owned(), string(block));
                out.insert(SUB_BLOCK.to_owned(), string(sub));
                out.insert(HOST.to_owned(), string(host));
            } else {
                tracing::debug!(topology = topo, "GCE physical_host is not /block/subBlock/host");
            }
        }
        if ids.mac.is_empty() {
            return out;
        }
        let Some(nic) = self.interfaces.iter().find(|i| i.mac == ids.mac) else {
            return out;
        };
        if !nic.ip_aliases.is_empty() {
            out.insert(IP_ALIASES.to_owned(), string(&nic.ip_aliases.join(",")));
        }
        match parse_network(&nic.network) {
            Some((number, name)) => {
                out.insert(NETWORK_NAME.to_owned(), string(name));
                out.insert(NETWORK_PROJECT_NUMBER.to_owned(), AttrValue::Int(number));
                out
            }
            None => {
                tracing::warn!(network = %nic.network, mac = %ids.mac, "GCE network is not projects/<number>/networks/<name>: no GCE attributes for this device");
                BTreeMap::new()
            }
        }
    }
}

/// `projects/<number>/networks/<name>` (Go's `Sscanf("projects/%d/networks/%s")`: the name
/// ends at white space).
fn parse_network(s: &str) -> Option<(i64, &str)> {
    let rest = s.strip_prefix("projects/")?;
    let (num, rest) = rest.split_once('/')?;
    let number: i64 = num.parse().ok()?;
    let name = rest.strip_prefix("networks/")?.split_whitespace().next()?;
    Some((number, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_paths() {
        assert_eq!(
            parse_network("projects/628944397724/networks/aojea-dra-net-1"),
            Some((628_944_397_724, "aojea-dra-net-1"))
        );
        assert_eq!(parse_network("projects/my-project/networks/default"), None);
        assert_eq!(parse_network("global/networks/default"), None);
        assert_eq!(parse_network("projects/1/networks/"), None);
    }
}
