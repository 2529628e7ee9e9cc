//! ResourceSlices (`resource.k8s.io/v1`) for this node's devices: one pool named after the node,
//! at most [`MAX_DEVICES_PER_SLICE`] devices per slice (the pool is split across slices with
//! `resourceSliceCount`), one `generation` for all slices of the pool, bumped on every change.
//!
//! [`build_slices`] is pure; a [`Publisher`] puts slices somewhere ([`KubePublisher`]: the API
//! server, [`DirPublisher`]: one JSON file per slice); [`SliceController`] re-publishes when the
//! inventory changes ([`diff`]).

mod dir;
mod kube_api;
mod published;
mod run;

use std::borrow::Borrow;
use std::collections::BTreeMap;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

pub use crate::telemetry::metrics::SliceMetrics;
pub use dir::DirPublisher;
pub use kube_api::{API_REQUEST_TIMEOUT, KubePublisher};
pub use published::{PUBLISHED_READ_TIMEOUT, PublishedDevice, PublishedDevices};
pub use run::{
    DEFAULT_MAX_INTERVAL, DEFAULT_MIN_INTERVAL, DEFAULT_SETTLE, DEFAULT_SETTLE_MAX, LoopTiming, RescanHandle,
    link_events, publish_loop,
};

use crate::inventory::{AttrValue, Device};
use crate::shared::Shared;

/// Upstream's driver name.
pub const DEFAULT_DRIVER: &str = "dra.net";
/// `ResourceSliceMaxDevices` (v1).
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// The limit for a slice with list attributes (`DRAListTypeAttributes`; Kubernetes 1.35+).
pub const MAX_DEVICES_PER_SLICE_WITH_LISTS: usize = 64;
pub const API_VERSION: &str = "resource.k8s.io/v1";
pub const KIND: &str = "ResourceSlice";

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum SliceError {
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("encoding slice {name}")]
    Json {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("kube API: {what}: no answer within {after:?}")]
    Timeout {
        what: String,
        after: std::time::Duration,
    },
    #[error("kube API: {what}")]
    Kube {
        what: String,
        /// The permission the request needs: (verb, API group, resource).
        needs: &'static (&'static str, &'static str, &'static str),
        #[source]
        source: kube::Error,
    },
}

impl SliceError {
    /// The HTTP status of the failed request (`403`, `500`...), `timeout`, `unreachable` (no
    /// answer: connection refused, TLS...) or `local` (files, encoding): the label of the
    /// publish-failure metric.
    #[must_use]
    pub fn status_label(&self) -> String {
        match self {
            Self::Kube { source, .. } => {
                crate::rbac::status_code(source).map_or_else(|| "unreachable".to_owned(), |c| c.to_string())
            }
            Self::Timeout { .. } => "timeout".to_owned(),
            Self::Io { .. } | Self::Json { .. } => "local".to_owned(),
        }
    }

    /// One line for `/readyz`: a 403 names the missing permission (and is logged once), other
    /// errors give their cause chain.
    #[must_use]
    pub fn reason(&self) -> String {
        if let Self::Kube { needs, source, .. } = self
            && let Some(r) = crate::rbac::note_forbidden(source, **needs)
        {
            return r;
        }
        crate::telemetry::chain(self).to_string()
    }
}

/// `metadata.ownerReferences[]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<bool>,
}

/// The part of `ObjectMeta` we write.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<OwnerReference>,
}

/// `ResourcePool`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePool {
    pub name: String,
    pub generation: i64,
    pub resource_slice_count: i64,
}

/// v1 `Device` (flat, no `basic` wrapper); only the fields dranet uses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceDevice {
    pub name: String,
    /// The inventory's own map while the device is unchanged ([`Shared`]), not a copy.
    #[serde(default, skip_serializing_if = "no_attributes")]
    pub attributes: Shared<BTreeMap<String, AttrValue>>,
}

fn no_attributes(a: &Shared<BTreeMap<String, AttrValue>>) -> bool {
    a.is_empty()
}

/// `ResourceSliceSpec`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    pub driver: String,
    pub pool: ResourcePool,
    pub node_name: String,
    #[serde(default)]
    pub devices: Vec<SliceDevice>,
}

/// A `resource.k8s.io/v1` `ResourceSlice`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSlice {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: ResourceSliceSpec,
}

