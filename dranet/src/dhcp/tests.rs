use std::net::Ipv4Addr;

use super::message::{ClasslessRoute, FIXED_LEN, MAGIC_COOKIE, Message, MessageType, opt};
use super::packet::{decode_udp, encode_udp};
use super::*;

const MAC: [u8; 6] = [0x02, 0xd7, 0, 0, 0, 9];

/// A BOOTREPLY laid out by hand (not by `encode`), with `options` after the cookie.
fn reply_bytes(xid: u32, yiaddr: [u8; 4], options: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; FIXED_LEN];
    b[0] = 2;
    b[1] = 1;
    b[2] = 6;
    b[4..8].copy_from_slice(&xid.to_be_bytes());
    b[10] = 0x80;
    b[16..20].copy_from_slice(&yiaddr);
    b[20..24].copy_from_slice(&[10, 77, 0, 1]);
    b[28..34].copy_from_slice(&MAC);
    b[236..240].copy_from_slice(&MAGIC_COOKIE);
    b.extend_from_slice(options);
    b
}

#[test]
fn a_hand_built_ack_decodes_field_by_field() {
    let opts = [
        53, 1, 5, // ACK
        54, 4, 10, 77, 0, 1, // server id
        1, 4, 255, 255, 255, 0, // mask
        3, 8, 10, 77, 0, 1, 10, 77, 0, 2, // routers
        51, 4, 0, 0, 0x0e, 0x10, // 3600 s
        121, 13, 24, 192, 168, 50, 10, 77, 0, 1, 0, 10, 77, 0, 254, // 2 routes
        56, 2, b'h', b'i', 255, 0, 0, 0,
    ];
    let m = Message::decode(&reply_bytes(0xdead_beef, [10, 77, 0, 55], &opts)).unwrap();
    assert_eq!(m.op, 2);
    assert_eq!(m.xid, 0xdead_beef);
    assert_eq!(m.flags, 0x8000);
    assert_eq!(m.yiaddr, Ipv4Addr::new(10, 77, 0, 55));
    assert_eq!(m.siaddr, Ipv4Addr::new(10, 77, 0, 1));
    assert_eq!(m.mac(), Some(MAC));
    assert_eq!(m.message_type(), Some(MessageType::Ack));
    assert_eq!(m.prefix_len().unwrap(), Some(24));
    assert_eq!(
        m.ip_list_option(opt::ROUTER).unwrap(),
        [Ipv4Addr::new(10, 77, 0, 1), Ipv4Addr::new(10, 77, 0, 2)]
    );
    assert_eq!(m.server_message().as_deref(), Some("hi"));
    let lease = Lease::from_ack(&m).unwrap();
    assert_eq!(lease.cidr(), "10.77.0.55/24");
    assert_eq!(lease.server, Some(Ipv4Addr::new(10, 77, 0, 1)));
    assert_eq!(lease.lease_secs, Some(3600));
    assert_eq!(
        lease.routes,
        [
            ClasslessRoute {
                destination: Ipv4Addr::new(192, 168, 50, 0),
                prefix_len: 24,
                router: Ipv4Addr::new(10, 77, 0, 1)
            },
            ClasslessRoute {
                destination: Ipv4Addr::UNSPECIFIED,
                prefix_len: 0,
                router: Ipv4Addr::new(10, 77, 0, 254)
            }
        ]
    );
    let routes = lease.route_configs();
    assert_eq!(routes[0].destination, "192.168.50.0/24");
    assert_eq!(routes[0].gateway, "10.77.0.1");
    assert_eq!(routes[1].destination, "0.0.0.0/0");
    assert_eq!(routes[1].gateway, "10.77.0.254");
    assert_eq!(routes[1].scope, 0);
}

