// Over 500 lines: one test per status/event case against the API simulator.

use std::sync::Mutex;
use std::time::Instant;

use serde_json::json;

use super::*;
use crate::config::NetworkConfig;
use crate::plan::ClaimRef;
use crate::slices::kube_mock::{client, status};
use crate::state::DeviceState;
use crate::sys::link::LinkSnapshot;
use crate::test_support::{TempDir, device_record, wait_for};

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
        snapshot: LinkSnapshot {
            mac: Some("02:00:00:00:00:01".into()),
            ..LinkSnapshot::default()
        },
        ..device_record(device, DeviceState::InPod)
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
    wait_for("the apply", Duration::from_secs(5), || {
        !log.lock().unwrap().is_empty()
    })
    .await
    .unwrap();
    wait_for("the report done", Duration::from_secs(5), || r.in_flight() == 0)
        .await
        .unwrap();
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
        EventReason::NetworkDeviceAttachFailed,
        "failed to attach network device eth1 to pod ns/pod-a: boom".into(),
    ));
    r.event(r.make_event(
        ObjectRef::claim("ns", "c1", "claim-uid"),
        EventReason::ClaimPrepareFailed,
        "x".repeat(2000),
    ));
    wait_for("two events", Duration::from_secs(5), || {
        log.lock().unwrap().len() == 2
    })
    .await
    .unwrap();
    wait_for("the reports done", Duration::from_secs(5), || r.in_flight() == 0)
        .await
        .unwrap();
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
    wait_for("every report timed out", Duration::from_secs(5), || {
        r.in_flight() == 0
    })
    .await
    .unwrap();
    assert_eq!(*hang.0.lock().unwrap(), MAX_IN_FLIGHT);

    // An API error is logged, nothing else.
    let (kube, log) = client(|_| (500, status(500, "InternalError")));
    let r = Reporter::new(Arc::new(KubeSink::new(kube, "dra.net")), "dra.net", "node-a");
    r.claim_status(apply);
    wait_for("the failed apply done", Duration::from_secs(5), || {
        r.in_flight() == 0 && !log.lock().unwrap().is_empty()
    })
    .await
    .unwrap();

    // Disabled: nothing is sent.
    let d = Reporter::disabled();
    d.claim_status(claim_statuses("dra.net", &[plan("eth1", "c1")], &[record("eth1")]).remove(0));
    assert_eq!(d.in_flight(), 0);
}

#[tokio::test]
async fn file_sink_writes_status_next_to_the_claims_and_appends_events() {
    let tmp = TempDir::new("report");
    let dir = tmp.path().join("claims");
    let sink = FileSink::new(&dir);
    let apply = claim_statuses("dra.net", &[plan("eth1", "c1")], &[record("eth1")]).remove(0);
    sink.apply_claim_status(&apply).await.unwrap();
    let written: ClaimStatusApply =
        serde_json::from_slice(&std::fs::read(dir.join("ns/c1.json")).unwrap()).unwrap();
    assert_eq!(written, apply);
    let r = Reporter::new(Arc::new(sink.clone()), "dra.net", "node-a");
    let (a, b, v) = (
        EventReason::NetworkDeviceRescued,
        EventReason::NetworkDeviceLateAttach,
        EventReason::NetworkDeviceVanished,
    );
    for reason in [a, b] {
        sink.event(&r.make_event(ObjectRef::pod("ns", "p", "u"), reason, "m".into()))
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
        [a.as_str(), b.as_str()]
    );
    // A create of a name that is there adds nothing (as the API server's AlreadyExists); a
    // repeat's update is a line of its own.
    let mut fixed = r.make_event(ObjectRef::pod("ns", "p", "u"), v, "m".into());
    fixed.metadata.name = "p.vanished-0123".into();
    sink.event(&fixed).await.unwrap();
    sink.event(&fixed).await.unwrap();
    sink.patch_event(&lines[0]).await.unwrap();
    let reasons: Vec<String> = std::fs::read_to_string(sink.events_path())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Event>(l).unwrap().reason)
        .collect();
    assert_eq!(reasons, [a.as_str(), b.as_str(), v.as_str(), a.as_str()]);
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
}

