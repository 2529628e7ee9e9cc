// Over 500 lines: the checkpoint's tests (formats 1-3, crash safety, corrupt files, migration, the golden files) share one set of fixtures.
use std::collections::BTreeMap;
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
        }
        .into(),
    );
    cp.pods.insert(
        "uid-1/sb-1".into(),
        PodRecord {
            pod_uid: "uid-1".into(),
            sandbox_id: "sb-1".into(),
            namespace: "ns".into(),
            name: "p".into(),
            netns_path: "/var/run/netns/x".into(),
            netns: NetnsId::test(7, 4026532000),
            // A pin is a path of the store's own `pins/` (checked on load): the tests that need
            // one set it for their store.
            pin: None,
            phase: PodPhase::Returned(ReturnReason::NetnsTeardown),
            devices: vec![],
            recovered: None,
        }
        .into(),
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
    assert!(d.join("checkpoint").is_dir());
    let cp = sample();
    s.save(&cp).unwrap();
    // A crash between write and rename leaves a torn tmp file: the checkpoint is the old one.
    fs::write(d.join("checkpoint/tmp.1.0"), b"{\"version\":3,\"pod\":{\"uid-").unwrap();
    fs::write(d.join("state.json.tmp.1.0"), b"{\"version\":2,\"pods\":{\"uid-").unwrap();
    assert_eq!(s.load().unwrap(), cp);
    assert_eq!(s.load_or_recover().source, LoadSource::Current);
    // The next save leaves the leftovers alone; the lock holder removes them.
    s.save(&cp).unwrap();
    assert_eq!(s.load().unwrap(), cp);
    s.remove_stale_temp_files();
    assert!(!d.join("checkpoint/tmp.1.0").exists() && !d.join("state.json.tmp.1.0").exists());
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
    let v1 = v1.replace("/run/dranet/pins", &s.pins_dir().display().to_string());
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
    // Saved again, it is format 3 (one file per record) and loads unchanged.
    s.save(&cp).unwrap();
    assert!(!s.path().exists() && d.join("state.json.migrated").exists());
    assert!(d.join("checkpoint/pod_uid-1_.json").exists());
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
    let mut r = sample().record("uid-1/sb-1").unwrap().clone();
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
        cp.pods.insert(pod_key(uid, sb), record(uid, sb).into());
        let bytes = serde_json::to_vec(&cp).unwrap();
        let err = decode(&bytes, Path::new("x")).unwrap_err();
        assert!(matches!(err, StateError::Invalid { .. }), "{uid:?} {sb:?}: {err}");
    }
    // A rebuilt record (no pod UID yet) and a format-1 one (no sandbox id) are fine.
    let mut cp = sample();
    cp.pods.insert(pod_key("", "sb-2"), record("", "sb-2").into());
    cp.pods.insert(pod_key("uid-2", ""), record("uid-2", "").into());
    assert_eq!(
        decode(&serde_json::to_vec(&cp).unwrap(), Path::new("x")).unwrap(),
        cp
    );
    // Two records of one sandbox under different keys: one would be lost.
    let mut cp = sample();
    cp.pods.insert("other".into(), record("uid-1", "sb-1").into());
    let err = decode(&serde_json::to_vec(&cp).unwrap(), Path::new("x")).unwrap_err();
    assert!(matches!(err, StateError::Invalid { .. }), "{err}");
}

