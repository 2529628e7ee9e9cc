//! End to end in kube mode, as root, on the real kernel: the `dranet run` binary selected onto an
//! in-memory API server (`dranet_sim::apiserver`, real HTTP/1.1 on 127.0.0.1) with
//! `--kubeconfig`, between the kubelet simulator and the NRI runtime harness, a veth pair
//! standing in for a NIC. ResourceSlices are applied to the API server, claims are read from it,
//! their device status is applied to it and failures show up there as Events.
//!
//! The API server enforces what a real one does: RBAC with the ClusterRole the shipped
//! `deploy/rbac.yaml` binds to dranet's ServiceAccount, and the resource.k8s.io/v1 validation
//! of slices and claim status (`ApiServer::enforcing`). The daemon never depends on it: a start
//! with the API server down, or with a role lacking `patch`, still protects every device.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dranet_sim::apiserver::{ApiServer, Recorded, TOKEN};
use dranet_sim::fixtures::{StateDir, TestPod, nic_device, wait_for};
use dranet_sim::kernel::{host_has, unique};
use dranet_sim::kubelet::Claim;
use dranet_sim::nic::{Nic, view, wait_restored};
use dranet_sim::node::{Node, NodeOptions, claim_object, free_port, http_get};
use dranet_sim::root_or_skip;
use serde_json::{Value, json};

/// The node name the harness runs the daemon under (`--node-name`): also the pool name.
const NODE: &str = "sim-node";
const DRIVER: &str = "dra.net";
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// The API server, with the Node seeded, and the daemon in kube mode talking to it. Fields drop
/// in order: the daemon goes before its API server.
struct KubeNode {
    node: Node,
    api: ApiServer,
    node_uid: String,
    _kubeconfig: StateDir,
}

async fn kube_node() -> Result<KubeNode> {
    kube_node_with(|_| {}).await
}

/// [`kube_node`], with `seed` storing more objects before the daemon starts.
async fn kube_node_with(seed: impl FnOnce(&ApiServer)) -> Result<KubeNode> {
    let api = ApiServer::enforcing().await?;
    let node_uid = format!("node-uid-{}", unique(""));
    api.put(
        &format!("/api/v1/nodes/{NODE}"),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": node_uid}}),
    );
    seed(&api);
    let (node, kubeconfig) = start_daemon(&api, None)
        .await
        .context("starting the daemon in kube mode")?;
    Ok(KubeNode {
        node,
        api,
        node_uid,
        _kubeconfig: kubeconfig,
    })
}

/// The daemon in kube mode (its HTTP endpoints on `bind_address`, if given), its kubeconfig
/// (in the returned dir) naming `api`.
async fn start_daemon(api: &ApiServer, bind_address: Option<&str>) -> Result<(Node, StateDir)> {
    let dir = StateDir::create("kubeconfig")?;
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let mut opts = NodeOptions {
        kubeconfig: Some(kubeconfig),
        ..NodeOptions::default()
    };
    if let Some(addr) = bind_address {
        opts.bind_address = addr.to_owned();
    }
    let node = Node::start(opts).await?;
    Ok((node, dir))
}

fn claim_path(namespace: &str, name: &str) -> String {
    format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
}

/// Seeds the claim as the scheduler would have left it: the harness's allocated claim plus the
/// spec every API object has (one request per device).
fn seed_claim(api: &ApiServer, claim: &Claim, pod_uid: &str, devices: &[(String, Value)]) {
    let mut obj = claim_object(claim, pod_uid, devices);
    let requests: Vec<Value> = (0..devices.len())
        .map(|i| json!({"name": format!("nic{i}"), "exactly": {"deviceClassName": DRIVER}}))
        .collect();
    obj["spec"] = json!({"devices": {"requests": requests}});
    api.put(&claim_path(&claim.namespace, &claim.name), obj);
}

