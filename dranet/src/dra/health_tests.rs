// Over 500 lines: one test per health transition and per service version.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};

use prost::Message;

use super::*;
use crate::dra::proto::health_v1alpha1 as pb;
use crate::rescue::RescueTrigger;
use crate::state::{PodPhase, PodRecord, ReturnReason};
use crate::sys::netns::NetnsId;
use crate::test_support::{NoSink, TempDir, device_record};

fn checkpoint(devices: &[(&str, DeviceState)]) -> Checkpoint {
    let mut cp = Checkpoint::default();
    cp.pods.insert(
        "uid-1/sb-1".into(),
        PodRecord {
            pod_uid: "uid-1".into(),
            sandbox_id: "sb-1".into(),
            namespace: "ns".into(),
            name: "pod-a".into(),
            netns_path: PathBuf::from("/run/netns/x"),
            netns: NetnsId::test(1, 2),
            pin: None,
            phase: PodPhase::Attached,
            devices: devices.iter().map(|(d, s)| device_record(d, *s)).collect(),
            recovered: None,
        }
        .into(),
    );
    cp
}

fn activity(kind: ActivityKind) -> Activity {
    Activity {
        at: crate::clock::MonoTime::from_ns(0),
        pod_uid: "uid-1".into(),
        pod: "ns/pod-a".into(),
        netns_path: None,
        kind,
    }
}

fn health(hub: &HealthHub, device: &str) -> (bool, String) {
    let d = hub
        .current()
        .into_iter()
        .find(|d| &*d.device == device)
        .unwrap_or_else(|| panic!("{device} not listed: {:?}", hub.current()));
    (d.healthy, d.message.to_string())
}

/// The hub publishes on every scan and every activity of a burst of pods: an entry allocates
/// nothing of its own (the names are the hub's, the messages that name no pod are made once),
/// an entry that did not change is the last list's, and the hub's own tables keep their
/// entries, so a burst leaves no fresh copy of every device among the pods' short-lived memory.
#[test]
fn an_unchanged_device_keeps_its_health_entry_across_publishes() {
    let hub = HealthHub::new("node-a");
    hub.observe_scan(["eth1", "eth2", "eth3"], &Checkpoint::default());
    let first = hub.inner.tx.borrow().clone();
    let host_names: Vec<*const u8> = hub.state().host.iter().map(|d| d.as_ptr()).collect();
    let home_message = first[0].message.clone();
    assert!(first.iter().all(|e| Arc::ptr_eq(&e.message, &home_message)));

    // eth1 goes into a pod; eth2 and eth3 stay where they are.
    let cp = checkpoint(&[("eth1", DeviceState::InPod)]);
    hub.observe_scan(["eth2", "eth3"], &cp);
    let second = hub.inner.tx.borrow().clone();
    assert_eq!(second.len(), 3);
    assert_eq!(&*second[0].message, "attached to pod ns/pod-a");
    assert_eq!(second[1..], first[1..], "eth2 and eth3 unchanged, since too");
    assert!(second[1..].iter().all(|e| Arc::ptr_eq(&e.message, &home_message)));
    let same_names = |a: &[DeviceHealth], b: &[DeviceHealth]| {
        a.iter().zip(b).all(|(a, b)| Arc::ptr_eq(&a.device, &b.device))
    };
    assert!(same_names(&first, &second), "the names are the hub's");
    let in_pod_name = hub.state().in_pod.get("eth1").map(|p| p.as_ptr());

    // The same scan and the same checkpoint again: nothing is made anew, not even the list.
    hub.observe_activity(
        &activity(ActivityKind::Attached {
            devices: vec!["eth1".into()],
            took_us: 1,
        }),
        &cp,
    );
    hub.observe_scan(["eth2", "eth3"], &cp);
    let third = hub.inner.tx.borrow().clone();
    assert!(Arc::ptr_eq(&second, &third));
    assert_eq!(hub.state().in_pod.get("eth1").map(|p| p.as_ptr()), in_pod_name);

    // eth1 comes home: back in the host set under the hub's name, with the one home message.
    let home = checkpoint(&[("eth1", DeviceState::Home)]);
    hub.observe_activity(
        &activity(ActivityKind::Returned {
            reason: ReturnReason::Hook,
            devices: vec!["eth1".into()],
            took_us: 1,
        }),
        &home,
    );
    hub.observe_scan(["eth1", "eth2", "eth3"], &home);
    let fourth = hub.inner.tx.borrow().clone();
    assert!(fourth.iter().all(|e| Arc::ptr_eq(&e.message, &home_message)));
    assert!(same_names(&first, &fourth));
    let st = hub.state();
    assert!(
        st.host.iter().map(|d| d.as_ptr()).eq(host_names.iter().copied()),
        "the host set holds the names it had"
    );
}

