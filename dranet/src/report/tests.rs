use std::sync::Mutex;
use std::time::Instant;

use serde_json::json;

use super::*;
use crate::config::NetworkConfig;
use crate::link::LinkSnapshot;
use crate::plan::ClaimRef;
use crate::slices::kube_mock::{client, status};
use crate::state::DeviceState;

fn plan(device: &str, claim: &str) -> DevicePlan {
    let mut config = NetworkConfig::default();
    config.interface.name = Some("net1".into());
    config.interface.addresses = vec!["10.1.2.3/24".into(), "fd00::3/64".into()];
    DevicePlan {
        device: device.into(),
        pool: "node-a".into(),
        request: "nic".into(),
        claim: ClaimRef {
            namespace: "ns".into(),
            name: claim.into(),
            uid: format!("uid-{claim}"),
        },
        host_ifname: Some(device.into()),
        pci_address: None,
        permanent_mac: None,
        rdma_device: None,
        config,
        char_devices: vec![],
    }
}

fn record(device: &str) -> DeviceRecord {
    DeviceRecord {
        device: device.into(),
        pod_ifname: "net1".into(),
        pci_address: None,
        permanent_mac: None,
        rdma_device: None,
        rdma_in_pod: false,
        pod_mac: None,
        snapshot: LinkSnapshot {
            mac: Some("02:00:00:00:00:01".into()),
            ..LinkSnapshot::default()
        },
        state: DeviceState::InPod,
        temp_name: None,
    }
}

async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn times_are_rfc3339_utc() {
    assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
    let at = |s| UNIX_EPOCH + Duration::from_secs(s);
    assert_eq!(rfc3339(at(951_782_400)), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(at(1_700_000_000)), "2023-11-14T22:13:20Z");
    assert_eq!(rfc3339(at(4_102_444_799)), "2099-12-31T23:59:59Z");
}

#[test]
fn device_status_as_upstream() {
    let now = "2026-12-03T10:00:00Z";
    let mut rec = record("eth1");
    let st = device_status("dra.net", &plan("eth1", "c1"), &rec, now);
    let v = serde_json::to_value(&st).unwrap();
    assert_eq!(
        v,
        json!({
            "driver": "dra.net", "pool": "node-a", "device": "eth1",
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "NetworkDeviceReady",
                 "message": "network device eth1 is in the pod as net1", "lastTransitionTime": now},
                {"type": "NetworkReady", "status": "True", "reason": "NetworkReady",
                 "message": "addresses, routes, rules and neighbours configured", "lastTransitionTime": now}
            ],
            "networkData": {"interfaceName": "net1", "hardwareAddress": "02:00:00:00:00:01",
                            "ips": ["10.1.2.3/24", "fd00::3/64"]}
        })
    );
    // A MAC set by the config wins; an RDMA link moved along adds RDMALinkReady.
    rec.pod_mac = Some("02:aa:00:00:00:09".into());
    rec.rdma_in_pod = true;
    rec.rdma_device = Some("mlx5_0".into());
    let st = device_status("dra.net", &plan("eth1", "c1"), &rec, now);
    assert_eq!(
        st.network_data.as_ref().unwrap().hardware_address,
        "02:aa:00:00:00:09"
    );
    let types: Vec<_> = st
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.reason.as_str()))
        .collect();
    assert_eq!(
        types,
        [
            ("Ready", "NetworkDeviceReady"),
            ("NetworkReady", "NetworkReady"),
            ("RDMALinkReady", "RDMALinkReady")
        ]
    );
    // No netdev: RDMA only.
    let mut p = plan("pci-0000-30-00-0", "c1");
    p.host_ifname = None;
    let st = device_status("dra.net", &p, &record("pci-0000-30-00-0"), now);
    assert!(st.network_data.is_none());
    assert_eq!(st.conditions[0].reason, "RDMAOnlyDeviceReady");
}

