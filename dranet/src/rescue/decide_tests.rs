// Over 500 lines: one test per rule of `decide` (paths, kernel identities, tier-B moves, freed names), sharing one record and event fixtures.
use super::*;
use crate::state::{Checkpoint, DeviceAt, DeviceRecord, DeviceState, PodPhase, PodRecord, ReturnReason};
use crate::sys::link::LinkSnapshot;
use crate::sys::netns::NetnsId;
use crate::watch::{EventKind, LifecycleEvent, Source, Task, UnlinkCall};

/// The owner of the record [`cp`] makes.
fn owner1() -> super::super::Owner {
    super::super::Owner::Pod(crate::ids::pod_uid("uid-1").unwrap())
}

const ID: NetnsId = NetnsId::test(42, 4026532999);

const KEY: &str = "uid-1/sb-1";

/// A physical NIC: no link kind, a PCI parent and a permanent MAC.
fn snap(name: &str, mac: &str) -> LinkSnapshot {
    LinkSnapshot {
        name: name.into(),
        mac: Some(mac.into()),
        perm_mac: Some(mac.into()),
        parent: Some("pci/0000:3b:00.1".into()),
        identified: true,
        ..LinkSnapshot::default()
    }
}

fn cp(phase: PodPhase, state: DeviceState) -> Checkpoint {
    let mut cp = Checkpoint::default();
    cp.pods.insert(
        KEY.into(),
        PodRecord {
            pod_uid: "uid-1".into(),
            sandbox_id: "sb-1".into(),
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
                pod_mac: Some("02:aa:00:00:00:01".into()),
                snapshot: snap("eth1", "0c:42:a1:00:00:01"),
                state,
                temp_name: None,
                at: Some(DeviceAt {
                    ifindex: PodIfindex::new(7),
                    netns: ID,
                }),
                rebuilt: false,
                return_error: None,
                vanish_unreported: false,
            }],
            recovered: None,
        }
        .into(),
    );
    cp
}

fn ev(kind: EventKind) -> LifecycleEvent {
    LifecycleEvent {
        time: crate::clock::MonoTime::from_ns(1000),
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
        entered: crate::clock::MonoTime::from_ns(900),
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
                owner: owner1(),
                key: KEY.into(),
                trigger: RescueTrigger::NetnsUnmounted,
                at: crate::clock::MonoTime::from_ns(1000)
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
            trigger: RescueTrigger::NetnsUnlinked,
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
            trigger: RescueTrigger::NsfsUnmounting,
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
            trigger: RescueTrigger::NetnsReleased,
            ..
        }]
    ));
}

fn appeared(mac: &str, perm: Option<&str>, parent: Option<&str>, kind: Option<&str>) -> LifecycleEvent {
    ev(EventKind::LinkAppeared {
        ifindex: 9,
        name: "dev7".into(),
        up: false,
        mac: Some(mac.into()),
        perm_mac: perm.map(Into::into),
        parent: parent.map(Into::into),
        kind: kind.map(Into::into),
    })
}

#[test]
fn a_device_returned_by_the_kernel_is_repaired_by_its_kernel_identity() {
    let cp = cp(PodPhase::Attached, DeviceState::InPod);
    let want = vec![Action::Repair {
        owner: owner1(),
        key: KEY.into(),
        device: "eth1".into(),
        ifindex: 9,
    }];
    // The parent device (its PCI function) names it, whatever MAC it carries now.
    assert_eq!(
        decide(
            &cp,
            &appeared(
                "02:00:00:00:00:09",
                Some("0c:42:a1:00:00:01"),
                Some("pci/0000:3b:00.1"),
                None
            )
        ),
        want
    );
    // Another PCI function with the same permanent MAC is not it.
    assert!(
        decide(
            &cp,
            &appeared(
                "0c:42:a1:00:00:01",
                Some("0c:42:a1:00:00:01"),
                Some("pci/0000:3b:00.0"),
                None
            )
        )
        .is_empty()
    );
    // Our own detach makes the device appear too: by then it is no longer out.
    let home = self::cp(PodPhase::Returning, DeviceState::Home);
    assert!(
        decide(
            &home,
            &appeared(
                "0c:42:a1:00:00:01",
                Some("0c:42:a1:00:00:01"),
                Some("pci/0000:3b:00.1"),
                None
            )
        )
        .is_empty()
    );
}