#[test]
fn host_pod_missing_and_back() {
    let hub = HealthHub::new("node-a");
    hub.observe_scan(["eth1", "eth2"], &Checkpoint::default());
    assert_eq!(
        health(&hub, "eth1"),
        (true, "in the host network namespace".into())
    );
    let since = hub.current()[0].since;
    assert!(since > 1_700_000_000, "{since}");

    // eth1 moves into a pod: gone from the host scan, healthy in the pod.
    let cp = checkpoint(&[("eth1", DeviceState::InPod)]);
    hub.observe_scan(["eth2"], &cp);
    assert_eq!(health(&hub, "eth1"), (true, "attached to pod ns/pod-a".into()));

    // eth2 vanishes and is in no pod: unhealthy, and still listed.
    hub.observe_scan([], &cp);
    let (ok, msg) = health(&hub, "eth2");
    assert!(!ok);
    assert!(msg.contains("missing from the host"), "{msg}");
    assert_eq!(hub.current().len(), 2);

    hub.observe_scan(["eth2"], &cp);
    assert!(health(&hub, "eth2").0);
}

#[test]
fn rescue_marks_devices_unhealthy_until_home() {
    let hub = HealthHub::new("node-a");
    let cp = checkpoint(&[("eth1", DeviceState::InPod), ("eth2", DeviceState::InPod)]);
    hub.observe_scan([], &cp);
    hub.observe_activity(
        &activity(ActivityKind::RescueStarted {
            trigger: RescueTrigger::NetnsUnmounted,
        }),
        &cp,
    );
    let (ok, msg) = health(&hub, "eth1");
    assert!(!ok);
    assert!(
        msg.contains("being returned to the host from pod ns/pod-a"),
        "{msg}"
    );
    assert!(msg.contains("netns_unmounted"), "{msg}");

    // A return that fails for one device: that device stays unhealthy with the error.
    let cp = checkpoint(&[("eth1", DeviceState::Home), ("eth2", DeviceState::Returning)]);
    hub.observe_activity(
        &activity(ActivityKind::Failed {
            action: FailedAction::Return,
            error: "boom".into(),
            device: None,
        }),
        &cp,
    );
    let (ok, msg) = health(&hub, "eth2");
    assert!(!ok);
    assert!(
        msg.contains("return from pod ns/pod-a failed") && msg.contains("boom"),
        "{msg}"
    );
    // eth1 came home: still "returning" until a scan sees it or Returned arrives.
    hub.observe_scan(["eth1"], &cp);
    assert_eq!(
        health(&hub, "eth1"),
        (true, "in the host network namespace".into())
    );
    assert!(
        !health(&hub, "eth2").0,
        "a scan does not clear a failed device still out"
    );

    // The retry succeeds.
    let cp = checkpoint(&[("eth1", DeviceState::Home), ("eth2", DeviceState::Home)]);
    hub.observe_activity(
        &activity(ActivityKind::Returned {
            reason: ReturnReason::NetnsTeardown,
            devices: vec!["eth1".into(), "eth2".into()],
            took_us: 10,
        }),
        &cp,
    );
    assert_eq!(
        health(&hub, "eth2"),
        (true, "in the host network namespace".into()),
        "home per the checkpoint before the rescan"
    );
    hub.observe_scan(["eth1", "eth2"], &cp);
    assert!(health(&hub, "eth2").0);
}

