//! The fuzz targets' seed corpus (`fuzz/corpus/<target>/`): a handful of valid inputs per target,
//! built here from the protocol definitions, and every committed input replayed through the
//! target's entry point (`dranet::fuzzing`), so the corpus stays valid and its inputs stay
//! regression tests in the plain test suite.
//!
//! Regenerate: `DRANET_WRITE_SEEDS=1 cargo test -p dranet --test fuzz_corpus`.
#![expect(
    clippy::unwrap_used,
    reason = "seed builders in a test: a failed unwrap is a failed test"
)]

use std::path::{Path, PathBuf};

use dranet::nri::pb::nri as api;
use dranet::nri::replay::request_frame;
use dranet::sys::ethtool as et;
use dranet::sys::rdma;
use prost::Message;

type Seeds = Vec<(&'static str, Vec<u8>)>;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
}

// ------------------------------------------------------------------------------------------
// nri: what a runtime writes on the trunk.

fn pod(uid: &str, netns: bool) -> api::PodSandbox {
    api::PodSandbox {
        id: format!("sb-{uid}"),
        name: format!("pod-{uid}"),
        uid: uid.into(),
        namespace: "default".into(),
        labels: [("app".to_string(), "x".to_string())].into_iter().collect(),
        linux: Some(api::LinuxPodSandbox {
            namespaces: if netns {
                vec![api::LinuxNamespace {
                    r#type: "network".into(),
                    path: format!("/var/run/netns/cni-{uid}"),
                }]
            } else {
                Vec::new()
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn frame(conn: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    dranet::nri::mux::encode_frame(&mut b, conn, payload);
    b.to_vec()
}

const T: i64 = 2_000_000_000;

fn nri_seeds() -> Seeds {
    let p = pod("0f9a1c52-5b7e-4d4e-9d1a-2a3b4c5d6e7f", true);
    let run = api::RunPodSandboxRequest { pod: Some(p.clone()) }.encode_to_vec();
    let configure = api::ConfigureRequest {
        runtime_name: "containerd".into(),
        runtime_version: "2.3.4".into(),
        registration_timeout: 5000,
        request_timeout: 2000,
        ..Default::default()
    }
    .encode_to_vec();
    let sync_part = |uids: &[&str], more| {
        api::SynchronizeRequest {
            pods: uids.iter().map(|u| pod(u, true)).collect(),
            containers: vec![api::Container {
                id: "c1".into(),
                pod_sandbox_id: "sb-a".into(),
                name: "app".into(),
                ..Default::default()
            }],
            more,
        }
        .encode_to_vec()
    };
    let mut sync = request_frame(1, "Synchronize", &sync_part(&["a", "b"], true), T);
    sync.extend(request_frame(3, "Synchronize", &sync_part(&["c"], true), T));
    sync.extend(request_frame(5, "Synchronize", &sync_part(&["d"], false), T));
    // One request cut over three frames, with a frame for a connection nobody opened between
    // them and stray bytes for the runtime-service connection (the plugin's client side).
    let whole = request_frame(7, "RunPodSandbox", &run, T);
    let msg = &whole[8..];
    let mut split = frame(1, &msg[..3]);
    split.extend(frame(9, b"nobody"));
    split.extend(frame(1, &msg[3..20]));
    split.extend(frame(2, &[0, 0, 0, 2, 0, 0, 0, 1, 2, 0, 0x0a, 0x00]));
    split.extend(frame(1, &msg[20..]));
    // A ttrpc header announcing 5 MiB: answered RESOURCE_EXHAUSTED and skipped.
    let mut oversized = frame(1, &[0x00, 0x50, 0x00, 0x00, 0, 0, 0, 11, 1, 0, 1, 2, 3, 4]);
    oversized.extend(request_frame(13, "Shutdown", &[], T));
    let state_change = api::StateChangeEvent {
        event: api::Event::RunPodSandbox as i32,
        pod: Some(p.clone()),
        container: None,
    }
    .encode_to_vec();
    let create = api::CreateContainerRequest {
        pod: Some(p.clone()),
        container: Some(api::Container {
            id: "c1".into(),
            name: "app".into(),
            ..Default::default()
        }),
    }
    .encode_to_vec();
    let stop = api::StopPodSandboxRequest { pod: Some(p.clone()) }.encode_to_vec();
    let mut teardown = request_frame(15, "StopPodSandbox", &stop, T);
    teardown.extend(request_frame(17, "RemovePodSandbox", &stop, T));
    let mut odd = request_frame(19, "Nope", b"", T);
    odd.extend(request_frame(21, "RunPodSandbox", &[0xff, 0xff], 1));
    vec![
        ("configure", request_frame(1, "Configure", &configure, T)),
        ("run_pod", request_frame(3, "RunPodSandbox", &run, T)),
        (
            "run_pod_host_network",
            request_frame(
                5,
                "RunPodSandbox",
                &api::RunPodSandboxRequest {
                    pod: Some(pod("hostnet", false)),
                }
                .encode_to_vec(),
                T,
            ),
        ),
        (
            "create_container",
            request_frame(7, "CreateContainer", &create, T),
        ),
        ("state_change", request_frame(9, "StateChange", &state_change, 0)),
        ("stop_remove", teardown),
        ("synchronize_parts", sync),
        ("split_frames", split),
        ("oversized_message", oversized),
        ("unknown_method_and_bad_payload", odd),
    ]
}

// ------------------------------------------------------------------------------------------
// http: what a client sends.

fn http_seeds() -> Seeds {
    let s = |x: &str| x.as_bytes().to_vec();
    vec![
        (
            "healthz",
            s("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:9177\r\nUser-Agent: kube-probe/1.34\r\n\r\n"),
        ),
        (
            "keep_alive",
            s(
                "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\n\r\n",
            ),
        ),
        ("head_http10", s("HEAD /metrics HTTP/1.0\r\n\r\n")),
        (
            "post_body",
            s("POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"),
        ),
        (
            "chunked",
            s(
                "PUT /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            ),
        ),
        (
            "query_close",
            s("GET /metrics?name[]=up HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        ),
        (
            "not_found",
            s("GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n"),
        ),
        ("bad_request_line", s("GET\r\n\r\n")),
    ]
}

// ------------------------------------------------------------------------------------------
// netlink replies (ethtool genetlink, RDMA nldev). nlmsghdr: len u32, type u16, flags u16,
// seq u32, pid u32 (host order); NLAs: len u16, type u16, value padded to 4.

fn nlmsg(ty: u16, flags: u16, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&u32::try_from(16 + body.len()).unwrap().to_ne_bytes());
    v.extend_from_slice(&ty.to_ne_bytes());
    v.extend_from_slice(&flags.to_ne_bytes());
    v.extend_from_slice(&7u32.to_ne_bytes());
    v.extend_from_slice(&0u32.to_ne_bytes());
    v.extend_from_slice(body);
    v
}

fn nla(ty: u16, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&u16::try_from(4 + value.len()).unwrap().to_ne_bytes());
    v.extend_from_slice(&ty.to_ne_bytes());
    v.extend_from_slice(value);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v
}

fn nest(ty: u16, parts: &[Vec<u8>]) -> Vec<u8> {
    nla(ty | et::NLA_F_NESTED, &parts.concat())
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

fn genl(family: u16, cmd: u8, attrs: &[u8]) -> Vec<u8> {
    let mut body = vec![cmd, 1, 0, 0];
    body.extend_from_slice(attrs);
    nlmsg(family, 0, &body)
}

fn ack(errno: i32) -> Vec<u8> {
    let mut body = (-errno).to_ne_bytes().to_vec();
    body.extend(nlmsg(0x14, 5, &[]));
    nlmsg(2, 0, &body)
}

/// A verbose bitset: (index, name, set) bits; `nomask` lists set bits only.
fn bitset(bits: &[(u32, &str, bool)], nomask: bool) -> Vec<Vec<u8>> {
    let list: Vec<Vec<u8>> = bits
        .iter()
        .filter(|b| !nomask || b.2)
        .map(|(i, name, on)| {
            let mut parts = vec![
                nla(et::ETHTOOL_A_BITSET_BIT_INDEX, &i.to_ne_bytes()),
                nla(et::ETHTOOL_A_BITSET_BIT_NAME, &cstr(name)),
            ];
            if *on && !nomask {
                parts.push(nla(et::ETHTOOL_A_BITSET_BIT_VALUE, &[]));
            }
            nest(et::ETHTOOL_A_BITSET_BITS_BIT, &parts)
        })
        .collect();
    let mut out = Vec::new();
    if nomask {
        out.push(nla(et::ETHTOOL_A_BITSET_NOMASK, &[]));
    }
    out.push(nla(et::ETHTOOL_A_BITSET_SIZE, &64u32.to_ne_bytes()));
    out.push(nest(et::ETHTOOL_A_BITSET_BITS, &list));
    out
}

fn ethtool_seeds() -> Seeds {
    let header = nest(
        et::ETHTOOL_A_FEATURES_HEADER,
        &[
            nla(et::ETHTOOL_A_HEADER_DEV_INDEX, &3u32.to_ne_bytes()),
            nla(et::ETHTOOL_A_HEADER_DEV_NAME, &cstr("eth1")),
        ],
    );
    let hw = [
        (0, "tx-scatter-gather", true),
        (16, "tx-tcp-segmentation", true),
        (17, "tx-tcp-ecn-segmentation", false),
        (20, "rx-gro", true),
        (31, "rx-checksum", true),
    ];
    let mut features = header.clone();
    features.extend(nest(et::ETHTOOL_A_FEATURES_HW, &bitset(&hw, false)));
    features.extend(nest(et::ETHTOOL_A_FEATURES_WANTED, &bitset(&hw, true)));
    features.extend(nest(et::ETHTOOL_A_FEATURES_ACTIVE, &bitset(&hw[..3], true)));
    features.extend(nest(
        et::ETHTOOL_A_FEATURES_NOCHANGE,
        &bitset(&[(17, "tx-tcp-ecn-segmentation", true)], true),
    ));
    let mut privflags = header;
    privflags.extend(nest(
        et::ETHTOOL_A_PRIVFLAGS_FLAGS,
        &bitset(&[(0, "legacy-rx", false), (1, "disable-fw-lldp", true)], false),
    ));
    let family = [
        nla(et::CTRL_ATTR_FAMILY_ID, &0x14u16.to_ne_bytes()),
        nla(et::CTRL_ATTR_FAMILY_NAME, &cstr(et::ETHTOOL_GENL_NAME)),
    ]
    .concat();
    let mut family_reply = genl(et::GENL_ID_CTRL, 1, &family);
    family_reply.extend(ack(0));
    let mut features_reply = genl(0x14, et::ETHTOOL_MSG_FEATURES_GET_REPLY, &features);
    features_reply.extend(ack(0));
    let mut done = genl(0x14, et::ETHTOOL_MSG_PRIVFLAGS_GET_REPLY, &privflags);
    done.extend(nlmsg(3, 2, &0i32.to_ne_bytes()));
    vec![
        ("family", family_reply),
        ("features", features_reply),
        ("privflags_done", done),
        ("error", ack(95)),
        ("features_attrs_only", features),
    ]
}

fn rdma_seeds() -> Seeds {
    use rdma::{RdmaAttr, RdmaMessage};
    let dev = |index, name: &str, ndev: &str| {
        rdma::encode(
            RdmaMessage {
                cmd: rdma::RDMA_NLDEV_CMD_GET,
                attrs: vec![
                    RdmaAttr::DevIndex(index),
                    RdmaAttr::DevName(name.into()),
                    RdmaAttr::NdevIndex(index + 10),
                    RdmaAttr::NdevName(ndev.into()),
                ],
            },
            7,
            false,
        )
    };
    let mut dump = dev(1, "mlx5_0", "ens1f0np0");
    dump.extend(dev(2, "mlx5_1", "ens1f1np1"));
    dump.extend(nlmsg(3, 2, &0i32.to_ne_bytes()));
    let mode = rdma::encode(
        RdmaMessage {
            cmd: rdma::RDMA_NLDEV_CMD_SYS_GET,
            attrs: vec![RdmaAttr::NetnsMode(0)],
        },
        8,
        false,
    );
    let mut moved = rdma::encode(
        RdmaMessage {
            cmd: rdma::RDMA_NLDEV_CMD_SET,
            attrs: vec![RdmaAttr::DevIndex(1), RdmaAttr::NetNsFd(9)],
        },
        9,
        false,
    );
    moved.extend(ack(0));
    vec![
        ("device_dump", dump),
        ("netns_mode", mode),
        ("move_ack", moved),
        ("error", ack(95)),
    ]
}

// ------------------------------------------------------------------------------------------
// probe_event: ring-buffer records.

fn record(kind: u32, path: &str, name: &str) -> Vec<u8> {
    use dranet_common::Event;
    let mut ev = Event {
        kind,
        flags: 2,
        ktime_ns: 1_000_000,
        ktime_enter_ns: 999_000,
        ret: 0,
        tgid: 4242,
        pid: 4243,
        netns_inum: 4_026_532_000,
        ifindex: 7,
        netns_cookie: 4096,
        netns2_inum: 4_026_531_840,
        flags2: 12,
        netns2_cookie: 1,
        comm: [0; dranet_common::COMM_LEN],
        name: [0; dranet_common::IFNAME_LEN],
        path: [0; dranet_common::PATH_LEN],
    };
    ev.comm[..5].copy_from_slice(b"crio\0");
    ev.name[..name.len()].copy_from_slice(name.as_bytes());
    ev.path[..path.len()].copy_from_slice(path.as_bytes());
    // SAFETY: Event is `#[repr(C)]` plain old data without padding (dranet-common asserts its
    // size); viewing it as bytes is sound.
    unsafe { std::slice::from_raw_parts((&raw const ev).cast::<u8>(), size_of::<Event>()) }.to_vec()
}

fn probe_event_seeds() -> Seeds {
    use dranet_common::kind;
    vec![
        ("umount", record(kind::UMOUNT, "/run/netns/cni-fuzz", "")),
        ("unlink", record(kind::UNLINK, "/var/run/netns/cni-other", "")),
        ("cleanup_queued", record(kind::NETNS_CLEANUP_QUEUED, "", "")),
        ("netns_put", record(kind::NETNS_PUT, "", "")),
        ("device_move", record(kind::DEV_NETNS_MOVE, "", "eth1")),
        ("nsfs_umount", record(kind::NSFS_UMOUNT, "", "")),
    ]
}

// ------------------------------------------------------------------------------------------
// config: claims' opaque parameters; dhcp: server replies.

// ------------------------------------------------------------------------------------------
// store: checkpoint files, written by hand (formats 1 and 2, a rebuilt record, format-3 record
// files) and broken ones.

fn store_seeds() -> Seeds {
    macro_rules! seed {
        ($name:literal) => {
            (
                $name,
                include_bytes!(concat!("../../fuzz/corpus/store/", $name)).to_vec(),
            )
        };
    }
    vec![
        seed!("v1_attached.json"),
        seed!("v2_two_sandboxes.json"),
        seed!("v2_recovered.json"),
        seed!("v3_record_plan.json"),
        seed!("v3_record_pod.json"),
        seed!("empty_object"),
        seed!("future_version_99"),
        seed!("truncated"),
        seed!("garbage"),
        seed!("hostile_uid"),
    ]
}

fn config_seeds() -> Seeds {
    let s = |x: &str| x.as_bytes().to_vec();
    vec![
        (
            "interface",
            s(r#"{"interface": {"name": "net1", "addresses": ["192.168.50.2/24"], "mtu": 9000}}"#),
        ),
        (
            "routes_rules",
            s(
                r#"{"interface": {"name": "net1"}, "routes": [{"destination": "10.50.0.0/16", "gateway": "192.168.50.1"}], "rules": [{"priority": 100, "table": 200, "source": "192.168.50.0/24"}]}"#,
            ),
        ),
        (
            "ethtool_vrf",
            s(
                r#"{"ethtool": {"features": {"gro": false, "tx-tcp-segmentation": true}, "privateFlags": {"legacy-rx": true}}, "interface": {"vrf": {"name": "blue"}}}"#,
            ),
        ),
        (
            "dhcp",
            s(r#"{"interface": {"dhcp": true, "arpIgnore": 1, "disableEbpfPrograms": true}}"#),
        ),
        (
            "invalid",
            s(r#"{"interface": {"name": "eth%d", "mtu": 10, "nmae": "x"}, "routes": [{"gateway": 7}]}"#),
        ),
    ]
}

fn dhcp_seeds() -> Seeds {
    use dranet::dhcp::message::{Message, MessageType, opt};
    use std::net::Ipv4Addr;
    let mac = [2, 0, 0, 0, 0, 1];
    let discover = Message::request(MessageType::Discover, 0x1234_5678, mac);
    let mut ack = Message::request(MessageType::Ack, 0x1234_5678, mac);
    ack.op = 2;
    ack.yiaddr = Ipv4Addr::new(192, 168, 50, 2);
    ack.siaddr = Ipv4Addr::new(192, 168, 50, 1);
    ack.set_option(opt::SUBNET_MASK, vec![255, 255, 255, 0]);
    ack.set_option(opt::ROUTER, vec![192, 168, 50, 1]);
    ack.set_option(opt::SERVER_ID, vec![192, 168, 50, 1]);
    ack.set_option(opt::LEASE_TIME, 3600u32.to_be_bytes().to_vec());
    // RFC 3442: 10.50.0.0/16 via 192.168.50.1, and an on-link default route.
    ack.set_option(
        opt::CLASSLESS_ROUTE,
        vec![16, 10, 50, 192, 168, 50, 1, 0, 0, 0, 0, 0],
    );
    let mut nak = Message::request(MessageType::Nak, 9, mac);
    nak.op = 2;
    nak.set_option(opt::MESSAGE, b"address not available".to_vec());
    let framed = dranet::dhcp::packet::encode_udp(
        Ipv4Addr::new(192, 168, 50, 1),
        Ipv4Addr::BROADCAST,
        67,
        68,
        &ack.encode(),
    )
    .unwrap();
    vec![
        ("discover", discover.encode()),
        ("ack", ack.encode()),
        ("nak", nak.encode()),
        ("ack_in_udp", framed),
    ]
}

// ------------------------------------------------------------------------------------------

type Entry = fn(&[u8]) -> Result<(), String>;

fn targets() -> Vec<(&'static str, Entry, Seeds)> {
    vec![
        ("nri", dranet::fuzzing::nri_stream as Entry, nri_seeds()),
        ("http", dranet::fuzzing::http_request, http_seeds()),
        ("ethtool", dranet::fuzzing::ethtool_reply, ethtool_seeds()),
        ("rdma", dranet::fuzzing::rdma_reply, rdma_seeds()),
        ("probe_event", dranet::fuzzing::probe_event, probe_event_seeds()),
        ("config", dranet::fuzzing::config_json, config_seeds()),
        ("dhcp", dranet::fuzzing::dhcp_packet, dhcp_seeds()),
        ("store", dranet::fuzzing::checkpoint, store_seeds()),
    ]
}

#[test]
fn seeds_pass_and_the_committed_corpus_replays_clean() {
    let write = std::env::var_os("DRANET_WRITE_SEEDS").is_some();
    let mut total = 0;
    for (target, entry, seeds) in targets() {
        let dir = corpus_dir().join(target);
        for (name, bytes) in &seeds {
            entry(bytes).unwrap_or_else(|e| panic!("seed {target}/{name}: {e}"));
            if write {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join(name), bytes).unwrap();
            }
        }
        let committed: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e} (regenerate with DRANET_WRITE_SEEDS=1)", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        assert!(
            committed.len() >= seeds.len(),
            "{target}: seeds missing from {}",
            dir.display()
        );
        for path in committed {
            let bytes = std::fs::read(&path).unwrap();
            total += bytes.len();
            entry(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
    // "A few KiB": the corpus is for seeding, not for storage.
    assert!(total < 64 << 10, "committed corpus is {total} bytes");
}

/// The decoders see what the seeds mean (so the seeds exercise the deep paths, not errors).
#[test]
fn seeds_decode_to_what_they_say() {
    let eth = ethtool_seeds();
    let replies = et::decode(&eth[1].1).unwrap();
    let et::Reply::Message { attrs, .. } = &replies[0] else {
        panic!("{replies:?}")
    };
    let f = et::Features::decode(attrs).unwrap();
    assert!(f.changeable("rx-gro") && !f.changeable("tx-tcp-ecn-segmentation"));
    assert_eq!(
        et::family_of(&et::decode(&eth[0].1).unwrap()).unwrap(),
        Some(0x14)
    );
    let r = rdma_seeds();
    let devs = rdma::devices_of(&rdma::decode(&r[0].1).unwrap());
    assert_eq!(devs.len(), 2);
    assert_eq!(
        rdma::mode_of(&rdma::decode(&r[1].1).unwrap()),
        Some(rdma::NetnsMode::Exclusive)
    );
    for (name, rec) in probe_event_seeds() {
        assert!(
            dranet::watch::event::decode(&rec, |_| None, |_| None).is_some(),
            "{name}"
        );
    }
    let replay = |b: &[u8]| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(dranet::nri::replay::replay(b, dranet::nri::SyncLimits::default()))
    };
    let s = nri_seeds();
    let r = replay(&s[6].1);
    assert_eq!(r.calls, vec!["Synchronize pods=4 containers=3"]);
    let r = replay(&s[7].1);
    assert_eq!(r.calls, vec!["RunPodSandbox"]);
    assert_eq!(r.check(), Ok(1));
}