#[test]
fn without_a_parent_the_permanent_mac_and_the_link_kind_identify() {
    let mut cp = cp(PodPhase::Attached, DeviceState::InPod);
    for r in cp.pods.values_mut() {
        r.devices[0].snapshot.parent = None;
    }
    assert_eq!(
        decide(
            &cp,
            &appeared("02:00:00:00:00:09", Some("0C-42-A1-00-00-01"), None, None)
        )
        .len(),
        1
    );
    // A link a pod or a host made (it has a kind) with that permanent MAC is not a physical NIC.
    assert!(
        decide(
            &cp,
            &appeared(
                "0c:42:a1:00:00:01",
                Some("0c:42:a1:00:00:01"),
                None,
                Some("dummy")
            )
        )
        .is_empty()
    );
}

/// An IPoIB device (no parent device recorded, link kind `ipoib`) the kernel returns is known
/// by its 20-byte permanent address, taken from the RTM_NEWLINK the monitor decodes.
#[test]
fn a_returned_ipoib_device_is_known_by_its_20_byte_permanent_address() {
    use crate::watch::rtnl;
    let mut cp = cp(PodPhase::Attached, DeviceState::InPod);
    for r in cp.pods.values_mut() {
        let s = &mut r.devices[0].snapshot;
        s.parent = None;
        s.kind = Some("ipoib".into());
        s.mac = Some(rtnl::tests::IPOIB_ADDR_STR.into());
        s.perm_mac = Some(rtnl::tests::IPOIB_ADDR_STR.into());
    }
    let mut table = rtnl::LinkTable::default();
    let ev = rtnl::to_event(&mut table, rtnl::tests::ipoib_newlink(9, "ib0")).unwrap();
    assert_eq!(
        decide(&cp, &ev),
        vec![Action::Repair {
            owner: owner1(),
            key: KEY.into(),
            device: "eth1".into(),
            ifindex: 9,
        }]
    );
}

/// Issue 2: any host link may carry the MAC a tenant wrote into the claim, or the device's
/// original MAC (Calico gives every host-side veth `ee:ee:ee:ee:ee:ee`): neither identifies it.
#[test]
fn a_host_link_with_the_claims_mac_or_the_original_mac_is_never_taken() {
    let cp = cp(PodPhase::Attached, DeviceState::InPod);
    for (mac, kind) in [
        ("02:aa:00:00:00:01", Some("veth")),
        ("02:aa:00:00:00:01", None),
        ("0c:42:a1:00:00:01", Some("veth")),
        ("0c:42:a1:00:00:01", None),
    ] {
        assert!(
            decide(&cp, &appeared(mac, None, None, kind)).is_empty(),
            "{mac} {kind:?}"
        );
    }
    // A device with no parent and no permanent MAC is recognised only at its own host ifindex.
    let mut virt = cp.clone();
    for r in virt.pods.values_mut() {
        let s = &mut r.devices[0].snapshot;
        s.parent = None;
        s.perm_mac = None;
        s.kind = Some("veth".into());
        s.ifindex = 5;
    }
    assert!(decide(&virt, &appeared("0c:42:a1:00:00:01", None, None, Some("veth"))).is_empty());
    let at_home = ev(EventKind::LinkAppeared {
        ifindex: 5,
        name: "dev5".into(),
        up: false,
        mac: None,
        perm_mac: None,
        parent: None,
        kind: Some("veth".into()),
    });
    assert_eq!(decide(&virt, &at_home).len(), 1);
    // Its host ifindex unknown (0: a record rebuilt from a pin), it is recognised at none, not
    // even at an index 0 an event gives.
    for r in virt.pods.values_mut() {
        r.devices[0].snapshot.ifindex = 0;
    }
    let mut at_zero = at_home.clone();
    if let EventKind::LinkAppeared { ifindex, .. } = &mut at_zero.kind {
        *ifindex = 0;
    }
    assert!(decide(&virt, &at_home).is_empty());
    assert!(decide(&virt, &at_zero).is_empty());
}

#[test]
fn two_sandboxes_of_one_pod_are_told_apart_by_path_and_identity() {
    let mut cp = cp(PodPhase::Attached, DeviceState::InPod);
    let mut old = cp.pods[KEY].clone();
    old.sandbox_id = "sb-0".into();
    old.netns_path = "/var/run/netns/old".into();
    old.netns = NetnsId::test(41, 4026532998);
    old.phase = PodPhase::Returned(ReturnReason::Replaced);
    old.devices[0].state = DeviceState::Home;
    cp.pods.insert(old.key(), old);
    // The old sandbox's teardown touches nothing of the new one.
    assert!(decide(&cp, &umount("/run/netns/old", 0, None)).is_empty());
    assert!(
        decide(
            &cp,
            &umount("/run/netns/old", 0, Some(NetnsId::test(41, 4026532998)))
        )
        .is_empty()
    );
    // A path reused for another netns does not rescue a sandbox whose identity differs.
    assert!(decide(&cp, &umount("/run/netns/abc", 0, Some(NetnsId::test(99, 1)))).is_empty());
    assert!(
        matches!(&decide(&cp, &umount("/run/netns/abc", 0, None))[..], [Action::Rescue { key, .. }] if key == KEY)
    );
}

