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
        "uid-1".into(),
        PodRecord {
            pod_uid: "uid-1".into(),
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
