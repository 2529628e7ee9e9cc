// Over 500 lines: one test per slice-building rule (pools, limits, generations).

use std::sync::Arc;

use super::*;
use crate::test_support::TempDir;

fn devices(n: usize) -> Vec<Device> {
    (0..n)
        .map(|i| Device {
            name: format!("dev{i:04}"),
            attributes: BTreeMap::from([
                (
                    "dra.net/ifName".to_owned(),
                    AttrValue::String(format!("dev{i:04}")),
                ),
                ("dra.net/mtu".to_owned(), AttrValue::Int(1500)),
                ("dra.net/rdma".to_owned(), AttrValue::Bool(false)),
                ("dra.net/fw".to_owned(), AttrValue::Version("1.2.3".into())),
            ])
            .into(),
            ..Device::default()
        })
        .collect()
}

#[test]
fn list_attributes_split_at_64_and_serialise_as_ints() {
    let mut devs = devices(130);
    devs[3].attributes.insert(
        "resource.kubernetes.io/numaNode".into(),
        AttrValue::Ints(vec![1, 0]),
    );
    let slices = build_slices("dra.net", "node-a", 1, None, &devs);
    let sizes: Vec<usize> = slices.iter().map(|s| s.spec.devices.len()).collect();
    assert_eq!(sizes, [64, 64, 2]);
    let json = serde_json::to_value(&slices[0]).unwrap();
    assert_eq!(
        json["spec"]["devices"][3]["attributes"]["resource.kubernetes.io/numaNode"],
        serde_json::json!({"ints": [1, 0]})
    );
}

#[test]
fn split_at_128() {
    for (n, want) in [
        (0, vec![0]),
        (1, vec![1]),
        (128, vec![128]),
        (129, vec![128, 1]),
        (300, vec![128, 128, 44]),
    ] {
        let slices = build_slices("dra.net", "node-a", 7, None, &devices(n));
        let sizes: Vec<usize> = slices.iter().map(|s| s.spec.devices.len()).collect();
        assert_eq!(sizes, want, "{n} devices");
        for (i, s) in slices.iter().enumerate() {
            assert_eq!(s.spec.pool.resource_slice_count, want.len() as i64);
            assert_eq!(s.spec.pool.generation, 7);
            assert_eq!(s.spec.pool.name, "node-a");
            assert_eq!(s.spec.node_name, "node-a");
            assert_eq!(s.spec.driver, "dra.net");
            assert_eq!(s.metadata.name, format!("node-a-dra.net-{i}"));
        }
    }
}