#[test]
fn one_apply_per_claim() {
    let plans = [
        plan("eth1", "c1"),
        plan("eth2", "c2"),
        plan("eth3", "c1"),
        plan("eth4", "c3"),
    ];
    // eth4 has no record (not attached): not reported.
    let recs = [record("eth1"), record("eth2"), record("eth3")];
    let applies = claim_statuses("dra.net", &plans, &recs);
    let got: Vec<(String, Vec<String>)> = applies
        .iter()
        .map(|a| {
            (
                a.metadata.name.clone(),
                a.status.devices.iter().map(|d| d.device.clone()).collect(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("c1".to_owned(), vec!["eth1".to_owned(), "eth3".to_owned()]),
            ("c2".to_owned(), vec!["eth2".to_owned()])
        ]
    );
    assert!(applies.iter().all(|a| a.api_version == "resource.k8s.io/v1"
        && a.kind == "ResourceClaim"
        && a.metadata.namespace == "ns"));
}

#[tokio::test]
async fn claim_status_is_one_forced_server_side_apply_of_the_status_subresource() {
    let (kube, log) = client(|s| {
        (
            200,
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c1", "namespace": "ns"}, "body": s.body}),
        )
    });
    let r = Reporter::new(Arc::new(KubeSink::new(kube, "dra.net")), "dra.net", "node-a");
    let apply = claim_statuses("dra.net", &[plan("eth1", "c1")], &[record("eth1")]).remove(0);
    let now = apply.status.devices[0].conditions[0].last_transition_time.clone();
    r.claim_status(apply);
    wait_for("the apply", || !log.lock().unwrap().is_empty()).await;
    wait_for("the report done", || r.in_flight() == 0).await;
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].method, "PATCH");
    assert_eq!(
        seen[0].uri,
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1/status?&force=true&fieldManager=dra.net"
    );
    assert_eq!(
        seen[0].body,
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c1", "namespace": "ns"},
            "status": {"devices": [{
                "driver": "dra.net", "pool": "node-a", "device": "eth1",
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "NetworkDeviceReady",
                     "message": "network device eth1 is in the pod as net1", "lastTransitionTime": now},
                    {"type": "NetworkReady", "status": "True", "reason": "NetworkReady",
                     "message": "addresses, routes, rules and neighbours configured", "lastTransitionTime": now}
                ],
                "networkData": {"interfaceName": "net1", "hardwareAddress": "02:00:00:00:00:01",
                                "ips": ["10.1.2.3/24", "fd00::3/64"]}
            }]}
        })
    );
}

#[tokio::test]
async fn events_are_core_v1_events_in_the_objects_namespace() {
    let (kube, log) = client(|s| (201, s.body.clone()));
    let r = Reporter::new(Arc::new(KubeSink::new(kube, "dra.net")), "dra.net", "node-a");
    r.event(r.make_event(
        ObjectRef::pod("ns", "pod-a", "pod-uid"),
        true,
        "NetworkDeviceAttachFailed",
        "failed to attach network device eth1 to pod ns/pod-a: boom".into(),
    ));
    r.event(r.make_event(
        ObjectRef::claim("ns", "c1", "claim-uid"),
        true,
        "ClaimPrepareFailed",
        "x".repeat(2000),
    ));
    wait_for("two events", || log.lock().unwrap().len() == 2).await;
    wait_for("the reports done", || r.in_flight() == 0).await;
    let mut seen = log.lock().unwrap().clone();
    seen.sort_by_key(|s| s.body["reason"].as_str().unwrap_or_default().to_owned());
    for s in &seen {
        assert_eq!(s.method, "POST");
        assert_eq!(s.uri, "/api/v1/namespaces/ns/events?");
    }
    let claim = &seen[0].body;
    assert_eq!(claim["reason"], "ClaimPrepareFailed");
    assert_eq!(
        claim["involvedObject"],
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "namespace": "ns", "name": "c1", "uid": "claim-uid"})
    );
    assert_eq!(
        claim["message"].as_str().unwrap().len(),
        1024,
        "messages are capped"
    );
    let pod = &seen[1].body;
    let ts = pod["firstTimestamp"].as_str().unwrap().to_owned();
    assert!(
        pod["metadata"]["name"].as_str().unwrap().starts_with("pod-a."),
        "{pod}"
    );
    let mut expect = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": pod["metadata"]["name"], "namespace": "ns"},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": "ns", "name": "pod-a", "uid": "pod-uid"},
        "reason": "NetworkDeviceAttachFailed",
        "message": "failed to attach network device eth1 to pod ns/pod-a: boom",
        "type": "Warning",
        "source": {"component": "dra.net", "host": "node-a"},
        "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
        "reportingComponent": "dra.net", "reportingInstance": "node-a"
    });
    assert_eq!(pod, &expect);
    expect["type"] = json!("Normal");
    assert_ne!(pod, &expect);
}

/// A sink that never answers, counting calls.
#[derive(Default)]
struct Hang(Mutex<usize>);