#[test]
fn rescue_events_only_for_a_netns_teardown() {
    let r = Reporter::new(Arc::new(Hang::default()), "dra.net", "node-a");
    let a = |reason: ReturnReason, pod: &str| Activity {
        at: crate::clock::MonoTime::from_ns(0),
        pod_uid: "uid-1".into(),
        pod: pod.into(),
        netns_path: None,
        kind: ActivityKind::Returned {
            reason,
            devices: vec!["eth1".into(), "eth2".into()],
            took_us: 420,
        },
    };
    let ev = rescue_event(&r, &a(ReturnReason::NetnsTeardown, "ns/pod-a")).unwrap();
    assert_eq!(ev.reason, "NetworkDeviceRescued");
    assert_eq!(ev.type_, "Normal");
    assert_eq!(ev.involved_object, ObjectRef::pod("ns", "pod-a", "uid-1"));
    assert!(
        ev.message.contains("eth1, eth2") && ev.message.contains("before StopPodSandbox"),
        "{}",
        ev.message
    );
    assert!(rescue_event(&r, &a(ReturnReason::Hook, "ns/pod-a")).is_none());
    assert!(
        rescue_event(&r, &a(ReturnReason::NetnsTeardown, "")).is_none(),
        "no pod to address"
    );
    let hook = Activity {
        kind: ActivityKind::Hook {
            name: crate::nri::hooks::PodHook::StopPodSandbox,
        },
        ..a(ReturnReason::NetnsTeardown, "ns/pod-a")
    };
    assert!(rescue_event(&r, &hook).is_none());
}

/// An API server that creates events (201, echoing them) and patches them (200), or answers a
/// PATCH with `patch_code`.
fn event_api(patch_code: u16) -> (kube::Client, Arc<Mutex<Vec<crate::slices::kube_mock::Seen>>>) {
    client(move |s| {
        let ev = json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "x", "namespace": "ns"}, "involvedObject": {}});
        match s.method.as_str() {
            "POST" => (201, s.body.clone()),
            "PATCH" if patch_code == 200 => (200, ev),
            _ => (patch_code, status(patch_code, "NotFound")),
        }
    })
}

fn pod_event(r: &Reporter, pod: &str, reason: EventReason, message: &str) -> Event {
    r.make_event(
        ObjectRef::pod("ns", pod, &format!("uid-{pod}")),
        reason,
        message.to_owned(),
    )
}

/// Sends `ev` and waits until the log holds `n` requests and nothing is in flight.
async fn send_and_settle(
    r: &Reporter,
    log: &Arc<Mutex<Vec<crate::slices::kube_mock::Seen>>>,
    ev: Event,
    n: usize,
) {
    r.event(ev);
    wait_for(&format!("{n} requests"), Duration::from_secs(5), || {
        log.lock().unwrap().len() == n
    })
    .await
    .unwrap();
    wait_for("the sender done", Duration::from_secs(5), || r.in_flight() == 0)
        .await
        .unwrap();
}