#[test]
fn json_has_the_api_field_names() {
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: "node-a".into(),
        uid: "u-1".into(),
        controller: Some(true),
    };
    let slices = build_slices("dra.net", "node-a", 3, Some(&owner), &devices(1));
    let v = serde_json::to_value(&slices[0]).unwrap();
    assert_eq!(v["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(v["kind"], "ResourceSlice");
    assert_eq!(v["metadata"]["name"], "node-a-dra.net-0");
    assert_eq!(v["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "u-1");
    assert_eq!(v["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(v["spec"]["pool"]["resourceSliceCount"], 1);
    assert_eq!(v["spec"]["pool"]["generation"], 3);
    assert_eq!(v["spec"]["nodeName"], "node-a");
    let d = &v["spec"]["devices"][0];
    assert_eq!(d["name"], "dev0000");
    assert_eq!(d["attributes"]["dra.net/ifName"]["string"], "dev0000");
    assert_eq!(d["attributes"]["dra.net/mtu"]["int"], 1500);
    assert_eq!(d["attributes"]["dra.net/rdma"]["bool"], false);
    assert_eq!(d["attributes"]["dra.net/fw"]["version"], "1.2.3");
    assert!(d.get("basic").is_none());
}

#[test]
fn diff_reports_added_removed_changed() {
    let old = devices(3);
    let mut new = devices(4);
    new.remove(0);
    new[0]
        .attributes
        .insert("dra.net/mtu".into(), AttrValue::Int(9000));
    // Non-published fields do not count as a change.
    new[1].ifname = Some("x".into());
    let d = diff(&old, &new);
    assert_eq!(d.added, ["dev0003"]);
    assert_eq!(d.removed, ["dev0000"]);
    assert_eq!(d.changed, ["dev0001"]);
    assert!(diff(&old, &old).is_empty());
}

#[tokio::test]
async fn the_published_list_is_kept_shared_not_copied() {
    let dir = TempDir::new("slices-shared");
    let publisher = DirPublisher::new(dir.path(), "dra.net", "node-a");
    let mut ctl = SliceController::new(publisher, "dra.net", "node-a");
    let inventory = crate::inventory::SharedInventory::default();
    let list: crate::inventory::DeviceList = crate::inventory::list_of(devices(130));
    inventory.replace(list.clone());
    assert!(ctl.update_shared(&list).await.unwrap());
    let kept = ctl.last.as_ref().expect("the last published set");
    assert!(
        std::sync::Arc::ptr_eq(kept, &list),
        "the controller keeps the scan's list itself"
    );
    assert!(std::sync::Arc::ptr_eq(&inventory.current(), &list));
    // An equal list from the next scan publishes nothing.
    assert!(
        !ctl.update_shared(&crate::inventory::list_of(devices(130)))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn controller_republishes_on_change_into_a_dir() {
    let dir = TempDir::new("slices-ctl");
    let publisher = DirPublisher::new(dir.path(), "dra.net", "node-a");
    // A foreign file in the same dir is left alone.
    std::fs::create_dir_all(dir.path()).unwrap();
    std::fs::write(dir.path().join("other-node-dra.net-0.json"), "{}").unwrap();
    let metrics = SliceMetrics::default();
    let mut ctl = SliceController::new(publisher.clone(), "dra.net", "node-a").with_metrics(metrics.clone());

    assert!(ctl.update(&devices(130)).await.unwrap());
    assert_eq!(metrics.devices("total"), 130);
    assert_eq!(metrics.devices("rdma"), 0);
    assert!(metrics.last_published() > 1.0e9);
    let files = publisher.read_all().unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(files[0].spec.devices.len(), 128);
    assert_eq!(files[1].spec.devices.len(), 2);
    assert_eq!(ctl.generation(), Some(1));

    assert!(!ctl.update(&devices(130)).await.unwrap(), "no change, no publish");
    assert_eq!(ctl.generation(), Some(1));

    assert!(ctl.update(&devices(5)).await.unwrap());
    let files = publisher.read_all().unwrap();
    assert_eq!(files.len(), 1, "stale slice file removed");
    assert_eq!(files[0].spec.pool.generation, 2);
    assert_eq!(files[0].spec.pool.resource_slice_count, 1);
    assert!(dir.path().join("other-node-dra.net-0.json").exists());

    // A restarted controller continues above the published generation.
    let mut again = SliceController::new(publisher.clone(), "dra.net", "node-a");
    assert!(again.update(&devices(5)).await.unwrap());
    assert_eq!(again.generation(), Some(3));
}

#[tokio::test]
async fn kube_publisher_applies_owns_and_prunes() {
    use super::kube_mock::{client, status};
    use serde_json::json;
    let (client, log) = client(
        |req| match (req.method.as_str(), req.uri.split('?').next().unwrap_or("")) {
            ("GET", "/api/v1/nodes/node-a") => (
                200,
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "uid": "node-uid"}}),
            ),
            ("GET", "/apis/resource.k8s.io/v1/resourceslices") => (
                200,
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {},
                "items": [
                  {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                   "metadata": {"name": "node-a-dra.net-0"}, "spec": {"pool": {"generation": 4}}},
                  {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                   "metadata": {"name": "node-a-dra.net-5"}, "spec": {"pool": {"generation": 4}}}
                ]}),
            ),
            ("PATCH", _) => (200, req.body.clone()),
            ("DELETE", p) if p.ends_with("node-a-dra.net-5") => (
                200,
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "node-a-dra.net-5"}}),
            ),
            _ => (404, status(404, "NotFound")),
        },
    );
    let publisher = KubePublisher::new(client, "dra.net", "node-a");
    let mut ctl = SliceController::new(publisher, "dra.net", "node-a");
    ctl.publish(&devices(3)).await.unwrap();
    assert_eq!(
        ctl.generation(),
        Some(5),
        "continues above the published generation"
    );

    let log = log.lock().unwrap();
    let lists: Vec<_> = log
        .iter()
        .filter(|r| r.method == "GET" && r.uri.contains("resourceslices"))
        .collect();
    assert!(!lists.is_empty());
    assert!(
        lists[0]
            .uri
            .contains("fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Ddra.net"),
        "{}",
        lists[0].uri
    );
    let patches: Vec<_> = log.iter().filter(|r| r.method == "PATCH").collect();
    assert_eq!(patches.len(), 1);
    assert!(
        patches[0]
            .uri
            .starts_with("/apis/resource.k8s.io/v1/resourceslices/node-a-dra.net-0?")
    );
    assert!(
        patches[0].uri.contains("fieldManager=dra.net"),
        "{}",
        patches[0].uri
    );
    assert!(patches[0].uri.contains("force=true"), "{}", patches[0].uri);
    let body = &patches[0].body;
    assert_eq!(body["spec"]["pool"]["generation"], 5);
    assert_eq!(body["spec"]["devices"].as_array().unwrap().len(), 3);
    assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "node-uid");
    assert_eq!(body["metadata"]["ownerReferences"][0]["kind"], "Node");
    let deletes: Vec<&str> = log
        .iter()
        .filter(|r| r.method == "DELETE")
        .map(|r| r.uri.as_str())
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert!(deletes[0].starts_with("/apis/resource.k8s.io/v1/resourceslices/node-a-dra.net-5"));
}

