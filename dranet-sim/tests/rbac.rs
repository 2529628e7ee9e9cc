//! The shipped ClusterRole is exact: every grant is needed by a named scenario (removing it makes
//! that scenario fail against the enforcing API server), and every grant is used by some
//! request the code makes (none grants a verb nothing calls). The scenarios drive dranet's own
//! API code paths (slice publisher, claim source, status and event sink) against the in-memory
//! API server with RBAC from `deploy/rbac.yaml`; no root needed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use dranet::dra::{ClaimSource, KubeClaimSource};
use dranet::report::{ObjectRef, Patched, Reporter, Sink};
use dranet::slices::{KubePublisher, SliceController};
use dranet_sim::apiserver::ApiServer;
use dranet_sim::authz::{Authorizer, Grant};
use serde_json::json;

const NODE: &str = "sim-node";
const DRIVER: &str = "dra.net";
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
const CLAIM: &str = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1";

/// The named scenarios, each one code path of `dranet run` in kube mode.
const SCENARIOS: &[&str] = &[
    "publish_new_slices",
    "prune_a_stale_slice",
    "read_a_claim",
    "list_claims_for_adoption",
    "report_claim_status",
    "report_an_event",
    "report_a_repeated_event",
];

async fn client(api: &ApiServer) -> Result<kube::Client> {
    let path = std::env::temp_dir().join(dranet_sim::kernel::unique("rbac-kubeconfig-"));
    api.write_kubeconfig(&path)?;
    let kc = kube::config::Kubeconfig::read_from(&path);
    let _ = std::fs::remove_file(&path);
    let cfg = kube::Config::from_custom_kubeconfig(kc?, &kube::config::KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(cfg)?)
}

fn device(name: &str) -> dranet::inventory::Device {
    dranet::inventory::Device {
        name: name.to_owned(),
        ..dranet::inventory::Device::default()
    }
}

fn seed(api: &ApiServer) {
    api.put(
        &format!("/api/v1/nodes/{NODE}"),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid"}}),
    );
    api.put(
        CLAIM,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": "c1", "namespace": "default", "uid": "claim-uid"},
               "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": DRIVER}}]}},
               "status": {"allocation": {"devices": {"results": [
                   {"request": "nic", "driver": DRIVER, "pool": NODE, "device": "eth1"}]}}}}),
    );
}

fn status_apply() -> Result<dranet::report::ClaimStatusApply> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": "default"},
        "status": {"devices": [{"driver": DRIVER, "pool": NODE, "device": "eth1",
            "conditions": [{"type": "Ready", "status": "True", "reason": "NetworkDeviceReady",
                            "message": "ok", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "networkData": {"interfaceName": "net0", "ips": ["10.0.0.2/24"]}}]}
    }))?)
}

/// Bounds a call of the code under test.
async fn within<T>(f: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .context("no result within 20 s")
}

