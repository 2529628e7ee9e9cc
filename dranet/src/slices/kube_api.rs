//! Publishing through the API server: server-side apply of each slice (field manager = driver
//! name, forced), then deletion of this node's slices of this driver that are no longer wanted.
//! Slices carry an ownerReference to the Node (controller) so they go away with it.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};

use super::{API_VERSION, KIND, OwnerReference, Publisher, ResourceSlice, SliceError};

const GROUP: &str = "resource.k8s.io";

/// How long one API request of a publish may take before the publish fails (and the publish
/// loop retries it with backoff): a hung API server must not stall slice updates forever.
pub const API_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Publishes to the cluster.
#[derive(Clone)]
pub struct KubePublisher {
    client: kube::Client,
    driver: String,
    node: String,
    timeout: Duration,
}

impl KubePublisher {
    #[must_use]
    pub fn new(client: kube::Client, driver: &str, node: &str) -> Self {
        Self {
            client,
            driver: driver.to_owned(),
            node: node.to_owned(),
            timeout: API_REQUEST_TIMEOUT,
        }
    }

    /// Bounds each API request by `timeout` instead of [`API_REQUEST_TIMEOUT`].
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs one API request under the timeout.
    async fn call<T>(
        &self,
        what: impl Into<String>,
        needs: &'static (&'static str, &'static str, &'static str),
        req: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, SliceError> {
        match tokio::time::timeout(self.timeout, req).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(SliceError::Kube {
                what: what.into(),
                needs,
                source,
            }),
            Err(_) => Err(SliceError::Timeout {
                what: what.into(),
                after: self.timeout,
            }),
        }
    }

    fn api(&self) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk(GROUP, "v1", KIND);
        let ar = ApiResource::from_gvk_with_plural(&gvk, "resourceslices");
        Api::all_with(self.client.clone(), &ar)
    }

    /// This node's slices of this driver.
    async fn existing(&self) -> Result<Vec<DynamicObject>, SliceError> {
        let lp = ListParams::default().fields(&format!(
            "spec.nodeName={},spec.driver={}",
            self.node, self.driver
        ));
        let api = self.api();
        Ok(self
            .call(
                "listing ResourceSlices",
                &("list", GROUP, "resourceslices"),
                api.list(&lp),
            )
            .await?
            .items)
    }
}

impl KubePublisher {
    /// This node's slices of this driver as JSON, whoever published them (upstream dranet's
    /// too): what [`super::PublishedDevices`] reads at start.
    pub fn existing_slices<'a>(&'a self) -> BoxFuture<'a, Result<Vec<serde_json::Value>, SliceError>> {
        Box::pin(async move {
            self.existing()
                .await?
                .iter()
                .map(|o| {
                    serde_json::to_value(o).map_err(|source| SliceError::Json {
                        name: o.metadata.name.clone().unwrap_or_default(),
                        source,
                    })
                })
                .collect()
        })
    }
}

fn generation_of(o: &DynamicObject) -> i64 {
    o.data
        .pointer("/spec/pool/generation")
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(0)
}

impl Publisher for KubePublisher {
    fn existing_generation<'a>(&'a self) -> BoxFuture<'a, Result<i64, SliceError>> {
        Box::pin(async move {
            Ok(self
                .existing()
                .await?
                .iter()
                .map(generation_of)
                .max()
                .unwrap_or(0))
        })
    }

    fn owner<'a>(&'a self) -> BoxFuture<'a, Result<Option<OwnerReference>, SliceError>> {
        Box::pin(async move {
            let nodes: Api<Node> = Api::all(self.client.clone());
            match self
                .call(
                    format!("getting Node {}", self.node),
                    &("get", "", "nodes"),
                    nodes.get(&self.node),
                )
                .await
            {
                Ok(n) => Ok(n.metadata.uid.map(|uid| OwnerReference {
                    api_version: "v1".to_owned(),
                    kind: "Node".to_owned(),
                    name: self.node.clone(),
                    uid,
                    controller: Some(true),
                })),
                Err(SliceError::Kube {
                    source: kube::Error::Api(e),
                    ..
                }) if e.code == 404 => {
                    tracing::warn!(node = %self.node, "no Node object; publishing slices without owner");
                    Ok(None)
                }
                // Without an answer we do not know the owner: the publish fails and is retried,
                // rather than slices going out without the Node that garbage-collects them.
                Err(e) => Err(e),
            }
        })
    }

    fn publish<'a>(&'a self, slices: &'a [ResourceSlice]) -> BoxFuture<'a, Result<(), SliceError>> {
        Box::pin(async move {
            let api = self.api();
            let pp = PatchParams::apply(&self.driver).force();
            for s in slices {
                debug_assert_eq!(s.api_version, API_VERSION);
                self.call(
                    format!("applying ResourceSlice {}", s.metadata.name),
                    &("patch", GROUP, "resourceslices"),
                    api.patch(&s.metadata.name, &pp, &Patch::Apply(s)),
                )
                .await?;
            }
            for old in self.existing().await? {
                let Some(name) = old.metadata.name else {
                    continue;
                };
                if slices.iter().any(|s| s.metadata.name == name) {
                    continue;
                }
                let dp = DeleteParams::default();
                match self
                    .call(
                        format!("deleting stale ResourceSlice {name}"),
                        &("delete", GROUP, "resourceslices"),
                        api.delete(&name, &dp),
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(SliceError::Kube {
                        source: kube::Error::Api(e),
                        ..
                    }) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })
    }
}
