use std::path::PathBuf;

use super::*;
use crate::plan::PodPlan;

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dranet-state-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    d
}

fn sample() -> Checkpoint {
    let mut cp = Checkpoint {
        version: FORMAT_VERSION,
        ..Checkpoint::default()
    };
    cp.plans.insert(
        "uid-1".into(),
        PodPlan {
            pod_uid: "uid-1".into(),
            pod_namespace: "ns".into(),
            pod_name: "p".into(),
            devices: vec![],
        },
    );
    cp.pods.insert(
        "uid-1/sb-1".into(),
        PodRecord {
            pod_uid: "uid-1".into(),
            sandbox_id: "sb-1".into(),
            namespace: "ns".into(),
            name: "p".into(),
            netns_path: "/var/run/netns/x".into(),
            netns: NetnsId {
                cookie: 7,
                inode: 4026532000,
            },
            pin: Some("/run/dranet/pins/uid-1".into()),
            phase: PodPhase::Returned(ReturnReason::NetnsTeardown),
            devices: vec![],
        },
    );
    cp
}

#[test]
fn absent_checkpoint_is_empty() {
    let d = tmpdir("absent");
    let s = Store::open(&d).unwrap();
    let cp = s.load().unwrap();
    assert!(cp.pods.is_empty() && cp.plans.is_empty());
    assert!(d.join("pins").is_dir());
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn save_load_round_trip_and_leftover_tmp_is_ignored() {
    let d = tmpdir("rt");
    let s = Store::open(&d).unwrap();
    let cp = sample();
    s.save(&cp).unwrap();
    // A crash between write and rename leaves a torn tmp file: the checkpoint is the old one.
    fs::write(d.join("state.json.tmp"), b"{\"version\":1,\"pods\":{\"uid-").unwrap();
    assert_eq!(s.load().unwrap(), cp);
    // The next save replaces the leftover.
    s.save(&cp).unwrap();
    assert_eq!(s.load().unwrap(), cp);
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn newer_format_and_garbage_are_refused() {
    let d = tmpdir("bad");
    let s = Store::open(&d).unwrap();
    fs::write(s.path(), b"{\"version\":99}").unwrap();
    assert!(matches!(s.load(), Err(StateError::Version { found: 99, .. })));
    fs::write(s.path(), b"not json").unwrap();
    let err = s.load().unwrap_err();
    assert!(matches!(err, StateError::Decode { .. }), "{err}");
    assert!(err.to_string().contains("state.json"), "{err}");
    fs::remove_dir_all(&d).unwrap();
}

/// A format-1 checkpoint (records keyed by pod UID, no sandbox id, addresses as strings, no
/// device location) loads as format 2: keyed by `<uid>/`, everything else kept.
#[test]
fn format_1_is_migrated_on_load() {
    let d = tmpdir("v1");
    let s = Store::open(&d).unwrap();
    let v1 = r#"{"version":1,"plans":{},"pods":{"uid-1":{"pod_uid":"uid-1","namespace":"ns","name":"p",
        "netns_path":"/var/run/netns/x","netns":{"cookie":7,"inode":4026532000},
        "pin":"/run/dranet/pins/uid-1","phase":"attached",
        "devices":[{"device":"eth1","pod_ifname":"net1","pci_address":null,"permanent_mac":null,
          "rdma_device":null,"snapshot":{"ifindex":5,"name":"eth1","mtu":1400,"mac":"02:00:00:00:00:01",
          "up":true,"addresses":["10.1.2.3/24"]},"state":"in_pod"}]}}}"#;
    fs::write(s.path(), v1).unwrap();
    let cp = s.load().unwrap();
    assert_eq!(cp.version, FORMAT_VERSION);
    let rec = &cp.pods["uid-1/"];
    assert_eq!((rec.pod_uid.as_str(), rec.sandbox_id.as_str()), ("uid-1", ""));
    assert_eq!(rec.pin_name(), "uid-1");
    assert_eq!(rec.devices[0].at, None);
    assert!(!rec.devices[0].snapshot.identified);
    assert_eq!(
        rec.devices[0].snapshot.addresses,
        vec![crate::link::AddrSnapshot::plain("10.1.2.3/24")]
    );
    assert_eq!(cp.records_of("uid-1").count(), 1);
    // Saved again, it stays format 2 and loads unchanged.
    s.save(&cp).unwrap();
    assert_eq!(s.load().unwrap(), cp);
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn records_of_a_pod_are_its_sandboxes_only() {
    let mut cp = sample();
    let mut b = cp.pods["uid-1/sb-1"].clone();
    b.sandbox_id = "sb-2".into();
    cp.pods.insert(b.key(), b);
    let mut other = cp.pods["uid-1/sb-1"].clone();
    other.pod_uid = "uid-10".into();
    cp.pods.insert(other.key(), other);
    let mut prefix = cp.pods["uid-1/sb-1"].clone();
    prefix.pod_uid = "uid".into();
    cp.pods.insert(prefix.key(), prefix);
    assert_eq!(
        cp.keys_of("uid-1"),
        vec!["uid-1/sb-1".to_owned(), "uid-1/sb-2".to_owned()]
    );
    assert_eq!(cp.keys_of("uid"), vec!["uid/sb-1".to_owned()]);
    assert_eq!(cp.keys_of("uid-10"), vec!["uid-10/sb-1".to_owned()]);
}