/// Runs one scenario against `api` (seeded fresh); `Err` when the code path failed.
async fn run(name: &str, api: &ApiServer) -> Result<()> {
    seed(api);
    let c = client(api).await?;
    match name {
        "publish_new_slices" => {
            let mut ctl = SliceController::new(KubePublisher::new(c, DRIVER, NODE), DRIVER, NODE);
            within(ctl.publish(&[device("eth1"), device("eth2")])).await??;
            let s = api
                .get(&format!("{SLICES}/{NODE}-{DRIVER}-0"))
                .context("no slice")?;
            ensure!(
                s["metadata"]["ownerReferences"][0]["uid"] == "node-uid",
                "no owner: {s}"
            );
        }
        "prune_a_stale_slice" => {
            let stale = format!("{SLICES}/{NODE}-{DRIVER}-3");
            api.put(
                &stale,
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                       "metadata": {"name": format!("{NODE}-{DRIVER}-3")},
                       "spec": {"driver": DRIVER, "nodeName": NODE,
                                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 4}, "devices": []}}),
            );
            api.put(
                &format!("{SLICES}/{NODE}-{DRIVER}-0"),
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                       "metadata": {"name": format!("{NODE}-{DRIVER}-0")},
                       "spec": {"driver": DRIVER, "nodeName": NODE,
                                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 4}, "devices": []}}),
            );
            let mut ctl = SliceController::new(KubePublisher::new(c, DRIVER, NODE), DRIVER, NODE);
            // An update of an existing slice (no create needed), then the prune.
            within(ctl.publish(&[device("eth1")])).await??;
            ensure!(api.get(&stale).is_none(), "the stale slice is still there");
        }
        "read_a_claim" => {
            let claim = within(KubeClaimSource::new(c).get("default", "c1")).await??;
            ensure!(claim.metadata.uid == "claim-uid");
        }
        "list_claims_for_adoption" => {
            // Another namespace's claim, allocated on this node too: the list is cluster-wide.
            api.put(
                "/apis/resource.k8s.io/v1/namespaces/team-b/resourceclaims/c2",
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                       "metadata": {"name": "c2", "namespace": "team-b", "uid": "claim-uid-2"},
                       "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": DRIVER}}]}},
                       "status": {"allocation": {"devices": {"results": [
                           {"request": "nic", "driver": DRIVER, "pool": NODE, "device": "eth2"}]}},
                                  "reservedFor": [{"resource": "pods", "name": "p2", "uid": "pod-uid-2"}]}}),
            );
            let claims = within(KubeClaimSource::new(c).list()).await??;
            let by_pod = dranet::dra::devices_by_pod(&claims, DRIVER, NODE);
            ensure!(claims.len() == 2, "{claims:?}");
            ensure!(
                by_pod.get("pod-uid-2").is_some_and(|d| d.contains("eth2")),
                "{by_pod:?}"
            );
        }
        "report_claim_status" => {
            let sink = dranet::report::KubeSink::new(c, DRIVER);
            within(sink.apply_claim_status(&status_apply()?)).await??;
            let claim = api.get(CLAIM).context("claim")?;
            ensure!(claim["status"]["devices"][0]["device"] == "eth1", "{claim}");
        }
        "report_an_event" | "report_a_repeated_event" => {
            let sink = Arc::new(dranet::report::KubeSink::new(c, DRIVER));
            let reporter = Reporter::new(sink.clone(), DRIVER, NODE);
            let mut ev = reporter.make_event(
                ObjectRef::claim("default", "c1", "claim-uid"),
                dranet::report::EventReason::ClaimPrepareFailed,
                "test".into(),
            );
            if name == "report_an_event" {
                within(sink.event(&ev)).await??;
            } else {
                api.put(
                    &format!("/api/v1/namespaces/default/events/{}", ev.metadata.name),
                    serde_json::to_value(&ev)?,
                );
                ev.count = 2;
                let p = within(sink.patch_event(&ev)).await??;
                ensure!(p == Patched::Updated, "{p:?}");
            }
            let stored = api.objects_under("/api/v1/namespaces/default/events/");
            ensure!(stored.len() == 1, "{stored:?}");
        }
        other => bail!("no scenario {other}"),
    }
    Ok(())
}

/// Runs every scenario, each on a fresh API server enforcing `role`: the outcome by scenario,
/// and every authorization check the requests made.
async fn run_all(
    role: &Authorizer,
) -> Result<(
    BTreeMap<&'static str, Result<()>>,
    Vec<dranet_sim::authz::Attributes>,
)> {
    let mut out = BTreeMap::new();
    let mut checks = Vec::new();
    for name in SCENARIOS {
        let api = ApiServer::enforcing().await?;
        api.set_authorizer(Some(role.clone()));
        let res = run(name, &api).await;
        checks.extend(api.requests().into_iter().flat_map(|r| r.checks).map(|(a, _)| a));
        out.insert(*name, res);
    }
    Ok((out, checks))
}