#[test]
fn classless_routes_follow_rfc3442() {
    let with = |v: &[u8]| {
        let mut m = Message::request(MessageType::Ack, 1, MAC);
        m.set_option(opt::CLASSLESS_ROUTE, v.to_vec());
        m.classless_routes()
    };
    // The RFC 3442 §1 table of encodings, each via router 10.0.0.1.
    let r = [10, 0, 0, 1];
    let cases: [(&[u8], [u8; 4], u8); 6] = [
        (&[0], [0, 0, 0, 0], 0),
        (&[8, 10], [10, 0, 0, 0], 8),
        (&[16, 10, 17], [10, 17, 0, 0], 16),
        (&[24, 10, 27, 129], [10, 27, 129, 0], 24),
        (&[25, 10, 229, 0, 128], [10, 229, 0, 128], 25),
        (&[32, 10, 198, 122, 47], [10, 198, 122, 47], 32),
    ];
    for (enc, dest, len) in cases {
        let got = with(&[enc, &r[..]].concat()).unwrap();
        assert_eq!(
            got,
            [ClasslessRoute {
                destination: Ipv4Addr::from(dest),
                prefix_len: len,
                router: Ipv4Addr::from(r)
            }],
            "{enc:?}"
        );
    }
    // On-link router 0.0.0.0 → link-scope route without gateway.
    let mut m = Message::request(MessageType::Ack, 1, MAC);
    m.yiaddr = Ipv4Addr::new(10, 0, 0, 5);
    m.set_option(opt::SUBNET_MASK, vec![255, 255, 255, 255]);
    m.set_option(opt::CLASSLESS_ROUTE, vec![24, 10, 0, 0, 0, 0, 0, 0]);
    let l = Lease::from_ack(&m).unwrap();
    assert_eq!(l.cidr(), "10.0.0.5/32");
    let rc = l.route_configs();
    assert_eq!(
        (rc[0].destination.as_str(), rc[0].gateway.as_str(), rc[0].scope),
        ("10.0.0.0/24", "", 253)
    );
    // Errors, each with a clear reason.
    for (bad, why) in [
        (&[33u8, 10, 0, 0, 0, 1, 2, 3, 4][..], "prefix length 33"),
        (&[24, 10, 0][..], "truncated destination"),
        (&[24, 10, 0, 0, 1, 2][..], "truncated router"),
        (
            &[25, 10, 229, 0, 129, 1, 2, 3, 4][..],
            "bits set beyond the prefix",
        ),
        (&[8, 10, 1, 2, 3, 4, 0][..], "truncated router"),
    ] {
        let e = with(bad).unwrap_err().to_string();
        assert!(e.contains(why), "{bad:?}: {e}");
    }
}

#[test]
fn subnet_masks_must_be_contiguous_and_are_required_in_an_ack() {
    let mask = |m: [u8; 4]| {
        let mut msg = Message::request(MessageType::Ack, 1, MAC);
        msg.set_option(opt::SUBNET_MASK, m.to_vec());
        msg.prefix_len()
    };
    assert_eq!(mask([255, 255, 255, 0]).unwrap(), Some(24));
    assert_eq!(mask([255, 255, 255, 255]).unwrap(), Some(32));
    assert_eq!(mask([0, 0, 0, 0]).unwrap(), Some(0));
    assert_eq!(mask([255, 255, 128, 0]).unwrap(), Some(17));
    assert!(mask([255, 0, 255, 0]).is_err());
    assert!(mask([0, 0, 0, 1]).is_err());
    let mut ack = Message::request(MessageType::Ack, 1, MAC);
    ack.yiaddr = Ipv4Addr::new(10, 0, 0, 5);
    let e = Lease::from_ack(&ack).unwrap_err().to_string();
    assert!(e.contains("no subnet mask"), "{e}");
    ack.set_option(opt::SUBNET_MASK, vec![255, 255, 0]);
    assert!(Lease::from_ack(&ack).is_err());
    ack.set_option(opt::SUBNET_MASK, vec![255, 255, 0, 0]);
    ack.yiaddr = Ipv4Addr::UNSPECIFIED;
    let e = Lease::from_ack(&ack).unwrap_err().to_string();
    assert!(e.contains("not usable"), "{e}");
}

