//! RBAC for the in-memory API server, as the real authorizer decides: the ClusterRoles bound to
//! dranet's ServiceAccount are loaded from the shipped manifests (`deploy/rbac.yaml`, or the
//! Helm chart rendered with its default values), and each request is turned into the attributes
//! the RBAC authorizer checks (verb from the method: `get`/`list`/`watch`, `create`, `update`,
//! `patch`, `delete`/`deletecollection`; API group, resource, subresource, name, namespace).
//! The API server adds the checks that are not plain RBAC of the HTTP verb: a server-side
//! apply that creates the object also needs `create`, and a claim status write that changes a
//! driver's `status.devices` entries also needs `resourceclaims/driver` with the node-aware
//! verb (`associated-node:<verb>` when the caller's service-account token is bound to the node
//! the claim is allocated on, `arbitrary-node:<verb>` otherwise; name = the driver), as the
//! Kubernetes 1.36 granular status authorization. A refusal is a 403 with the `Status` body of
//! a real API server. Test support only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// dranet's ServiceAccount in the shipped manifests.
pub const SA_NAMESPACE: &str = "kube-system";
pub const SA_NAME: &str = "dranet";

/// What the authorizer checks for one request.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Attributes {
    pub verb: String,
    /// API group (`""` for core).
    pub group: String,
    pub resource: String,
    /// Empty when none.
    pub subresource: String,
    /// Empty for list/create/deletecollection.
    pub name: String,
    /// Empty at the cluster scope.
    pub namespace: String,
}

impl Attributes {
    /// `resource` or `resource/subresource`, as RBAC rules name it.
    #[must_use]
    pub fn rbac_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// One grant: (group, resource[/sub], verb, resourceName) with `*` wildcards; `None` name = any.
pub type Grant = (String, String, String, Option<String>);

/// The caller: its user name and, for a bound service-account token, its node.
#[derive(Clone, Debug)]
pub struct User {
    pub name: String,
    pub node: Option<String>,
}

/// The rules in force for dranet's ServiceAccount.
#[derive(Clone, Debug)]
pub struct Authorizer {
    grants: BTreeSet<Grant>,
    /// Where the rules came from (for messages).
    pub source: String,
}

/// The repository root (two levels above this crate).
#[must_use]
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

impl Authorizer {
    /// The rules bound to `kube-system/dranet` in `deploy/rbac.yaml`.
    pub fn shipped() -> Result<Self> {
        Self::from_manifest(&repo_root().join("deploy/rbac.yaml"))
    }

    /// The rules bound to `kube-system/dranet` in the Helm chart rendered with its default
    /// values (`deploy/helm/rendered/default.yaml`, kept current by
    /// `scripts/validate-manifests.sh`).
    pub fn shipped_helm() -> Result<Self> {
        Self::from_manifest(&repo_root().join("deploy/helm/rendered/default.yaml"))
    }

    /// The rules of every ClusterRole that a ClusterRoleBinding in `path` binds to
    /// `kube-system/dranet`.
    pub fn from_manifest(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).with_context(|| format!("parsing {}", path.display()))?;
        let docs: Vec<Value> = docs.into_iter().filter(Value::is_object).collect();
        let mut grants = BTreeSet::new();
        let mut bound = 0;
        for b in docs.iter().filter(|d| d["kind"] == "ClusterRoleBinding") {
            let to_sa = b["subjects"].as_array().into_iter().flatten().any(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == SA_NAME && s["namespace"] == SA_NAMESPACE
            });
            if !to_sa || b["roleRef"]["kind"] != "ClusterRole" {
                continue;
            }
            let role_name = &b["roleRef"]["name"];
            let Some(role) = docs
                .iter()
                .find(|d| d["kind"] == "ClusterRole" && &d["metadata"]["name"] == role_name)
            else {
                bail!(
                    "{}: binding to ClusterRole {role_name} that is not there",
                    path.display()
                );
            };
            grants.extend(dranet::rbac::grants_of_rules(&role["rules"]));
            bound += 1;
        }
        if bound == 0 {
            bail!(
                "{}: no ClusterRole bound to {SA_NAMESPACE}/{SA_NAME}",
                path.display()
            );
        }
        Ok(Self {
            grants,
            source: path.display().to_string(),
        })
    }

    /// Every grant.
    #[must_use]
    pub fn grants(&self) -> &BTreeSet<Grant> {
        &self.grants
    }

    /// The same rules less one grant (a mutation of the role).
    #[must_use]
    pub fn without(&self, g: &Grant) -> Self {
        let mut grants = self.grants.clone();
        grants.remove(g);
        Self {
            grants,
            source: format!(
                "{} without {} {} {}",
                self.source,
                g.2,
                g.1,
                if g.0.is_empty() { "(core)" } else { &g.0 }
            ),
        }
    }

    /// The grant that allows `a`, if any.
    #[must_use]
    pub fn allowing(&self, a: &Attributes) -> Option<&Grant> {
        let res = a.rbac_resource();
        self.grants.iter().find(|(g, r, v, n)| {
            (g == "*" || *g == a.group)
                && (r == "*" || *r == res || r.strip_prefix("*/").is_some_and(|s| s == a.subresource))
                && (v == "*" || *v == a.verb)
                && n.as_ref().is_none_or(|n| !a.name.is_empty() && *n == a.name)
        })
    }
}