#[tokio::test]
async fn publish_loop_rescans_on_request_and_forces_republish() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    let dir = TempDir::new("slices-loop");
    let publisher = DirPublisher::new(dir.path(), "dra.net", "node-a");
    let ctl = SliceController::new(publisher.clone(), "dra.net", "node-a");
    let scans = Arc::new(AtomicUsize::new(0));
    let count = Arc::new(AtomicUsize::new(3));
    let (s2, c2) = (scans.clone(), count.clone());
    let scan = move || {
        s2.fetch_add(1, Ordering::SeqCst);
        Ok(devices(c2.load(Ordering::SeqCst)))
    };
    let inv = crate::inventory::SharedInventory::default();
    let handle = RescanHandle::new();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let timing = LoopTiming {
        min_interval: Duration::from_millis(10),
        max_interval: Duration::from_secs(3600),
        settle: Duration::from_millis(5),
        settle_max: Duration::from_millis(50),
    };
    let task = tokio::spawn(publish_loop(
        scan,
        inv.clone(),
        ctl,
        handle.clone(),
        timing,
        stop_rx,
    ));
    let wait_gen = |g: i64| {
        let publisher = publisher.clone();
        async move {
            for _ in 0..200 {
                if publisher
                    .read_all()
                    .unwrap()
                    .first()
                    .map(|s| s.spec.pool.generation)
                    == Some(g)
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("generation {g} never published");
        }
    };
    wait_gen(1).await;
    assert_eq!(inv.snapshot().len(), 3);
    count.store(5, Ordering::SeqCst);
    handle.request_rescan();
    wait_gen(2).await;
    assert_eq!(publisher.read_all().unwrap()[0].spec.devices.len(), 5);
    // No change: a rescan does not publish; a forced one does.
    handle.request_rescan();
    let before = scans.load(Ordering::SeqCst);
    for _ in 0..200 {
        if scans.load(Ordering::SeqCst) > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(publisher.read_all().unwrap()[0].spec.pool.generation, 2);
    handle.request_republish();
    wait_gen(3).await;
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
const NODE_SEL: &str = "fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Ddra.net";

fn slice_list(items: &[(&str, i64)]) -> serde_json::Value {
    let items: Vec<_> = items
        .iter()
        .map(|(name, g)| {
            serde_json::json!({"apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": name}, "spec": {"pool": {"generation": g}}})
        })
        .collect();
    serde_json::json!({"apiVersion": API_VERSION, "kind": "ResourceSliceList", "metadata": {}, "items": items})
}

fn node_a() -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "uid": "node-uid"}})
}

