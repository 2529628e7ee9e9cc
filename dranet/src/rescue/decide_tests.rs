use super::*;
use crate::link::LinkSnapshot;
use crate::netns::NetnsId;
use crate::state::{Checkpoint, DeviceRecord, DeviceState, PodPhase, PodRecord, ReturnReason};
use crate::watch::{EventKind, LifecycleEvent, Source, Task, UnlinkCall};

const ID: NetnsId = NetnsId {
    cookie: 42,
    inode: 4026532999,
};

fn snap(name: &str, mac: &str) -> LinkSnapshot {
    LinkSnapshot {
        name: name.into(),
        mac: Some(mac.into()),
        ..LinkSnapshot::default()
    }
}

fn cp(phase: PodPhase, state: DeviceState) -> Checkpoint {
    let mut cp = Checkpoint::default();
    cp.pods.insert(
        "uid-1".into(),
        PodRecord {
            pod_uid: "uid-1".into(),
            namespace: "ns".into(),
            name: "p".into(),
            netns_path: "/var/run/netns/abc".into(),
            netns: ID,
            pin: Some("/run/dranet/pins/uid-1".into()),
            phase,
            devices: vec![DeviceRecord {
                device: "eth1".into(),
                pod_ifname: "net1".into(),
                pci_address: None,
                permanent_mac: Some("0c:42:a1:00:00:01".into()),
                rdma_device: None,
                rdma_in_pod: false,
                pod_mac: None,
                snapshot: snap("eth1", "0c:42:a1:00:00:01"),
                state,
                temp_name: None,
            }],
        },
    );
    cp
}

fn ev(kind: EventKind) -> LifecycleEvent {
    LifecycleEvent {
        time: 1000,
        source: Source::Probe,
        kind,
    }
}

fn task() -> Task {
    Task {
        pid: 1,
        tid: 1,
        comm: "crio".into(),
    }
}

fn umount(path: &str, ret: i64, netns: Option<NetnsId>) -> LifecycleEvent {
    ev(EventKind::NetnsUnmounted {
        path: path.into(),
        flags: 2,
        ret,
        entered: 900,
        task: task(),
        netns,
    })
}

#[test]
fn umount_of_an_attached_pods_netns_rescues_it_by_path_in_either_spelling() {
    let cp = cp(PodPhase::Attached, DeviceState::InPod);
    for path in ["/var/run/netns/abc", "/run/netns/abc"] {
        let got = decide(&cp, &umount(path, 0, None));
        assert_eq!(
            got,
            vec![Action::Rescue {
                pod_uid: "uid-1".into(),
                trigger: "netns_unmounted",
                at: 1000
            }],
            "{path}"
        );
    }
}

#[test]
fn identity_matches_even_under_another_path() {
    let cp = cp(PodPhase::Attached, DeviceState::InPod);
    assert_eq!(decide(&cp, &umount("/run/netns/other", 0, Some(ID))).len(), 1);
}

#[test]
fn failed_umount_unrelated_paths_and_returned_pods_do_nothing() {
    let attached = cp(PodPhase::Attached, DeviceState::InPod);
    assert!(decide(&attached, &umount("/run/netns/abc", -22, None)).is_empty());
    assert!(decide(&attached, &umount("/run/netns/zzz", 0, None)).is_empty());
    let returned = cp(PodPhase::Returned(ReturnReason::Hook), DeviceState::Home);
    assert!(decide(&returned, &umount("/run/netns/abc", 0, None)).is_empty());
}

#[test]
fn unlink_nsfs_umount_and_netns_release_rescue() {
    let cp = cp(PodPhase::Attached, DeviceState::InPod);
    let unlink = ev(EventKind::NetnsUnlinked {
        path: "/var/run/netns/abc".into(),
        ret: 0,
        call: UnlinkCall::Unlinkat,
        task: task(),
        netns: None,
    });
    assert!(matches!(
        &decide(&cp, &unlink)[..],
        [Action::Rescue {
            trigger: "netns_unlinked",
            ..
        }]
    ));
    let nsfs = ev(EventKind::NsfsUnmounting {
        inode: ID.inode,
        flags: 2,
        task: task(),
        netns: Some(ID),
    });
    assert!(matches!(
        &decide(&cp, &nsfs)[..],
        [Action::Rescue {
            trigger: "nsfs_unmounting",
            ..
        }]
    ));
    let rel = ev(EventKind::NetnsReleased {
        netns: ID,
        task: task(),
    });
    assert!(matches!(
        &decide(&cp, &rel)[..],
        [Action::Rescue {
            trigger: "netns_released",
            ..
        }]
    ));
}

#[test]
fn a_managed_device_appearing_in_the_host_is_repaired_by_mac() {
    let cp = cp(PodPhase::Attached, DeviceState::InPod);
    let appeared = |mac: &str, perm: Option<&str>| {
        ev(EventKind::LinkAppeared {
            ifindex: 9,
            name: "dev7".into(),
            up: false,
            mac: Some(mac.into()),
            perm_mac: perm.map(Into::into),
        })
    };
    let want = vec![Action::Repair {
        pod_uid: "uid-1".into(),
        device: "eth1".into(),
        ifindex: 9,
    }];
    assert_eq!(decide(&cp, &appeared("0C:42:A1:00:00:01", None)), want);
    assert_eq!(
        decide(&cp, &appeared("02:00:00:00:00:09", Some("0c:42:a1:00:00:01"))),
        want
    );
    assert!(decide(&cp, &appeared("02:00:00:00:00:09", None)).is_empty());
    // Our own detach makes the device appear too: by then it is no longer InPod.
    let home = super::super::decide::decide(
        &self::cp(PodPhase::Returning, DeviceState::Home),
        &appeared("0c:42:a1:00:00:01", None),
    );
    assert!(home.is_empty());
}

#[test]
fn lost_events_reconcile() {
    let cp = Checkpoint::default();
    assert_eq!(
        decide(&cp, &ev(EventKind::Lost { count: 3 })),
        vec![Action::Reconcile]
    );
}

#[test]
fn path_normalization() {
    assert_eq!(normalize_path("/var/run/netns/x"), "/run/netns/x");
    assert_eq!(normalize_path("/run/netns/x"), "/run/netns/x");
    assert_eq!(normalize_path("/var/lib/x"), "/var/lib/x");
}