#[tokio::test]
async fn repeated_identical_events_are_one_event_created_then_patched() {
    let (kube, log) = event_api(200);
    let r = Reporter::new(Arc::new(KubeSink::new(kube, "dra.net")), "dra.net", "node-a");
    let msg = "failed to attach network device eth1 to pod ns/pod-a: boom";
    let first = pod_event(&r, "pod-a", EventReason::NetworkDeviceAttachFailed, msg);
    let name = first.metadata.name.clone();
    send_and_settle(&r, &log, first, 1).await;
    for n in 2..=3 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        send_and_settle(
            &r,
            &log,
            pod_event(&r, "pod-a", EventReason::NetworkDeviceAttachFailed, msg),
            n,
        )
        .await;
    }
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].uri, "/api/v1/namespaces/ns/events?");
    assert_eq!(seen[0].body["count"], 1);
    assert_eq!(seen[0].body["metadata"]["name"], name.as_str());
    let first_ts = seen[0].body["firstTimestamp"].clone();
    for (i, count) in [(1, 2), (2, 3)] {
        let s = &seen[i];
        assert_eq!(s.method, "PATCH", "{s:?}");
        assert_eq!(s.uri, format!("/api/v1/namespaces/ns/events/{name}?"));
        assert_eq!(s.content_type, "application/strategic-merge-patch+json");
        let ts = s.body["lastTimestamp"].as_str().unwrap();
        assert!(ts >= first_ts.as_str().unwrap(), "{ts}");
        assert_eq!(
            s.body,
            json!({"count": count, "lastTimestamp": ts, "message": msg}),
            "exactly what client-go patches"
        );
    }

    // A different message, reason or object is an Event of its own.
    send_and_settle(
        &r,
        &log,
        pod_event(&r, "pod-a", EventReason::NetworkDeviceAttachFailed, "other"),
        4,
    )
    .await;
    send_and_settle(
        &r,
        &log,
        pod_event(&r, "pod-a", EventReason::RdmaDeviceAttachFailed, msg),
        5,
    )
    .await;
    send_and_settle(
        &r,
        &log,
        pod_event(&r, "pod-b", EventReason::NetworkDeviceAttachFailed, msg),
        6,
    )
    .await;
    let seen = log.lock().unwrap().clone();
    let mut names = vec![name.clone()];
    for s in &seen[3..] {
        assert_eq!(s.method, "POST", "{s:?}");
        assert_eq!(s.body["count"], 1);
        let n = s.body["metadata"]["name"].as_str().unwrap().to_owned();
        assert!(!names.contains(&n), "{n} reused");
        names.push(n);
    }
    // And the first one still counts on.
    send_and_settle(
        &r,
        &log,
        pod_event(&r, "pod-a", EventReason::NetworkDeviceAttachFailed, msg),
        7,
    )
    .await;
    let last = log.lock().unwrap()[6].clone();
    assert_eq!(
        (last.method.as_str(), last.body["count"].as_i64()),
        ("PATCH", Some(4))
    );
    assert_eq!(last.uri, format!("/api/v1/namespaces/ns/events/{name}?"));
    assert_eq!(r.correlated(), (4, 2), "four event keys, two objects");
}

#[tokio::test]
async fn a_burst_of_repeats_never_blocks_and_the_server_count_only_grows() {
    let (kube, log) = event_api(200);
    let r = Reporter::new(Arc::new(KubeSink::new(kube, "dra.net")), "dra.net", "node-a");
    let start = Instant::now();
    for _ in 0..20 {
        r.event(pod_event(
            &r,
            "pod-a",
            EventReason::NetworkDeviceAttachFailed,
            "boom",
        ));
    }
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "{:?}",
        start.elapsed()
    );
    assert!(r.in_flight() <= 1, "one sender per event key");
    wait_for("the sender done", Duration::from_secs(5), || r.in_flight() == 0)
        .await
        .unwrap();
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen[0].method, "POST");
    assert!(seen[1..].iter().all(|s| s.method == "PATCH"), "{seen:?}");
    let counts: Vec<i64> = seen.iter().map(|s| s.body["count"].as_i64().unwrap()).collect();
    assert!(counts.windows(2).all(|w| w[0] < w[1]), "{counts:?}");
    assert_eq!(counts.last(), Some(&20), "every repeat counted: {counts:?}");
    assert!(seen.len() <= 20);
}