/// Every save keeps the record file it replaces as `<name>.prev`, through temp files of its own
/// that never stay behind; a removed record loses both files.
#[test]
fn saves_keep_the_previous_generation_and_leave_no_temp_files() {
    let d = tmpdir("prev");
    let s = Store::open(&d).unwrap();
    let first = sample();
    s.save(&first).unwrap();
    let pod = d.join("checkpoint/pod_uid-1_sb-1.json");
    let pod_prev = d.join("checkpoint/pod_uid-1_sb-1.json.prev");
    assert!(pod.exists());
    assert!(!pod_prev.exists(), "nothing to keep before the first save");
    let mut second = sample();
    second.plans.clear();
    second.pods.get_mut("uid-1/sb-1").unwrap().phase = PodPhase::Attached;
    s.save(&second).unwrap();
    assert_eq!(s.load().unwrap(), second);
    let prev = decode_record(&fs::read(&pod_prev).unwrap(), &pod_prev).unwrap();
    assert_eq!(prev, Record::Pod(first.record("uid-1/sb-1").unwrap().clone()));
    assert!(!d.join("checkpoint/plan_uid-1.json").exists());
    let left: Vec<String> = fs::read_dir(d.join("checkpoint"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tmp."))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    s.save(&Checkpoint::default()).unwrap();
    assert!(!pod.exists() && !pod_prev.exists());
    assert_eq!(s.load_or_recover().source, LoadSource::Absent);
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

/// A single-file checkpoint (format 2) that does not load is moved aside and `.prev` is used;
/// when `.prev` does not load either, the result is empty and says so. Nothing fails. What loads
/// is migrated to record files.
#[test]
fn a_single_file_checkpoint_that_does_not_load_falls_back_to_prev_then_to_nothing() {
    for (what, bytes) in corrupt_variants() {
        let d = tmpdir(&format!("recover-{}", what.replace(' ', "-")));
        let s = Store::open(&d).unwrap();
        let prev = sample();
        fs::write(s.prev_path(), serde_json::to_vec(&prev).unwrap()).unwrap();
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
        // Migrated: the record files hold it, the single file is gone.
        assert!(!s.path().exists() && !s.prev_path().exists());
        assert_eq!(s.load().unwrap(), prev);
        assert_eq!(s.load_or_recover().source, LoadSource::Current);

        fs::write(s.path(), &bytes).unwrap();
        fs::write(s.prev_path(), &bytes).unwrap();
        let got = s.load_or_recover();
        assert!(
            matches!(got.source, LoadSource::Nothing { .. }),
            "{what}: {:?}",
            got.source
        );
        assert!(got.cp.pods.is_empty() && got.cp.plans.is_empty());
        // Nothing loaded: the record files are emptied too (the single file is the authority).
        assert!(s.load().unwrap().pods.is_empty());
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
        // The `v3_record*` seeds are record files (format 3).
        assert_eq!(
            decode_record(&bytes, &path).is_ok(),
            name.starts_with("v3_record"),
            "{name}"
        );
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
        // Not recorded before issue 38: absent from the file, as in every older record.
        flags: None,
        txqlen: None,
        group: None,
        lower: None,
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
        return_error: None,
        vanish_unreported: false,
    };
    let json = serde_json::to_string(&record).unwrap();
    assert_eq!(
        json,
        "{\"device\":\"pci-0000-3b-00-1\",\"pod_ifname\":\"net1\",\"pci_address\":\"0000:3b:00.1\",\"permanent_mac\":\"02:00:00:00:00:02\",\"rdma_device\":null,\"snapshot\":{\"ifindex\":7,\"name\":\"eth1\",\"altnames\":[\"enp3s0\"],\"alias\":\"uplink\",\"mtu\":9000,\"mac\":\"02:00:00:00:00:01\",\"perm_mac\":\"02:00:00:00:00:02\",\"gso_max_size\":65536,\"gso_max_segs\":64,\"gro_max_size\":65536,\"gso_ipv4_max_size\":65536,\"gro_ipv4_max_size\":65536,\"up\":true,\"addresses\":[{\"cidr\":\"10.0.0.2/24\",\"broadcast\":\"10.0.0.255\",\"label\":\"eth1:1\",\"flags\":128,\"scope\":0,\"metric\":100,\"valid_lft\":300,\"preferred_lft\":200},{\"cidr\":\"fd00::2/64\",\"peer\":\"fd00::1\",\"flags\":0,\"scope\":0,\"valid_lft\":4294967295,\"preferred_lft\":4294967295}],\"parent\":\"pci/0000:3b:00.1\",\"identified\":true,\"features\":{\"rx-gro-hw\":true},\"private_flags\":{\"legacy-rx\":false},\"sysctls\":{\"ipv4/rp_filter\":2}},\"state\":\"in_pod\"}"
    );
    let back: DeviceRecord = serde_json::from_str(&json).unwrap();
    assert_eq!(back, record);
}

/// A sandbox record with `devices` devices, each with a snapshot as big as a real one (offloads,
/// sysctls): ≈ 4 KiB of JSON per device.
fn big_record(uid: &str, sandbox: &str, devices: usize) -> PodRecord {
    let mut r = record(uid, sandbox);
    for j in 0..devices {
        let mut dev = crate::test_support::device_record(&format!("dev-{j}"), DeviceState::InPod);
        // As a real snapshot (checked on load): a name and an ifindex.
        dev.snapshot.name = format!("eth{j}");
        dev.snapshot.ifindex = u32::try_from(j + 1).unwrap();
        for f in 0..60 {
            dev.snapshot
                .features
                .insert(format!("feature-number-{f}"), f % 2 == 0);
        }
        for c in 0..40 {
            dev.snapshot.sysctls.insert(format!("ipv4/sysctl_number_{c}"), c);
        }
        r.devices.push(dev);
    }
    r
}

fn plan_of(uid: &str) -> PodPlan {
    PodPlan {
        pod_uid: uid.into(),
        pod_namespace: "ns".into(),
        pod_name: format!("p-{uid}"),
        devices: vec![],
    }
}

/// Name → (inode, size, mtime) of every file in `dir`.
fn files_of(dir: &Path) -> BTreeMap<String, (u64, u64, std::time::SystemTime)> {
    use std::os::unix::fs::MetadataExt;
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                (m.ino(), m.size(), m.modified().unwrap()),
            )
        })
        .collect()
}