#[test]
fn a_device_home_under_a_temporary_name_is_unhealthy() {
    let hub = HealthHub::new("node-a");
    let mut cp = checkpoint(&[("eth1", DeviceState::HomeNameBusy)]);
    cp.pods.get_mut("uid-1/sb-1").unwrap().devices[0].temp_name = Some("dn7".into());
    hub.observe_scan(["dn7"], &cp);
    let (ok, msg) = health(&hub, "eth1");
    assert!(!ok);
    assert!(msg.contains("back in the host as dn7"), "{msg}");
}

#[test]
fn a_failed_repair_names_its_device_and_attach_failures_are_not_health() {
    let hub = HealthHub::new("node-a");
    let cp = checkpoint(&[("eth1", DeviceState::InPod), ("eth2", DeviceState::InPod)]);
    hub.observe_scan([], &cp);
    hub.observe_activity(
        &activity(ActivityKind::Failed {
            action: FailedAction::Attach,
            error: "no".into(),
            device: Some("eth1".into()),
        }),
        &cp,
    );
    assert!(
        health(&hub, "eth1").0,
        "a rolled-back attach is not a device fault"
    );
    hub.observe_activity(
        &activity(ActivityKind::Failed {
            action: FailedAction::Repair,
            error: "EBUSY".into(),
            device: Some("eth2".into()),
        }),
        &cp,
    );
    assert!(health(&hub, "eth1").0);
    let (ok, msg) = health(&hub, "eth2");
    assert!(!ok && msg.contains("repair") && msg.contains("EBUSY"), "{msg}");
}

#[test]
fn unchanged_input_sends_nothing_and_keeps_since() {
    let hub = HealthHub::new("node-a");
    let mut rx = hub.inner.tx.subscribe();
    hub.observe_scan(["eth1"], &Checkpoint::default());
    assert!(rx.has_changed().unwrap());
    rx.borrow_and_update();
    let before = hub.current();
    hub.observe_scan(["eth1"], &Checkpoint::default());
    assert!(!rx.has_changed().unwrap(), "same list sent again");
    assert_eq!(hub.current(), before);
}

#[tokio::test]
async fn stream_resends_before_the_timeout_and_follows_changes() {
    let hub = HealthHub::with_timing("node-a", Duration::from_secs(5), Duration::from_millis(300));
    hub.observe_scan(["eth1"], &Checkpoint::default());
    let mut s = Box::pin(hub.stream::<pb::NodeWatchResourcesResponse>());
    let first = s.next().await.unwrap();
    assert_eq!(first.devices.len(), 1);
    let d = &first.devices[0];
    assert_eq!(d.device.as_ref().unwrap().pool_name, "node-a");
    assert_eq!(d.device.as_ref().unwrap().device_name, "eth1");
    assert_eq!(d.health, pb::HealthStatus::Healthy as i32);
    assert_eq!(d.health_check_timeout_seconds, 5);
    // Nothing changes: the list comes again after the resend interval, before the timeout.
    let t = tokio::time::Instant::now();
    let again = s.next().await.unwrap();
    assert_eq!(again, first);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // A change is sent at once.
    hub.observe_scan([], &Checkpoint::default());
    let t = tokio::time::Instant::now();
    let changed = s.next().await.unwrap();
    assert!(t.elapsed() < Duration::from_millis(250), "{:?}", t.elapsed());
    assert_eq!(changed.devices[0].health, pb::HealthStatus::Unhealthy as i32);
    assert_eq!(hub.watchers(), 1);
    drop(s);
    assert_eq!(hub.watchers(), 0, "a dropped stream leaves nothing behind");
}