#[tokio::test]
async fn a_patch_of_an_expired_event_creates_it_again_with_the_count() {
    let (kube, log) = event_api(404);
    let r = Reporter::new(Arc::new(KubeSink::new(kube, "dra.net")), "dra.net", "node-a");
    let first = pod_event(&r, "pod-a", EventReason::ClaimPrepareFailed, "no");
    let name = first.metadata.name.clone();
    send_and_settle(&r, &log, first, 1).await;
    send_and_settle(
        &r,
        &log,
        pod_event(&r, "pod-a", EventReason::ClaimPrepareFailed, "no"),
        3,
    )
    .await;
    let seen = log.lock().unwrap().clone();
    assert_eq!(
        seen.iter().map(|s| s.method.as_str()).collect::<Vec<_>>(),
        ["POST", "PATCH", "POST"]
    );
    assert_eq!(seen[2].body["metadata"]["name"], name.as_str());
    assert_eq!(seen[2].body["count"], 2);
    assert_eq!(seen[2].body["firstTimestamp"], seen[0].body["firstTimestamp"]);
    // Created again: the next repeat patches (and, here, recreates) with count 3.
    send_and_settle(
        &r,
        &log,
        pod_event(&r, "pod-a", EventReason::ClaimPrepareFailed, "no"),
        5,
    )
    .await;
    assert_eq!(log.lock().unwrap()[4].body["count"], 3);
}

#[tokio::test]
async fn the_correlation_cache_is_bounded_and_forgets_the_least_recent() {
    let (kube, log) = event_api(200);
    let r = Reporter::new(Arc::new(KubeSink::new(kube, "dra.net")), "dra.net", "node-a").with_correlator(
        CorrelatorOptions {
            entries: 3,
            ..CorrelatorOptions::default()
        },
    );
    for (i, pod) in ["p0", "p1", "p2", "p3", "p4"].iter().enumerate() {
        send_and_settle(
            &r,
            &log,
            pod_event(&r, pod, EventReason::NetworkDeviceReturnFailed, "m"),
            i + 1,
        )
        .await;
        assert!(
            r.correlated().0 <= 3 && r.correlated().1 <= 3,
            "{:?}",
            r.correlated()
        );
    }
    assert_eq!(r.correlated(), (3, 3));
    // p4 is remembered: patched. p0 was evicted: a new Event.
    send_and_settle(
        &r,
        &log,
        pod_event(&r, "p4", EventReason::NetworkDeviceReturnFailed, "m"),
        6,
    )
    .await;
    send_and_settle(
        &r,
        &log,
        pod_event(&r, "p0", EventReason::NetworkDeviceReturnFailed, "m"),
        7,
    )
    .await;
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen[5].method, "PATCH");
    assert_eq!(seen[5].body["count"], 2);
    assert_eq!(seen[6].method, "POST");
    assert_eq!(seen[6].body["count"], 1);
    assert_eq!(r.correlated(), (3, 3));
}

#[tokio::test]
async fn a_hanging_api_holds_one_sender_per_event_key_and_never_blocks() {
    let hang = Arc::new(Hang::default());
    let r = Reporter::new(hang.clone(), "dra.net", "node-a").with_timeout(Duration::from_millis(200));
    let start = Instant::now();
    // 20: under the spam filter's burst of 25 for the object.
    for _ in 0..20 {
        r.event(pod_event(
            &r,
            "pod-a",
            EventReason::NetworkDeviceReturnFailed,
            "m",
        ));
    }
    r.event(pod_event(
        &r,
        "pod-b",
        EventReason::NetworkDeviceReturnFailed,
        "m",
    ));
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(r.in_flight(), 2);
    wait_for("both senders timed out", Duration::from_secs(5), || {
        r.in_flight() == 0
    })
    .await
    .unwrap();
    assert_eq!(*hang.0.lock().unwrap(), 2, "one request per key, not per repeat");
    // After the failure, the next repeat tries again (creating: nothing was created).
    r.event(pod_event(
        &r,
        "pod-a",
        EventReason::NetworkDeviceReturnFailed,
        "m",
    ));
    assert_eq!(r.in_flight(), 1);
}

/// The pure correlator, on a clock the test moves.
mod correlator {
    use super::*;
    use crate::report::correlate::{Correlator, Observed, lock};

    fn ev(r: &Reporter, pod: &str, message: &str) -> Event {
        pod_event(r, pod, EventReason::NetworkDeviceReturnFailed, message)
    }

    fn state(o: &Observed) -> (String, i32) {
        match o {
            Observed::Send(s) => {
                let st = lock(s);
                (st.event.metadata.name.clone(), st.event.count)
            }
            other => panic!("not sent: {other:?}"),
        }
    }

