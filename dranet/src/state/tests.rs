use std::fs;
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
            recovered: None,
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
    fs::write(d.join("state.json.tmp.1.0"), b"{\"version\":1,\"pods\":{\"uid-").unwrap();
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
    // Valid JSON without a format version is not a checkpoint dranet wrote.
    for bad in [&b"{}"[..], b"{\"version\":0}", b"{\"plans\":{},\"pods\":{}}"] {
        fs::write(s.path(), bad).unwrap();
        let err = s.load().unwrap_err();
        assert!(matches!(err, StateError::Invalid { .. }), "{err}");
    }
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
        vec![crate::sys::link::AddrSnapshot::plain("10.1.2.3/24")]
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

fn record(uid: &str, sandbox: &str) -> PodRecord {
    let mut r = sample().pods["uid-1/sb-1"].clone();
    r.pod_uid = uid.into();
    r.sandbox_id = sandbox.into();
    r
}

/// Identifiers that paths and keys are built from are checked on load, as at the boundary.
#[test]
fn records_with_unsafe_ids_make_the_checkpoint_invalid() {
    for (uid, sb) in [
        ("../x", "sb"),
        ("uid-1", "a/b"),
        ("", ""),
        ("UP", "sb"),
        ("uid-1", ".h"),
    ] {
        let mut cp = sample();
        cp.pods.insert(pod_key(uid, sb), record(uid, sb));
        let bytes = serde_json::to_vec(&cp).unwrap();
        let err = decode(&bytes, Path::new("x")).unwrap_err();
        assert!(matches!(err, StateError::Invalid { .. }), "{uid:?} {sb:?}: {err}");
    }
    // A rebuilt record (no pod UID yet) and a format-1 one (no sandbox id) are fine.
    let mut cp = sample();
    cp.pods.insert(pod_key("", "sb-2"), record("", "sb-2"));
    cp.pods.insert(pod_key("uid-2", ""), record("uid-2", ""));
    assert_eq!(
        decode(&serde_json::to_vec(&cp).unwrap(), Path::new("x")).unwrap(),
        cp
    );
    // Two records of one sandbox under different keys: one would be lost.
    let mut cp = sample();
    cp.pods.insert("other".into(), record("uid-1", "sb-1"));
    let err = decode(&serde_json::to_vec(&cp).unwrap(), Path::new("x")).unwrap_err();
    assert!(matches!(err, StateError::Invalid { .. }), "{err}");
}

/// Every save keeps the document it replaces as `state.json.prev`, through temp files of its
/// own that never stay behind.
#[test]
fn saves_keep_the_previous_generation_and_leave_no_temp_files() {
    let d = tmpdir("prev");
    let s = Store::open(&d).unwrap();
    let first = sample();
    s.save(&first).unwrap();
    assert!(!s.prev_path().exists(), "nothing to keep before the first save");
    let mut second = sample();
    second.plans.clear();
    s.save(&second).unwrap();
    assert_eq!(s.load().unwrap(), second);
    assert_eq!(s.load_prev().unwrap(), Some(first));
    let left: Vec<String> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp."))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    fs::remove_dir_all(&d).unwrap();
}

fn corrupt_variants() -> Vec<(&'static str, Vec<u8>)> {
    let good = serde_json::to_vec(&sample()).unwrap();
    vec![
        ("truncated", good[..good.len() / 2].to_vec()),
        ("garbage", b"\x00\xffnot a checkpoint\n".to_vec()),
        ("empty object", b"{}".to_vec()),
        (
            "version 99",
            b"{\"version\":99,\"plans\":{},\"pods\":{}}".to_vec(),
        ),
        ("empty file", Vec::new()),
    ]
}

/// A checkpoint that does not load is moved aside and `.prev` is used; when `.prev` does not
/// load either, the result is empty and says so. Nothing fails.
#[test]
fn a_checkpoint_that_does_not_load_falls_back_to_prev_then_to_nothing() {
    for (what, bytes) in corrupt_variants() {
        let d = tmpdir(&format!("recover-{}", what.replace(' ', "-")));
        let s = Store::open(&d).unwrap();
        let prev = sample();
        s.save(&prev).unwrap();
        s.save(&prev).unwrap();
        fs::write(s.path(), &bytes).unwrap();
        let got = s.load_or_recover();
        let LoadSource::Previous { problem, aside } = &got.source else {
            panic!("{what}: {:?}", got.source);
        };
        assert!(!problem.is_empty());
        let aside = aside.clone().unwrap();
        assert!(
            aside
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("state.json.corrupt-"),
            "{aside:?}"
        );
        assert_eq!(
            fs::read(&aside).unwrap(),
            bytes,
            "{what}: the bad file is kept as it was"
        );
        assert_eq!(got.cp, prev, "{what}");
        assert!(!s.path().exists());
        // The next two saves bring back state.json and then rotate it into .prev.
        s.save(&got.cp).unwrap();
        assert_eq!(s.load().unwrap(), prev);

        fs::write(s.path(), &bytes).unwrap();
        fs::write(s.prev_path(), &bytes).unwrap();
        let got = s.load_or_recover();
        assert!(
            matches!(got.source, LoadSource::Nothing { .. }),
            "{what}: {:?}",
            got.source
        );
        assert!(got.cp.pods.is_empty() && got.cp.plans.is_empty());
        fs::remove_dir_all(&d).unwrap();
    }
    // No file at all: empty, nothing to report.
    let d = tmpdir("recover-absent");
    let s = Store::open(&d).unwrap();
    assert_eq!(s.load_or_recover().source, LoadSource::Absent);
    fs::remove_dir_all(&d).unwrap();
}

