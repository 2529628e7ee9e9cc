//! Listing claims, for adoption: every `resource.k8s.io/v1` ResourceClaim of the cluster
//! ([`KubeClaimSource`], paged) or of `--claims-dir` ([`FileClaimSource`]), and the devices of
//! this driver in this node's pool that each pod holds through them ([`devices_by_pod`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use tracing::warn;

use super::{ClaimError, ClaimSource, KubeClaimSource, ResourceClaim, transient};

/// Claims per page of a list: a large cluster's claims come in several requests, none of them
/// huge.
const LIST_PAGE: u32 = 500;

/// The devices that each pod holds through `claims`: pod UID → slice device names of the results
/// of `driver` in `pool` (this node), for claims that are allocated and reserved for pods. A claim
/// reserved for several pods counts for each; other consumers (not `pods` of the core group) are
/// not pods and count for none.
#[must_use]
pub fn devices_by_pod(
    claims: &[ResourceClaim],
    driver: &str,
    pool: &str,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for rc in claims {
        let Some(alloc) = &rc.status.allocation else {
            continue;
        };
        let devices: Vec<&str> = alloc
            .devices
            .results
            .iter()
            .filter(|r| r.driver == driver && r.pool == pool && !r.device.is_empty())
            .map(|r| r.device.as_str())
            .collect();
        if devices.is_empty() {
            continue;
        }
        let pods = rc
            .status
            .reserved_for
            .iter()
            .filter(|c| c.api_group.is_empty() && c.resource == "pods" && !c.uid.is_empty());
        for pod in pods {
            out.entry(pod.uid.clone())
                .or_default()
                .extend(devices.iter().map(|d| (*d).to_owned()));
        }
    }
    out
}

/// Decodes one claim as the API server sent it (dynamic, so any v1 claim decodes into our
/// tolerant types).
fn decode(obj: &DynamicObject) -> Result<ResourceClaim, ClaimError> {
    let decode_err = |source| ClaimError::Decode {
        namespace: obj.metadata.namespace.clone().unwrap_or_default(),
        name: obj.metadata.name.clone().unwrap_or_default(),
        source,
    };
    let v = serde_json::to_value(obj).map_err(decode_err)?;
    serde_json::from_value(v).map_err(decode_err)
}