/// The point of format 3: with 500 records (and 500 plans) on disk, a save of one changed record
/// writes that record's file (its old one kept as `.prev`) and touches no other file; a removal
/// removes that record's files only.
#[tokio::test]
async fn a_save_of_one_changed_record_among_500_writes_only_that_record() {
    let d = tmpdir("o1");
    let s = Store::open(&d).unwrap();
    let mut cp = Checkpoint {
        version: FORMAT_VERSION,
        ..Checkpoint::default()
    };
    for i in 0..500 {
        let uid = format!("uid-{i:03}");
        let r = big_record(&uid, &format!("sb-{i:03}"), 2);
        cp.pods.insert(r.key(), r.into());
        cp.plans.insert(uid.clone(), plan_of(&uid).into());
    }
    s.save(&cp).unwrap();
    let total: u64 = files_of(&s.records_dir()).values().map(|f| f.1).sum();
    assert!(total > 2 << 20, "a big checkpoint: {total} bytes");
    // As the engine does it: loaded, then its writer.
    let loaded = s.load_or_recover();
    assert_eq!((loaded.source, &loaded.cp), (LoadSource::Current, &cp));
    let w = Writer::start(s.clone()).unwrap();
    let before = files_of(&s.records_dir());
    let key = "uid-250/sb-250".to_owned();
    cp.pods.get_mut(&key).unwrap().phase = PodPhase::Attached;
    let g = w.stage(&cp).unwrap();
    w.durable(g).await.unwrap();
    let after = files_of(&s.records_dir());
    let changed: Vec<&String> = after
        .iter()
        .filter(|(n, f)| before.get(*n) != Some(*f))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        changed,
        ["pod_uid-250_sb-250.json", "pod_uid-250_sb-250.json.prev"],
        "files touched by a save of one record"
    );
    let one = after["pod_uid-250_sb-250.json"].1;
    assert!(one < 16 << 10 && one * 400 < total, "{one} of {total} bytes");
    // The .prev is the file it replaced (the same inode, renamed).
    assert_eq!(
        after["pod_uid-250_sb-250.json.prev"].0,
        before["pod_uid-250_sb-250.json"].0
    );
    // A removal of one sandbox record and one plan: their files only.
    cp.pods.remove("uid-007/sb-007");
    cp.plans.remove("uid-008");
    let g = w.stage(&cp).unwrap();
    w.durable(g).await.unwrap();
    let gone: Vec<String> = after
        .keys()
        .filter(|n| !s.records_dir().join(n).exists())
        .cloned()
        .collect();
    assert_eq!(gone, ["plan_uid-008.json", "pod_uid-007_sb-007.json"]);
    assert_eq!(s.load().unwrap(), cp);
    drop(w);
    fs::remove_dir_all(&d).unwrap();
}

/// [`sample`] and `n` big sandbox records (`uid-<i>/sb`, 2 devices with full snapshots).
fn sample_with_big_records(n: usize) -> Checkpoint {
    let mut cp = sample();
    for i in 0..n {
        let r = big_record(&format!("uid-{i}"), "sb", 2);
        cp.pods.insert(r.key(), r.into());
    }
    cp
}

/// What a stage hands the writer thread: exactly the records that changed since the last stage
/// (encoded), removals as such, a first stage without a known disk state as a full save.
#[test]
fn the_differ_hands_out_only_changed_records() {
    let mut differ = store::Differ::default();
    let mut cp = sample_with_big_records(500);
    let first = differ.diff(&cp).unwrap();
    assert!(first.full && first.files.len() == 502, "{}", first.files.len());
    let none = differ.diff(&cp).unwrap();
    assert!(!none.full && none.files.is_empty());
    cp.pods.get_mut("uid-3/sb").unwrap().devices[1].state = DeviceState::Returning;
    let one = differ.diff(&cp).unwrap();
    assert_eq!(one.files.keys().collect::<Vec<_>>(), ["pod_uid-3_sb.json"]);
    let bytes = one.bytes();
    assert!(bytes > 4 << 10 && bytes < 16 << 10, "{bytes}");
    assert_eq!(
        decode_record(one.files["pod_uid-3_sb.json"].as_deref().unwrap(), Path::new("x")).unwrap(),
        Record::Pod(cp.record("uid-3/sb").unwrap().clone())
    );
    // A record renamed in place (a rebuilt record's pod UID filled in) moves to its new file.
    let mut r = cp.pods.remove("uid-4/sb").unwrap();
    r.pod_uid = "uid-44".into();
    cp.pods.insert("uid-4/sb".into(), r);
    cp.plans.remove("uid-1");
    let moved = differ.diff(&cp).unwrap();
    let files: Vec<(&str, bool)> = moved
        .files
        .iter()
        .map(|(n, c)| (n.as_str(), c.is_some()))
        .collect();
    assert_eq!(
        files,
        [
            ("plan_uid-1.json", false),
            ("pod_uid-44_sb.json", true),
            ("pod_uid-4_sb.json", false)
        ]
    );
    // Coalesced stages: the newer value wins, a full save replaces everything before it.
    let mut a = store::Delta::default();
    a.files.insert("x".into(), Some(b"1".to_vec()));
    let mut b = store::Delta::default();
    b.files.insert("x".into(), None);
    a.then(b);
    assert_eq!(a.files["x"], None);
    let mut full = store::Delta {
        full: true,
        ..store::Delta::default()
    };
    full.files.insert("y".into(), Some(b"2".to_vec()));
    a.then(full);
    assert!(a.full && !a.files.contains_key("x"));
}