/// Every request carried the kubeconfig user's token, was served by a route, was allowed by the
/// shipped role and was valid.
fn assert_clean_traffic(api: &ApiServer) {
    let refused: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| matches!(r.status, Some(403 | 422)))
        .map(|r| {
            format!(
                "{} {} -> {:?}: {}",
                r.method,
                r.path,
                r.status,
                String::from_utf8_lossy(&r.body)
            )
        })
        .collect();
    assert!(refused.is_empty(), "refused requests: {refused:#?}");
    let reqs = api.requests();
    let bearer = format!("Bearer {TOKEN}");
    for r in &reqs {
        assert_eq!(
            r.header("authorization"),
            Some(bearer.as_str()),
            "{} {} without the token",
            r.method,
            r.path
        );
    }
    let unhandled: Vec<String> = api
        .unhandled()
        .iter()
        .map(|r| format!("{} {}?{}", r.method, r.path, r.raw_query))
        .collect();
    assert!(unhandled.is_empty(), "requests no route served: {unhandled:?}");
}

fn summary(reqs: &[Recorded]) -> Vec<String> {
    reqs.iter()
        .map(|r| {
            format!(
                "#{} {:?}ms {} {}?{} -> {:?}",
                r.conn,
                r.at.as_millis(),
                r.method,
                r.path,
                r.raw_query,
                r.status
            )
        })
        .collect()
}

