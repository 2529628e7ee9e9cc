//! What dranet may do on the API server, derived from the calls the code makes: the one source
//! of the ClusterRole. `deploy/rbac.yaml` and the Helm chart's role are checked against
//! [`PERMISSIONS`] by the tests (`rbac::tests`, and `dranet-sim/tests/rbac.rs`, which also shows
//! that every permission is needed by a named scenario and that nothing else is ever asked for).
//!
//! A refused request (403) is logged once per missing permission, with the verb, group and
//! resource the server named (see [`note_forbidden`]).

use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock};

/// One permission: a verb on a resource (with its subresource) of an API group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// Resource, with `/<subresource>` where the call is on one.
    pub resource: &'static str,
    pub verb: &'static str,
    /// Only for the object named after the driver (`resourceNames: [<driver>]`).
    pub driver_name_only: bool,
    /// The code path that makes the call.
    pub used_by: &'static str,
}

const fn p(
    group: &'static str,
    resource: &'static str,
    verb: &'static str,
    used_by: &'static str,
) -> Permission {
    Permission {
        group,
        resource,
        verb,
        driver_name_only: false,
        used_by,
    }
}

/// Every permission `dranet run` needs in kube mode, and nothing more.
pub const PERMISSIONS: &[Permission] = &[
    p(
        "",
        "nodes",
        "get",
        "slices::kube_api KubePublisher::owner: the Node's uid for the slices' ownerReference",
    ),
    p(
        "",
        "events",
        "create",
        "report::api KubeSink::event: ClaimPrepareFailed, NetworkDeviceAttachFailed, NetworkDeviceRescued",
    ),
    p(
        "",
        "events",
        "patch",
        "report::api KubeSink::patch_event: count and lastTimestamp of a repeated event",
    ),
    p(
        "resource.k8s.io",
        "resourceslices",
        "list",
        "slices::kube_api KubePublisher::existing: this node's slices (generation, pruning)",
    ),
    p(
        "resource.k8s.io",
        "resourceslices",
        "create",
        "slices::kube_api KubePublisher::publish: server-side apply of a slice that does not exist yet",
    ),
    p(
        "resource.k8s.io",
        "resourceslices",
        "patch",
        "slices::kube_api KubePublisher::publish: server-side apply (an HTTP PATCH) of every slice",
    ),
    p(
        "resource.k8s.io",
        "resourceslices",
        "delete",
        "slices::kube_api KubePublisher::publish: pruning this node's stale slices",
    ),
    p(
        "resource.k8s.io",
        "resourceclaims",
        "get",
        "dra::claim KubeClaimSource::get: the allocated claim at NodePrepareResources",
    ),
    p(
        "resource.k8s.io",
        "resourceclaims",
        "list",
        "dra::claim KubeClaimSource::list: this node's allocated claims, to adopt running pods with no record (adoption)",
    ),
    p(
        "resource.k8s.io",
        "resourceclaims/status",
        "patch",
        "report::api KubeSink::apply_claim_status: server-side apply of status.devices",
    ),
    Permission {
        group: "resource.k8s.io",
        resource: "resourceclaims/driver",
        verb: "associated-node:patch",
        driver_name_only: true,
        used_by: "report::api KubeSink::apply_claim_status: writing status.devices (1.36 granular status authorization)",
    },
];

/// One rule of a ClusterRole, as the tests compare them: every (group, resource, verb,
/// resourceName) it grants.
pub type Grant = (String, String, String, Option<String>);

/// The grants of [`PERMISSIONS`] for `driver`.
#[must_use]
pub fn grants(driver: &str) -> BTreeSet<Grant> {
    PERMISSIONS
        .iter()
        .map(|p| {
            (
                p.group.to_owned(),
                p.resource.to_owned(),
                p.verb.to_owned(),
                p.driver_name_only.then(|| driver.to_owned()),
            )
        })
        .collect()
}