    #[test]
    fn spam_filter_is_a_token_bucket_per_source_and_object() {
        let r = Reporter::disabled();
        let mut c = Correlator::default();
        let t0 = Instant::now();
        // 25 at once for one object (each message its own Event, one bucket) go out ...
        for i in 0..25 {
            assert!(
                matches!(
                    c.observe(ev(&r, "pod-a", &format!("m{i}")), t0),
                    Observed::Send(_)
                ),
                "{i}"
            );
        }
        // ... the 26th does not, whatever its reason or message.
        assert!(matches!(c.observe(ev(&r, "pod-a", "m-late"), t0), Observed::Spam));
        assert!(matches!(
            c.observe(
                pod_event(&r, "pod-a", EventReason::NetworkDeviceLateAttach, "x"),
                t0
            ),
            Observed::Spam
        ));
        // Another object has its own bucket.
        assert!(matches!(c.observe(ev(&r, "pod-b", "m0"), t0), Observed::Send(_)));
        // Half the refill interval: still nothing; the full interval: exactly one.
        let half = t0 + SPAM_REFILL_FOR_TEST / 2;
        assert!(matches!(c.observe(ev(&r, "pod-a", "n1"), half), Observed::Spam));
        let full = t0 + SPAM_REFILL_FOR_TEST;
        assert!(matches!(
            c.observe(ev(&r, "pod-a", "n2"), full),
            Observed::Send(_)
        ));
        assert!(matches!(c.observe(ev(&r, "pod-a", "n3"), full), Observed::Spam));
        // A long quiet time refills up to the burst, not beyond.
        let later = full + SPAM_REFILL_FOR_TEST * 1000;
        let sent = (0..40)
            .filter(|i| {
                matches!(
                    c.observe(ev(&r, "pod-a", &format!("k{i}")), later),
                    Observed::Send(_)
                )
            })
            .count();
        assert_eq!(sent, 25);
    }

    const SPAM_REFILL_FOR_TEST: Duration = crate::report::correlate::SPAM_REFILL;

    #[test]
    fn held_back_repeats_are_counted_and_a_repeat_after_the_window_is_a_new_event() {
        let r = Reporter::disabled();
        let mut c = Correlator::new(CorrelatorOptions {
            burst: 1,
            ..CorrelatorOptions::default()
        });
        let t0 = Instant::now();
        let first = c.observe(ev(&r, "pod-a", "m"), t0);
        let (name, count) = state(&first);
        assert_eq!(count, 1);
        let Observed::Send(slot) = first else {
            unreachable!()
        };
        // What the sender does once the server has it.
        {
            let mut st = lock(&slot);
            st.created = Some(name.clone());
            st.sent_count = 1;
            st.sending = false;
        }
        // Held back by the filter (burst 1), but counted.
        assert!(matches!(
            c.observe(ev(&r, "pod-a", "m"), t0 + Duration::from_secs(1)),
            Observed::Spam
        ));
        assert_eq!(lock(&slot).event.count, 2);
        // The next one that passes carries both repeats, under the first name.
        let o = c.observe(ev(&r, "pod-a", "m"), t0 + Duration::from_secs(301));
        assert_eq!(state(&o), (name.clone(), 3));
        lock(&slot).sending = false;
        // After the window (1 h of silence): a new Event.
        let o = c.observe(
            ev(&r, "pod-a", "m"),
            t0 + Duration::from_secs(301) + crate::report::correlate::DEDUP_WINDOW + Duration::from_secs(1),
        );
        let (new_name, count) = state(&o);
        assert_eq!(count, 1);
        assert_ne!(new_name, name);
    }
}