/// A save compares an unchanged record by pointer, not field by field: the writer's copy of what
/// is on disk is the engine's records themselves until one is written to (copy on write). A
/// record written to parts from the copy (the copy keeps the old value for the diff); an equal
/// record put in its place is shared again after one compare.
#[test]
fn the_writers_copy_is_the_engines_records_until_one_changes() {
    let mut differ = store::Differ::default();
    let mut cp = sample_with_big_records(500);
    let all = cp.pods.len() + cp.plans.len();
    differ.diff(&cp).unwrap();
    assert_eq!(differ.shared_with(&cp), all);
    cp.pods.get_mut("uid-3/sb").unwrap().devices[1].state = DeviceState::Returning;
    assert_eq!(differ.shared_with(&cp), all - 1);
    let one = differ.diff(&cp).unwrap();
    assert_eq!(one.files.keys().collect::<Vec<_>>(), ["pod_uid-3_sb.json"]);
    assert_eq!(differ.shared_with(&cp), all);
    // A write of the same values (a copy, not the same record): no file, and shared again.
    let copy = cp.record("uid-4/sb").unwrap().clone();
    cp.pods.insert("uid-4/sb".into(), copy.into());
    assert_eq!(differ.shared_with(&cp), all - 1);
    assert!(differ.diff(&cp).unwrap().files.is_empty());
    assert_eq!(differ.shared_with(&cp), all);
}

/// The format-3 files, byte for byte: their names, `{"version":3,"plan"|"pod":..}` and a
/// newline (the records themselves are format 2's; see the snapshot's golden test).
#[test]
fn the_record_files_of_format_3_are_fixed() {
    let d = tmpdir("golden3");
    let s = Store::open(&d).unwrap();
    let mut cp = sample();
    if let Some(r) = cp.pods.get_mut("uid-1/sb-1") {
        r.pin = Some("/run/dranet/pins/uid-1".into());
    }
    s.save(&cp).unwrap();
    let files = files_of(&s.records_dir());
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        ["plan_uid-1.json", "pod_uid-1_sb-1.json"]
    );
    assert_eq!(
        fs::read_to_string(d.join("checkpoint/plan_uid-1.json")).unwrap(),
        "{\"version\":3,\"plan\":{\"pod_uid\":\"uid-1\",\"pod_namespace\":\"ns\",\"pod_name\":\"p\",\"devices\":[]}}\n"
    );
    assert_eq!(
        fs::read_to_string(d.join("checkpoint/pod_uid-1_sb-1.json")).unwrap(),
        "{\"version\":3,\"pod\":{\"pod_uid\":\"uid-1\",\"sandbox_id\":\"sb-1\",\"namespace\":\"ns\",\"name\":\"p\",\"netns_path\":\"/var/run/netns/x\",\"netns\":{\"cookie\":7,\"inode\":4026532000},\"pin\":\"/run/dranet/pins/uid-1\",\"phase\":{\"returned\":\"netns_teardown\"},\"devices\":[]}}\n"
    );
    // Names: a format-1 record (no sandbox), a rebuilt one (no pod UID), long and odd ids hashed.
    assert_eq!(pod_file_name("uid-1", ""), "pod_uid-1_.json");
    assert_eq!(pod_file_name("", "sb-1"), "pod__sb-1.json");
    assert_eq!(plan_file_name("a.b-c"), "plan_a.b-c.json");
    let long = "a".repeat(253);
    for name in [
        plan_file_name(&long),
        pod_file_name(&long, "sb"),
        pod_file_name("../x", "sb"),
        pod_file_name("u_1", "sb"),
        plan_file_name(".hidden"),
    ] {
        assert!(
            name.len() < 100 && name.contains("_~") && !name.contains('/'),
            "{name}"
        );
    }
    assert_ne!(pod_file_name("u_1", "sb"), pod_file_name("u", "1_sb"));
    fs::remove_dir_all(&d).unwrap();
}

