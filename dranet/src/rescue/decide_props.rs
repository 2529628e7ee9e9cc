//! A property of [`decide`], on seeded random checkpoints and events: no event about a link, a
//! netns or a path the checkpoint does not know ever yields an action (only `Lost` does, by
//! design: it names nothing). A fixed seed, so a failure replays; `DRANET_DECIDE_SEED` and
//! `DRANET_DECIDE_CASES` change them.

use super::*;
use crate::state::{DeviceRecord, PodRecord, ReturnReason};
use crate::sys::link::LinkSnapshot;
use crate::sys::netns::NetnsId;
use crate::watch::{Source, Task, UnlinkCall};

use crate::test_support::SplitMix64 as Rng;

// Known identifiers come from small pools, unknown ones from outside them.
fn known_netns(r: &mut Rng) -> NetnsId {
    let n = r.below(8);
    NetnsId::test(1 + n, 4_026_532_000 + n)
}

fn unknown_netns(r: &mut Rng) -> NetnsId {
    // The inode may collide with a known one (inodes are reused); the cookie never does.
    NetnsId::test(1_000 + r.below(1_000_000), 4_026_532_000 + r.below(16))
}

fn known_path(r: &mut Rng) -> String {
    let n = r.below(8);
    if r.coin() {
        format!("/run/netns/p{n}")
    } else {
        format!("/var/run/netns/p{n}")
    }
}

fn unknown_path(r: &mut Rng) -> String {
    let n = r.below(1_000_000);
    match r.below(4) {
        0 => format!("/run/netns/unknown-{n}"),
        1 => format!("/var/run/netns/q{n}"),
        2 => format!("/run/netns/p{n}/x"),
        _ => format!("/var/run/netns/p{}0", 8 + r.below(100)),
    }
}

fn mac(prefix: u8, n: u64) -> String {
    format!("{prefix:02x}:00:00:00:{:02x}:{:02x}", (n >> 8) & 0xff, n & 0xff)
}

fn random_snapshot(r: &mut Rng) -> LinkSnapshot {
    LinkSnapshot {
        ifindex: 1 + r.below32(30),
        name: format!("eth{}", r.below(10)),
        kind: match r.below(3) {
            0 => None,
            1 => Some("veth".into()),
            _ => Some("dummy".into()),
        },
        parent: r.coin().then(|| format!("pci/0000:3b:00.{}", r.below(8))),
        perm_mac: r.coin().then(|| mac(0x0c, r.below(16))),
        mac: Some(mac(0x02, r.below(16))),
        identified: r.below(4) != 0,
        ..LinkSnapshot::default()
    }
}

fn random_device(r: &mut Rng, i: usize) -> DeviceRecord {
    DeviceRecord {
        device: format!("dev{i}"),
        pod_ifname: format!("net{i}"),
        pci_address: None,
        permanent_mac: None,
        rdma_device: None,
        rdma_in_pod: false,
        pod_mac: None,
        snapshot: random_snapshot(r),
        state: *r
            .pick(&[
                DeviceState::Moving,
                DeviceState::InPod,
                DeviceState::Returning,
                DeviceState::Home,
                DeviceState::HomeNameBusy,
            ])
            .unwrap(),
        temp_name: None,
        at: r.coin().then(|| DeviceAt {
            ifindex: PodIfindex::new(1 + r.below32(30)),
            netns: known_netns(r),
        }),
        rebuilt: r.below(8) == 0,
        return_error: None,
        vanish_unreported: false,
    }
}

fn random_checkpoint(r: &mut Rng) -> Checkpoint {
    let mut cp = Checkpoint::default();
    for i in 0..r.below(6) {
        let phase = *r
            .pick(&[
                PodPhase::Attaching,
                PodPhase::Attached,
                PodPhase::Returning,
                PodPhase::Returned(ReturnReason::Hook),
                PodPhase::Returned(ReturnReason::NetnsTeardown),
            ])
            .unwrap();
        let rec = PodRecord {
            pod_uid: if r.below(6) == 0 {
                String::new()
            } else {
                format!("uid-{}", r.below(3))
            },
            sandbox_id: format!("sb-{i}"),
            namespace: "ns".into(),
            name: "p".into(),
            netns_path: known_path(r).into(),
            netns: known_netns(r),
            pin: r.coin().then(|| format!("/run/dranet/pins/sb-{i}").into()),
            phase,
            devices: (0..usize::try_from(r.below(4)).unwrap())
                .map(|d| random_device(r, d))
                .collect(),
            recovered: None,
        };
        cp.pods.insert(rec.key(), rec.into());
    }
    cp
}

fn task() -> Task {
    Task {
        pid: 1,
        tid: 1,
        comm: "crio".into(),
    }
}

