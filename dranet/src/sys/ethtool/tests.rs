//! Byte-for-byte checks against the kernel uapi (`netlink.h`, `genetlink.h`,
//! `ethtool_netlink.h`): nlmsghdr is len u32, type u16, flags u16, seq u32, pid u32 (host
//! order); genlmsghdr is cmd u8, version u8, reserved u16; NLAs are len u16, type u16, value
//! padded to 4, nests flagged with NLA_F_NESTED (0x8000).
use super::*;
use crate::test_support::{nla, nlmsg_hdr as hdr};

fn nested(ty: u16, parts: &[Vec<u8>]) -> Vec<u8> {
    let inner: Vec<u8> = parts.concat();
    nla(ty | 0x8000, &inner)
}

fn genl(family: u16, flags: u16, seq: u32, cmd: u8, version: u8, attrs: &[u8]) -> Vec<u8> {
    let mut v = hdr(u32::try_from(20 + attrs.len()).unwrap(), family, flags, seq);
    v.extend_from_slice(&[cmd, version, 0, 0]);
    v.extend_from_slice(attrs);
    v
}

#[test]
fn constants_match_the_uapi() {
    // enum order of ethtool_netlink.h (USER_NONE = 0 ... FEATURES_GET = 11).
    assert_eq!(ETHTOOL_MSG_FEATURES_GET, 11);
    assert_eq!(ETHTOOL_MSG_FEATURES_SET, 12);
    assert_eq!(ETHTOOL_MSG_PRIVFLAGS_GET, 13);
    assert_eq!(ETHTOOL_MSG_PRIVFLAGS_SET, 14);
    assert_eq!(ETHTOOL_MSG_FEATURES_GET_REPLY, 11);
    assert_eq!(ETHTOOL_MSG_PRIVFLAGS_GET_REPLY, 14);
    assert_eq!(GENL_ID_CTRL, 16);
    assert_eq!(NETLINK_GENERIC, 16);
}

#[test]
fn family_lookup_names_ethtool() {
    // CTRL_CMD_GETFAMILY (3), version 1, CTRL_ATTR_FAMILY_NAME (2) = "ethtool\0" (8 bytes).
    let want = genl(16, 0x5, 4, 3, 1, &nla(2, b"ethtool\0"));
    assert_eq!(want.len(), 32);
    assert_eq!(get_family(4, "ethtool"), want);
}

#[test]
fn features_get_carries_a_nested_header_with_the_device_name() {
    let attrs = nested(1, &[nla(2, b"eth1\0")]);
    assert_eq!(
        features_get(0x1b, 7, &Dev::Name("eth1".into())),
        genl(0x1b, 0x5, 7, 11, 1, &attrs)
    );
    let attrs = nested(1, &[nla(1, &42u32.to_ne_bytes())]);
    assert_eq!(
        features_get(0x1b, 8, &Dev::Index(42)),
        genl(0x1b, 0x5, 8, 11, 1, &attrs)
    );
}

#[test]
fn features_set_sends_named_bits_without_nomask() {
    let mut want = BTreeMap::new();
    want.insert("rx-gro".to_owned(), true);
    want.insert("tx-tcp-segmentation".to_owned(), false);
    let header = nested(1, &[nla(1, &9u32.to_ne_bytes()), nla(3, &2u32.to_ne_bytes())]);
    let bit_on = nested(1, &[nla(2, b"rx-gro\0"), nla(3, &[])]);
    let bit_off = nested(1, &[nla(2, b"tx-tcp-segmentation\0")]);
    let wanted = nested(3, &[nested(3, &[bit_on, bit_off])]);
    let attrs = [header, wanted].concat();
    let got = features_set(0x1b, 3, &Dev::Index(9), &want);
    assert_eq!(got, genl(0x1b, 0x5, 3, 12, 1, &attrs));
    // The length field covers the whole message.
    assert_eq!(
        u32::from_ne_bytes(got[..4].try_into().unwrap()) as usize,
        got.len()
    );
}

#[test]
fn privflags_requests_use_their_own_commands_and_attribute() {
    let header = nested(1, &[nla(2, b"p0\0")]);
    assert_eq!(
        privflags_get(0x1b, 1, &Dev::Name("p0".into())),
        genl(0x1b, 0x5, 1, 13, 1, &header)
    );
    let mut flags = BTreeMap::new();
    flags.insert("legacy-rx".to_owned(), true);
    let header = nested(1, &[nla(2, b"p0\0"), nla(3, &2u32.to_ne_bytes())]);
    let body = nested(
        2,
        &[nested(3, &[nested(1, &[nla(2, b"legacy-rx\0"), nla(3, &[])])])],
    );
    assert_eq!(
        privflags_set(0x1b, 2, &Dev::Name("p0".into()), &flags),
        genl(0x1b, 0x5, 2, 14, 1, &[header, body].concat())
    );
}