/// Every record file can be truncated or garbage: that record comes from its `.prev` (one save
/// behind) when that loads, else it is left out; every other record loads; the bad files are
/// moved aside; `load` (read only, `dranet status`) names the bad file.
#[test]
fn a_record_file_that_does_not_load_falls_back_to_its_prev_then_is_left_out() {
    let mut variants = corrupt_variants();
    let good = encode_pod(&sample().pods["uid-1/sb-1"]).unwrap();
    variants.push(("truncated record", good[..good.len() - 20].to_vec()));
    variants.push((
        "format 2 in a record file",
        b"{\"version\":2,\"pod\":{}}".to_vec(),
    ));
    variants.push((
        "another record's file",
        encode_pod(&record("uid-9", "sb-9")).unwrap(),
    ));
    for (what, bytes) in variants {
        let d = tmpdir(&format!("rec-{}", what.replace(' ', "-")));
        let s = Store::open(&d).unwrap();
        let mut old = sample();
        for i in 2..5 {
            let r = record(&format!("uid-{i}"), "sb");
            cp_insert(&mut old, r);
        }
        s.save(&old).unwrap();
        let mut new = old.clone();
        for r in new.pods.values_mut() {
            r.phase = PodPhase::Attached;
        }
        s.save(&new).unwrap();
        let bad = s.records_dir().join("pod_uid-3_sb.json");
        fs::write(&bad, &bytes).unwrap();

        let err = s.load().unwrap_err();
        assert!(err.to_string().contains("pod_uid-3_sb.json"), "{what}: {err}");
        let shown = s.load_prev().unwrap().unwrap();
        assert_eq!(shown.pods["uid-3/sb"], old.pods["uid-3/sb"], "{what}");

        let got = s.load_or_recover();
        let LoadSource::Previous { problem, aside } = &got.source else {
            panic!("{what}: {:?}", got.source);
        };
        assert!(problem.contains("pod_uid-3_sb.json"), "{what}: {problem}");
        let aside = aside.clone().unwrap();
        assert!(
            aside
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("pod_uid-3_sb.json.corrupt-"),
            "{aside:?}"
        );
        assert_eq!(fs::read(&aside).unwrap(), bytes, "{what}: kept as it was");
        // That record one save behind, every other one current.
        let mut want = new.clone();
        want.pods.insert("uid-3/sb".into(), old.pods["uid-3/sb"].clone());
        assert_eq!(got.cp, want, "{what}");

        // Its file and its .prev bad: left out, the others load.
        fs::write(&bad, &bytes).unwrap();
        fs::write(s.records_dir().join("pod_uid-3_sb.json.prev"), &bytes).unwrap();
        let got = s.load_or_recover();
        let LoadSource::Nothing { prev_problem, .. } = &got.source else {
            panic!("{what}: {:?}", got.source);
        };
        assert!(
            prev_problem.contains("pod_uid-3_sb.json.prev"),
            "{what}: {prev_problem}"
        );
        let mut want = new.clone();
        want.pods.remove("uid-3/sb");
        assert_eq!(got.cp, want, "{what}");
        // Both moved aside: the next start loads cleanly (the record is rebuilt from its pin).
        assert_eq!(s.load().unwrap(), want, "{what}");
        fs::remove_dir_all(&d).unwrap();
    }
}

fn cp_insert(cp: &mut Checkpoint, r: PodRecord) {
    cp.plans.insert(r.pod_uid.clone(), plan_of(&r.pod_uid).into());
    cp.pods.insert(r.key(), r.into());
}

/// A format-2 `state.json` (what dranet wrote before record files) loads as it always did and
/// is migrated: every record in its own file, `state.json` and its `.prev` renamed
/// `*.migrated`; the writer's first save after that writes only what changed.
#[tokio::test]
async fn a_format_2_state_json_is_migrated_to_record_files() {
    let d = tmpdir("migrate2");
    let s = Store::open(&d).unwrap();
    let mut cp = sample();
    cp_insert(&mut cp, big_record("uid-2", "sb-2", 2));
    let mut v2 = serde_json::to_value(&cp).unwrap();
    v2["version"] = 2.into();
    fs::write(s.path(), serde_json::to_vec(&v2).unwrap()).unwrap();
    fs::write(s.prev_path(), b"{\"version\":2}").unwrap();
    assert_eq!(s.load().unwrap(), cp, "read before the migration");
    let got = s.load_or_recover();
    assert_eq!((got.source, &got.cp), (LoadSource::Current, &cp));
    assert!(!s.path().exists() && !s.prev_path().exists());
    assert!(d.join("state.json.migrated").exists() && d.join("state.json.prev.migrated").exists());
    assert_eq!(
        files_of(&s.records_dir()).keys().collect::<Vec<_>>(),
        [
            "plan_uid-1.json",
            "plan_uid-2.json",
            "pod_uid-1_sb-1.json",
            "pod_uid-2_sb-2.json"
        ]
    );
    let w = Writer::start(s.clone()).unwrap();
    let before = files_of(&s.records_dir());
    cp.plans.get_mut("uid-2").unwrap().pod_name = "renamed".into();
    let g = w.stage(&cp).unwrap();
    w.durable(g).await.unwrap();
    let after = files_of(&s.records_dir());
    let changed: Vec<&String> = after
        .iter()
        .filter(|(n, f)| before.get(*n) != Some(*f))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(changed, ["plan_uid-2.json", "plan_uid-2.json.prev"]);
    assert_eq!(Store::open(&d).unwrap().load_or_recover().cp, cp);
    drop(w);
    fs::remove_dir_all(&d).unwrap();
}

/// A save that fails is written again with the next stage: a record whose only save failed is
/// not left behind on disk.
#[tokio::test]
async fn a_failed_save_is_written_again_with_the_next_stage() {
    use std::os::unix::fs::PermissionsExt;
    let d = tmpdir("retry");
    let s = Store::open(&d).unwrap();
    let w = Writer::start(s.clone()).unwrap();
    let mut cp = sample();
    let g = w.stage(&cp).unwrap();
    w.durable(g).await.unwrap();
    // The records dir replaced by a file: every write fails (also as root).
    let rdir = s.records_dir();
    fs::rename(&rdir, d.join("aside")).unwrap();
    fs::write(&rdir, b"").unwrap();
    cp.pods.get_mut("uid-1/sb-1").unwrap().phase = PodPhase::Attached;
    let g = w.stage(&cp).unwrap();
    assert!(matches!(w.durable(g).await, Err(StateError::Save(_))));
    fs::remove_file(&rdir).unwrap();
    fs::rename(d.join("aside"), &rdir).unwrap();
    fs::set_permissions(&rdir, fs::Permissions::from_mode(0o700)).unwrap();
    // Another record changes: the failed one is written with it.
    cp.plans.get_mut("uid-1").unwrap().pod_name = "q".into();
    let g = w.stage(&cp).unwrap();
    w.durable(g).await.unwrap();
    assert_eq!(s.load().unwrap(), cp);
    drop(w);
    fs::remove_dir_all(&d).unwrap();
}

