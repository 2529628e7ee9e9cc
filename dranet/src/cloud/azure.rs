//! Azure (upstream `pkg/cloudprovider/azure`): the instance metadata service at
//! `/metadata/instance` (API version 2025-11-11, header `Metadata: true`). Node-level
//! attributes on every device: `azure.dra.net/vmSize`, `placementGroupId`,
//! `interconnectGroupId`, `interconnectSubgroupId` (those that are not empty).
//!
//! Not done here: upstream's per-NIC policy routing (`GetDeviceConfig`: a rule and default
//! route per NIC in table 100 + its index) is not merged into claims.

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
    super::retry(t, t.fetch_for, || async {
        let r = super::get_ok(ep, &path, &HEADERS, t).await?;
        super::decode(ep, &path, &r.body)
    })
    .await
}

impl Azure {
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