fn bit(index: u32, name: &str, value: bool) -> Vec<u8> {
    let mut parts = vec![
        nla(1, &index.to_ne_bytes()),
        nla(2, format!("{name}\0").as_bytes()),
    ];
    if value {
        parts.push(nla(3, &[]));
    }
    nested(1, &parts)
}

/// A FEATURES_GET_REPLY as the kernel builds it (`features_fill_reply`): HW with a mask
/// (every known feature listed, VALUE on those in hw_features), WANTED/ACTIVE/NOCHANGE as lists
/// (NOMASK, only set bits).
fn features_reply() -> Vec<u8> {
    let header = nested(1, &[nla(1, &5u32.to_ne_bytes()), nla(2, b"veth0\0")]);
    let size = nla(2, &4u32.to_ne_bytes());
    let hw = nested(
        2,
        &[
            size.clone(),
            nested(
                3,
                &[
                    bit(0, "tx-scatter-gather", true),
                    bit(1, "rx-gro", true),
                    bit(2, "rx-lro", false),
                    bit(3, "netns-local", true),
                ],
            ),
        ],
    );
    let list = |ty, bits: Vec<Vec<u8>>| nested(ty, &[nla(1, &[]), size.clone(), nested(3, &bits)]);
    let wanted = list(3, vec![bit(0, "tx-scatter-gather", true)]);
    let active = list(
        4,
        vec![bit(0, "tx-scatter-gather", true), bit(3, "netns-local", true)],
    );
    let nochange = list(5, vec![bit(3, "netns-local", true)]);
    [header, hw, wanted, active, nochange].concat()
}

#[test]
fn a_features_reply_decodes_into_sets() {
    let f = Features::decode(&features_reply()).unwrap();
    assert_eq!(f.hw.len(), 4);
    assert_eq!(f.hw.get("rx-lro"), Some(&false));
    assert!(f.wanted.contains("tx-scatter-gather") && !f.wanted.contains("rx-gro"));
    assert!(f.active.contains("netns-local"));
    assert!(f.changeable("rx-gro"));
    assert!(!f.changeable("rx-lro"), "not in hw_features");
    assert!(!f.changeable("netns-local"), "never-change");
    let snap = f.changeable_wanted();
    assert_eq!(
        snap,
        BTreeMap::from([
            ("rx-gro".to_owned(), false),
            ("tx-scatter-gather".to_owned(), true)
        ])
    );
}

#[test]
fn whole_messages_decode_with_acks_errors_and_several_per_datagram() {
    let reply = genl(0x1b, 0, 7, 11, 1, &features_reply());
    let mut ack = hdr(36, 2, 0, 7);
    ack.extend_from_slice(&0i32.to_ne_bytes());
    ack.extend_from_slice(&hdr(20, 0x1b, 5, 7));
    let mut err = hdr(36, 2, 0, 8);
    err.extend_from_slice(&(-libc::EOPNOTSUPP).to_ne_bytes());
    err.extend_from_slice(&hdr(20, 0x1b, 5, 8));
    let all = [reply, ack, err].concat();
    let r = decode(&all).unwrap();
    assert_eq!(r.len(), 3);
    assert!(matches!(&r[0], Reply::Message { cmd: 11, attrs } if Features::decode(attrs).is_ok()));
    assert_eq!(r[1], Reply::Ack { errno: None });
    assert_eq!(
        r[2],
        Reply::Ack {
            errno: Some(libc::EOPNOTSUPP)
        }
    );
    // A garbage code of i32::MIN: no overflow (found by fuzzing).
    let mut min = hdr(36, 2, 0, 9);
    min.extend_from_slice(&i32::MIN.to_ne_bytes());
    min.extend_from_slice(&hdr(20, 0x1b, 5, 9));
    assert_eq!(
        decode(&min).unwrap(),
        vec![Reply::Ack {
            errno: Some(i32::MAX)
        }]
    );
    // A truncated message is an error, not a panic.
    assert!(decode(&all[..30]).is_err());
    assert!(Features::decode(&[8, 0, 2, 0x80, 0xff, 0xff]).is_err());
}