/// Label put on every slice so stale ones can be found without a field selector.
pub const NODE_LABEL: &str = "dra.net/node";

/// Deterministic slice name: `<node>-<driver>-<index>` (a DNS subdomain when the node name is).
#[must_use]
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    let mut base = format!("{node}-{driver}");
    base.truncate(240);
    format!("{base}-{index}")
}

/// Splits `devices` into slices of ≤ 128 devices (≤ 64 when a device has a list attribute;
/// always at least one slice, possibly empty, so the pool exists), all with `generation` and
/// the same `resourceSliceCount`.
#[must_use]
pub fn build_slices<D: Borrow<Device>>(
    driver: &str,
    node: &str,
    generation: i64,
    owner: Option<&OwnerReference>,
    devices: &[D],
) -> Vec<ResourceSlice> {
    let lists = devices
        .iter()
        .any(|d| device(d).attributes.values().any(AttrValue::is_list));
    let per_slice = if lists {
        MAX_DEVICES_PER_SLICE_WITH_LISTS
    } else {
        MAX_DEVICES_PER_SLICE
    };
    let chunks: Vec<&[D]> = if devices.is_empty() {
        vec![&[]]
    } else {
        devices.chunks(per_slice).collect()
    };
    let count = i64::try_from(chunks.len()).unwrap_or(i64::MAX);
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| ResourceSlice {
            api_version: API_VERSION.to_owned(),
            kind: KIND.to_owned(),
            metadata: ObjectMeta {
                name: slice_name(node, driver, i),
                labels: BTreeMap::from([(NODE_LABEL.to_owned(), node.to_owned())]),
                owner_references: owner.cloned().into_iter().collect(),
            },
            spec: ResourceSliceSpec {
                driver: driver.to_owned(),
                pool: ResourcePool {
                    name: node.to_owned(),
                    generation,
                    resource_slice_count: count,
                },
                node_name: node.to_owned(),
                devices: chunk
                    .iter()
                    .map(|d| SliceDevice {
                        name: device(d).name.clone(),
                        attributes: device(d).attributes.clone(),
                    })
                    .collect(),
            },
        })
        .collect()
}

/// What changed between two inventories (by device name).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InventoryDiff {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

impl InventoryDiff {
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// A device of a list of devices or of shared ones.
fn device<D: Borrow<Device>>(d: &D) -> &Device {
    d.borrow()
}

/// Compares published views (name + attributes) of two inventories.
#[must_use]
pub fn diff<A: Borrow<Device>, B: Borrow<Device>>(old: &[A], new: &[B]) -> InventoryDiff {
    let o: BTreeMap<&str, &BTreeMap<String, AttrValue>> = old
        .iter()
        .map(|d| (device(d).name.as_str(), &*device(d).attributes))
        .collect();
    let n: BTreeMap<&str, &BTreeMap<String, AttrValue>> = new
        .iter()
        .map(|d| (device(d).name.as_str(), &*device(d).attributes))
        .collect();
    let mut out = InventoryDiff::default();
    for (name, attrs) in &n {
        match o.get(name) {
            None => out.added.push((*name).to_owned()),
            Some(prev) if prev != attrs => out.changed.push((*name).to_owned()),
            Some(_) => {}
        }
    }
    out.removed = o
        .keys()
        .filter(|k| !n.contains_key(*k))
        .map(|k| (*k).to_owned())
        .collect();
    out
}

/// Where slices go. Implementations replace the node's whole set: create/update the given
/// slices and delete this node's slices of this driver that are not in it.
pub trait Publisher: Send + Sync {
    /// Highest pool generation already published for this node (0 if none), so a restarted
    /// driver continues above it.
    fn existing_generation<'a>(&'a self) -> BoxFuture<'a, Result<i64, SliceError>>;
    /// The owner reference to put on slices (the Node), if known.
    /// `Ok(None)` when there is no Node object; an error when the API server did not say.
    fn owner<'a>(&'a self) -> BoxFuture<'a, Result<Option<OwnerReference>, SliceError>>;
    fn publish<'a>(&'a self, slices: &'a [ResourceSlice]) -> BoxFuture<'a, Result<(), SliceError>>;
}

