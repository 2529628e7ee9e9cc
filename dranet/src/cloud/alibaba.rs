//! Alibaba Cloud (upstream `pkg/cloudprovider/alibaba`): the ECS metadata service at
//! `100.100.100.200/latest` (a token from `PUT /latest/api/token`, sent as
//! `X-aliyun-ecs-metadata-token`). `alibaba.dra.net/instanceType` on every device (when the
//! metadata gave one) and `alibaba.dra.net/erdma: true` on the eRDMA devices (`erdma*` in
//! `class/infiniband`, by their PCI address).

use std::collections::{BTreeMap, BTreeSet};

use super::{CloudError, CloudOptions, CloudTiming, Endpoint, string};
use crate::inventory::{AttrValue, DeviceIds};

pub const INSTANCE_TYPE: &str = "alibaba.dra.net/instanceType";
pub const ERDMA: &str = "alibaba.dra.net/erdma";

/// What ECS says about this instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Alibaba {
    pub instance_type: String,
    pub erdma_pci_addresses: BTreeSet<String>,
}

async fn token(ep: &Endpoint, timing: CloudTiming) -> Result<String, CloudError> {
    let path = "/latest/api/token";
    let r = super::http::send(
        ep,
        http::Method::PUT,
        path,
        &[("X-aliyun-ecs-metadata-token-ttl-seconds", "21600")],
        None,
        timing.request,
    )
    .await?;
    Ok(super::ok(ep, path, r)?.text().trim().to_owned())
}

async fn get(ep: &Endpoint, path: &str, timing: CloudTiming) -> Result<String, CloudError> {
    let t = token(ep, timing).await?;
    let r = super::get_ok(ep, path, &[("X-aliyun-ecs-metadata-token", &t)], timing).await?;
    Ok(r.text().trim().to_owned())
}

pub(super) async fn probe(ep: &Endpoint, timing: CloudTiming) -> Result<(), CloudError> {
    get(ep, "/latest/meta-data/instance-id", timing).await.map(|_| ())
}

/// As upstream, an instance type that cannot be read is logged and left empty: the eRDMA
/// attribute does not need it.
pub(super) async fn instance(ep: &Endpoint, opts: &CloudOptions) -> Alibaba {
    let t = opts.timing;
    let instance_type = match super::retry(t, t.fetch_for, || {
        get(ep, "/latest/meta-data/instance/instance-type", t)
    })
    .await
    {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %crate::telemetry::chain(&e), "Alibaba Cloud instance type unavailable: no alibaba.dra.net/instanceType");
            String::new()
        }
    };
    Alibaba {
        instance_type,
        erdma_pci_addresses: erdma_addresses(&opts.sysfs),
    }
}

/// PCI addresses of the `erdma*` devices: the last component of their `device` link.
fn erdma_addresses(sysfs: &std::path::Path) -> BTreeSet<String> {
    let dir = sysfs.join("class/infiniband");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return BTreeSet::new();
    };
    rd.filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("erdma"))
        .filter_map(|e| std::fs::read_link(e.path().join("device")).ok())
        .filter_map(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect()
}

impl Alibaba {
    pub(super) fn device_attributes(&self, ids: &DeviceIds) -> BTreeMap<String, AttrValue> {
        let mut out = BTreeMap::new();
        if !self.instance_type.is_empty() {
            out.insert(INSTANCE_TYPE.to_owned(), string(&self.instance_type));
        }
        if !ids.pci_address.is_empty() && self.erdma_pci_addresses.contains(&ids.pci_address) {
            out.insert(ERDMA.to_owned(), AttrValue::Bool(true));
        }
        out
    }
}