/// One writer per state dir: a second lock waits, then fails naming the holder; dropping the
/// first frees it.
#[tokio::test]
async fn the_state_dir_lock_is_exclusive_and_names_its_holder() {
    let d = tmpdir("lock");
    let _s = Store::open(&d).unwrap();
    let held = StateLock::acquire(&d, std::time::Duration::ZERO).await.unwrap();
    assert!(StateLock::try_acquire(&d).unwrap().is_none());
    let started = std::time::Instant::now();
    let err = StateLock::acquire(&d, std::time::Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(started.elapsed() >= std::time::Duration::from_millis(300));
    let msg = err.to_string();
    assert!(msg.contains(&format!("pid {}", std::process::id())), "{msg}");
    assert!(msg.contains("in use by another dranet"), "{msg}");
    drop(held);
    assert!(StateLock::try_acquire(&d).unwrap().is_some());
    fs::remove_dir_all(&d).unwrap();
}

/// The writer thread saves staged generations in order; awaiting one means it (or a newer one,
/// which contains it) is on disk; a failed save is reported to its waiters.
#[tokio::test]
async fn the_writer_saves_staged_generations_and_reports_failures() {
    let d = tmpdir("writer");
    let s = Store::open(&d).unwrap();
    let w = Writer::start(s.clone()).unwrap();
    let mut cp = sample();
    let mut last = 0;
    for i in 0..50 {
        cp.plans.get_mut("uid-1").unwrap().pod_name = format!("p{i}");
        last = w.stage(&cp).unwrap();
    }
    w.durable(last).await.unwrap();
    assert_eq!(s.load().unwrap(), cp);
    // Earlier generations are durable too (contained in the last).
    w.durable(1).await.unwrap();
    fs::remove_dir_all(&d).unwrap();
    let g = w.stage(&cp).unwrap();
    let err = w.durable(g).await.unwrap_err();
    assert!(matches!(err, StateError::Save(_)), "{err}");
    drop(w);
}

/// Huge and deeply nested inputs are refused without a panic or a stack overflow.
#[test]
fn huge_and_deeply_nested_inputs_are_refused() {
    let deep = "[".repeat(1 << 20);
    assert!(decode(deep.as_bytes(), Path::new("x")).is_err());
    let deep_obj = "{\"version\":2,\"plans\":".to_owned() + &"{\"a\":".repeat(100_000);
    assert!(decode(deep_obj.as_bytes(), Path::new("x")).is_err());
    let big = vec![b'7'; 16 << 20];
    assert!(decode(&big, Path::new("x")).is_err());
    for (_, bytes) in corrupt_variants() {
        check_decode(&bytes).unwrap();
    }
}

/// The committed seed corpus of the `store` fuzz target holds the property (`check_decode`).
#[test]
fn the_store_fuzz_corpus_holds_the_property() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/store");
    let mut n = 0;
    for e in fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let bytes = fs::read(&path).unwrap();
        check_decode(&bytes).unwrap();
        // The `v*` seeds are checkpoints dranet reads (the rest are refusals).
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(decode(&bytes, &path).is_ok(), name.starts_with('v'), "{name}");
        n += 1;
    }
    assert!(n >= 5, "seed corpus in {} has {n} files", dir.display());
}