/// The attributes of a request to `path` (decoded) with `method` and `query`; `None` for a
/// non-resource path.
#[must_use]
pub fn attributes(method: &str, path: &str, query: &[(String, String)]) -> Option<Attributes> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (*ns, rest),
        _ => ("", rest),
    };
    let (resource, name, sub) = match rest {
        [r] => (*r, "", ""),
        [r, n] => (*r, *n, ""),
        [r, n, s] => (*r, *n, *s),
        _ => return None,
    };
    let watch = query
        .iter()
        .any(|(k, v)| k == "watch" && (v == "true" || v == "1"));
    let verb = match (method, name.is_empty()) {
        ("GET" | "HEAD", _) if watch => "watch",
        ("GET" | "HEAD", true) => "list",
        ("GET" | "HEAD", false) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "deletecollection",
        ("DELETE", false) => "delete",
        _ => return None,
    };
    Some(Attributes {
        verb: verb.to_owned(),
        group: group.to_owned(),
        resource: resource.to_owned(),
        subresource: sub.to_owned(),
        name: name.to_owned(),
        namespace: namespace.to_owned(),
    })
}

/// The 403 a real API server sends: `<resource>.<group> "<name>" is forbidden: User "<user>"
/// cannot <verb> resource "<resource>[/<sub>]" in API group "<group>" <scope>[: <extra>]`.
#[must_use]
pub fn forbidden(user: &str, a: &Attributes, extra: &str) -> Value {
    let gr = if a.group.is_empty() {
        a.resource.clone()
    } else {
        format!("{}.{}", a.resource, a.group)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_owned()
    } else {
        format!("in the namespace \"{}\"", a.namespace)
    };
    let mut message = format!(
        "{gr} \"{}\" is forbidden: User \"{user}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
        a.name,
        a.verb,
        a.rbac_resource(),
        a.group
    );
    if a.name.is_empty() {
        message = message.replacen(
            &format!("{gr} \"\" is forbidden"),
            &format!("{gr} is forbidden"),
            1,
        );
    }
    if !extra.is_empty() {
        message.push_str(": ");
        message.push_str(extra);
    }
    let mut status = crate::apiserver::status_body(403, "Forbidden", &message);
    status["details"] = json!({"name": a.name, "group": a.group, "kind": a.resource});
    status
}

/// The entries of `status.devices` of `driver` in a claim (or an apply body).
#[must_use]
pub fn device_entries<'a>(obj: &'a Value, driver: &str) -> Vec<&'a Value> {
    obj.pointer("/status/devices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|d| d["driver"] == driver)
        .collect()
}

/// The drivers named in `status.devices` of either object.
#[must_use]
pub fn drivers_in(a: &Value, b: &Value) -> BTreeSet<String> {
    [a, b]
        .iter()
        .filter_map(|o| o.pointer("/status/devices").and_then(Value::as_array))
        .flatten()
        .filter_map(|d| d["driver"].as_str().map(str::to_owned))
        .collect()
}

