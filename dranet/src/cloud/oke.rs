//! OCI / OKE (upstream `pkg/cloudprovider/oke`): the instance metadata service v2 at `/opc/v2`
//! with `Authorization: Bearer Oracle`. Node-level RDMA topology on every device, from
//! `/opc/v2/host/`: `oke.dra.net/hpcIslandId`, `networkBlockId`, `localBlockId`, `rackId`,
//! `gpuMemoryFabricId` (those that are not empty). With `rdmaTopologyData` (GB200, GB300...) the
//! OCIDs are cut to their unique suffix (at most 60 characters, to fit an attribute); without it
//! (H100...) the top-level `networkBlockId` and `rackId` are used as given.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{CloudError, CloudOptions, CloudTiming, Endpoint, string};
use crate::inventory::AttrValue;

pub const HPC_ISLAND_ID: &str = "oke.dra.net/hpcIslandId";
pub const NETWORK_BLOCK_ID: &str = "oke.dra.net/networkBlockId";
pub const LOCAL_BLOCK_ID: &str = "oke.dra.net/localBlockId";
pub const RACK_ID: &str = "oke.dra.net/rackId";
pub const GPU_MEMORY_FABRIC_ID: &str = "oke.dra.net/gpuMemoryFabricId";

const HEADERS: [(&str, &str); 1] = [("Authorization", "Bearer Oracle")];

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Topology {
    #[serde(default)]
    customer_gpu_memory_fabric: String,
    #[serde(default, rename = "customerHPCIslandId")]
    customer_hpc_island_id: String,
    #[serde(default)]
    customer_local_block: String,
    #[serde(default)]
    customer_network_block: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Host {
    #[serde(default)]
    network_block_id: String,
    #[serde(default)]
    rack_id: String,
    #[serde(default)]
    rdma_topology_data: Option<Topology>,
}

/// The node's topology.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Oke {
    pub hpc_island_id: String,
    pub network_block_id: String,
    pub local_block_id: String,
    pub rack_id: String,
    pub gpu_memory_fabric_id: String,
}

pub(super) async fn probe(ep: &Endpoint, timing: CloudTiming) -> Result<(), CloudError> {
    super::get_ok(ep, "/opc/v2/instance/", &HEADERS, timing)
        .await
        .map(|_| ())
}

pub(super) async fn instance(ep: &Endpoint, opts: &CloudOptions) -> Result<Oke, CloudError> {
    let t = opts.timing;
    let path = "/opc/v2/host/";
    let host: Host = super::retry(t, t.fetch_for, || async {
        let r = super::get_ok(ep, path, &HEADERS, t).await?;
        super::decode(ep, path, &r.body)
    })
    .await
    .map_err(|e| match e {
        CloudError::Timeout { .. } | CloudError::Status { .. } => CloudError::Invalid {
            what: "OCI host metadata",
            why: format!("{e} (please enable TopologyData for your tenancy)"),
        },
        other => other,
    })?;
    let Some(topo) = host.rdma_topology_data else {
        return Ok(Oke {
            network_block_id: host.network_block_id,
            rack_id: host.rack_id,
            ..Oke::default()
        });
    };
    Ok(Oke {
        hpc_island_id: ocid_suffix("HPCIslandId", &topo.customer_hpc_island_id)?,
        network_block_id: ocid_suffix("NetworkBlockId", &topo.customer_network_block)?,
        local_block_id: ocid_suffix("LocalBlockId", &topo.customer_local_block)?,
        rack_id: host.rack_id,
        gpu_memory_fabric_id: ocid_suffix("GpuMemoryFabric", &topo.customer_gpu_memory_fabric)?,
    })
}

/// The part of an OCID after its last `.`, at most its last 60 characters; empty stays empty.
fn ocid_suffix(what: &str, s: &str) -> Result<String, CloudError> {
    if s.is_empty() {
        return Ok(String::new());
    }
    let invalid = |why: &str| CloudError::Invalid {
        what: "OCI host metadata",
        why: format!("invalid {what}: {why}: {s:?}"),
    };
    if !s.contains("ocid") {
        return Err(invalid("not an OCID (no 'ocid')"));
    }
    let (_, suffix) = s
        .rsplit_once('.')
        .ok_or_else(|| invalid("not an OCID (no '.')"))?;
    let skip = suffix.len().saturating_sub(60);
    Ok(suffix.get(skip..).unwrap_or(suffix).to_owned())
}

impl Oke {
    pub(super) fn device_attributes(&self) -> BTreeMap<String, AttrValue> {
        [
            (HPC_ISLAND_ID, &self.hpc_island_id),
            (NETWORK_BLOCK_ID, &self.network_block_id),
            (LOCAL_BLOCK_ID, &self.local_block_id),
            (RACK_ID, &self.rack_id),
            (GPU_MEMORY_FABRIC_ID, &self.gpu_memory_fabric_id),
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
    fn ocid_suffixes() {
        let long = format!("ocid1.hpcisland.oc1.iad.{}", "a".repeat(70));
        assert_eq!(ocid_suffix("x", &long).unwrap(), "a".repeat(60));
        assert_eq!(ocid_suffix("x", "ocid1.rack.oc1.iad.abc").unwrap(), "abc");
        assert_eq!(ocid_suffix("x", "").unwrap(), "");
        assert!(ocid_suffix("x", "not-an-id").is_err());
        assert!(ocid_suffix("x", "ocid1").is_err());
    }
}
