//! Publishing through the API server: server-side apply of each slice (field manager = driver
//! name, forced), then deletion of this node's slices of this driver that are no longer wanted.
//! Slices carry an ownerReference to the Node (controller) so they go away with it.

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};

use super::{API_VERSION, KIND, OwnerReference, Publisher, ResourceSlice, SliceError};

/// Publishes to the cluster.
#[derive(Clone)]
pub struct KubePublisher {
    client: kube::Client,
    driver: String,
    node: String,
}

impl KubePublisher {
    #[must_use]
    pub fn new(client: kube::Client, driver: &str, node: &str) -> Self {
        Self {
            client,
            driver: driver.to_owned(),
            node: node.to_owned(),
        }
    }

    fn api(&self) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", KIND);
        let ar = ApiResource::from_gvk_with_plural(&gvk, "resourceslices");
        Api::all_with(self.client.clone(), &ar)
    }

    fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> SliceError {
        let what = what.into();
        move |source| SliceError::Kube { what, source }
    }

    /// This node's slices of this driver.
    async fn existing(&self) -> Result<Vec<DynamicObject>, SliceError> {
        let lp = ListParams::default().fields(&format!(
            "spec.nodeName={},spec.driver={}",
            self.node, self.driver
        ));
        Ok(self
            .api()
            .list(&lp)
            .await
            .map_err(Self::kube_err("listing ResourceSlices"))?
            .items)
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

    fn owner<'a>(&'a self) -> BoxFuture<'a, Option<OwnerReference>> {
        Box::pin(async move {
            let nodes: Api<Node> = Api::all(self.client.clone());
            match nodes.get(&self.node).await {
                Ok(n) => n.metadata.uid.map(|uid| OwnerReference {
                    api_version: "v1".to_owned(),
                    kind: "Node".to_owned(),
                    name: self.node.clone(),
                    uid,
                    controller: Some(true),
                }),
                Err(e) => {
                    tracing::warn!(node = %self.node, error = %e, "no Node object; publishing slices without owner");
                    None
                }
            }
        })
    }

    fn publish<'a>(&'a self, slices: &'a [ResourceSlice]) -> BoxFuture<'a, Result<(), SliceError>> {
        Box::pin(async move {
            let api = self.api();
            let pp = PatchParams::apply(&self.driver).force();
            for s in slices {
                debug_assert_eq!(s.api_version, API_VERSION);
                api.patch(&s.metadata.name, &pp, &Patch::Apply(s))
                    .await
                    .map_err(Self::kube_err(format!(
                        "applying ResourceSlice {}",
                        s.metadata.name
                    )))?;
            }
            for old in self.existing().await? {
                let Some(name) = old.metadata.name else {
                    continue;
                };
                if slices.iter().any(|s| s.metadata.name == name) {
                    continue;
                }
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => {
                        return Err(SliceError::Kube {
                            what: format!("deleting stale ResourceSlice {name}"),
                            source: e,
                        });
                    }
                }
            }
            Ok(())
        })
    }
}