#[tokio::test]
async fn a_stream_ends_when_told_to_stop() {
    let hub = HealthHub::with_timing("node-a", Duration::from_secs(30), Duration::from_secs(3600));
    hub.observe_scan(["eth1"], &Checkpoint::default());
    let (tx, rx) = watch::channel(false);
    let mut s = Box::pin(hub.stream_until::<pb::NodeWatchResourcesResponse>(rx));
    assert!(s.next().await.is_some());
    tx.send_replace(true);
    let end = tokio::time::timeout(Duration::from_secs(2), s.next()).await;
    assert_eq!(
        end,
        Ok(None),
        "the stream must end on stop, not wait for the resend"
    );
    drop(s);
    assert_eq!(hub.watchers(), 0);
}

/// A clock the test moves by hand (unix seconds).
fn manual_clock(start: i64) -> (Arc<AtomicI64>, Clock) {
    let t = Arc::new(AtomicI64::new(start));
    let c = t.clone();
    (t, Arc::new(move || c.load(Ordering::SeqCst)))
}

fn hub_with_clock(grace: Duration, start: i64) -> (HealthHub, Arc<AtomicI64>) {
    let (t, clock) = manual_clock(start);
    let hub = HealthHub::with_options(
        "node-a",
        HealthOptions {
            gone_grace: grace,
            clock,
            ..HealthOptions::default()
        },
    );
    (hub, t)
}

fn listed(hub: &HealthHub) -> Vec<String> {
    hub.current().into_iter().map(|d| d.device.to_string()).collect()
}

#[test]
fn a_device_gone_for_good_is_unhealthy_for_the_grace_then_dropped_and_healthy_when_back() {
    let (hub, t) = hub_with_clock(Duration::from_secs(300), 1_000_000);
    hub.observe_scan(["eth1", "eth2"], &Checkpoint::default());
    // eth2 disappears at t0.
    hub.observe_scan(["eth1"], &Checkpoint::default());
    let d = hub.current().into_iter().find(|d| &*d.device == "eth2").unwrap();
    assert!(!d.healthy && d.message.contains("missing from the host"), "{d:?}");
    assert_eq!(d.since, 1_000_000);

    // One second short of the grace: still listed, unhealthy, `since` unchanged.
    t.store(1_000_299, Ordering::SeqCst);
    hub.refresh();
    let d = hub.current().into_iter().find(|d| &*d.device == "eth2").unwrap();
    assert!(!d.healthy);
    assert_eq!(d.since, 1_000_000, "the time it went missing");
    // Scans in between do not restart the grace.
    hub.observe_scan(["eth1"], &Checkpoint::default());
    assert_eq!(listed(&hub), ["eth1", "eth2"]);

    // The grace ran out: dropped, without any new input (refresh is what a stream's resend
    // does); the other device is untouched.
    t.store(1_000_300, Ordering::SeqCst);
    hub.refresh();
    assert_eq!(listed(&hub), ["eth1"]);
    assert!(health(&hub, "eth1").0);
    // And it stays dropped.
    t.store(1_009_000, Ordering::SeqCst);
    hub.observe_scan(["eth1"], &Checkpoint::default());
    assert_eq!(listed(&hub), ["eth1"]);

    // It comes back: listed again, healthy, since now.
    hub.observe_scan(["eth1", "eth2"], &Checkpoint::default());
    let d = hub.current().into_iter().find(|d| &*d.device == "eth2").unwrap();
    assert!(d.healthy, "{d:?}");
    assert_eq!(d.since, 1_009_000);

    // Gone again later: a fresh grace, counted from the new disappearance.
    t.store(1_010_000, Ordering::SeqCst);
    hub.observe_scan(["eth1"], &Checkpoint::default());
    t.store(1_010_299, Ordering::SeqCst);
    hub.refresh();
    assert_eq!(listed(&hub), ["eth1", "eth2"]);
    t.store(1_010_300, Ordering::SeqCst);
    hub.refresh();
    assert_eq!(listed(&hub), ["eth1"]);
}

