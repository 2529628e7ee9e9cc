//! The parts of a `resource.k8s.io/v1` ResourceClaim that Prepare reads (own serde types, API
//! field names), and where claims come from: [`ClaimSource`] ([`KubeClaimSource`] GETs them,
//! [`FileClaimSource`] reads `--claims-dir`, [`MemoryClaimSource`] serves tests). Listing every
//! claim and picking the devices this node's pods hold ([`devices_by_pod`]) is in [`list`]:
//! adoption needs it.

mod list;

pub use list::{FileClaimSource, devices_by_pod};

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// Errors of claim sources.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("ResourceClaim {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("getting ResourceClaim {namespace}/{name}")]
    Kube {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("getting ResourceClaim {namespace}/{name}: no answer from the API server within {after:?}")]
    Timeout {
        namespace: String,
        name: String,
        after: std::time::Duration,
    },
    #[error("decoding ResourceClaim {namespace}/{name}")]
    Decode {
        namespace: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("listing ResourceClaims")]
    List {
        #[source]
        source: kube::Error,
    },
    #[error("listing ResourceClaims: no answer from the API server within {after:?}")]
    ListTimeout { after: std::time::Duration },
    #[error("reading the claims directory {dir}")]
    ListDir {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("this claim source cannot list claims")]
    ListUnsupported,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaim {
    #[serde(default)]
    pub metadata: ClaimMeta,
    #[serde(default)]
    pub status: ClaimStatus,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationResult>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_for: Vec<ConsumerReference>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationResult {
    #[serde(default)]
    pub devices: DeviceAllocationResult,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAllocationResult {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<DeviceRequestAllocationResult>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<DeviceAllocationConfiguration>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRequestAllocationResult {
    #[serde(default)]
    pub request: String,
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub pool: String,
    #[serde(default)]
    pub device: String,
    #[serde(default, rename = "shareID", skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}

/// `source` is `FromClass` or `FromClaim`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAllocationConfiguration {
    #[serde(default)]
    pub source: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opaque: Option<OpaqueDeviceConfiguration>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpaqueDeviceConfiguration {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub parameters: serde_json::Value,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerReference {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub uid: String,
}

/// Where Prepare gets ResourceClaims.
pub trait ClaimSource: Send + Sync + 'static {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimError>>;

    /// Every ResourceClaim of every namespace (adoption picks this node's allocated ones with
    /// [`devices_by_pod`]). A claim that cannot be decoded is left out (logged) rather than
    /// failing the others. The default: this source cannot list.
    fn list<'a>(&'a self) -> BoxFuture<'a, Result<Vec<ResourceClaim>, ClaimError>> {
        Box::pin(async { Err(ClaimError::ListUnsupported) })
    }
}

/// How long Prepare waits for the API server's answer to one claim GET by default: well inside
/// kubelet's 45 s NodePrepareResources deadline, so a hung API server is a clear per-claim error
/// (and kubelet's retry a fresh attempt) rather than a call kubelet gives up on.
pub const CLAIM_GET_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// GET `resource.k8s.io/v1` resourceclaims from the API server.
///
/// A read that gets no usable answer (connection refused or reset, 429, 5xx) is retried with
/// jittered backoff (100 ms doubling to 2 s) until the claim's deadline; a 404 or a 403 is
/// final at once. A 403 is logged once with the missing permission. With a
/// [`crate::ready::Readiness`], the outcome of the last read is its `claims` condition.
#[derive(Clone)]
pub struct KubeClaimSource {
    client: kube::Client,
    timeout: std::time::Duration,
    ready: Option<crate::ready::Readiness>,
}

impl KubeClaimSource {
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            timeout: CLAIM_GET_TIMEOUT,
            ready: None,
        }
    }

    /// Bounds each GET by `timeout` instead of [`CLAIM_GET_TIMEOUT`].
    #[must_use]
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Reports each read's outcome as the [`crate::ready::CLAIMS`] condition.
    #[must_use]
    pub fn with_readiness(mut self, ready: crate::ready::Readiness) -> Self {
        self.ready = Some(ready);
        self
    }

    fn observe(&self, res: &Result<ResourceClaim, ClaimError>) {
        let Some(r) = &self.ready else {
            return;
        };
        match res {
            Ok(_) | Err(ClaimError::NotFound { .. } | ClaimError::Decode { .. }) => {
                r.set_met(crate::ready::CLAIMS);
            }
            Err(e @ ClaimError::Kube { source, .. }) => {
                let why = crate::rbac::note_forbidden(source, ("get", "resource.k8s.io", "resourceclaims"))
                    .unwrap_or_else(|| crate::telemetry::chain(e).to_string());
                r.set_unmet(
                    crate::ready::CLAIMS,
                    format!("ResourceClaims not readable: {why}"),
                );
            }
            Err(e @ ClaimError::Timeout { .. }) => {
                r.set_unmet(crate::ready::CLAIMS, format!("ResourceClaims not readable: {e}"));
            }
            // Listing errors are adoption's (logged there), never a GET's.
            Err(
                ClaimError::List { .. }
                | ClaimError::ListTimeout { .. }
                | ClaimError::ListDir { .. }
                | ClaimError::ListUnsupported,
            ) => {}
        }
    }

    async fn fetch(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError> {
        use k8s_openapi::api::resource::v1::ResourceClaim as Rc;
        let api: kube::Api<Rc> = kube::Api::namespaced(self.client.clone(), namespace);
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut backoff = crate::backoff::Backoff::new(
            std::time::Duration::from_millis(100),
            std::time::Duration::from_secs(2),
        );
        let rc = loop {
            let got = match tokio::time::timeout_at(deadline, api.get(name)).await {
                Ok(got) => got,
                Err(_) => {
                    return Err(ClaimError::Timeout {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                        after: self.timeout,
                    });
                }
            };
            match got {
                Ok(rc) => break rc,
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    return Err(ClaimError::NotFound {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                    });
                }
                Err(source) => {
                    let wait = backoff.next_delay();
                    if !transient(&source) || tokio::time::Instant::now() + wait >= deadline {
                        return Err(ClaimError::Kube {
                            namespace: namespace.to_owned(),
                            name: name.to_owned(),
                            source,
                        });
                    }
                    tracing::debug!(%namespace, %name, error = %crate::telemetry::chain(&source), retry_in = ?wait, "claim read failed, retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        };
        let decode = |source| ClaimError::Decode {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source,
        };
        let v = serde_json::to_value(&rc).map_err(decode)?;
        serde_json::from_value(v).map_err(decode)
    }
}

/// Whether a failed read may work when tried again soon: no answer at all, or the server said
/// it is overloaded or failing (429, 5xx). Not a 4xx that will stay what it is.
fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

impl ClaimSource for KubeClaimSource {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimError>> {
        Box::pin(async move {
            let res = self.fetch(namespace, name).await;
            self.observe(&res);
            res
        })
    }

    fn list<'a>(&'a self) -> BoxFuture<'a, Result<Vec<ResourceClaim>, ClaimError>> {
        Box::pin(self.list_all())
    }
}

/// Claims kept in memory, keyed by `namespace/name` (tests, offline runs).
#[derive(Clone, Debug, Default)]
pub struct MemoryClaimSource {
    claims: Arc<RwLock<HashMap<String, ResourceClaim>>>,
}

impl MemoryClaimSource {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a claim (keyed by its metadata namespace and name).
    pub fn insert(&self, claim: ResourceClaim) {
        let key = format!("{}/{}", claim.metadata.namespace, claim.metadata.name);
        let mut g = match self.claims.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        g.insert(key, claim);
    }

    pub fn remove(&self, namespace: &str, name: &str) {
        let mut g = match self.claims.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        g.remove(&format!("{namespace}/{name}"));
    }
}

impl ClaimSource for MemoryClaimSource {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimError>> {
        Box::pin(async move {
            let g = match self.claims.read() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            g.get(&format!("{namespace}/{name}"))
                .cloned()
                .ok_or_else(|| ClaimError::NotFound {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
        })
    }

    fn list<'a>(&'a self) -> BoxFuture<'a, Result<Vec<ResourceClaim>, ClaimError>> {
        Box::pin(async move {
            let g = match self.claims.read() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            Ok(g.values().cloned().collect())
        })
    }
}