#[test]
fn a_tier_b_move_of_a_placed_device_is_recorded() {
    let cp = cp(PodPhase::Attached, DeviceState::InPod);
    let host = NetnsId::test(1, 4026531833);
    let moving = |ifindex, from| {
        ev(EventKind::DeviceMoving {
            ifindex,
            name: "net1".into(),
            new_ifindex: 12,
            from,
            to: host,
            task: task(),
        })
    };
    assert_eq!(
        decide(&cp, &moving(7, ID)),
        vec![Action::Moved {
            owner: owner1(),
            key: KEY.into(),
            device: "eth1".into(),
            to: DeviceAt {
                ifindex: PodIfindex::new(12),
                netns: host
            },
        }]
    );
    // Same ifindex in another netns: another device.
    assert!(decide(&cp, &moving(7, host)).is_empty());
    assert!(decide(&cp, &moving(8, ID)).is_empty());
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

/// Issue 38 #2: a host link deleted under, or renamed away from, the name a device home under a
/// temporary name waits for: give it its name back. Nothing for other names or other devices.
#[test]
fn a_host_name_freed_renames_the_device_waiting_for_it() {
    let mut c = cp(PodPhase::Returned(ReturnReason::Hook), DeviceState::HomeNameBusy);
    if let Some(r) = c.pods.get_mut(KEY) {
        r.devices[0].temp_name = Some("dn7".into());
    }
    let rename = vec![Action::Rename {
        owner: owner1(),
        key: KEY.into(),
        device: "eth1".into(),
    }];
    let deleted = |name: &str| {
        ev(EventKind::LinkDeleted {
            ifindex: 30,
            name: name.into(),
        })
    };
    let changed = |name: &str| {
        ev(EventKind::LinkChanged {
            ifindex: 30,
            name: name.into(),
            up: true,
        })
    };
    assert_eq!(decide(&c, &deleted("eth1")), rename);
    assert_eq!(decide(&c, &deleted("eth2")), vec![]);
    // The squatter renamed away (the event names its new name).
    assert_eq!(decide(&c, &changed("cni0")), rename);
    // The squatter changed something else and keeps the name; the device itself changed.
    assert_eq!(decide(&c, &changed("eth1")), vec![]);
    assert_eq!(decide(&c, &changed("dn7")), vec![]);
    // A device home under its own name waits for nothing.
    let home = cp(PodPhase::Returned(ReturnReason::Hook), DeviceState::Home);
    assert_eq!(decide(&home, &deleted("eth1")), vec![]);
}

/// The return reasons' labels are their checkpoint names; the ones counted in
/// `dranet_rescue_returns` keep the trigger labels dashboards know.
#[test]
fn return_reasons_and_triggers_keep_their_labels() {
    use crate::state::ReturnCount;
    for r in [
        ReturnReason::Hook,
        ReturnReason::NetnsTeardown,
        ReturnReason::Reconcile,
        ReturnReason::Rollback,
        ReturnReason::Replaced,
        ReturnReason::Vanished,
    ] {
        assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{r}\""));
    }
    let counted = |r: ReturnReason| r.counted_as();
    assert_eq!(
        counted(ReturnReason::Hook),
        ReturnCount::Returns { trigger: "hook" }
    );
    assert_eq!(
        counted(ReturnReason::Reconcile),
        ReturnCount::Returns { trigger: "reconcile" }
    );
    assert_eq!(
        counted(ReturnReason::Replaced),
        ReturnCount::Returns { trigger: "replaced" }
    );
    assert_eq!(
        counted(ReturnReason::Vanished),
        ReturnCount::Returns { trigger: "vanished" }
    );
    assert_eq!(counted(ReturnReason::Rollback), ReturnCount::Rollback);
    assert_eq!(counted(ReturnReason::NetnsTeardown), ReturnCount::Rescued);
    for (t, label) in [
        (RescueTrigger::NetnsUnmounted, "netns_unmounted"),
        (RescueTrigger::NetnsUnlinked, "netns_unlinked"),
        (RescueTrigger::NsfsUnmounting, "nsfs_unmounting"),
        (RescueTrigger::NetnsReleased, "netns_released"),
    ] {
        assert_eq!(t.to_string(), label);
        assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{label}\""));
    }
}