#[test]
fn a_device_back_before_the_grace_ends_starts_a_new_grace_next_time() {
    let (hub, t) = hub_with_clock(Duration::from_secs(60), 5_000);
    hub.observe_scan(["eth1"], &Checkpoint::default());
    hub.observe_scan([], &Checkpoint::default());
    t.store(5_050, Ordering::SeqCst);
    hub.observe_scan(["eth1"], &Checkpoint::default());
    assert!(health(&hub, "eth1").0);
    hub.observe_scan([], &Checkpoint::default());
    // 70 s after the first disappearance, 20 s after the second: still listed.
    t.store(5_070, Ordering::SeqCst);
    hub.refresh();
    assert_eq!(listed(&hub), ["eth1"]);
    assert!(!health(&hub, "eth1").0);
    t.store(5_110, Ordering::SeqCst);
    hub.refresh();
    assert!(listed(&hub).is_empty());
}

#[test]
fn devices_in_a_pod_or_with_work_pending_are_never_dropped() {
    let (hub, t) = hub_with_clock(Duration::from_secs(10), 100);
    // eth1 in a pod (not in the host scan), eth2 being returned, eth3 with a failed return,
    // eth4 home under a temporary name.
    let mut cp = checkpoint(&[
        ("eth1", DeviceState::InPod),
        ("eth2", DeviceState::Returning),
        ("eth3", DeviceState::InPod),
        ("eth4", DeviceState::HomeNameBusy),
    ]);
    cp.pods.get_mut("uid-1/sb-1").unwrap().devices[3].temp_name = Some("dn9".into());
    hub.observe_scan([], &cp);
    hub.observe_activity(
        &activity(ActivityKind::RescueStarted {
            trigger: RescueTrigger::NetnsUnmounted,
        }),
        &cp,
    );
    hub.observe_activity(
        &activity(ActivityKind::Failed {
            action: FailedAction::Repair,
            error: "EBUSY".into(),
            device: Some("eth3".into()),
        }),
        &cp,
    );
    // The pod record is gone but the failure is still pending for eth3; eth2 still
    // returning; eth4 still home under dn9 in another record.
    let mut later = checkpoint(&[("eth4", DeviceState::HomeNameBusy)]);
    later.pods.get_mut("uid-1/sb-1").unwrap().devices[0].temp_name = Some("dn9".into());
    t.store(10_000, Ordering::SeqCst);
    hub.observe_scan([], &later);
    hub.refresh();
    let got: Vec<(String, bool)> = hub
        .current()
        .into_iter()
        .map(|d| (d.device.to_string(), d.healthy))
        .collect();
    assert_eq!(
        got,
        [
            ("eth1".to_owned(), false),
            ("eth2".to_owned(), false),
            ("eth3".to_owned(), false),
            ("eth4".to_owned(), false)
        ],
        "{:?}",
        hub.current()
    );
    // eth1 was still "being returned" (the rescue started and nothing said it ended): not
    // dropped either. Once Returned says it is home and a scan does not find it, the grace
    // starts.
    let home = checkpoint(&[("eth1", DeviceState::Home), ("eth2", DeviceState::Home)]);
    hub.observe_activity(
        &activity(ActivityKind::Returned {
            reason: ReturnReason::NetnsTeardown,
            devices: vec!["eth1".into(), "eth2".into()],
            took_us: 1,
        }),
        &home,
    );
    hub.observe_scan([], &later);
    assert!(listed(&hub).contains(&"eth1".to_owned()));
    t.store(10_010, Ordering::SeqCst);
    hub.refresh();
    assert_eq!(listed(&hub), ["eth3", "eth4"], "{:?}", hub.current());
}

