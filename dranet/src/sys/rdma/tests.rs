//! Byte-for-byte checks against the kernel uapi (`rdma_netlink.h`, `netlink.h`): nlmsghdr is
//! len u32, type u16, flags u16, seq u32, pid u32 (host order); no family header; NLAs are
//! len u16, type u16, value padded to 4.
use super::*;
use crate::test_support::{nla, nlmsg_hdr as hdr};

#[test]
fn message_types_match_the_uapi() {
    assert_eq!(nl_type(RDMA_NLDEV_CMD_GET), 5121);
    assert_eq!(nl_type(RDMA_NLDEV_CMD_SET), 5122);
    assert_eq!(nl_type(RDMA_NLDEV_CMD_SYS_GET), 5126);
    assert_eq!(nl_type(RDMA_NLDEV_CMD_SYS_SET), 5127);
}

#[test]
fn sys_get_is_a_bare_header() {
    // NLM_F_REQUEST (1) | NLM_F_ACK (4)
    assert_eq!(sys_get(7), hdr(16, 5126, 0x5, 7));
}

#[test]
fn device_dump_sets_nlm_f_dump() {
    // NLM_F_DUMP = NLM_F_ROOT (0x100) | NLM_F_MATCH (0x200)
    assert_eq!(dev_dump(1), hdr(16, 5121, 0x305, 1));
}

#[test]
fn a_move_carries_the_device_index_and_the_netns_fd() {
    let mut want = hdr(32, 5122, 0x5, 9);
    want.extend(nla(1, &3u32.to_ne_bytes()));
    want.extend(nla(68, &11u32.to_ne_bytes()));
    assert_eq!(dev_move(9, 3, 11), want);
}

#[test]
fn a_device_dump_reply_decodes() {
    // Two devices as the kernel sends them (nldev_fill_dev_info: DEV_INDEX, DEV_NAME, then more
    // attributes we keep raw), NLM_F_MULTI, then NLMSG_DONE.
    let mut payload1 = nla(1, &0u32.to_ne_bytes());
    payload1.extend(nla(2, b"mlx5_0\0"));
    payload1.extend(nla(3, &1u32.to_ne_bytes())); // PORT_INDEX, unknown to us
    let mut payload2 = nla(1, &1u32.to_ne_bytes());
    payload2.extend(nla(2, b"rxe0\0"));
    let mut buf = hdr(u32::try_from(16 + payload1.len()).unwrap(), 5121, 0x2, 1);
    buf.extend(&payload1);
    buf.extend(hdr(u32::try_from(16 + payload2.len()).unwrap(), 5121, 0x2, 1));
    buf.extend(&payload2);
    let mut done = hdr(20, 3, 0x2, 1);
    done.extend(0i32.to_ne_bytes());
    buf.extend(done);
    let r = decode(&buf).unwrap();
    assert_eq!(r.len(), 3);
    assert_eq!(r[2], Reply::Done);
    assert_eq!(
        devices_of(&r),
        vec![
            RdmaDevice {
                index: 0,
                name: "mlx5_0".into()
            },
            RdmaDevice {
                index: 1,
                name: "rxe0".into()
            }
        ]
    );
    match &r[0] {
        Reply::Message(m) => {
            assert_eq!(m.cmd, RDMA_NLDEV_CMD_GET);
            assert!(matches!(&m.attrs[2], RdmaAttr::Other(n) if n.kind() == 3));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn sys_get_reply_gives_the_mode_and_errors_carry_errno() {
    for (v, mode) in [(0u8, NetnsMode::Exclusive), (1, NetnsMode::Shared)] {
        let payload = nla(66, &[v]);
        let mut buf = hdr(u32::try_from(16 + payload.len()).unwrap(), 5126, 0, 2);
        buf.extend(payload);
        assert_eq!(mode_of(&decode(&buf).unwrap()), Some(mode));
    }
    // NLMSG_ERROR (2) with -EOPNOTSUPP and the original header echoed.
    let mut err = hdr(36, 2, 0, 3);
    err.extend((-libc::EOPNOTSUPP).to_ne_bytes());
    err.extend(hdr(16, 5122, 0x5, 3));
    assert_eq!(
        decode(&err).unwrap(),
        vec![Reply::Ack {
            errno: Some(libc::EOPNOTSUPP)
        }]
    );
    // An ACK: error 0.
    let mut ack = hdr(36, 2, 0, 3);
    ack.extend(0i32.to_ne_bytes());
    ack.extend(hdr(16, 5122, 0x5, 3));
    assert_eq!(decode(&ack).unwrap(), vec![Reply::Ack { errno: None }]);
    // A garbage code of i32::MIN: no overflow (found by fuzzing).
    let mut min = hdr(36, 2, 0, 3);
    min.extend(i32::MIN.to_ne_bytes());
    min.extend(hdr(16, 5122, 0x5, 3));
    assert_eq!(
        decode(&min).unwrap(),
        vec![Reply::Ack {
            errno: Some(i32::MAX)
        }]
    );
}

#[test]
fn truncated_replies_are_errors_not_panics() {
    let mut buf = hdr(40, 5121, 0, 1);
    buf.extend(nla(1, &0u32.to_ne_bytes()));
    assert!(decode(&buf).is_err());
    let mut bad_nla = hdr(24, 5121, 0, 1);
    bad_nla.extend([0xff, 0x00, 0x01, 0x00, 0, 0, 0, 0]);
    assert!(decode(&bad_nla).is_err());
    assert!(decode(&[1, 2, 3]).unwrap().is_empty());
}

#[test]
fn attributes_round_trip_through_the_encoder() {
    let msg = RdmaMessage {
        cmd: RDMA_NLDEV_CMD_SET,
        attrs: vec![
            RdmaAttr::DevIndex(4),
            RdmaAttr::DevName("ibp1s0".into()),
            RdmaAttr::NetNsFd(12),
        ],
    };
    let bytes = encode(msg.clone(), 5, false);
    match &decode(&bytes).unwrap()[..] {
        [Reply::Message(m)] => assert_eq!(m, &msg),
        other => panic!("{other:?}"),
    }
}

#[test]
fn this_kernel_without_rdma_reports_it_cleanly() {
    // No RDMA subsystem here: either the protocol is missing or there are no devices; never a panic.
    match host_mode() {
        Ok(None) | Ok(Some(_)) => {}
        Err(e) => panic!("{e}"),
    }
}