/// The checkpoint the crash test's child saves as step `n`: 40 sandbox records and their plans,
/// each present or not and with a value that depend on `n` alone; a step changes about a fifth.
fn crash_state(n: u64) -> Checkpoint {
    let mut cp = Checkpoint {
        version: FORMAT_VERSION,
        ..Checkpoint::default()
    };
    for i in 0..40u64 {
        if ((n + 3 * i) / 7).is_multiple_of(4) {
            continue;
        }
        let uid = format!("uid-{i}");
        let mut r = big_record(&uid, "sb", 2);
        r.name = format!("v{}", (n + i) / 5);
        let mut p = plan_of(&uid);
        p.pod_name = format!("v{}", (n + 2 * i) / 5);
        cp.plans.insert(uid, p.into());
        cp.pods.insert(r.key(), r.into());
    }
    cp
}

const CRASH_DIR: &str = "DRANET_STATE_CRASH_DIR";

/// The child of `a_sigkill_during_saves_leaves_every_record_old_or_new`: loads the state dir
/// (it must load cleanly), then saves `crash_state(n)` for n = start, start + 1, … through its
/// writer, printing `durable <n>` once each is on disk, until it is killed.
#[tokio::test]
#[ignore = "the child of a_sigkill_during_saves_leaves_every_record_old_or_new"]
async fn crash_child_saves_until_killed() {
    let Ok(dir) = std::env::var(CRASH_DIR) else {
        return;
    };
    let start: u64 = std::env::var("DRANET_STATE_CRASH_START")
        .unwrap()
        .parse()
        .unwrap();
    let s = Store::open(&dir).unwrap();
    s.remove_stale_temp_files();
    let loaded = s.load_or_recover();
    assert!(
        matches!(loaded.source, LoadSource::Current | LoadSource::Absent),
        "{:?}",
        loaded.source
    );
    let w = Writer::start(s).unwrap();
    for n in start.. {
        let g = w.stage(&crash_state(n)).unwrap();
        w.durable(g).await.unwrap();
        println!("durable {n}");
    }
}

/// SIGKILL at random points of a stream of saves (a child process: this test binary running
/// `crash_child_saves_until_killed`), 20 times over the same state dir: every time, the state
/// loads cleanly (no torn or missing file) and every record — present or not — is at its value of
/// the last save reported durable or of the one after it (old or new), never older, never mixed
/// within a record.
#[test]
fn a_sigkill_during_saves_leaves_every_record_old_or_new() {
    use std::io::BufRead;
    let d = tmpdir("sigkill");
    Store::open(&d).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    let mut start = 1u64;
    for round in 0..20 {
        let mut child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "state::tests::crash_child_saves_until_killed",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_DIR, &d)
            .env("DRANET_STATE_CRASH_START", start.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        // At least one save durable, then a kill at a random point of the next ones.
        let mut acked = loop {
            let line = lines.next().expect("the child stopped before a save").unwrap();
            if let Some(n) = line.strip_prefix("durable ") {
                break n.parse::<u64>().unwrap();
            }
        };
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(std::time::Duration::from_micros((seed >> 33) % 30_000));
        child.kill().unwrap();
        child.wait().unwrap();
        for line in lines {
            if let Some(n) = line.unwrap().strip_prefix("durable ") {
                acked = n.parse().unwrap();
            }
        }
        let loaded = Store::open(&d)
            .unwrap()
            .load()
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let (old, new) = (crash_state(acked), crash_state(acked + 1));
        for key in old.pods.keys().chain(new.pods.keys()) {
            let got = loaded.pods.get(key);
            assert!(
                got == old.pods.get(key) || got == new.pods.get(key),
                "round {round}, after {acked}: record {key} is {:?}",
                got.map(|r| &r.name)
            );
        }
        for uid in old.plans.keys().chain(new.plans.keys()) {
            let got = loaded.plans.get(uid);
            assert!(
                got == old.plans.get(uid) || got == new.plans.get(uid),
                "round {round}, after {acked}: plan {uid} is {:?}",
                got.map(|p| &p.pod_name)
            );
        }
        let extra = loaded
            .pods
            .keys()
            .find(|k| !old.pods.contains_key(*k) && !new.pods.contains_key(*k));
        assert!(extra.is_none(), "round {round}: record {extra:?} of neither");
        start = acked + 2;
    }
    fs::remove_dir_all(&d).unwrap();
}