/// Re-publishes the pool when the inventory changes.
pub struct SliceController<P: Publisher> {
    publisher: P,
    driver: String,
    node: String,
    generation: Option<i64>,
    last: Option<crate::inventory::DeviceList>,
    metrics: Option<SliceMetrics>,
    ready: Option<crate::ready::Readiness>,
}

impl<P: Publisher> SliceController<P> {
    pub fn new(publisher: P, driver: impl Into<String>, node: impl Into<String>) -> Self {
        Self {
            publisher,
            driver: driver.into(),
            node: node.into(),
            generation: None,
            last: None,
            metrics: None,
            ready: None,
        }
    }

    /// The metrics publications are recorded in, if any.
    #[must_use]
    pub fn metrics(&self) -> Option<&SliceMetrics> {
        self.metrics.as_ref()
    }

    /// Records publications in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: SliceMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Reports each publication's outcome as the [`crate::ready::SLICES`] condition.
    #[must_use]
    pub fn with_readiness(mut self, ready: crate::ready::Readiness) -> Self {
        ready.expect(crate::ready::SLICES, "ResourceSlices not published yet");
        self.ready = Some(ready);
        self
    }

    #[must_use]
    pub fn publisher(&self) -> &P {
        &self.publisher
    }

    /// Current pool generation (after the first publish).
    #[must_use]
    pub fn generation(&self) -> Option<i64> {
        self.generation
    }

    /// Publishes `devices` if they differ from the last published set (or nothing was
    /// published yet); returns whether it published.
    pub async fn update<D: Borrow<Device>>(&mut self, devices: &[D]) -> Result<bool, SliceError> {
        if self.unchanged(devices) {
            return Ok(false);
        }
        self.publish(devices).await?;
        Ok(true)
    }

    /// [`Self::update`] of a shared list, which is kept as the last published set (no copy).
    pub async fn update_shared(
        &mut self,
        devices: &crate::inventory::DeviceList,
    ) -> Result<bool, SliceError> {
        if self.unchanged(devices) {
            return Ok(false);
        }
        self.publish_shared(devices).await?;
        Ok(true)
    }

    /// `devices` are the last published set.
    fn unchanged<D: Borrow<Device>>(&self, devices: &[D]) -> bool {
        self.last
            .as_ref()
            .is_some_and(|last| diff(last, devices).is_empty())
    }

    /// Publishes unconditionally (e.g. after kubelet re-registration wiped the slices).
    pub async fn publish<D: Borrow<Device>>(&mut self, devices: &[D]) -> Result<(), SliceError> {
        let list = crate::inventory::list_of(devices.iter().map(|d| device(d).clone()));
        self.publish_shared(&list).await
    }

    /// [`Self::publish`] of a shared list.
    pub async fn publish_shared(&mut self, devices: &crate::inventory::DeviceList) -> Result<(), SliceError> {
        match self.try_publish(devices).await {
            Ok(()) => {
                if let Some(m) = &self.metrics {
                    let rdma = devices
                        .iter()
                        .filter(|d| {
                            d.attributes.get(crate::inventory::attr::RDMA) == Some(&AttrValue::Bool(true))
                        })
                        .count();
                    m.published(devices.len(), rdma);
                }
                if let Some(r) = &self.ready {
                    r.set_met(crate::ready::SLICES);
                }
                Ok(())
            }
            Err(e) => {
                if let Some(m) = &self.metrics {
                    m.failed(&e.status_label());
                }
                if let Some(r) = &self.ready {
                    r.set_unmet(
                        crate::ready::SLICES,
                        format!("ResourceSlices not published: {}", e.reason()),
                    );
                }
                Err(e)
            }
        }
    }

    async fn try_publish(&mut self, devices: &crate::inventory::DeviceList) -> Result<(), SliceError> {
        let generation = match self.generation {
            Some(g) => g + 1,
            None => self.publisher.existing_generation().await? + 1,
        };
        let owner = self.publisher.owner().await?;
        let slices = build_slices(&self.driver, &self.node, generation, owner.as_ref(), devices);
        if let Err(e) = self.publisher.publish(&slices).await {
            // Some slices of this generation may be out already: the next attempt takes a new
            // one, so no two different device sets are ever published under one generation.
            self.generation = Some(generation);
            return Err(e);
        }
        self.generation = Some(generation);
        self.last = Some(devices.clone());
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod kube_mock;
#[cfg(test)]
mod tests;