#[tokio::test]
async fn a_stream_drops_a_gone_device_at_a_resend_without_new_input() {
    let (t, clock) = manual_clock(50_000);
    let hub = HealthHub::with_options(
        "node-a",
        HealthOptions {
            resend: Duration::from_millis(50),
            gone_grace: Duration::from_secs(300),
            clock,
            ..HealthOptions::default()
        },
    );
    hub.observe_scan(["eth1", "eth2"], &Checkpoint::default());
    hub.observe_scan(["eth1"], &Checkpoint::default());
    let mut s = Box::pin(hub.stream::<pb::NodeWatchResourcesResponse>());
    let names = |r: &pb::NodeWatchResourcesResponse| -> Vec<String> {
        r.devices
            .iter()
            .map(|d| d.device.as_ref().unwrap().device_name.clone())
            .collect()
    };
    assert_eq!(names(&s.next().await.unwrap()), ["eth1", "eth2"]);
    assert_eq!(names(&s.next().await.unwrap()), ["eth1", "eth2"]);
    t.store(50_300, Ordering::SeqCst);
    let r = tokio::time::timeout(Duration::from_secs(2), s.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(names(&r), ["eth1"]);
}

#[test]
fn both_versions_carry_the_same_list_on_the_wire() {
    use crate::dra::proto::health_v1 as v1;
    let hub = HealthHub::new("node-a");
    let cp = checkpoint(&[("eth2", DeviceState::InPod)]);
    hub.observe_scan(["eth1"], &cp);
    hub.observe_scan(["eth1"], &Checkpoint::default());
    let list = hub.inner.tx.borrow().clone();
    let a = pb::NodeWatchResourcesResponse::from_list(&list, "node-a", 30);
    let b = v1::NodeWatchResourcesResponse::from_list(&list, "node-a", 30);
    assert_eq!(a.devices.len(), 2);
    assert_eq!(a.encode_to_vec(), b.encode_to_vec(), "same fields, same numbers");
    // And each decodes as the other.
    let back = v1::NodeWatchResourcesResponse::decode(a.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back, b);
    assert_eq!(b.devices[1].health, v1::HealthStatus::Unhealthy as i32);
    assert_eq!(b.devices[0].health, v1::HealthStatus::Healthy as i32);
    assert_eq!(
        <pb::NodeWatchResourcesResponse as HealthResponse>::SERVICE,
        "v1alpha1.DRAResourceHealth"
    );
    assert_eq!(
        <v1::NodeWatchResourcesResponse as HealthResponse>::SERVICE,
        "v1.DRAResourceHealth"
    );
}

async fn uds_channel(path: &std::path::Path) -> tonic::transport::Channel {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::try_from("http://[::]:0")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let p = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(p).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .unwrap()
}

#[tokio::test]
async fn both_versions_are_served_over_the_dra_socket_from_one_hub() {
    use crate::dra::proto::health_v1 as v1;
    use crate::dra::proto::pluginregistration::InfoRequest;
    use crate::dra::proto::pluginregistration::registration_client::RegistrationClient;
    use crate::dra::{KubeletPlugin, MemoryClaimSource, PluginConfig, Preparer};

    let root = TempDir::new("health-uds");
    let cfg = PluginConfig {
        kubelet_root: root.path().to_path_buf(),
        driver: "dra.net".into(),
    };
    let preparer = Arc::new(Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(MemoryClaimSource::new()),
        Arc::new(crate::inventory::SharedInventory::new(Vec::new())),
        Arc::new(NoSink),
    ));
    let hub = HealthHub::new("node-a");
    hub.observe_scan(["eth1", "eth2"], &Checkpoint::default());
    let plugin = KubeletPlugin::start_with_health(&cfg, preparer, hub.clone())
        .await
        .unwrap();

    // Registration lists both health services after the node services.
    let info = RegistrationClient::new(uds_channel(&cfg.registration_socket()).await)
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );

    let ch = uds_channel(&cfg.dra_socket()).await;
    let mut new = v1::dra_resource_health_client::DraResourceHealthClient::new(ch.clone())
        .node_watch_resources(v1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut old = pb::dra_resource_health_client::DraResourceHealthClient::new(ch)
        .node_watch_resources(pb::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let a = new.message().await.unwrap().unwrap();
    let b = old.message().await.unwrap().unwrap();
    assert_eq!(a.devices.len(), 2);
    assert_eq!(a.encode_to_vec(), b.encode_to_vec(), "{a:?} vs {b:?}");
    assert!(
        a.devices
            .iter()
            .all(|d| d.health == v1::HealthStatus::Healthy as i32
                && d.health_check_timeout_seconds == 30
                && d.device.as_ref().is_some_and(|id| id.pool_name == "node-a"))
    );
    assert_eq!(hub.watchers(), 2);

    // One change reaches both streams.
    hub.observe_scan(["eth1"], &Checkpoint::default());
    let wait = Duration::from_secs(5);
    let a = tokio::time::timeout(wait, new.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let b = tokio::time::timeout(wait, old.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(a.devices[1].device.as_ref().unwrap().device_name, "eth2");
    assert_eq!(a.devices[1].health, v1::HealthStatus::Unhealthy as i32);
    assert_eq!(a.encode_to_vec(), b.encode_to_vec());

    // Stopping the plugin ends both streams.
    tokio::time::timeout(wait, plugin.stop()).await.unwrap();
    for s in [
        tokio::time::timeout(wait, new.message())
            .await
            .map(|r| r.ok().flatten().is_none()),
        tokio::time::timeout(wait, old.message())
            .await
            .map(|r| r.ok().flatten().is_none()),
    ] {
        assert_eq!(s, Ok(true), "a stream outlived the plugin");
    }
}

#[test]
fn a_vanished_device_is_gone_and_a_stuck_return_is_unhealthy_with_its_error() {
    let (hub, t) = hub_with_clock(Duration::from_secs(300), 1_000);
    let cp = checkpoint(&[("eth1", DeviceState::InPod), ("eth2", DeviceState::InPod)]);
    hub.observe_scan([], &cp);
    hub.observe_activity(
        &activity(ActivityKind::RescueStarted {
            trigger: RescueTrigger::NetnsUnmounted,
        }),
        &cp,
    );
    // eth1 was deleted in the pod; eth2 cannot come home.
    let cp = checkpoint(&[("eth1", DeviceState::Gone), ("eth2", DeviceState::Returning)]);
    hub.observe_activity(
        &activity(ActivityKind::Vanished {
            device: "eth1".into(),
            host_name: "eth1".into(),
            record: "uid-1/sb-1".into(),
        }),
        &cp,
    );
    hub.observe_activity(
        &activity(ActivityKind::ReturnStuck {
            devices: vec!["eth2".into()],
            reason: crate::rescue::StuckReason::NameTaken,
            error: "File exists (os error 17)".into(),
        }),
        &cp,
    );
    let (ok, msg) = health(&hub, "eth1");
    assert!(!ok && msg.contains("missing from the host"), "{msg}");
    let (ok, msg) = health(&hub, "eth2");
    assert!(!ok, "{msg}");
    assert!(
        msg.contains("still failing after the rescue's retries (name_taken)") && msg.contains("os error 17"),
        "{msg}"
    );
    // Gone for good: dropped after the grace; the stuck one stays listed.
    t.store(1_300, Ordering::SeqCst);
    hub.refresh();
    assert_eq!(listed(&hub), ["eth2"]);
}

/// A restart's hub has never seen a device the start-up reconcile found gone (in neither the
/// host nor a pod since): its `Vanished` entry makes it known, listed gone (UNHEALTHY) until the
/// grace runs out, so kubelet hears of it.
#[test]
fn a_device_first_heard_of_as_vanished_is_listed_gone() {
    let (hub, t) = hub_with_clock(Duration::from_secs(300), 1_000);
    let cp = checkpoint(&[("eth1", DeviceState::Gone)]);
    hub.observe_scan(["eth9"], &cp);
    assert_eq!(listed(&hub), ["eth9"]);
    hub.observe_activity(
        &activity(ActivityKind::Vanished {
            device: "eth1".into(),
            host_name: "ens1".into(),
            record: "uid-1/sb-1".into(),
        }),
        &cp,
    );
    let (ok, msg) = health(&hub, "eth1");
    assert!(!ok && msg.contains("missing from the host"), "{msg}");
    t.store(1_300, Ordering::SeqCst);
    hub.refresh();
    assert_eq!(listed(&hub), ["eth9"]);
}