impl Sink for Hang {
    fn apply_claim_status<'a>(&'a self, _: &'a ClaimStatusApply) -> BoxFuture<'a, Result<(), ReportError>> {
        *self.0.lock().unwrap() += 1;
        Box::pin(futures::future::pending())
    }
    fn event<'a>(&'a self, _: &'a Event) -> BoxFuture<'a, Result<(), ReportError>> {
        *self.0.lock().unwrap() += 1;
        Box::pin(futures::future::pending())
    }
}

#[tokio::test]
async fn a_hanging_or_failing_api_never_blocks_and_reports_are_bounded() {
    let hang = Arc::new(Hang::default());
    let r = Reporter::new(hang.clone(), "dra.net", "node-a").with_timeout(Duration::from_millis(200));
    let apply = claim_statuses("dra.net", &[plan("eth1", "c1")], &[record("eth1")]).remove(0);
    let start = Instant::now();
    for _ in 0..MAX_IN_FLIGHT + 10 {
        r.claim_status(apply.clone());
    }
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(r.in_flight(), MAX_IN_FLIGHT, "the extra reports are dropped");
    wait_for("every report timed out", || r.in_flight() == 0).await;
    assert_eq!(*hang.0.lock().unwrap(), MAX_IN_FLIGHT);

    // An API error is logged, nothing else.
    let (kube, log) = client(|_| (500, status(500, "InternalError")));
    let r = Reporter::new(Arc::new(KubeSink::new(kube, "dra.net")), "dra.net", "node-a");
    r.claim_status(apply);
    wait_for("the failed apply done", || {
        r.in_flight() == 0 && !log.lock().unwrap().is_empty()
    })
    .await;

    // Disabled: nothing is sent.
    let d = Reporter::disabled();
    d.claim_status(claim_statuses("dra.net", &[plan("eth1", "c1")], &[record("eth1")]).remove(0));
    assert_eq!(d.in_flight(), 0);
}

#[tokio::test]
async fn file_sink_writes_status_next_to_the_claims_and_appends_events() {
    let dir = std::env::temp_dir().join(format!("dranet-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sink = FileSink::new(&dir);
    let apply = claim_statuses("dra.net", &[plan("eth1", "c1")], &[record("eth1")]).remove(0);
    sink.apply_claim_status(&apply).await.unwrap();
    let written: ClaimStatusApply =
        serde_json::from_slice(&std::fs::read(dir.join("ns/c1.json")).unwrap()).unwrap();
    assert_eq!(written, apply);
    let r = Reporter::new(Arc::new(sink.clone()), "dra.net", "node-a");
    for reason in ["A", "B"] {
        sink.event(&r.make_event(ObjectRef::pod("ns", "p", "u"), false, reason, "m".into()))
            .await
            .unwrap();
    }
    let lines: Vec<Event> = std::fs::read_to_string(sink.events_path())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(),
        ["A", "B"]
    );
    for bad in ["", "..", ".hidden", "a/b"] {
        assert!(
            matches!(sink.status_path("ns", bad), Err(ReportError::BadName { .. })),
            "{bad:?}"
        );
        assert!(
            matches!(sink.status_path(bad, "c"), Err(ReportError::BadName { .. })),
            "{bad:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rescue_events_only_for_a_netns_teardown() {
    let r = Reporter::new(Arc::new(Hang::default()), "dra.net", "node-a");
    let a = |reason: &str, pod: &str| Activity {
        at: 0,
        pod_uid: "uid-1".into(),
        pod: pod.into(),
        netns_path: None,
        kind: ActivityKind::Returned {
            reason: reason.into(),
            devices: vec!["eth1".into(), "eth2".into()],
            took_us: 420,
        },
    };
    let ev = rescue_event(&r, &a("NetnsTeardown", "ns/pod-a")).unwrap();
    assert_eq!(ev.reason, "NetworkDeviceRescued");
    assert_eq!(ev.type_, "Normal");
    assert_eq!(ev.involved_object, ObjectRef::pod("ns", "pod-a", "uid-1"));
    assert!(
        ev.message.contains("eth1, eth2") && ev.message.contains("before StopPodSandbox"),
        "{}",
        ev.message
    );
    assert!(rescue_event(&r, &a("Hook", "ns/pod-a")).is_none());
    assert!(
        rescue_event(&r, &a("NetnsTeardown", "")).is_none(),
        "no pod to address"
    );
    let hook = Activity {
        kind: ActivityKind::Hook {
            name: "StopPodSandbox".into(),
        },
        ..a("NetnsTeardown", "ns/pod-a")
    };
    assert!(rescue_event(&r, &hook).is_none());
}