/// Issue 38 #7: a record's pin is a path dranet unmounts and removes, so one that is not a pin of
/// this state dir (outside `pins/`, through `..`, a symlink in `pins/` leading out, a hidden
/// name) makes its record file corrupt: moved aside, its `.prev` tried, every other record loads.
#[test]
fn a_record_whose_pin_is_not_in_the_pins_dir_is_moved_aside_and_costs_no_other_record() {
    let d = tmpdir("hostile-pin");
    let s = Store::open(&d).unwrap();
    let outside = d.join("victim");
    fs::write(&outside, b"").unwrap();
    let link = s.pins_dir().join("evil");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    let hostile: [(&str, PathBuf); 5] = [
        ("outside", outside.clone()),
        ("dotdot", s.pins_dir().join("..").join("victim")),
        ("symlink", link.clone()),
        ("hidden", s.pins_dir().join(".x")),
        ("nested", s.pins_dir().join("a").join("b")),
    ];
    for (what, pin) in hostile {
        let mut cp = sample();
        let mut good = record("uid-2", "sb");
        good.pin = Some(s.pins_dir().join("sb"));
        cp_insert(&mut cp, good.clone());
        let mut bad = record("uid-3", "sb");
        bad.pin = Some(pin);
        cp_insert(&mut cp, bad);
        cp.pods.remove("uid-1/sb-1");
        s.save(&cp).unwrap();
        let _ = fs::remove_file(s.records_dir().join("pod_uid-3_sb.json.prev"));
        let got = s.load_or_recover();
        assert!(!got.cp.pods.contains_key("uid-3/sb"), "{what}: loaded");
        assert_eq!(*got.cp.pods["uid-2/sb"], good, "{what}");
        assert!(
            matches!(&got.source, LoadSource::Nothing { problem, .. } if problem.contains("pin")),
            "{what}: {:?}",
            got.source
        );
        assert!(
            fs::read_dir(s.records_dir()).unwrap().any(|e| e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("pod_uid-3_sb.json.corrupt-")),
            "{what}: not moved aside"
        );
        for e in fs::read_dir(s.records_dir()).unwrap() {
            let p = e.unwrap().path();
            if p.to_string_lossy().contains(".corrupt-") {
                fs::remove_file(p).unwrap();
            }
        }
    }
    assert!(outside.exists());
    fs::remove_dir_all(&d).unwrap();
}

/// Issue 38 #7, every other field: a record whose fields are out of what the kernel or dranet
/// ever writes is moved aside as corrupt, one field at a time, and costs no other record.
#[test]
fn a_record_with_a_hostile_field_is_moved_aside_and_costs_no_other_record() {
    type Edit = fn(&mut PodRecord);
    let d = tmpdir("hostile-fields");
    let s = Store::open(&d).unwrap();
    let valid = || {
        let mut r = big_record("uid-3", "sb", 1);
        r.devices[0].pci_address = Some("0000:3b:00.1".into());
        r.devices[0].permanent_mac = Some("0c:42:a1:00:00:01".into());
        r.devices[0].snapshot.mac = Some("0c:42:a1:00:00:01".into());
        r.devices[0].snapshot.altnames = vec!["enp59s0f1".into()];
        r.devices[0].snapshot.parent = Some("pci/0000:3b:00.1".into());
        r.devices[0].snapshot.mtu = 9000;
        r
    };
    let hostile: [(&str, Edit); 16] = [
        ("device name with '/'", |r| r.devices[0].device = "a/b".into()),
        ("pod interface name of 16 bytes", |r| {
            r.devices[0].pod_ifname = "abcdefghijklmnop".into();
        }),
        ("snapshot name with '/'", |r| {
            r.devices[0].snapshot.name = "x/y".into()
        }),
        ("100,000 altnames", |r| {
            r.devices[0].snapshot.altnames = (0..100_000).map(|i| format!("alt{i}")).collect();
        }),
        ("MTU 2^32-1", |r| r.devices[0].snapshot.mtu = u32::MAX),
        // 0 is not among them: unknown, as a record rebuilt from a pin says (loads, below).
        ("ifindex beyond the kernel's int", |r| {
            r.devices[0].snapshot.ifindex = 1 << 31;
        }),
        ("place at ifindex 0", |r| {
            r.devices[0].at = Some(DeviceAt {
                ifindex: PodIfindex::new(0),
                netns: r.netns,
            });
        }),
        ("temporary name of 16 bytes", |r| {
            r.devices[0].temp_name = Some("dn12345678901234".into());
        }),
        ("MAC not a MAC", |r| {
            r.devices[0].snapshot.mac = Some("zz:zz".into())
        }),
        ("PCI address that is a path", |r| {
            r.devices[0].pci_address = Some("../../etc".into());
        }),
        ("sysctl key out of /proc/sys", |r| {
            r.devices[0].snapshot.sysctls.insert("ipv4/../../x".into(), 1);
        }),
        ("address not a CIDR", |r| {
            r.devices[0].snapshot.addresses = vec![crate::sys::link::AddrSnapshot::plain("x")];
        }),
        ("parent not <bus>/<name>", |r| {
            r.devices[0].snapshot.parent = Some("pci/../x/y".into());
        }),
        ("pod name with '/'", |r| r.name = "a/b".into()),
        ("relative netns path", |r| r.netns_path = "run/netns/x".into()),
        ("2,000 devices", |r| {
            let d = r.devices[0].clone();
            r.devices = vec![d; 2000];
        }),
    ];
    // The valid one loads as it is; so does one whose host ifindex is unknown (0: a record
    // rebuilt from a pin), with no earlier version to fall back on.
    let mut cp = sample();
    cp_insert(&mut cp, valid());
    s.save(&cp).unwrap();
    assert_eq!(s.load_or_recover().cp, cp);
    let mut unknown = valid();
    unknown.devices[0].snapshot.ifindex = 0;
    cp_insert(&mut cp, unknown);
    s.save(&cp).unwrap();
    let _ = fs::remove_file(s.records_dir().join("pod_uid-3_sb.json.prev"));
    let got = s.load_or_recover();
    assert_eq!(got.cp, cp, "a host ifindex of 0 (unknown) is refused");
    assert!(matches!(got.source, LoadSource::Current), "{:?}", got.source);
    for (what, edit) in hostile {
        let mut cp = sample();
        let mut good = record("uid-2", "sb");
        good.devices = valid().devices;
        cp_insert(&mut cp, good.clone());
        let mut bad = valid();
        edit(&mut bad);
        cp_insert(&mut cp, bad);
        s.save(&cp).unwrap();
        let _ = fs::remove_file(s.records_dir().join("pod_uid-3_sb.json.prev"));
        let got = s.load_or_recover();
        assert!(!got.cp.pods.contains_key("uid-3/sb"), "{what}: loaded");
        assert_eq!(*got.cp.pods["uid-2/sb"], good, "{what}");
        assert!(got.cp.pods.contains_key("uid-1/sb-1"), "{what}");
        assert!(
            matches!(&got.source, LoadSource::Nothing { problem, .. } if problem.contains("uid-3/sb")),
            "{what}: {:?}",
            got.source
        );
        let mut aside = false;
        for e in fs::read_dir(s.records_dir()).unwrap() {
            let p = e.unwrap().path();
            if p.to_string_lossy().contains(".corrupt-") {
                aside |= p.to_string_lossy().contains("pod_uid-3_sb.json.corrupt-");
                fs::remove_file(p).unwrap();
            }
        }
        assert!(aside, "{what}: not moved aside");
    }
    fs::remove_dir_all(&d).unwrap();
}