fn show(g: &Grant) -> String {
    let group = if g.0.is_empty() { "\"\"" } else { g.0.as_str() };
    match &g.3 {
        Some(n) => format!("{} {}/{} [{n}]", g.2, group, g.1),
        None => format!("{} {}/{}", g.2, group, g.1),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_of_the_shipped_role_is_needed_by_a_named_scenario() -> Result<()> {
    let role = Authorizer::shipped()?;
    let helm = Authorizer::shipped_helm()?;
    assert_eq!(
        role.grants(),
        helm.grants(),
        "deploy/rbac.yaml and the chart differ"
    );
    for r in [&role, &helm] {
        let (baseline, _) = run_all(r).await?;
        for (name, res) in &baseline {
            assert!(
                res.is_ok(),
                "{name} fails with the full role of {}: {res:?}",
                r.source
            );
        }
    }
    let mut report = Vec::new();
    for g in role.grants() {
        let (outcome, _) = run_all(&role.without(g)).await?;
        let failing: Vec<&str> = outcome
            .iter()
            .filter(|(_, r)| r.is_err())
            .map(|(n, _)| *n)
            .collect();
        report.push(format!("without {:<60} fails: {}", show(g), failing.join(", ")));
        assert!(
            !failing.is_empty(),
            "dead rule: nothing fails without {}",
            show(g)
        );
        // The failure is the refusal of exactly that permission.
        for n in &failing {
            let e = format!(
                "{:#}",
                outcome[n]
                    .as_ref()
                    .err()
                    .map_or(String::new(), |e| format!("{e:#}"))
            );
            assert!(
                e.contains("403") || e.contains("forbidden") || e.contains("Forbidden"),
                "{n}: {e}"
            );
        }
    }
    eprintln!("{}", report.join("\n"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_rule_grants_a_verb_the_code_never_uses() -> Result<()> {
    let role = Authorizer::shipped()?;
    let (_, checks) = run_all(&role).await?;
    let used: BTreeSet<&Grant> = checks.iter().filter_map(|a| role.allowing(a)).collect();
    let unused: Vec<String> = role
        .grants()
        .iter()
        .filter(|g| !used.contains(g))
        .map(show)
        .collect();
    assert!(unused.is_empty(), "granted, never asked for: {unused:?}");
    // And the code asks for nothing beyond rbac::PERMISSIONS.
    let table = dranet::rbac::grants(DRIVER);
    for a in &checks {
        let g = role
            .allowing(a)
            .with_context(|| format!("refused with the full role: {a:?}"))?;
        assert!(
            table.contains(g),
            "{a:?} allowed by {g:?}, which is not in rbac::PERMISSIONS"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_status_of_a_claim_on_another_node_needs_arbitrary_node() -> Result<()> {
    let api = ApiServer::enforcing().await?;
    seed(&api);
    let mut claim = api.get(CLAIM).context("claim")?;
    claim["status"]["allocation"]["devices"]["results"][0]["pool"] = json!("other-node");
    api.put(CLAIM, claim);
    let sink = dranet::report::KubeSink::new(client(&api).await?, DRIVER);
    let mut apply = status_apply()?;
    apply.status.devices[0].pool = "other-node".into();
    let e = sink.apply_claim_status(&apply).await.err().context("applied")?;
    let msg = dranet::telemetry::chain(&e).to_string();
    assert!(
        msg.contains("cannot arbitrary-node:patch resource \"resourceclaims/driver\""),
        "{msg}"
    );
    // A status entry for a device the claim does not have: 422, as the real server.
    let api = ApiServer::enforcing().await?;
    seed(&api);
    let sink = dranet::report::KubeSink::new(client(&api).await?, DRIVER);
    let mut apply = status_apply()?;
    apply.status.devices[0].device = "eth9".into();
    let e = sink.apply_claim_status(&apply).await.err().context("applied")?;
    let msg = dranet::telemetry::chain(&e).to_string();
    assert!(msg.contains("must be an allocated device in the claim"), "{msg}");
    Ok(())
}