/// The on-disk form of a device's snapshot is the checkpoint's, not whatever `LinkSnapshot`
/// becomes: every field, byte for byte, as format 2 writes it.
#[test]
fn the_on_disk_snapshot_of_format_2_is_fixed() {
    use crate::sys::link::{AddrSnapshot, LinkSnapshot};
    let snapshot = LinkSnapshot {
        ifindex: 7,
        name: "eth1".into(),
        altnames: vec!["enp3s0".into()],
        alias: Some("uplink".into()),
        mtu: 9000,
        mac: Some("02:00:00:00:00:01".into()),
        perm_mac: Some("02:00:00:00:00:02".into()),
        gso_max_size: Some(65536),
        gso_max_segs: Some(64),
        gro_max_size: Some(65536),
        gso_ipv4_max_size: Some(65536),
        gro_ipv4_max_size: Some(65536),
        up: true,
        addresses: vec![
            AddrSnapshot {
                cidr: "10.0.0.2/24".into(),
                peer: None,
                broadcast: Some("10.0.0.255".parse().unwrap()),
                label: Some("eth1:1".into()),
                flags: 0x80,
                scope: 0,
                metric: Some(100),
                valid_lft: 300,
                preferred_lft: 200,
            },
            AddrSnapshot {
                cidr: "fd00::2/64".into(),
                peer: Some("fd00::1".parse().unwrap()),
                broadcast: None,
                label: None,
                flags: 0,
                scope: 0,
                metric: None,
                valid_lft: u32::MAX,
                preferred_lft: u32::MAX,
            },
        ],
        kind: None,
        parent: Some("pci/0000:3b:00.1".into()),
        identified: true,
        features: [("rx-gro-hw".to_owned(), true)].into(),
        private_flags: [("legacy-rx".to_owned(), false)].into(),
        sysctls: [("ipv4/rp_filter".to_owned(), 2)].into(),
    };
    let record = DeviceRecord {
        device: "pci-0000-3b-00-1".into(),
        pod_ifname: "net1".into(),
        pci_address: Some("0000:3b:00.1".into()),
        permanent_mac: Some("02:00:00:00:00:02".into()),
        rdma_device: None,
        rdma_in_pod: false,
        pod_mac: None,
        snapshot,
        state: DeviceState::InPod,
        temp_name: None,
        at: None,
        rebuilt: false,
    };
    let json = serde_json::to_string(&record).unwrap();
    assert_eq!(
        json,
        "{\"device\":\"pci-0000-3b-00-1\",\"pod_ifname\":\"net1\",\"pci_address\":\"0000:3b:00.1\",\"permanent_mac\":\"02:00:00:00:00:02\",\"rdma_device\":null,\"snapshot\":{\"ifindex\":7,\"name\":\"eth1\",\"altnames\":[\"enp3s0\"],\"alias\":\"uplink\",\"mtu\":9000,\"mac\":\"02:00:00:00:00:01\",\"perm_mac\":\"02:00:00:00:00:02\",\"gso_max_size\":65536,\"gso_max_segs\":64,\"gro_max_size\":65536,\"gso_ipv4_max_size\":65536,\"gro_ipv4_max_size\":65536,\"up\":true,\"addresses\":[{\"cidr\":\"10.0.0.2/24\",\"broadcast\":\"10.0.0.255\",\"label\":\"eth1:1\",\"flags\":128,\"scope\":0,\"metric\":100,\"valid_lft\":300,\"preferred_lft\":200},{\"cidr\":\"fd00::2/64\",\"peer\":\"fd00::1\",\"flags\":0,\"scope\":0,\"valid_lft\":4294967295,\"preferred_lft\":4294967295}],\"parent\":\"pci/0000:3b:00.1\",\"identified\":true,\"features\":{\"rx-gro-hw\":true},\"private_flags\":{\"legacy-rx\":false},\"sysctls\":{\"ipv4/rp_filter\":2}},\"state\":\"in_pod\"}"
    );
    let back: DeviceRecord = serde_json::from_str(&json).unwrap();
    assert_eq!(back, record);
}

/// The encoder that reuses unchanged records writes exactly what a full encode writes, through
/// additions, changes (of a record, of a plan), removals and an empty checkpoint.
#[test]
fn cached_encoding_is_byte_identical_to_a_full_encode() {
    let mut enc = store::Encoder::default();
    let mut cp = sample();
    let same = |enc: &mut store::Encoder, cp: &Checkpoint| {
        let full = store::encode(cp).unwrap();
        let cached = enc.encode(cp).unwrap();
        assert_eq!(
            String::from_utf8(cached).unwrap(),
            String::from_utf8(full).unwrap()
        );
    };
    same(&mut enc, &cp);
    for i in 0..20 {
        let r = record(&format!("uid-{i}"), "sb-\"quoted\"");
        cp.pods.insert(r.key(), r);
    }
    same(&mut enc, &cp);
    same(&mut enc, &cp);
    let key = record("uid-3", "sb-\"quoted\"").key();
    cp.pods.get_mut(&key).unwrap().phase = PodPhase::Attached;
    same(&mut enc, &cp);
    cp.plans.get_mut("uid-1").unwrap().pod_name = "renamed".into();
    same(&mut enc, &cp);
    cp.pods.remove(&key);
    same(&mut enc, &cp);
    // (Quoted identifiers are refused on load; the round trip uses valid ones.)
    let mut valid = sample();
    let r = record("uid-9", "sb-9");
    valid.pods.insert(r.key(), r);
    let back = decode(&enc.encode(&valid).unwrap(), std::path::Path::new("x")).unwrap();
    assert_eq!(back, valid);
    same(&mut enc, &Checkpoint::default());
}
