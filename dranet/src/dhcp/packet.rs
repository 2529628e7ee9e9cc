//! IPv4 + UDP framing of DHCP messages for the packet socket (pure, no I/O). The client sends
//! and receives whole IP datagrams because the device has no IPv4 address yet: the kernel's UDP
//! path would pick a source address of another device and, with `rp_filter` on, drop replies
//! arriving on an address-less device.

use std::net::Ipv4Addr;

use super::DhcpError;

pub const CLIENT_PORT: u16 = 68;
pub const SERVER_PORT: u16 = 67;
const IPPROTO_UDP: u8 = 17;
const IPV4_HEADER: usize = 20;
const UDP_HEADER: usize = 8;

/// A received UDP datagram (addresses and ports from the headers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Datagram<'a> {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub src_port: u16,
    pub dst_port: u16,
    pub payload: &'a [u8],
}

/// RFC 1071 one's-complement sum of `parts`, folded, not inverted.
fn ones_sum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    for part in parts {
        let mut chunks = part.chunks_exact(2);
        for c in &mut chunks {
            sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        if let [last] = chunks.remainder() {
            sum += u32::from(u16::from_be_bytes([*last, 0]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
    }
    // Folded above: fits 16 bits.
    u16::try_from(sum).unwrap_or(u16::MAX)
}

/// An IPv4 header (no options, TTL 64, DF clear) + UDP header + `payload`, both checksums set.
/// `None` if the datagram would exceed 65535 bytes.
#[must_use]
pub fn encode_udp(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
    payload: &[u8],
) -> Option<Vec<u8>> {
    let udp_len = u16::try_from(UDP_HEADER + payload.len()).ok()?;
    let total = u16::try_from(IPV4_HEADER + UDP_HEADER + payload.len()).ok()?;
    let mut b = Vec::with_capacity(usize::from(total));
    b.extend_from_slice(&[0x45, 0]);
    b.extend_from_slice(&total.to_be_bytes());
    b.extend_from_slice(&[0, 0, 0, 0, 64, IPPROTO_UDP, 0, 0]);
    b.extend_from_slice(&src.octets());
    b.extend_from_slice(&dst.octets());
    let ip_sum = !ones_sum(&[&b[..IPV4_HEADER]]);
    b[10..12].copy_from_slice(&ip_sum.to_be_bytes());

    let mut udp = Vec::with_capacity(UDP_HEADER);
    udp.extend_from_slice(&src_port.to_be_bytes());
    udp.extend_from_slice(&dst_port.to_be_bytes());
    udp.extend_from_slice(&udp_len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    let pseudo = [
        &src.octets()[..],
        &dst.octets()[..],
        &[0, IPPROTO_UDP],
        &udp_len.to_be_bytes()[..],
    ]
    .concat();
    let mut udp_sum = !ones_sum(&[&pseudo, &udp, payload]);
    if udp_sum == 0 {
        // 0 means "no checksum" in UDP over IPv4 (RFC 768).
        udp_sum = 0xffff;
    }
    udp[6..8].copy_from_slice(&udp_sum.to_be_bytes());
    b.extend_from_slice(&udp);
    b.extend_from_slice(payload);
    Some(b)
}

fn bad(why: impl Into<String>) -> DhcpError {
    DhcpError::Malformed(why.into())
}

/// Parses an IPv4 datagram carrying UDP. The IP header checksum is verified; the UDP checksum
/// is not: on veth and with checksum offload a packet socket sees the datagram before the
/// checksum is filled in (`TP_STATUS_CSUMNOTREADY`), and the DHCP layer checks `xid`, `op` and
/// the client address anyway. Fragments are refused (DHCP replies fit one datagram).
pub fn decode_udp(b: &[u8]) -> Result<Datagram<'_>, DhcpError> {
    let Some(&vihl) = b.first() else {
        return Err(bad("empty packet"));
    };
    if vihl >> 4 != 4 {
        return Err(bad(format!("IP version {}, not 4", vihl >> 4)));
    }
    let ihl = usize::from(vihl & 0x0f) * 4;
    if ihl < IPV4_HEADER || b.len() < ihl {
        return Err(bad(format!(
            "IPv4 header length {ihl} in a {}-byte packet",
            b.len()
        )));
    }
    let header = &b[..ihl];
    if ones_sum(&[header]) != 0xffff {
        return Err(bad("IPv4 header checksum mismatch"));
    }
    let total = usize::from(u16::from_be_bytes([b[2], b[3]]));
    if total < ihl || total > b.len() {
        return Err(bad(format!(
            "IPv4 total length {total} in a {}-byte packet",
            b.len()
        )));
    }
    let frag = u16::from_be_bytes([b[6], b[7]]);
    if frag & 0x3fff != 0 {
        return Err(bad("IPv4 fragment"));
    }
    if b[9] != IPPROTO_UDP {
        return Err(bad(format!("IP protocol {}, not UDP", b[9])));
    }
    let ip = |at: usize| Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3]);
    let (src, dst) = (ip(12), ip(16));
    let udp = &b[ihl..total];
    if udp.len() < UDP_HEADER {
        return Err(bad("truncated UDP header"));
    }
    let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    if udp_len < UDP_HEADER || udp_len > udp.len() {
        return Err(bad(format!(
            "UDP length {udp_len} in a {}-byte datagram",
            udp.len()
        )));
    }
    Ok(Datagram {
        src,
        dst,
        src_port: u16::from_be_bytes([udp[0], udp[1]]),
        dst_port: u16::from_be_bytes([udp[2], udp[3]]),
        payload: &udp[UDP_HEADER..udp_len],
    })
}