/// Whether the claim is allocated on `node`: its allocation's node selector names the node (a
/// `metadata.name` field selector, as the scheduler writes it), or, without a selector, every
/// allocated device is in a pool named after the node (the simulator's claims).
#[must_use]
pub fn allocated_on(claim: &Value, node: &str) -> bool {
    let alloc = &claim["status"]["allocation"];
    if let Some(terms) = alloc
        .pointer("/nodeSelector/nodeSelectorTerms")
        .and_then(Value::as_array)
    {
        return terms.iter().any(|t| {
            t["matchFields"].as_array().into_iter().flatten().any(|f| {
                f["key"] == "metadata.name"
                    && f["operator"] == "In"
                    && f["values"]
                        .as_array()
                        .is_some_and(|v| v.iter().any(|x| x == node))
            })
        });
    }
    let results = alloc.pointer("/devices/results").and_then(Value::as_array);
    results.is_some_and(|r| !r.is_empty() && r.iter().all(|d| d["pool"] == node))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &[(&str, &str)]) -> Vec<(String, String)> {
        s.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    #[test]
    fn verbs_from_methods_as_the_rbac_authorizer() {
        let cases = [
            ("GET", "/api/v1/nodes/a", vec![], "get", "", "nodes", "", "a", ""),
            (
                "GET",
                "/apis/resource.k8s.io/v1/resourceslices",
                vec![],
                "list",
                "resource.k8s.io",
                "resourceslices",
                "",
                "",
                "",
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1/resourceslices",
                vec![("watch", "true")],
                "watch",
                "resource.k8s.io",
                "resourceslices",
                "",
                "",
                "",
            ),
            (
                "POST",
                "/api/v1/namespaces/ns/events",
                vec![],
                "create",
                "",
                "events",
                "",
                "",
                "ns",
            ),
            (
                "PUT",
                "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status",
                vec![],
                "update",
                "resource.k8s.io",
                "resourceclaims",
                "status",
                "c",
                "ns",
            ),
            (
                "PATCH",
                "/api/v1/namespaces/ns/events/e",
                vec![],
                "patch",
                "",
                "events",
                "",
                "e",
                "ns",
            ),
            (
                "DELETE",
                "/apis/resource.k8s.io/v1/resourceslices/s",
                vec![],
                "delete",
                "resource.k8s.io",
                "resourceslices",
                "",
                "s",
                "",
            ),
            (
                "DELETE",
                "/apis/resource.k8s.io/v1/resourceslices",
                vec![],
                "deletecollection",
                "resource.k8s.io",
                "resourceslices",
                "",
                "",
                "",
            ),
        ];
        for (m, p, query, verb, group, res, sub, name, ns) in cases {
            let a = attributes(m, p, &q(&query)).unwrap();
            assert_eq!(
                (
                    a.verb.as_str(),
                    a.group.as_str(),
                    a.resource.as_str(),
                    a.subresource.as_str(),
                    a.name.as_str(),
                    a.namespace.as_str()
                ),
                (verb, group, res, sub, name, ns),
                "{m} {p}"
            );
        }
        assert!(attributes("GET", "/healthz", &[]).is_none());
    }

    #[test]
    fn shipped_roles_load_and_match_with_resource_names_and_wildcards() {
        let a = Authorizer::shipped().unwrap();
        let h = Authorizer::shipped_helm().unwrap();
        assert_eq!(
            a.grants(),
            h.grants(),
            "deploy/rbac.yaml and the chart grant the same"
        );
        let attrs = |verb: &str, res: &str, sub: &str, name: &str| Attributes {
            verb: verb.into(),
            group: "resource.k8s.io".into(),
            resource: res.into(),
            subresource: sub.into(),
            name: name.into(),
            namespace: "ns".into(),
        };
        assert!(
            a.allowing(&attrs(
                "associated-node:patch",
                "resourceclaims",
                "driver",
                "dra.net"
            ))
            .is_some()
        );
        assert!(
            a.allowing(&attrs(
                "associated-node:patch",
                "resourceclaims",
                "driver",
                "other.net"
            ))
            .is_none()
        );
        assert!(
            a.allowing(&attrs(
                "arbitrary-node:patch",
                "resourceclaims",
                "driver",
                "dra.net"
            ))
            .is_none()
        );
        assert!(
            a.allowing(&attrs("update", "resourceclaims", "status", "c"))
                .is_none()
        );
        assert!(a.allowing(&attrs("watch", "resourceslices", "", "")).is_none());
        let g = a
            .allowing(&attrs("patch", "resourceslices", "", "s"))
            .cloned()
            .unwrap();
        assert!(
            a.without(&g)
                .allowing(&attrs("patch", "resourceslices", "", "s"))
                .is_none()
        );
    }

    #[test]
    fn forbidden_status_reads_like_the_api_servers() {
        let a = attributes(
            "PATCH",
            "/apis/resource.k8s.io/v1/resourceslices/n-dra.net-0",
            &[],
        )
        .unwrap();
        let s = forbidden("system:serviceaccount:kube-system:dranet", &a, "");
        assert_eq!(
            s["message"],
            "resourceslices.resource.k8s.io \"n-dra.net-0\" is forbidden: User \"system:serviceaccount:kube-system:dranet\" cannot patch resource \"resourceslices\" in API group \"resource.k8s.io\" at the cluster scope"
        );
        assert_eq!(s["reason"], "Forbidden");
        assert_eq!(s["code"], 403);
        assert_eq!(s["details"]["kind"], "resourceslices");
        let a = attributes("POST", "/api/v1/namespaces/ns/events", &[]).unwrap();
        assert_eq!(
            forbidden("u", &a, "")["message"],
            "events is forbidden: User \"u\" cannot create resource \"events\" in API group \"\" in the namespace \"ns\""
        );
        assert_eq!(
            dranet::rbac::missing_permission(s["message"].as_str().unwrap()),
            Some(("patch".into(), "resource.k8s.io".into(), "resourceslices".into()))
        );
    }
}
