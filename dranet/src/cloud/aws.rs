//! AWS (upstream `pkg/cloudprovider/aws`): the EC2 instance metadata service (IMDSv2: a token
//! from `PUT /latest/api/token`, falling back to IMDSv1 when the token is refused), its
//! identity document for the instance type. Attributes only on Neuron instances (`trn*`,
//! `inf*`) and only for devices bound to the `efa` driver: their EFA device groups
//! ([`super::neuron`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::{CloudError, CloudOptions, CloudTiming, Endpoint, neuron, string};
use crate::inventory::{AttrValue, DeviceIds};

const TOKEN_PATH: &str = "/latest/api/token";
const DOCUMENT_PATH: &str = "/latest/dynamic/instance-identity/document";

#[derive(Debug, Deserialize)]
struct Document {
    #[serde(default, rename = "instanceType")]
    instance_type: String,
    #[serde(default)]
    region: String,
}

/// What EC2 says about this instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Aws {
    pub instance_type: String,
    pub region: String,
    pub neuron: bool,
    /// sysfs root: the EFA driver of a device, DMI `product_name`.
    pub sysfs: PathBuf,
}

/// A Trainium or Inferentia instance type (the letters before the first digit are `trn` or
/// `inf`).
#[must_use]
pub fn is_neuron(instance_type: &str) -> bool {
    let lower = instance_type.to_ascii_lowercase();
    let prefix = lower
        .split(|c: char| c.is_ascii_digit())
        .next()
        .unwrap_or_default();
    prefix == "trn" || prefix == "inf"
}

async fn document(ep: &Endpoint, timing: CloudTiming) -> Result<Document, CloudError> {
    let token = super::http::send(
        ep,
        http::Method::PUT,
        TOKEN_PATH,
        &[("X-aws-ec2-metadata-token-ttl-seconds", "21600")],
        None,
        timing.request,
    )
    .await?;
    // IMDSv2 when the token is given; IMDSv1 when IMDS answers the token request otherwise.
    let token = (token.status == 200).then(|| token.text().trim().to_owned());
    let headers: Vec<(&str, &str)> = token
        .as_deref()
        .map(|t| vec![("X-aws-ec2-metadata-token", t)])
        .unwrap_or_default();
    let r = super::get_ok(ep, DOCUMENT_PATH, &headers, timing).await?;
    super::decode(ep, DOCUMENT_PATH, &r.body)
}

pub(super) async fn probe(ep: &Endpoint, timing: CloudTiming) -> Result<(), CloudError> {
    document(ep, timing).await.map(|_| ())
}

pub(super) async fn instance(ep: &Endpoint, opts: &CloudOptions) -> Result<Aws, CloudError> {
    let t = opts.timing;
    let doc = super::retry(t, t.fetch_for, || document(ep, t)).await?;
    Ok(Aws {
        neuron: is_neuron(&doc.instance_type),
        instance_type: doc.instance_type,
        region: doc.region,
        sysfs: opts.sysfs.clone(),
    })
}

impl Aws {
    fn is_efa(&self, pci: &str) -> bool {
        crate::pci::validate_address(pci).is_ok()
            && crate::pci::driver_of(&self.sysfs, pci).is_ok_and(|d| d == "efa")
    }

    pub(super) fn device_attributes(&self, ids: &DeviceIds) -> BTreeMap<String, AttrValue> {
        if !self.neuron || !self.is_efa(&ids.pci_address) {
            return BTreeMap::new();
        }
        let dmi = self.sysfs.join("devices/virtual/dmi/id/product_name");
        let Ok(product) = std::fs::read_to_string(&dmi) else {
            tracing::warn!(path = %dmi.display(), pci = %ids.pci_address, "no DMI product name: no EFA device groups");
            return BTreeMap::new();
        };
        match neuron::device_groups(product.trim(), &ids.pci_address) {
            Ok(groups) => groups.into_iter().map(|(k, v)| (k, string(&v))).collect(),
            Err(neuron::NoGroups::NoTable(f)) => {
                tracing::warn!(family = %f, pci = %ids.pci_address, "no EFA wiring table for this instance family");
                BTreeMap::new()
            }
            Err(why) => {
                tracing::debug!(?why, pci = %ids.pci_address, "no EFA device groups");
                BTreeMap::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neuron_instance_types() {
        for (t, want) in [
            ("trn1.32xlarge", true),
            ("trn2.48xlarge", true),
            ("inf1.24xlarge", true),
            ("inf2.48xlarge", true),
            ("p5.48xlarge", false),
            ("g5.xlarge", false),
            ("m5.xlarge", false),
            ("c6i.large", false),
            ("", false),
        ] {
            assert_eq!(is_neuron(t), want, "{t}");
        }
    }
}