/// A server-side apply of slice `name` with `n` devices of pool generation `g` out of `count`.
fn apply(name: &str, g: i64, count: i64, n: usize, owner: bool) -> kube_mock::Step {
    let name2 = name.to_owned();
    kube_mock::Step::patch(&format!("{SLICES}/{name}"))
        .query("fieldManager=dra.net")
        .query("force=true")
        .check(move |r| {
            assert_eq!(r.content_type, "application/apply-patch+yaml", "{name2}");
            let b = &r.body;
            assert_eq!(b["metadata"]["name"], name2.as_str());
            assert_eq!(b["spec"]["driver"], "dra.net");
            assert_eq!(b["spec"]["nodeName"], "node-a");
            assert_eq!(b["spec"]["pool"]["name"], "node-a");
            assert_eq!(b["spec"]["pool"]["generation"], g, "{name2}");
            assert_eq!(b["spec"]["pool"]["resourceSliceCount"], count, "{name2}");
            assert_eq!(b["spec"]["devices"].as_array().map(Vec::len), Some(n), "{name2}");
            if owner {
                assert_eq!(b["metadata"]["ownerReferences"][0]["uid"], "node-uid");
            } else {
                assert!(b["metadata"]["ownerReferences"].is_null(), "{b}");
            }
        })
        .echo(200)
}

const STEP: std::time::Duration = std::time::Duration::from_secs(5);

/// Bounds a call of the code under test, so a missing answer fails the test instead of hanging it.
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(10), f)
        .await
        .expect("the code under test did not finish within 10 s")
}

#[tokio::test]
async fn scenario_publish_130_devices_in_two_slices_then_shrink_and_prune() {
    use kube_mock::Step;
    let (client, verifier) = kube_mock::scenario(
        vec![
            Step::get(SLICES).query(NODE_SEL).reply(200, slice_list(&[])),
            Step::get("/api/v1/nodes/node-a").reply(200, node_a()),
            apply("node-a-dra.net-0", 1, 2, 128, true),
            apply("node-a-dra.net-1", 1, 2, 2, true),
            Step::get(SLICES).query(NODE_SEL).reply(
                200,
                slice_list(&[("node-a-dra.net-0", 1), ("node-a-dra.net-1", 1)]),
            ),
            // 120 devices: one slice, generation 2, the second slice pruned.
            Step::get("/api/v1/nodes/node-a").reply(200, node_a()),
            apply("node-a-dra.net-0", 2, 1, 120, true),
            Step::get(SLICES).query(NODE_SEL).reply(
                200,
                slice_list(&[("node-a-dra.net-0", 2), ("node-a-dra.net-1", 1)]),
            ),
            Step::delete(&format!("{SLICES}/node-a-dra.net-1")).reply(
                200,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            ),
        ],
        STEP,
    );
    let mut ctl = SliceController::new(
        KubePublisher::new(client, "dra.net", "node-a"),
        "dra.net",
        "node-a",
    );
    let first = within(ctl.update(&devices(130))).await;
    let second = within(ctl.update(&devices(120))).await;
    // Unchanged devices: no request at all.
    let third = within(ctl.update(&devices(120))).await;
    verifier.done().await;
    assert!(first.unwrap());
    assert!(second.unwrap());
    assert!(!third.unwrap());
    assert_eq!(ctl.generation(), Some(2));
}