impl KubeClaimSource {
    /// Every claim of the cluster, page by page; each page's request is bounded by the source's
    /// timeout and retried with backoff while the API server gives no usable answer.
    pub(super) async fn list_all(&self) -> Result<Vec<ResourceClaim>, ClaimError> {
        let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceClaim");
        let ar = ApiResource::from_gvk_with_plural(&gvk, "resourceclaims");
        let api: kube::Api<DynamicObject> = kube::Api::all_with(self.client.clone(), &ar);
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut lp = ListParams::default().limit(LIST_PAGE);
            if let Some(t) = &token {
                lp = lp.continue_token(t);
            }
            let page = self.list_page(&api, &lp).await?;
            for obj in &page.items {
                match decode(obj) {
                    Ok(rc) => out.push(rc),
                    Err(e) => {
                        warn!(error = %crate::telemetry::chain(&e), "a ResourceClaim that cannot be decoded is left out")
                    }
                }
            }
            match page.metadata.continue_ {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => break,
            }
        }
        Ok(out)
    }

    async fn list_page(
        &self,
        api: &kube::Api<DynamicObject>,
        lp: &ListParams,
    ) -> Result<kube::core::ObjectList<DynamicObject>, ClaimError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut backoff = crate::backoff::Backoff::new(
            std::time::Duration::from_millis(100),
            std::time::Duration::from_secs(2),
        );
        loop {
            let Ok(got) = tokio::time::timeout_at(deadline, api.list(lp)).await else {
                return Err(ClaimError::ListTimeout { after: self.timeout });
            };
            match got {
                Ok(page) => return Ok(page),
                Err(source) => {
                    let wait = backoff.next_delay();
                    if !transient(&source) || tokio::time::Instant::now() + wait >= deadline {
                        // A 403 names the missing permission, once.
                        let _ = crate::rbac::note_forbidden(
                            &source,
                            ("list", "resource.k8s.io", "resourceclaims"),
                        );
                        return Err(ClaimError::List { source });
                    }
                    tracing::debug!(error = %crate::telemetry::chain(&source), retry_in = ?wait, "claim list failed, retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

/// `--claims-dir`: ResourceClaims read from `<dir>/<namespace>/<name>.json` (no API server: the
/// node simulator and the demo write them there, as the scheduler would have allocated them).
#[derive(Clone, Debug)]
pub struct FileClaimSource {
    dir: PathBuf,
}

impl FileClaimSource {
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// `<ns>/<name>.json` files, each decoded; unreadable or undecodable ones are left out
    /// (logged). A missing directory holds no claims.
    fn list_sync(dir: &Path) -> Result<Vec<ResourceClaim>, ClaimError> {
        let dir_err = |source| ClaimError::ListDir {
            dir: dir.display().to_string(),
            source,
        };
        let namespaces = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(dir_err(e)),
        };
        let mut out = Vec::new();
        for ns in namespaces.filter_map(Result::ok) {
            let (Ok(ty), Some(ns_name)) = (ns.file_type(), ns.file_name().to_str().map(str::to_owned)) else {
                continue;
            };
            if !ty.is_dir() {
                continue;
            }
            let Ok(files) = std::fs::read_dir(ns.path()) else {
                continue;
            };
            for f in files.filter_map(Result::ok) {
                let path = f.path();
                let Some(name) = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_suffix(".json"))
                else {
                    continue;
                };
                if !f.file_type().is_ok_and(|t| t.is_file()) {
                    continue;
                }
                let decoded = std::fs::read(&path)
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice::<ResourceClaim>(&b).map_err(|e| e.to_string()));
                match decoded {
                    Ok(rc) => out.push(rc),
                    Err(e) => warn!(namespace = %ns_name, name, error = %e, "claim file left out"),
                }
            }
        }
        out.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        Ok(out)
    }
}

impl ClaimSource for FileClaimSource {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimError>> {
        Box::pin(async move {
            let safe = |s: &str| !s.is_empty() && !s.contains('/') && s != "." && s != "..";
            let not_found = || ClaimError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            };
            if !safe(namespace) || !safe(name) {
                return Err(not_found());
            }
            let path = self.dir.join(namespace).join(format!("{name}.json"));
            let bytes = tokio::fs::read(&path).await.map_err(|_| not_found())?;
            serde_json::from_slice(&bytes).map_err(|source| ClaimError::Decode {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                source,
            })
        })
    }

    fn list<'a>(&'a self) -> BoxFuture<'a, Result<Vec<ResourceClaim>, ClaimError>> {
        Box::pin(async move {
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || Self::list_sync(&dir))
                .await
                .unwrap_or_else(|_| Err(ClaimError::ListUnsupported))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(ns: &str, name: &str, results: serde_json::Value, reserved: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}")},
            "status": {"allocation": {"devices": {"results": results}}, "reservedFor": reserved}
        }))
        .unwrap()
    }

    fn pod(uid: &str) -> serde_json::Value {
        json!({"resource": "pods", "name": format!("pod-{uid}"), "uid": uid})
    }

    #[test]
    fn only_this_drivers_devices_in_this_nodes_pool_held_by_pods() {
        let claims = vec![
            claim(
                "a",
                "mine",
                json!([
                    {"request": "r0", "driver": "dra.net", "pool": "node-a", "device": "eth1"},
                    {"request": "r1", "driver": "dra.net", "pool": "node-b", "device": "eth2"},
                    {"request": "r2", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu0"},
                    {"request": "r3", "driver": "dra.net", "pool": "node-a", "device": "pci-0000-3b-00-1"}
                ]),
                json!([pod("p1")]),
            ),
            // Another node's claim.
            claim(
                "a",
                "theirs",
                json!([{"request": "r", "driver": "dra.net", "pool": "node-b", "device": "eth1"}]),
                json!([pod("p2")]),
            ),
            // Allocated but reserved for no pod yet, or for something that is not a pod.
            claim(
                "a",
                "unreserved",
                json!([{"request": "r", "driver": "dra.net", "pool": "node-a", "device": "eth3"}]),
                json!([]),
            ),
            claim(
                "a",
                "job",
                json!([{"request": "r", "driver": "dra.net", "pool": "node-a", "device": "eth4"}]),
                json!([{"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "j1"}]),
            ),
            // Shared by two pods.
            claim(
                "b",
                "shared",
                json!([{"request": "r", "driver": "dra.net", "pool": "node-a", "device": "eth5"}]),
                json!([pod("p1"), pod("p3")]),
            ),
        ];
        let mut not_allocated = claim("a", "pending", json!([]), json!([pod("p4")]));
        not_allocated.status.allocation = None;
        let mut all = claims;
        all.push(not_allocated);
        let got = devices_by_pod(&all, "dra.net", "node-a");
        let want: BTreeMap<String, BTreeSet<String>> = [
            ("p1", vec!["eth1", "eth5", "pci-0000-3b-00-1"]),
            ("p3", vec!["eth5"]),
        ]
        .into_iter()
        .map(|(p, d)| (p.to_owned(), d.into_iter().map(str::to_owned).collect()))
        .collect();
        assert_eq!(got, want);
        assert!(devices_by_pod(&all, "other.driver", "node-a").is_empty());
    }

    #[tokio::test]
    async fn the_claims_dir_lists_every_namespaces_claims_and_skips_what_is_not_a_claim() {
        let dir = std::env::temp_dir().join(format!("dranet-claims-list-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let src = FileClaimSource::new(&dir);
        // No directory yet: no claims.
        assert!(src.list().await.unwrap().is_empty());
        let c1 = claim(
            "ns1",
            "c1",
            json!([{"request": "r", "driver": "dra.net", "pool": "node-a", "device": "eth1"}]),
            json!([pod("p1")]),
        );
        let c2 = claim(
            "ns2",
            "c2",
            json!([{"request": "r", "driver": "dra.net", "pool": "node-a", "device": "eth2"}]),
            json!([pod("p2")]),
        );
        for c in [&c1, &c2] {
            let d = dir.join(&c.metadata.namespace);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join(format!("{}.json", c.metadata.name)),
                serde_json::to_vec(c).unwrap(),
            )
            .unwrap();
        }
        // Not claims: a broken file, a non-JSON name, a file at the top, the status the
        // embedded report sink writes under <dir>/status/<ns>/<name>.json.
        std::fs::write(dir.join("ns1/broken.json"), b"{not json").unwrap();
        std::fs::write(dir.join("ns1/notes.txt"), b"x").unwrap();
        std::fs::write(dir.join("top.json"), b"{}").unwrap();
        std::fs::create_dir_all(dir.join("status/ns1")).unwrap();
        std::fs::write(dir.join("status/ns1/c1.json"), b"{}").unwrap();
        let got = src.list().await.unwrap();
        assert_eq!(got, vec![c1.clone(), c2]);
        // And get still reads one.
        assert_eq!(src.get("ns1", "c1").await.unwrap(), c1);
        let by_pod = devices_by_pod(&got, "dra.net", "node-a");
        assert_eq!(by_pod.len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn the_api_servers_claims_are_listed_cluster_wide_page_by_page() {
        use crate::slices::kube_mock::{Step, scenario, status};
        use std::time::Duration;
        const L: &str = "/apis/resource.k8s.io/v1/resourceclaims";
        let item = |ns: &str, name: &str, pod: &str| {
            json!({"metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}")},
                   "spec": {"devices": {"requests": []}},
                   "status": {"allocation": {"devices": {"results": [
                        {"request": "r", "driver": "dra.net", "pool": "node-a", "device": "eth1"}]}},
                              "reservedFor": [{"resource": "pods", "name": "p", "uid": pod}]}})
        };
        let page = |items: Vec<serde_json::Value>, cont: &str| {
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList",
                   "metadata": {"resourceVersion": "7", "continue": cont}, "items": items})
        };
        let (client, verifier) = scenario(
            vec![
                // A failing server is asked again within the deadline.
                Step::get(L)
                    .query("limit=500")
                    .reply(503, status(503, "ServiceUnavailable")),
                Step::get(L)
                    .query("limit=500")
                    .reply(200, page(vec![item("a", "c1", "p1")], "tok-1")),
                Step::get(L)
                    .query("continue=tok-1")
                    .reply(200, page(vec![item("b", "c2", "p2")], "")),
                // A 403 is final.
                Step::get(L).reply(403, status(403, "Forbidden")),
            ],
            Duration::from_secs(5),
        );
        let src = KubeClaimSource::new(client).with_timeout(Duration::from_secs(3));
        let got = src.list().await.unwrap();
        let refused = src.list().await.unwrap_err();
        verifier.done().await;
        let names: Vec<&str> = got.iter().map(|c| c.metadata.name.as_str()).collect();
        assert_eq!(names, ["c1", "c2"]);
        let by_pod = devices_by_pod(&got, "dra.net", "node-a");
        assert_eq!(by_pod.keys().collect::<Vec<_>>(), ["p1", "p2"]);
        assert!(matches!(refused, ClaimError::List { .. }), "{refused:?}");
    }
}