#[test]
fn a_family_reply_gives_the_id() {
    let attrs = [nla(2, b"ethtool\0"), nla(1, &0x1bu16.to_ne_bytes())].concat();
    let r = decode(&genl(16, 0, 1, 1, 2, &attrs)).unwrap();
    assert_eq!(family_of(&r).unwrap(), Some(0x1b));
}

#[test]
fn compact_bitsets_are_refused() {
    let compact = [
        nla(2, &4u32.to_ne_bytes()),
        nla(4, &[1, 0, 0, 0]),
        nla(5, &[1, 0, 0, 0]),
    ]
    .concat();
    assert!(decode_bitset(&compact).is_err());
}

#[test]
fn private_flags_decode_with_values() {
    let flags = nested(
        2,
        &[
            nla(2, &2u32.to_ne_bytes()),
            nested(
                3,
                &[
                    bit(0, "legacy-rx", true),
                    bit(1, "vf-true-promisc-support", false),
                ],
            ),
        ],
    );
    let got = decode_privflags(&[nested(1, &[nla(1, &3u32.to_ne_bytes())]), flags].concat()).unwrap();
    assert_eq!(
        got,
        BTreeMap::from([
            ("legacy-rx".to_owned(), true),
            ("vf-true-promisc-support".to_owned(), false)
        ])
    );
}

fn veth_like() -> Features {
    let mut f = Features::default();
    for (n, hw) in [
        ("tx-checksum-ipv4", false),
        ("tx-checksum-ip-generic", true),
        ("tx-checksum-ipv6", false),
        ("tx-tcp-segmentation", true),
        ("tx-tcp6-segmentation", true),
        ("tx-tcp-ecn-segmentation", true),
        ("rx-gro", true),
        ("rx-lro", false),
        ("loopback", false),
    ] {
        f.hw.insert(n.to_owned(), hw);
    }
    f.active.insert("tx-checksum-ip-generic".into());
    f.active.insert("tx-tcp-segmentation".into());
    f
}

#[test]
fn kernel_names_and_ethtool_aliases_resolve() {
    let f = veth_like();
    assert_eq!(
        resolve_feature(&f, "rx-gro", true).unwrap(),
        BTreeMap::from([("rx-gro".to_owned(), true)])
    );
    for alias in ["gro", "generic-receive-offload"] {
        assert_eq!(
            resolve_feature(&f, alias, false).unwrap(),
            BTreeMap::from([("rx-gro".to_owned(), false)])
        );
    }
    let tso = resolve_feature(&f, "tso", false).unwrap();
    assert_eq!(
        tso.keys().collect::<Vec<_>>(),
        [
            "tx-tcp-ecn-segmentation",
            "tx-tcp-segmentation",
            "tx-tcp6-segmentation"
        ]
    );
    // `tx` matches fixed checksum features too: under an alias they are skipped.
    assert_eq!(
        resolve_feature(&f, "tx-checksumming", false).unwrap(),
        BTreeMap::from([("tx-checksum-ip-generic".to_owned(), false)])
    );
}

#[test]
fn unknown_and_fixed_features_are_refused() {
    let f = veth_like();
    assert_eq!(
        resolve_feature(&f, "no-such-offload", true),
        Err(NameProblem::Unknown)
    );
    // An alias whose features this kernel does not have at all.
    assert_eq!(resolve_feature(&f, "ntuple", true), Err(NameProblem::Unknown));
    assert_eq!(
        resolve_feature(&f, "lro", true),
        Err(NameProblem::Fixed {
            feature: "rx-lro".into(),
            is: false
        })
    );
    assert_eq!(
        resolve_feature(&f, "loopback", true),
        Err(NameProblem::Fixed {
            feature: "loopback".into(),
            is: false
        })
    );
    // Asking a fixed feature for the state it already has is a no-op, not an error.
    assert_eq!(resolve_feature(&f, "loopback", false), Ok(BTreeMap::new()));
}

#[test]
fn glob_matches_like_the_shell() {
    assert!(glob("tx-tcp*-segmentation", "tx-tcp6-segmentation"));
    assert!(glob("tx-tcp*-segmentation", "tx-tcp-segmentation"));
    assert!(!glob("tx-tcp*-segmentation", "tx-tcp6-segmentation-x"));
    assert!(glob("tx-scatter-gather*", "tx-scatter-gather"));
    assert!(!glob("rx-gro", "rx-gro-hw"));
}