/// Plans are records too: one whose device would give the pod's containers a character device
/// that is not an RDMA node, look a host link up by a path, or apply a configuration Prepare
/// never accepts is moved aside as corrupt and costs no other record.
#[test]
fn a_plan_with_a_hostile_field_is_moved_aside_and_costs_no_other_record() {
    type Edit = fn(&mut crate::plan::DevicePlan);
    let d = tmpdir("hostile-plans");
    let s = Store::open(&d).unwrap();
    let device = || crate::plan::DevicePlan {
        device: "eth1".into(),
        pool: "node-a".into(),
        request: "nic".into(),
        claim: crate::plan::ClaimRef {
            namespace: "ns".into(),
            name: "c1".into(),
            uid: "c-uid-1".into(),
        },
        host_ifname: Some("eth1".into()),
        pci_address: Some("0000:3b:00.1".into()),
        permanent_mac: Some("0c:42:a1:00:00:01".into()),
        rdma_device: Some("mlx5_0".into()),
        config: crate::config::NetworkConfig::default(),
        char_devices: vec![crate::plan::CharDevice {
            path: "/dev/infiniband/uverbs0".into(),
            kind: "c".into(),
            major: 231,
            minor: 192,
        }],
    };
    let hostile: [(&str, Edit); 5] = [
        ("a disk as a character device", |p| {
            p.char_devices[0].path = "/dev/sda".into()
        }),
        ("a character device through '..'", |p| {
            p.char_devices[0].path = "/dev/infiniband/../sda".into();
        }),
        ("host interface name that is a path", |p| {
            p.host_ifname = Some("../eth0".into())
        }),
        ("PCI address that is a path", |p| {
            p.pci_address = Some("../../x".into())
        }),
        ("an interface name Prepare refuses", |p| {
            p.config.interface.name = Some("a/b".into());
        }),
    ];
    let mut good = plan_of("uid-2");
    good.devices = vec![device()];
    let mut cp = sample();
    cp.plans.insert("uid-2".into(), good.clone().into());
    s.save(&cp).unwrap();
    assert_eq!(s.load_or_recover().cp, cp, "a valid plan loads as it is");
    for (what, edit) in hostile {
        let mut bad = plan_of("uid-3");
        bad.devices = vec![device()];
        edit(&mut bad.devices[0]);
        let mut cp = sample();
        cp.plans.insert("uid-2".into(), good.clone().into());
        cp.plans.insert("uid-3".into(), bad.into());
        s.save(&cp).unwrap();
        let _ = fs::remove_file(s.records_dir().join("plan_uid-3.json.prev"));
        let got = s.load_or_recover();
        assert!(!got.cp.plans.contains_key("uid-3"), "{what}: loaded");
        assert_eq!(*got.cp.plans["uid-2"], good, "{what}");
        let mut aside = false;
        for e in fs::read_dir(s.records_dir()).unwrap() {
            let p = e.unwrap().path();
            if p.to_string_lossy().contains(".corrupt-") {
                aside |= p.to_string_lossy().contains("plan_uid-3.json.corrupt-");
                fs::remove_file(p).unwrap();
            }
        }
        assert!(aside, "{what}: not moved aside");
    }
    fs::remove_dir_all(&d).unwrap();
}
