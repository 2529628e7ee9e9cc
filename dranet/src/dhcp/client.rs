//! The DHCPv4 exchange over an `AF_PACKET` socket (fenced: syscalls). Blocking: runs on a
//! thread of the blocking pool, never on a tokio worker.
//!
//! Why a packet socket and not a UDP socket bound to port 68: the device has no IPv4 address
//! yet. A UDP send would take its source address from another device of the netns (the kernel's
//! `inet_select_addr` falls back to any address), and a broadcast reply arriving on a device
//! without an address is dropped whenever `rp_filter` is set (`fib_validate_source`), which
//! Debian and most distributions do by default. The packet socket sends and receives whole IP
//! datagrams (`SOCK_DGRAM`: the kernel adds and strips the Ethernet header), bound to the one
//! device, with a classic BPF filter so only UDP to port 68 is queued.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::message::{Message, MessageType, opt};
use super::packet::{self, CLIENT_PORT, SERVER_PORT};
use super::{DhcpError, Lease};
use crate::sys::packet::{PacketSocket, random_xid};

/// Interval between retransmissions of DISCOVER and REQUEST. RFC 2131 §4.1 suggests 4 s with
/// exponential backoff; prepare gives the whole exchange 5 s (as upstream), so we resend every
/// second (also covers a NIC whose carrier comes up a moment after we set it up).
const RETRANSMIT: Duration = Duration::from_secs(1);

/// What we ask the server for (option 55).
const PARAMETERS: [u8; 10] = [
    opt::SUBNET_MASK,
    opt::ROUTER,
    opt::DNS,
    opt::DOMAIN_NAME,
    opt::MTU,
    opt::LEASE_TIME,
    opt::SERVER_ID,
    opt::RENEWAL_TIME,
    opt::REBINDING_TIME,
    opt::CLASSLESS_ROUTE,
];

fn base_request(kind: MessageType, xid: u32, mac: [u8; 6], started: Instant) -> Message {
    let mut m = Message::request(kind, xid, mac);
    m.secs = u16::try_from(started.elapsed().as_secs()).unwrap_or(u16::MAX);
    m.set_option(opt::PARAMETER_LIST, PARAMETERS.to_vec());
    m.set_option(opt::MAX_MESSAGE_SIZE, 1500u16.to_be_bytes().to_vec());
    m
}

fn send(sock: &PacketSocket, m: &Message) -> Result<(), DhcpError> {
    let datagram = packet::encode_udp(
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::BROADCAST,
        CLIENT_PORT,
        SERVER_PORT,
        &m.encode(),
    )
    .ok_or_else(|| DhcpError::Malformed("request too large".into()))?;
    Ok(sock.send_broadcast(&datagram)?)
}

/// A reply to our transaction: a BOOTREPLY from port 67 with our `xid` and hardware address.
fn ours(buf: &[u8], xid: u32, mac: [u8; 6]) -> Result<Option<Message>, DhcpError> {
    let d = packet::decode_udp(buf)?;
    if d.dst_port != CLIENT_PORT || d.src_port != SERVER_PORT {
        return Ok(None);
    }
    let m = Message::decode(d.payload)?;
    if m.op != super::message::BOOTREPLY || m.xid != xid || m.mac() != Some(mac) {
        return Ok(None);
    }
    Ok(Some(m))
}

enum Stage {
    Selecting,
    Requesting { server: Ipv4Addr, offered: Ipv4Addr },
}

/// DISCOVER → OFFER → REQUEST → ACK on `sock` for the device with hardware address `mac`,
/// within `timeout` for the whole exchange. The first valid OFFER is taken. A NAK from the
/// chosen server, or an ACK that cannot be used (no subnet mask, a bad option 121, ...), ends
/// the exchange with an error at once; anything else that is not a reply to us is ignored (the
/// last reason is reported if the time runs out).
pub fn exchange(sock: &PacketSocket, mac: [u8; 6], timeout: Duration) -> Result<Lease, DhcpError> {
    let started = Instant::now();
    let deadline = started + timeout;
    let xid = random_xid()?;
    let mut stage = Stage::Selecting;
    let mut ignored: Option<String> = None;
    send(sock, &base_request(MessageType::Discover, xid, mac, started))?;
    let mut next_send = Instant::now() + RETRANSMIT;
    let mut buf = vec![0u8; 65536];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(DhcpError::Timeout {
                timeout,
                waiting_for: match stage {
                    Stage::Selecting => "DHCPOFFER",
                    Stage::Requesting { .. } => "DHCPACK",
                },
                ignored,
            });
        }
        if now >= next_send {
            let m = match &stage {
                Stage::Selecting => base_request(MessageType::Discover, xid, mac, started),
                Stage::Requesting { server, offered } => request_for(xid, mac, started, *server, *offered),
            };
            send(sock, &m)?;
            next_send = now + RETRANSMIT;
        }
        let wait = deadline.min(next_send).saturating_duration_since(now);
        let Some(n) = sock.recv(&mut buf, wait)? else {
            continue;
        };
        let reply = match ours(&buf[..n.min(buf.len())], xid, mac) {
            Ok(Some(m)) => m,
            Ok(None) => continue,
            Err(e) => {
                ignored = Some(e.to_string());
                continue;
            }
        };
        match (&stage, reply.message_type()) {
            (Stage::Selecting, Some(MessageType::Offer)) => {
                let server = match reply.ip_option(opt::SERVER_ID) {
                    Ok(Some(s)) if !s.is_unspecified() => s,
                    Ok(_) => {
                        ignored = Some("DHCPOFFER without a server identifier (option 54)".into());
                        continue;
                    }
                    Err(e) => {
                        ignored = Some(format!("DHCPOFFER: {e}"));
                        continue;
                    }
                };
                if !usable(reply.yiaddr) {
                    ignored = Some(format!("DHCPOFFER of unusable address {}", reply.yiaddr));
                    continue;
                }
                let offered = reply.yiaddr;
                send(sock, &request_for(xid, mac, started, server, offered))?;
                next_send = Instant::now() + RETRANSMIT;
                stage = Stage::Requesting { server, offered };
            }
            (Stage::Requesting { server, .. }, Some(t @ (MessageType::Ack | MessageType::Nak))) => {
                // RFC 2131 §4.3.2: only the selected server answers our REQUEST; a reply of
                // another server (with our xid) is not for this exchange.
                match reply.ip_option(opt::SERVER_ID) {
                    Ok(Some(s)) if s == *server => {}
                    Ok(None) if t == MessageType::Nak => {}
                    _ => {
                        ignored = Some(format!("{t:?} from another server"));
                        continue;
                    }
                }
                if t == MessageType::Nak {
                    return Err(DhcpError::Nak {
                        server: *server,
                        message: reply.server_message(),
                    });
                }
                return Lease::from_ack(&reply);
            }
            _ => {}
        }
    }
}

fn request_for(xid: u32, mac: [u8; 6], started: Instant, server: Ipv4Addr, offered: Ipv4Addr) -> Message {
    let mut m = base_request(MessageType::Request, xid, mac, started);
    m.set_option(opt::REQUESTED_IP, offered.octets().to_vec());
    m.set_option(opt::SERVER_ID, server.octets().to_vec());
    m
}

/// A unicast host address a device can carry.
pub(super) fn usable(a: Ipv4Addr) -> bool {
    !(a.is_unspecified() || a.is_broadcast() || a.is_multicast() || a.is_loopback())
}
