use std::path::PathBuf;

use super::*;
use crate::link::LinkSnapshot;
use crate::netns::NetnsId;
use crate::state::{DeviceRecord, PodPhase, PodRecord};

fn record(device: &str, state: DeviceState) -> DeviceRecord {
    DeviceRecord {
        device: device.into(),
        pod_ifname: "net1".into(),
        pci_address: None,
        permanent_mac: None,
        rdma_device: None,
        rdma_in_pod: false,
        pod_mac: None,
        snapshot: LinkSnapshot::default(),
        state,
        temp_name: None,
    }
}

fn checkpoint(devices: &[(&str, DeviceState)]) -> Checkpoint {
    let mut cp = Checkpoint::default();
    cp.pods.insert(
        "uid-1".into(),
        PodRecord {
            pod_uid: "uid-1".into(),
            namespace: "ns".into(),
            name: "pod-a".into(),
            netns_path: PathBuf::from("/run/netns/x"),
            netns: NetnsId { cookie: 1, inode: 2 },
            pin: None,
            phase: PodPhase::Attached,
            devices: devices.iter().map(|(d, s)| record(d, *s)).collect(),
        },
    );
    cp
}

fn activity(kind: ActivityKind) -> Activity {
    Activity {
        at: 0,
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
        .find(|d| d.device == device)
        .unwrap_or_else(|| panic!("{device} not listed: {:?}", hub.current()));
    (d.healthy, d.message)
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
            trigger: "umount".into(),
        }),
        &cp,
    );
    let (ok, msg) = health(&hub, "eth1");
    assert!(!ok);
    assert!(
        msg.contains("being returned to the host from pod ns/pod-a"),
        "{msg}"
    );
    assert!(msg.contains("umount"), "{msg}");

    // A return that fails for one device: that device stays unhealthy with the error.
    let cp = checkpoint(&[("eth1", DeviceState::Home), ("eth2", DeviceState::Returning)]);
    hub.observe_activity(
        &activity(ActivityKind::Failed {
            action: "return".into(),
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
            reason: "NetnsTeardown".into(),
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
    cp.pods.get_mut("uid-1").unwrap().devices[0].temp_name = Some("dn7".into());
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
            action: "attach".into(),
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
            action: "repair".into(),
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
    let mut s = Box::pin(hub.stream());
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
    let mut s = Box::pin(hub.stream_until(rx));
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