#[tokio::test]
async fn scenario_hung_and_failing_api_server_then_a_new_generation() {
    use kube_mock::Step;
    let timeout = std::time::Duration::from_millis(300);
    let (client, verifier) = kube_mock::scenario(
        vec![
            // The list never answers: the publish fails with a timeout.
            Step::get(SLICES).query(NODE_SEL).hang(),
            // Then a Node that is not there (slices go out without owner) and a failed apply
            // of the second slice after the first went out.
            Step::get(SLICES).query(NODE_SEL).reply(200, slice_list(&[])),
            Step::get("/api/v1/nodes/node-a").reply(404, kube_mock::status(404, "NotFound")),
            apply("node-a-dra.net-0", 1, 2, 128, false),
            Step::patch(&format!("{SLICES}/node-a-dra.net-1"))
                .reply(500, kube_mock::status(500, "etcdserver: request timed out")),
            // The retry publishes the same devices under a new generation.
            Step::get("/api/v1/nodes/node-a").reply(200, node_a()),
            apply("node-a-dra.net-0", 2, 2, 128, true),
            apply("node-a-dra.net-1", 2, 2, 1, true),
            Step::get(SLICES).query(NODE_SEL).reply(
                200,
                slice_list(&[("node-a-dra.net-0", 2), ("node-a-dra.net-1", 2)]),
            ),
        ],
        STEP,
    );
    let publisher = KubePublisher::new(client, "dra.net", "node-a").with_timeout(timeout);
    let mut ctl = SliceController::new(publisher, "dra.net", "node-a");
    let t0 = std::time::Instant::now();
    let hung = within(ctl.update(&devices(129))).await;
    let hung_took = t0.elapsed();
    let failed = within(ctl.update(&devices(129))).await;
    let ok = within(ctl.update(&devices(129))).await;
    verifier.done().await;
    let e = hung.unwrap_err();
    assert!(matches!(e, SliceError::Timeout { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "kube API: listing ResourceSlices: no answer within 300ms"
    );
    assert!(hung_took < std::time::Duration::from_secs(3), "{hung_took:?}");
    let e = failed.unwrap_err();
    assert!(matches!(e, SliceError::Kube { .. }), "{e:?}");
    assert_eq!(e.to_string(), "kube API: applying ResourceSlice node-a-dra.net-1");
    assert!(ok.unwrap());
    assert_eq!(ctl.generation(), Some(2));
}

#[tokio::test]
async fn scenario_publish_loop_retries_a_failed_publish_without_a_rescan_request() {
    use kube_mock::Step;
    use std::time::Duration;
    let (client, verifier) = kube_mock::scenario(
        vec![
            Step::get(SLICES)
                .query(NODE_SEL)
                .reply(503, kube_mock::status(503, "ServiceUnavailable")),
            Step::get(SLICES)
                .query(NODE_SEL)
                .reply(503, kube_mock::status(503, "ServiceUnavailable")),
            Step::get(SLICES)
                .query(NODE_SEL)
                .reply(200, slice_list(&[("node-a-dra.net-0", 7)])),
            Step::get("/api/v1/nodes/node-a").reply(200, node_a()),
            apply("node-a-dra.net-0", 8, 1, 3, true),
            Step::get(SLICES)
                .query(NODE_SEL)
                .reply(200, slice_list(&[("node-a-dra.net-0", 8)])),
        ],
        STEP,
    );
    let ctl = SliceController::new(
        KubePublisher::new(client, "dra.net", "node-a"),
        "dra.net",
        "node-a",
    );
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let inv = crate::inventory::SharedInventory::default();
    // The periodic rescan is an hour away: only the retry can publish.
    let timing = LoopTiming {
        min_interval: Duration::from_millis(20),
        max_interval: Duration::from_secs(3600),
        settle: Duration::from_millis(5),
        settle_max: Duration::from_millis(50),
    };
    let task = tokio::spawn(publish_loop(
        || Ok(devices(3)),
        inv.clone(),
        ctl,
        RescanHandle::new(),
        timing,
        stop_rx,
    ));
    let seen = verifier.done().await;
    assert_eq!(seen.len(), 6);
    stop.send(true).unwrap();
    within(task).await.unwrap();
    assert_eq!(inv.snapshot().len(), 3);
}