/// Slices published for the node, with the device named `device` in one of them.
fn slices_with(api: &ApiServer, device: &str) -> Option<Vec<Value>> {
    let slices: Vec<Value> = api
        .objects_under(&format!("{SLICES}/"))
        .into_iter()
        .map(|(_, v)| v)
        .filter(|s| s["spec"]["nodeName"] == NODE)
        .collect();
    let has = slices.iter().any(|s| {
        s["spec"]["devices"]
            .as_array()
            .is_some_and(|ds| ds.iter().any(|d| d["name"] == device))
    });
    has.then_some(slices)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_mode_publishes_slices_prepares_from_the_api_and_reports_status() -> Result<()> {
    root_or_skip!("kube_mode_publishes_slices_prepares_from_the_api_and_reports_status");
    let t0 = Instant::now();
    let (nic, before) = Nic::with_view()?;
    let device = dranet::inventory::netdev_device_name(&nic.name);
    // Left over from an earlier run of the driver on this node (generation 5, a slice index
    // the new pool does not use), and a slice of another node that is none of its business.
    let stale = format!("{SLICES}/{NODE}-{DRIVER}-7");
    let other = format!("{SLICES}/other-node-{DRIVER}-0");
    let slice = |node: &str, name: &str| {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 5, "resourceSliceCount": 8}, "devices": []}
        })
    };
    let kn = kube_node_with(|api| {
        api.put(&stale, slice(NODE, &format!("{NODE}-{DRIVER}-7")));
        api.put(&other, slice("other-node", &format!("other-node-{DRIVER}-0")));
    })
    .await?;
    let (api, node) = (&kn.api, &kn.node);

    // ResourceSlices: applied server-side, owned by the Node, the NIC in the pool; the stale
    // slice deleted, the other node's kept, the generation continued above the stale one. The
    // stale slice goes right after the apply: the pool is looked at once it has (else a poll
    // between the two requests sees one slice too many).
    let slices = api
        .wait_for(
            "a ResourceSlice with the test NIC, the stale slice deleted",
            Duration::from_secs(20),
            |a| slices_with(a, &device).filter(|_| a.get(&stale).is_none()),
        )
        .await
        .with_context(|| format!("requests: {:#?}", summary(&api.requests())))?;
    for s in &slices {
        assert_eq!(s["apiVersion"], "resource.k8s.io/v1", "{s}");
        assert_eq!(s["kind"], "ResourceSlice", "{s}");
        assert_eq!(s["spec"]["driver"], DRIVER, "{s}");
        assert_eq!(s["spec"]["pool"]["name"], NODE, "{s}");
        assert_eq!(s["spec"]["pool"]["resourceSliceCount"], slices.len(), "{s}");
        let owner = &s["metadata"]["ownerReferences"][0];
        assert_eq!(owner["apiVersion"], "v1", "{s}");
        assert_eq!(owner["kind"], "Node", "{s}");
        assert_eq!(owner["name"], NODE, "{s}");
        assert_eq!(owner["uid"], kn.node_uid.as_str(), "{s}");
        assert_eq!(owner["controller"], true, "{s}");
        assert!(
            s["spec"]["pool"]["generation"].as_i64().is_some_and(|g| g > 5),
            "the pool generation does not continue above the stale one: {s}"
        );
    }
    api.wait_for("the stale slice deleted", Duration::from_secs(5), |a| {
        a.get(&stale).is_none().then_some(())
    })
    .await?;
    let pool: Vec<Value> = api
        .objects_under(&format!("{SLICES}/"))
        .into_iter()
        .map(|(_, v)| v)
        .filter(|s| s["spec"]["nodeName"] == NODE)
        .collect();
    let problems = dranet_sim::limits::pool_problems(&pool);
    assert!(problems.is_empty(), "the pool is not consistent: {problems:?}");
    let deletes = api.requests_to("DELETE", SLICES);
    assert_eq!(deletes.len(), 1, "{:#?}", summary(&deletes));
    assert_eq!(deletes[0].path, stale);
    assert_eq!(deletes[0].status, Some(200));
    assert!(api.get(&other).is_some(), "another node's slice was deleted");
    let applies = api.requests_to("PATCH", &format!("{SLICES}/"));
    assert!(!applies.is_empty());
    for r in &applies {
        assert_eq!(r.content_type, "application/apply-patch+yaml", "{r:?}");
        assert_eq!(r.param("fieldManager"), Some(DRIVER), "{r:?}");
        assert_eq!(r.param("force"), Some("true"), "{r:?}");
    }
    let lists = api.requests_to("GET", SLICES);
    assert!(
        lists
            .iter()
            .any(|r| r.param("fieldSelector") == Some(&format!("spec.nodeName={NODE},spec.driver={DRIVER}"))),
        "no list by node and driver: {:#?}",
        summary(&lists)
    );
    assert!(
        !api.requests_to("GET", &format!("/api/v1/nodes/{NODE}"))
            .is_empty(),
        "the Node was never read"
    );

    // Prepare reads the claim from the API server.
    let mut p = TestPod::new("kube-pod-")?;
    let config = json!({"interface": {"name": "net0", "addresses": ["192.168.70.2/24"]}});
    seed_claim(api, &p.claim, &p.uid, &[(device.clone(), config)]);
    node.prepare(&p.claim).await.context("NodePrepareResources")?;
    let path = claim_path(&p.claim.namespace, &p.claim.name);
    let gets = api.requests_to("GET", &path);
    assert!(
        gets.iter().any(|r| r.path == path && r.status == Some(200)),
        "{:#?}",
        summary(&gets)
    );

    // The pod runs: the NIC is in its netns under the configured name.
    p.run(node).await?;
    assert!(!host_has(&nic.name), "{} still in the host", nic.name);
    let v = p.ns.ip(&["-j", "addr", "show", "dev", "net0"])?;
    assert!(v.contains("192.168.70.2"), "net0 has no address in the pod: {v}");
    assert!(
        v.contains(&nic.mac),
        "net0 in the pod is not the NIC ({}): {v}",
        nic.mac
    );

    // The device status is applied on the claim's status subresource.
    let st = api
        .wait_for("the claim's device status", Duration::from_secs(5), |a| {
            a.get(&path)
                .filter(|c| c["status"]["devices"].as_array().is_some_and(|d| !d.is_empty()))
        })
        .await
        .with_context(|| format!("requests: {:#?}", summary(&api.requests())))?;
    let devs = st["status"]["devices"].as_array().context("status.devices")?;
    assert_eq!(devs.len(), 1, "{st}");
    let d = &devs[0];
    assert_eq!(d["driver"], DRIVER, "{st}");
    assert_eq!(d["pool"], NODE, "{st}");
    assert_eq!(d["device"], device.as_str(), "{st}");
    assert_eq!(d["networkData"]["interfaceName"], "net0", "{st}");
    assert_eq!(d["networkData"]["hardwareAddress"], nic.mac.as_str(), "{st}");
    assert_eq!(d["networkData"]["ips"][0], "192.168.70.2/24", "{st}");
    assert_eq!(d["conditions"][0]["reason"], "NetworkDeviceReady", "{st}");
    // The apply touched the status only: the allocation and reservation are still there.
    assert_eq!(
        st["status"]["allocation"]["devices"]["results"][0]["device"],
        device.as_str(),
        "{st}"
    );
    assert_eq!(st["status"]["reservedFor"][0]["uid"], p.uid.as_str(), "{st}");
    let status_applies = api.requests_to("PATCH", &format!("{path}/status"));
    assert!(!status_applies.is_empty());
    for r in &status_applies {
        assert_eq!(r.content_type, "application/apply-patch+yaml", "{r:?}");
        assert_eq!(r.param("fieldManager"), Some(DRIVER), "{r:?}");
        assert_eq!(r.param("force"), Some("true"), "{r:?}");
        assert_eq!(r.status, Some(200), "{r:?}");
        let b = r.json();
        assert_eq!(b["kind"], "ResourceClaim", "{b}");
        assert_eq!(b["metadata"]["name"], p.claim.name.as_str(), "{b}");
        assert!(
            b["status"]["allocation"].is_null(),
            "the apply claims the allocation: {b}"
        );
    }

    // Teardown: the NIC comes home as it was; unprepare.
    p.stop(node).await?;
    assert!(host_has(&nic.name), "{} not home after StopPodSandbox", nic.name);
    p.ns.remove_crio_style()?;
    p.remove(node).await?;
    node.runtime.set_state(vec![], vec![]);
    wait_restored(&nic.name, &before, Duration::from_secs(1))
        .await
        .context("the NIC was not restored")?;
    node.unprepare(&p.claim).await?;
    assert!(node.pins().is_empty(), "pins left: {:?}", node.pins());

    // The client is the real one: bearer token on every request, and keep-alive in use.
    assert_clean_traffic(api);
    let reqs = api.requests();
    let most = reqs
        .iter()
        .map(|r| reqs.iter().filter(|x| x.conn == r.conn).count())
        .max()
        .unwrap_or(0);
    assert!(
        most >= 2,
        "no connection carried two requests: {:#?}",
        summary(&reqs)
    );
    let mut kn = kn;
    kn.node.stop()?;
    eprintln!(
        "kube mode life cycle: {} requests, {:?}",
        kn.api.requests().len(),
        t0.elapsed()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_mode_prepare_of_a_vanished_claim_fails_with_an_event() -> Result<()> {
    root_or_skip!("kube_mode_prepare_of_a_vanished_claim_fails_with_an_event");
    let mut kn = kube_node().await?;
    let (api, node) = (&kn.api, &kn.node);
    let namespace = unique("ns-");
    let claim = Claim::new(&namespace, &unique("gone-"), &unique("gone-uid-"));
    let err = node
        .prepare(&claim)
        .await
        .err()
        .context("prepare of a claim the API server does not have succeeded")?;
    let msg = format!("{err:#}");
    assert!(msg.contains("not found"), "{msg}");
    let path = claim_path(&namespace, &claim.name);
    let gets = api.requests_to("GET", &path);
    assert!(
        gets.iter().any(|r| r.status == Some(404)),
        "{:#?}",
        summary(&gets)
    );

    // A Warning on the claim, in the claim's namespace.
    let events = format!("/api/v1/namespaces/{namespace}/events");
    let (ev_path, ev) = api
        .wait_for("a ClaimPrepareFailed event", Duration::from_secs(5), |a| {
            a.objects_under(&format!("{events}/"))
                .into_iter()
                .find(|(_, e)| e["reason"] == "ClaimPrepareFailed")
        })
        .await
        .with_context(|| format!("requests: {:#?}", summary(&api.requests())))?;
    assert_eq!(ev["type"], "Warning", "{ev}");
    assert_eq!(ev["involvedObject"]["kind"], "ResourceClaim", "{ev}");
    assert_eq!(ev["involvedObject"]["apiVersion"], "resource.k8s.io/v1", "{ev}");
    assert_eq!(ev["involvedObject"]["namespace"], namespace.as_str(), "{ev}");
    assert_eq!(ev["involvedObject"]["name"], claim.name.as_str(), "{ev}");
    assert_eq!(ev["involvedObject"]["uid"], claim.uid.as_str(), "{ev}");
    assert_eq!(ev["metadata"]["namespace"], namespace.as_str(), "{ev}");
    assert_eq!(ev["source"]["component"], DRIVER, "{ev}");
    assert_eq!(ev["source"]["host"], NODE, "{ev}");
    assert_eq!(ev["count"], 1, "{ev}");
    assert!(
        ev["message"].as_str().is_some_and(|m| m.contains("not found")),
        "{ev}"
    );
    let posts = api.requests_to("POST", &events);
    assert_eq!(posts.len(), 1, "{:#?}", summary(&posts));
    assert_eq!(posts[0].path, events);
    assert_eq!(posts[0].status, Some(201));

    // kubelet retries: the same failure again is counted on the same Event (strategic merge
    // PATCH), not a second Event.
    assert!(node.prepare(&claim).await.is_err());
    let ev = api
        .wait_for("the Event's count at 2", Duration::from_secs(5), |a| {
            a.get(&ev_path).filter(|e| e["count"] == 2)
        })
        .await
        .with_context(|| format!("requests: {:#?}", summary(&api.requests())))?;
    let patches = api.requests_to("PATCH", &ev_path);
    assert_eq!(patches.len(), 1, "{:#?}", summary(&patches));
    assert_eq!(patches[0].content_type, "application/strategic-merge-patch+json");
    assert_eq!(patches[0].status, Some(200));
    assert_eq!(api.objects_under(&format!("{events}/")).len(), 1, "{ev}");
    assert_clean_traffic(api);
    kn.node.stop()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_mode_hung_api_server_fails_prepare_in_bounded_time() -> Result<()> {
    root_or_skip!("kube_mode_hung_api_server_fails_prepare_in_bounded_time");
    let nic = Nic::create()?;
    let device = dranet::inventory::netdev_device_name(&nic.name);
    let mut kn = kube_node().await?;
    let (api, node) = (&kn.api, &kn.node);
    let uid = unique("kube-hang-");
    let claim = Claim::new("default", &format!("claim-{uid}"), &format!("claim-uid-{uid}"));
    seed_claim(
        api,
        &claim,
        &uid,
        &[(device.clone(), json!({"interface": {"name": "net0"}}))],
    );
    let claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/";
    api.hang(claims);

    // The claim GETs get no answer: a per-claim error after the daemon's 10 s claim timeout,
    // well inside kubelet's 45 s call deadline. A pod of five claims: fetched one at a time,
    // five timeouts (50 s) would run past that deadline; they are fetched at once.
    let mut pod_claims = vec![claim.clone()];
    for i in 1..5 {
        pod_claims.push(Claim::new(
            "default",
            &format!("claim-{uid}-{i}"),
            &format!("claim-uid-{uid}-{i}"),
        ));
    }
    let plugin = node.plugin.as_ref().context("daemon not registered")?;
    let start = Instant::now();
    let results = plugin.prepare(&pod_claims).await?;
    let took = start.elapsed();
    eprintln!("hung API server: 5 claims failed after {took:?}: {results:?}");
    assert_eq!(results.len(), 5, "{results:?}");
    for c in &pod_claims {
        let res = &results[&c.uid];
        assert!(res.devices.is_empty(), "{res:?}");
        assert!(
            res.error.contains("no answer from the API server") && res.error.contains(&c.name),
            "{}: {res:?}",
            c.name
        );
    }
    assert!(
        took >= Duration::from_secs(9),
        "failed before the timeout: {took:?}"
    );
    assert!(
        took < Duration::from_secs(20),
        "5 hung claim GETs took {took:?}: fetched one at a time, not at once"
    );
    for c in &pod_claims {
        let hung = api.requests_to("GET", &claim_path("default", &c.name));
        assert!(
            !hung.is_empty() && hung.iter().all(|r| r.status.is_none()),
            "{}: {:#?}",
            c.name,
            summary(&hung)
        );
    }

    // An API server that answers 500: the claim read is retried (jittered backoff) within the
    // claim's deadline; healed after a second, the same NodePrepareResources call succeeds.
    api.fail(claims, 500);
    let start = Instant::now();
    let heal = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        api.heal(claims);
    };
    let (res, ()) = tokio::join!(node.prepare(&claim), heal);
    res.context("prepare while the API server failed for a second")?;
    let took = start.elapsed();
    eprintln!("500 for a second: prepare succeeded after {took:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let gets = api.requests_to("GET", &claim_path("default", &claim.name));
    assert!(
        gets.iter().filter(|r| r.status == Some(500)).count() >= 2,
        "the failing read was not retried: {:#?}",
        summary(&gets)
    );
    assert_eq!(
        gets.last().and_then(|r| r.status),
        Some(200),
        "{:#?}",
        summary(&gets)
    );
    node.unprepare(&claim).await?;
    // The failures were reported on the claim meanwhile (the events path never hung).
    wait_for("ClaimPrepareFailed events", Duration::from_secs(5), || {
        api.objects_under("/api/v1/namespaces/default/events/")
            .iter()
            .any(|(_, e)| {
                e["reason"] == "ClaimPrepareFailed" && e["involvedObject"]["name"] == claim.name.as_str()
            })
    })
    .await?;
    assert!(host_has(&nic.name));
    assert_clean_traffic(api);
    kn.node.stop()?;
    Ok(())
}

/// `/healthz` and `/readyz` of the daemon at `addr`, polled until `ok` holds (10 s at most).
async fn wait_http(addr: &str, path: &str, what: &str, ok: impl Fn(u16, &str) -> bool) -> Result<String> {
    let start = Instant::now();
    loop {
        let got = http_get(addr, path).await;
        if let Ok((code, body)) = &got
            && ok(*code, body)
        {
            return Ok(body.clone());
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("{path}: {what}: last answer {got:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A pod with one claim on `nic` as `net0`, seeded on the API server and prepared.
async fn prepare_pod(api: &ApiServer, node: &Node, nic: &Nic, tag: &str) -> Result<TestPod> {
    let p = TestPod::new(tag)?;
    seed_claim(
        api,
        &p.claim,
        &p.uid,
        &[nic_device(nic, json!({"interface": {"name": "net0"}}))],
    );
    node.prepare(&p.claim).await.context("NodePrepareResources")?;
    Ok(p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_mode_api_server_down_at_start_then_up() -> Result<()> {
    root_or_skip!("kube_mode_api_server_down_at_start_then_up");
    let (nic1, nic2) = (Nic::create()?, Nic::create()?);
    let (before1, before2) = (view(&nic1.name, None)?, view(&nic2.name, None)?);
    let port = free_port()?;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let http = format!("127.0.0.1:{}", free_port()?);
    let seed_node = |api: &ApiServer| {
        api.put(
            &format!("/api/v1/nodes/{NODE}"),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid-1"}}),
        );
    };
    // Two pods' claims prepared while the API server is up; then the daemon dies.
    let api = ApiServer::enforcing_at(addr).await?;
    seed_node(&api);
    let (mut node, _kubeconfig) = start_daemon(&api, Some(&http)).await?;
    let mut p1 = prepare_pod(&api, &node, &nic1, "down-1-").await?;
    let p2 = prepare_pod(&api, &node, &nic2, "down-2-").await?;
    node.kill()?;

    // The API server is gone (connection refused); the daemon starts anyway.
    drop(api);
    node.restart().await.context("start with the API server down")?;
    let health = wait_http(
        &http,
        "/healthz",
        "healthy while the API server is down",
        |c, _| c == 200,
    )
    .await?;
    assert_eq!(health.trim(), "ok");
    let why = wait_http(&http, "/readyz", "not ready, slices named", |c, b| {
        c == 503 && b.contains("slices: ResourceSlices not published")
    })
    .await?;
    eprintln!("/readyz during the outage:\n{why}");

    // NRI hooks and a CRI-O-order rescue during the outage.
    node.runtime
        .run_pod_sandbox(&p1.sandbox)
        .await
        .context("RunPodSandbox during the outage")?;
    assert!(!host_has(&nic1.name), "{} not moved into the pod", nic1.name);
    p1.ns.remove_crio_style()?;
    wait_restored(&nic1.name, &before1, Duration::from_secs(5))
        .await
        .context("CRI-O-order rescue during the outage")?;
    p1.stop(&node).await?;
    node.runtime.remove_pod_sandbox(&p1.sandbox).await?;
    node.runtime
        .run_pod_sandbox(&p2.sandbox)
        .await
        .context("RunPodSandbox during the outage")?;
    assert!(!host_has(&nic2.name), "{} not moved into the pod", nic2.name);
    assert!(node.daemon_running(), "the daemon exited during the outage");

    // The API server is back: the slices appear (the pod's NIC with them) and /readyz is OK.
    let api = ApiServer::enforcing_at(addr).await?;
    seed_node(&api);
    let device2 = dranet::inventory::netdev_device_name(&nic2.name);
    let device1 = dranet::inventory::netdev_device_name(&nic1.name);
    api.wait_for(
        "the slices once the API server is back",
        Duration::from_secs(60),
        |a| slices_with(a, &device1).filter(|_| slices_with(a, &device2).is_some()),
    )
    .await
    .with_context(|| format!("requests: {:#?}", summary(&api.requests())))?;
    wait_http(&http, "/readyz", "ready once the slices are out", |c, _| c == 200).await?;
    assert_clean_traffic(&api);

    node.runtime.stop_pod_sandbox(&p2.sandbox).await?;
    wait_restored(&nic2.name, &before2, Duration::from_secs(5)).await?;
    node.runtime.remove_pod_sandbox(&p2.sandbox).await?;
    node.unprepare(&p1.claim).await?;
    node.unprepare(&p2.claim).await?;
    node.stop()?;
    drop(p2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_mode_role_without_patch_keeps_running_and_names_the_permission() -> Result<()> {
    root_or_skip!("kube_mode_role_without_patch_keeps_running_and_names_the_permission");
    let (nic, before) = Nic::with_view()?;
    let http = format!("127.0.0.1:{}", free_port()?);
    let api = ApiServer::enforcing().await?;
    let role = dranet_sim::authz::Authorizer::shipped()?;
    let patch = (
        "resource.k8s.io".to_owned(),
        "resourceslices".to_owned(),
        "patch".to_owned(),
        None,
    );
    assert!(role.grants().contains(&patch));
    api.set_authorizer(Some(role.without(&patch)));
    api.put(
        &format!("/api/v1/nodes/{NODE}"),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid-2"}}),
    );
    let (mut node, _kubeconfig) = start_daemon(&api, Some(&http)).await?;
    api.wait_for("a refused slice apply", Duration::from_secs(20), |a| {
        a.forbidden()
            .into_iter()
            .find(|r| r.method == "PATCH" && r.path.starts_with(SLICES))
    })
    .await?;
    let refused = &api.forbidden()[0];
    eprintln!("refused: {} {}", refused.method, refused.path);
    let why = wait_http(&http, "/readyz", "names the missing permission", |c, b| {
        c == 503 && b.contains("cannot patch resourceslices.resource.k8s.io")
    })
    .await?;
    eprintln!("/readyz:\n{why}");
    assert!(why.contains("403 Forbidden"), "{why}");
    assert!(
        why.contains(
            "User \"system:serviceaccount:kube-system:dranet\" cannot patch resource \"resourceslices\""
        ),
        "{why}"
    );
    wait_http(&http, "/healthz", "healthy", |c, _| c == 200).await?;
    let (_, metrics) = http_get(&http, "/metrics").await?;
    assert!(
        metrics.contains("dranet_driver_publish_failures_total{status=\"403\"}"),
        "{metrics}"
    );

    // Devices are still protected: a pod gets its NIC and a CRI-O-order teardown brings it home.
    let mut p = prepare_pod(&api, &node, &nic, "noperm-").await?;
    node.runtime.run_pod_sandbox(&p.sandbox).await?;
    assert!(!host_has(&nic.name));
    p.ns.remove_crio_style()?;
    wait_restored(&nic.name, &before, Duration::from_secs(5))
        .await
        .context("rescue with a role lacking patch")?;
    p.stop_and_remove(&node).await?;
    node.unprepare(&p.claim).await?;
    assert!(node.daemon_running(), "the daemon exited");

    // The permission granted: the retry publishes (no restart).
    api.set_authorizer(Some(role));
    let device = dranet::inventory::netdev_device_name(&nic.name);
    api.wait_for("the slices once patch is granted", Duration::from_secs(90), |a| {
        slices_with(a, &device)
    })
    .await?;
    node.stop()?;
    Ok(())
}