/// An event about nothing the checkpoint knows.
fn unknown_event(r: &mut Rng) -> EventKind {
    let netns = |r: &mut Rng| r.coin().then(|| unknown_netns(r));
    match r.below(12) {
        0 => EventKind::NetnsUnmounted {
            path: unknown_path(r),
            flags: 2,
            ret: *r.pick(&[0, 0, -22]).unwrap(),
            entered: crate::clock::MonoTime::from_ns(1),
            task: task(),
            netns: netns(r),
        },
        1 => EventKind::NetnsUnlinked {
            path: unknown_path(r),
            ret: *r.pick(&[0, 0, -2]).unwrap(),
            call: UnlinkCall::Unknown,
            task: task(),
            netns: netns(r),
        },
        2 => EventKind::NsfsUnmounting {
            inode: 4_026_532_000 + r.below(16),
            flags: 2,
            task: task(),
            netns: netns(r),
        },
        3 => EventKind::NetnsReleased {
            netns: unknown_netns(r),
            task: task(),
        },
        // A known ifindex, but in a netns we never placed anything in.
        4 => EventKind::DeviceMoving {
            ifindex: 1 + r.below32(30),
            name: "net0".into(),
            new_ifindex: i32::try_from(r.below(64)).unwrap(),
            from: unknown_netns(r),
            to: if r.coin() {
                known_netns(r)
            } else {
                unknown_netns(r)
            },
            task: task(),
        },
        // A link with no identity of any device we know.
        5 => EventKind::LinkAppeared {
            ifindex: 1_000 + r.below32(1_000_000),
            name: format!("eth{}", r.below(10)),
            up: r.coin(),
            mac: Some(mac(0x02, r.below(16))),
            perm_mac: r.coin().then(|| mac(0x0e, r.below(1 << 16))),
            parent: r.coin().then(|| format!("pci/0000:99:{:02x}.0", r.below(32))),
            kind: match r.below(3) {
                0 => None,
                1 => Some("veth".into()),
                _ => Some("dummy".into()),
            },
        },
        6 => EventKind::NsidAdded {
            nsid: i32::try_from(r.below(64)).unwrap(),
            netns: netns(r),
        },
        7 => EventKind::NsidRemoved {
            nsid: i32::try_from(r.below(64)).unwrap(),
            netns: netns(r),
        },
        8 => EventKind::LinkLeftHost {
            ifindex: 1 + r.below32(30),
            name: "eth0".into(),
            nsid: 1,
            new_ifindex: None,
            to: netns(r),
        },
        9 => EventKind::LinkChanged {
            ifindex: 1 + r.below32(30),
            name: "eth0".into(),
            up: r.coin(),
        },
        10 => EventKind::LinkDeleted {
            ifindex: 1 + r.below32(30),
            name: "eth0".into(),
        },
        _ => r
            .pick(&[
                EventKind::NetnsCleanupQueued { task: task() },
                EventKind::NetnsCleanupStarted { task: task() },
                EventKind::NetnsCleanupFinished { task: task() },
            ])
            .unwrap()
            .clone(),
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn no_event_about_an_unknown_link_netns_or_path_yields_an_action() {
    let seed = env_u64("DRANET_DECIDE_SEED", 0x5eed_d3c1_de00_0019);
    let cases = env_u64("DRANET_DECIDE_CASES", 50_000);
    let mut r = Rng(seed);
    let mut known_hits = 0u64;
    for case in 0..cases {
        let cp = random_checkpoint(&mut r);
        let ev = LifecycleEvent {
            time: crate::clock::MonoTime::from_ns(case),
            source: *r
                .pick(&[Source::Probe, Source::Rtnetlink, Source::Inotify])
                .unwrap(),
            kind: unknown_event(&mut r),
        };
        let got = decide(&cp, &ev);
        assert!(
            got.is_empty(),
            "seed {seed:#x} case {case}: {ev:?} about nothing known yielded {got:?}\ncheckpoint: {cp:#?}"
        );
        // The same checkpoint does react to its own paths: the generator is not vacuous.
        if let Some(rec) = cp.pods.values().next() {
            let path = rec.netns_path.display().to_string();
            let known = LifecycleEvent {
                time: crate::clock::MonoTime::from_ns(case),
                source: Source::Inotify,
                kind: EventKind::NetnsUnlinked {
                    path,
                    ret: 0,
                    call: UnlinkCall::Unknown,
                    task: task(),
                    netns: None,
                },
            };
            known_hits += u64::from(!decide(&cp, &known).is_empty());
        }
    }
    let lost = LifecycleEvent {
        time: crate::clock::MonoTime::from_ns(0),
        source: Source::Probe,
        kind: EventKind::Lost { count: 1 },
    };
    assert_eq!(decide(&Checkpoint::default(), &lost), vec![Action::Reconcile]);
    assert!(
        known_hits > cases / 10,
        "only {known_hits} of {cases} known paths acted on"
    );
}