#[test]
fn a_vanished_device_and_a_stuck_return_are_warnings_with_a_claim_status() {
    let r = Reporter::new(Arc::new(Hang::default()), "dra.net", "node-a");
    let base = Activity {
        at: crate::clock::MonoTime::from_ns(0),
        pod_uid: "uid-1".into(),
        pod: "ns/pod-a".into(),
        netns_path: None,
        kind: ActivityKind::Vanished {
            device: "eth1".into(),
            host_name: "ens1".into(),
            record: "uid-1/sb-1".into(),
        },
    };
    let (ev, devices, reason, message) = trouble_event(&r, &base).unwrap();
    // A fixed name: the same report sent again (after a restart) is the same Event.
    let again = trouble_event(&r, &base).unwrap().0;
    assert_eq!(ev.metadata.name, again.metadata.name);
    assert!(
        ev.metadata.name.starts_with("pod-a.vanished-"),
        "{}",
        ev.metadata.name
    );
    assert_eq!(
        ev.metadata.name,
        crate::report::vanished_event_name("pod-a", "uid-1", "uid-1/sb-1", "eth1")
    );
    assert_ne!(
        ev.metadata.name,
        crate::report::vanished_event_name("pod-a", "uid-1", "uid-1/sb-2", "eth1"),
        "another sandbox's report is another Event"
    );
    assert!(crate::report::vanished_event_name(&"p".repeat(300), "u", "r", "d").len() <= 253);
    assert_eq!(ev.reason, "NetworkDeviceVanished");
    assert_eq!(ev.type_, "Warning");
    assert_eq!(ev.involved_object, ObjectRef::pod("ns", "pod-a", "uid-1"));
    assert_eq!(devices, vec!["eth1".to_owned()]);
    assert!(message.contains("eth1 (ens1) no longer exists"), "{message}");
    let plans = [plan("eth1", "c1"), plan("eth2", "c1"), plan("eth3", "c2")];
    let applies = trouble_statuses("dra.net", &plans, &devices, reason, &message);
    assert_eq!(applies.len(), 1, "only the claim of the device concerned");
    let d = &applies[0].status.devices;
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].device, "eth1");
    assert_eq!(d[0].conditions[0].type_, "Ready");
    assert_eq!(d[0].conditions[0].status, "False");
    assert_eq!(d[0].conditions[0].reason, "NetworkDeviceVanished");
    let stuck = Activity {
        kind: ActivityKind::ReturnStuck {
            devices: vec!["eth2".into(), "eth3".into()],
            reason: crate::rescue::StuckReason::NameTaken,
            error: "File exists (os error 17)".into(),
        },
        ..base.clone()
    };
    let (ev, devices, reason, message) = trouble_event(&r, &stuck).unwrap();
    assert_eq!(ev.reason, "NetworkDeviceReturnFailed");
    assert!(
        message.contains("eth2, eth3") && message.contains("name_taken"),
        "{message}"
    );
    assert_eq!(
        trouble_statuses("dra.net", &plans, &devices, reason, &message).len(),
        2,
        "one apply per claim"
    );
    assert!(rescue_event(&r, &stuck).is_none());
    let returned = Activity {
        kind: ActivityKind::Returned {
            reason: ReturnReason::NetnsTeardown,
            devices: vec![],
            took_us: 1,
        },
        ..base
    };
    assert!(trouble_event(&r, &returned).is_none());
}

#[test]
fn event_reasons_keep_upstreams_names_and_only_a_rescue_is_normal() {
    let r = Reporter::new(Arc::new(Hang::default()), "dra.net", "node-a");
    let seen: Vec<(String, String)> = EventReason::ALL
        .iter()
        .map(|&reason| {
            let ev = r.make_event(ObjectRef::pod("ns", "p", "u"), reason, "m".into());
            (ev.reason, ev.type_)
        })
        .collect();
    let want = [
        ("ClaimPrepareFailed", "Warning"),
        ("NetworkDeviceAttachFailed", "Warning"),
        ("RDMADeviceAttachFailed", "Warning"),
        ("NetworkDeviceLateAttach", "Warning"),
        ("NetworkDeviceRescued", "Normal"),
        ("NetworkDeviceVanished", "Warning"),
        ("NetworkDeviceReturnFailed", "Warning"),
    ];
    assert_eq!(seen, want.map(|(a, b)| (a.to_owned(), b.to_owned())).to_vec());
}