#[test]
fn requests_encode_as_the_rfc_lays_them_out_and_round_trip() {
    let mut m = Message::request(MessageType::Discover, 0x0102_0304, MAC);
    m.set_option(opt::PARAMETER_LIST, vec![1, 3, 121]);
    // Longer than 255 bytes: split into two instances of the code (RFC 3396).
    let long: Vec<u8> = (0..300u16).map(|i| (i % 251) as u8).collect();
    m.set_option(opt::CLIENT_ID, long.clone());
    let b = m.encode();
    assert!(b.len() >= 300);
    assert_eq!(&b[..4], &[1, 1, 6, 0]);
    assert_eq!(&b[4..8], &[1, 2, 3, 4]);
    assert_eq!(&b[10..12], &[0x80, 0]);
    assert_eq!(&b[28..34], &MAC);
    assert_eq!(&b[236..240], &MAGIC_COOKIE);
    assert_eq!(&b[240..243], &[53, 1, 1]);
    assert_eq!(&b[243..248], &[55, 3, 1, 3, 121]);
    assert_eq!(&b[248..250], &[61, 255]);
    assert_eq!(&b[505..507], &[61, 45]);
    assert_eq!(b[552], opt::END);
    let back = Message::decode(&b).unwrap();
    assert_eq!(back, m);
    assert_eq!(back.option(opt::CLIENT_ID), Some(&long[..]));
}

#[test]
fn overloaded_file_and_sname_carry_options() {
    let mut b = reply_bytes(7, [10, 0, 0, 9], &[53, 1, 2, 52, 1, 3, 255]);
    // file (108..236): mask; sname (44..108): server id.
    b[108..114].copy_from_slice(&[1, 4, 255, 255, 0, 0]);
    b[114] = 255;
    b[44..50].copy_from_slice(&[54, 4, 10, 0, 0, 1]);
    b[50] = 255;
    let m = Message::decode(&b).unwrap();
    assert_eq!(m.message_type(), Some(MessageType::Offer));
    assert_eq!(m.prefix_len().unwrap(), Some(16));
    assert_eq!(
        m.ip_option(opt::SERVER_ID).unwrap(),
        Some(Ipv4Addr::new(10, 0, 0, 1))
    );
    let bad = reply_bytes(7, [10, 0, 0, 9], &[52, 1, 4, 255]);
    assert!(
        Message::decode(&bad)
            .unwrap_err()
            .to_string()
            .contains("option 52")
    );
}