/// The grants of a ClusterRole's `rules` (JSON, as parsed from YAML): one per group × resource ×
/// verb × resourceName.
#[must_use]
pub fn grants_of_rules(rules: &serde_json::Value) -> BTreeSet<Grant> {
    let strs = |v: &serde_json::Value, k: &str| -> Vec<String> {
        v.get(k)
            .and_then(serde_json::Value::as_array)
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let mut out = BTreeSet::new();
    for rule in rules.as_array().into_iter().flatten() {
        let names = strs(rule, "resourceNames");
        let names: Vec<Option<String>> = if names.is_empty() {
            vec![None]
        } else {
            names.into_iter().map(Some).collect()
        };
        for g in strs(rule, "apiGroups") {
            for r in strs(rule, "resources") {
                for v in strs(rule, "verbs") {
                    for n in &names {
                        out.insert((g.clone(), r.clone(), v.clone(), n.clone()));
                    }
                }
            }
        }
    }
    out
}

/// The `rules:` of the ClusterRole for `driver`, as YAML (4-space indented items), one rule per
/// resource with a comment naming the code path of each verb: what `deploy/rbac.yaml` and the
/// chart carry.
#[must_use]
pub fn rules_yaml(driver: &str) -> String {
    let mut keys: Vec<(&str, &str, bool)> = Vec::new();
    for p in PERMISSIONS {
        let k = (p.group, p.resource, p.driver_name_only);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut out = String::new();
    for (group, resource, named) in keys {
        let perms: Vec<&Permission> = PERMISSIONS
            .iter()
            .filter(|p| (p.group, p.resource, p.driver_name_only) == (group, resource, named))
            .collect();
        for p in &perms {
            out.push_str(&format!("  # {}: {}\n", p.verb, p.used_by));
        }
        out.push_str(&format!("  - apiGroups: [\"{group}\"]\n"));
        out.push_str(&format!("    resources: [\"{resource}\"]\n"));
        let verbs: Vec<String> = perms.iter().map(|p| format!("\"{}\"", p.verb)).collect();
        out.push_str(&format!("    verbs: [{}]\n", verbs.join(", ")));
        if named {
            out.push_str(&format!("    resourceNames: [\"{driver}\"]\n"));
        }
    }
    out
}

/// The permission a 403 names: `(verb, group, resource)` parsed from the server's message
/// (`... cannot <verb> resource "<resource>" in API group "<group>" ...`).
#[must_use]
pub fn missing_permission(message: &str) -> Option<(String, String, String)> {
    let rest = message.split("cannot ").nth(1)?;
    let (verb, rest) = rest.split_once(" resource \"")?;
    let (resource, rest) = rest.split_once('"')?;
    let group = rest
        .split_once("in API group \"")
        .and_then(|(_, g)| g.split_once('"'))
        .map_or("", |(g, _)| g);
    Some((verb.to_owned(), group.to_owned(), resource.to_owned()))
}

/// The status code of a kube error that came from the API server, if any.
#[must_use]
pub fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

fn logged() -> &'static Mutex<BTreeSet<(String, String, String)>> {
    static LOGGED: OnceLock<Mutex<BTreeSet<(String, String, String)>>> = OnceLock::new();
    LOGGED.get_or_init(Mutex::default)
}

/// Whether this is the first 403 for (verb, group, resource) in this process.
fn first_time(verb: &str, group: &str, resource: &str) -> bool {
    logged()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert((verb.to_owned(), group.to_owned(), resource.to_owned()))
}

/// Logs a 403 once per missing permission (later ones at debug level), naming the verb, group
/// and resource the server refused and the code path that needs it; returns a one-line reason
/// for readiness (`403 Forbidden: cannot patch resourceslices.resource.k8s.io`). `fallback` is
/// what the caller asked for, used when the message names nothing.
pub fn note_forbidden(e: &kube::Error, fallback: (&str, &str, &str)) -> Option<String> {
    let kube::Error::Api(s) = e else {
        return None;
    };
    if s.code != 403 {
        return None;
    }
    let (verb, group, resource) = missing_permission(&s.message).unwrap_or_else(|| {
        (
            fallback.0.to_owned(),
            fallback.1.to_owned(),
            fallback.2.to_owned(),
        )
    });
    let used_by = PERMISSIONS
        .iter()
        .find(|p| p.verb == verb && p.group == group && p.resource == resource)
        .map_or("(not a permission dranet asks for)", |p| p.used_by);
    let first = first_time(&verb, &group, &resource);
    let api_group = if group.is_empty() {
        "\"\" (core)"
    } else {
        group.as_str()
    };
    if first {
        tracing::error!(
            verb = %verb,
            group = %api_group,
            resource = %resource,
            needed_by = used_by,
            server = %s.message,
            "403 Forbidden: dranet's ClusterRole lacks a permission (see deploy/rbac.yaml); devices stay protected, this API call keeps failing until it is granted"
        );
    } else {
        tracing::debug!(verb = %verb, group = %api_group, resource = %resource, "403 Forbidden again");
    }
    let what = if group.is_empty() {
        resource
    } else {
        format!("{resource}.{group}")
    };
    Some(format!("403 Forbidden: cannot {verb} {what}: {}", s.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(path: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn cluster_role_rules(yaml: &str) -> Vec<serde_json::Value> {
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml).expect("YAML");
        docs.into_iter()
            .filter(|d| d["kind"] == "ClusterRole")
            .map(|d| d["rules"].clone())
            .collect()
    }

    fn check(path: &str, yaml: &str) {
        let roles = cluster_role_rules(yaml);
        assert_eq!(roles.len(), 1, "{path}: one ClusterRole");
        let got = grants_of_rules(&roles[0]);
        let want = grants("dra.net");
        assert!(
            got == want,
            "{path}: the ClusterRole differs from rbac::PERMISSIONS\n  granted, never used: {:?}\n  used, not granted: {:?}\nrules from the table:\n{}",
            got.difference(&want).collect::<Vec<_>>(),
            want.difference(&got).collect::<Vec<_>>(),
            rules_yaml("dra.net")
        );
    }

    #[test]
    fn deploy_rbac_yaml_is_the_table() {
        check("deploy/rbac.yaml", &repo("deploy/rbac.yaml"));
    }

    #[test]
    fn the_charts_rendered_role_is_the_table() {
        // Rendered with the chart's default values by scripts/validate-manifests.sh, which
        // fails when this file differs from a fresh rendering.
        let path = "deploy/helm/rendered/default.yaml";
        check(path, &repo(path));
    }

    #[test]
    fn deploy_rbac_yaml_carries_the_rules_as_generated() {
        let text = repo("deploy/rbac.yaml");
        assert!(
            text.contains(&rules_yaml("dra.net")),
            "deploy/rbac.yaml: the rules block is not rbac::rules_yaml(\"dra.net\"); put this under `rules:`:\n{}",
            rules_yaml("dra.net")
        );
    }

    #[test]
    fn missing_permission_from_a_real_message() {
        let m = r#"resourceslices.resource.k8s.io "n-dra.net-0" is forbidden: User "system:serviceaccount:kube-system:dranet" cannot patch resource "resourceslices" in API group "resource.k8s.io" at the cluster scope"#;
        assert_eq!(
            missing_permission(m),
            Some(("patch".into(), "resource.k8s.io".into(), "resourceslices".into()))
        );
        let m = r#"nodes "a" is forbidden: User "u" cannot get resource "nodes" in API group "" at the cluster scope"#;
        assert_eq!(
            missing_permission(m),
            Some(("get".into(), String::new(), "nodes".into()))
        );
        let m = r#"resourceclaims.resource.k8s.io "c" is forbidden: User "u" cannot associated-node:patch resource "resourceclaims/driver" in API group "resource.k8s.io" in the namespace "default""#;
        assert_eq!(
            missing_permission(m),
            Some((
                "associated-node:patch".into(),
                "resource.k8s.io".into(),
                "resourceclaims/driver".into()
            ))
        );
        assert_eq!(missing_permission("something else"), None);
    }

    #[test]
    fn a_403_is_noted_once_per_permission_with_a_reason() {
        let e = kube::Error::Api(
            kube::core::Status::failure(
                r#"resourceslices.resource.k8s.io "x" is forbidden: User "u" cannot delete resource "resourceslices" in API group "resource.k8s.io" at the cluster scope"#,
                "Forbidden",
            )
            .with_code(403)
            .boxed(),
        );
        let why = note_forbidden(&e, ("patch", "", "x")).unwrap();
        assert!(
            why.starts_with("403 Forbidden: cannot delete resourceslices.resource.k8s.io: "),
            "{why}"
        );
        // Logged at error level the first time only.
        assert!(!first_time("delete", "resource.k8s.io", "resourceslices"));
        assert!(first_time("never", "seen", "before"));
    }

    #[test]
    fn grants_expand_every_combination() {
        let rules = serde_json::json!([
            {"apiGroups": ["", "x"], "resources": ["a", "b"], "verbs": ["get"]},
            {"apiGroups": ["y"], "resources": ["c"], "verbs": ["v"], "resourceNames": ["n1", "n2"]}
        ]);
        assert_eq!(grants_of_rules(&rules).len(), 6);
    }
}