#[test]
fn short_or_inconsistent_messages_are_malformed() {
    assert!(Message::decode(&[]).is_err());
    assert!(Message::decode(&[0; FIXED_LEN - 1]).is_err());
    let e = Message::decode(&[0; FIXED_LEN]).unwrap_err().to_string();
    assert!(e.contains("magic cookie"), "{e}");
    let e = Message::decode(&reply_bytes(1, [0; 4], &[53]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no length"), "{e}");
    let e = Message::decode(&reply_bytes(1, [0; 4], &[53, 4, 1]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("runs past the end"), "{e}");
    // No END: the area just ends.
    let m = Message::decode(&reply_bytes(1, [0; 4], &[0, 0, 53, 1, 6])).unwrap();
    assert_eq!(m.message_type(), Some(MessageType::Nak));
    // Repeated codes are concatenated (RFC 3396).
    let m = Message::decode(&reply_bytes(1, [0; 4], &[3, 4, 1, 1, 1, 1, 3, 4, 2, 2, 2, 2])).unwrap();
    assert_eq!(m.ip_list_option(opt::ROUTER).unwrap().len(), 2);
    let m = Message::decode(&reply_bytes(1, [0; 4], &[3, 3, 1, 1, 1, 51, 2, 0, 1])).unwrap();
    assert!(m.ip_list_option(opt::ROUTER).is_err());
    assert!(m.u32_option(opt::LEASE_TIME).is_err());
    assert!(m.message_type().is_none());
}

fn ones_complement_ok(b: &[u8]) -> bool {
    let mut sum: u32 = 0;
    for c in b.chunks(2) {
        let w = u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]);
        sum += u32::from(w);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

#[test]
fn udp_framing_sets_both_checksums_and_decodes_back() {
    let payload = b"hello dhcp!"; // odd length
    let src = Ipv4Addr::UNSPECIFIED;
    let dst = Ipv4Addr::BROADCAST;
    let d = encode_udp(src, dst, 68, 67, payload).unwrap();
    assert_eq!(d.len(), 20 + 8 + payload.len());
    assert_eq!(d[0], 0x45);
    assert_eq!(d[9], 17);
    assert!(ones_complement_ok(&d[..20]), "IP header checksum");
    let udp_len = u16::try_from(8 + payload.len()).unwrap();
    let pseudo = [
        &src.octets()[..],
        &dst.octets()[..],
        &[0, 17],
        &udp_len.to_be_bytes()[..],
        &d[20..],
    ]
    .concat();
    assert!(ones_complement_ok(&pseudo), "UDP checksum");
    let got = decode_udp(&d).unwrap();
    assert_eq!((got.src, got.dst, got.src_port, got.dst_port), (src, dst, 68, 67));
    assert_eq!(got.payload, payload);
    // Trailing link-layer padding past the IP total length is ignored.
    let mut padded = d.clone();
    padded.extend_from_slice(&[0; 7]);
    assert_eq!(decode_udp(&padded).unwrap().payload, payload);
    let mut corrupt = d.clone();
    corrupt[8] ^= 1;
    assert!(decode_udp(&corrupt).unwrap_err().to_string().contains("checksum"));
    let mut frag = d.clone();
    frag[7] = 1;
    let s = !{
        frag[10] = 0;
        frag[11] = 0;
        let mut sum: u32 = frag[..20]
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    };
    frag[10..12].copy_from_slice(&s.to_be_bytes());
    assert!(decode_udp(&frag).unwrap_err().to_string().contains("fragment"));
    assert!(decode_udp(&d[..25]).is_err());
    assert!(encode_udp(src, dst, 1, 2, &vec![0; 70_000]).is_none());
}

/// xorshift64*: deterministic pseudo-random bytes for the no-panic test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn poke_everything(m: &Message) {
    let _ = m.message_type();
    let _ = m.mac();
    let _ = m.prefix_len();
    let _ = m.classless_routes();
    let _ = m.ip_list_option(opt::ROUTER);
    let _ = m.ip_option(opt::SERVER_ID);
    let _ = m.u32_option(opt::LEASE_TIME);
    let _ = m.server_message();
    if let Ok(l) = Lease::from_ack(m) {
        let _ = l.route_configs();
        let _ = l.cidr();
    }
    // What decodes must encode and decode again to the same message (encode never overloads
    // `file`/`sname`, so only without option 52).
    if m.option(opt::OVERLOAD).is_none() {
        let again = Message::decode(&m.encode()).unwrap();
        assert_eq!(&again, m);
    }
}

#[test]
fn random_bytes_never_panic_the_decoders() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let valid = {
        let opts = [
            53, 1, 5, 54, 4, 10, 0, 0, 1, 1, 4, 255, 255, 255, 0, 121, 8, 24, 10, 1, 2, 10, 0, 0, 1, 52, 1,
            3, 255,
        ];
        let mut b = reply_bytes(5, [10, 0, 0, 7], &opts);
        b[108..114].copy_from_slice(&[3, 4, 10, 0, 0, 1]);
        b
    };
    let framed = encode_udp(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::BROADCAST, 67, 68, &valid).unwrap();
    let mut decoded = 0;
    for i in 0..30_000 {
        let buf: Vec<u8> = match i % 3 {
            // Pure noise, any length (short ones hit the length checks).
            0 => {
                let len = rng.below(700);
                (0..len).map(|_| rng.next() as u8).collect()
            }
            // A valid message with a few bytes changed and maybe truncated: reaches the options.
            1 => {
                let mut b = valid.clone();
                for _ in 0..=rng.below(6) {
                    let at = FIXED_LEN - 4 + rng.below(b.len() - FIXED_LEN + 4);
                    b[at] = rng.next() as u8;
                }
                if rng.below(3) == 0 {
                    b.truncate(rng.below(b.len() + 1));
                }
                b
            }
            // A valid framed datagram, corrupted.
            _ => {
                let mut b = framed.clone();
                let at = rng.below(b.len());
                b[at] = rng.next() as u8;
                if rng.below(2) == 0 {
                    b.truncate(rng.below(b.len() + 1));
                }
                b
            }
        };
        if let Ok(m) = Message::decode(&buf) {
            decoded += 1;
            poke_everything(&m);
        }
        if let Ok(d) = decode_udp(&buf)
            && let Ok(m) = Message::decode(d.payload)
        {
            poke_everything(&m);
        }
    }
    // The mutation half must mostly reach the option parser, not stop at the cookie.
    assert!(decoded > 1_000, "only {decoded} decoded");
}
