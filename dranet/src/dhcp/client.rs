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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use super::message::{Message, MessageType, opt};
use super::packet::{self, CLIENT_PORT, SERVER_PORT};
use super::{DhcpError, Lease};

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

/// An `AF_PACKET`/`SOCK_DGRAM` socket for IPv4 bound to one device, filtered to UDP port 68.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: i32,
}

fn io_err(what: &'static str) -> impl FnOnce(std::io::Error) -> DhcpError {
    move |source| DhcpError::Socket { what, source }
}

fn last_os(what: &'static str) -> DhcpError {
    DhcpError::Socket {
        what,
        source: std::io::Error::last_os_error(),
    }
}

/// Classic BPF over the IP header (a `SOCK_DGRAM` packet socket's filter sees the packet from
/// the network header): accept unfragmented UDP to port 68, drop the rest.
fn udp_68_filter() -> [libc::sock_filter; 9] {
    let stmt = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u16, k: u32, jt: u8, jf: u8| libc::sock_filter { code, jt, jf, k };
    [
        stmt(0x30, 9),                            // ldb [9]            (protocol)
        jump(0x15, 17, 0, 6),                     // jeq #UDP, next, drop
        stmt(0x28, 6),                            // ldh [6]            (flags, fragment offset)
        jump(0x45, 0x1fff, 4, 0),                 // jset #0x1fff, drop, next
        stmt(0xb1, 0),                            // ldxb 4*([0]&0xf)   (header length)
        stmt(0x48, 2),                            // ldh [x+2]          (UDP destination port)
        jump(0x15, u32::from(CLIENT_PORT), 0, 1), // jeq #68, accept, drop
        stmt(0x06, 0xffff),                       // ret #65535 (accept)
        stmt(0x06, 0),                            // ret #0 (drop)
    ]
}

impl PacketSocket {
    /// Opens the socket in the calling thread's netns, bound to `ifindex` of that netns.
    pub fn open(ifindex: u32) -> Result<Self, DhcpError> {
        let ifindex = i32::try_from(ifindex).map_err(|_| DhcpError::Socket {
            what: "ifindex",
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        })?;
        let proto = (libc::ETH_P_IP as u16).to_be();
        // SAFETY: plain socket(2) call; the result is checked before use.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                i32::from(proto),
            )
        };
        if raw < 0 {
            return Err(last_os("socket(AF_PACKET)"));
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut filter = udp_68_filter();
        let prog = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_mut_ptr(),
        };
        // SAFETY: SO_ATTACH_FILTER copies the `sock_fprog` and the instructions it points at
        // (both live locals) during the call; `fd` is an open socket.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                (&raw const prog).cast(),
                std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(last_os("SO_ATTACH_FILTER"));
        }
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex;
        // SAFETY: bind reads `size_of::<sockaddr_ll>()` bytes from the live local `sll`.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const sll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(last_os("bind(AF_PACKET)"));
        }
        let sock = Self { fd, ifindex };
        // Packets of other devices queued between socket() and bind(): drop them.
        let mut buf = [0u8; 64];
        while sock.recv_now(&mut buf).is_some() {}
        Ok(sock)
    }

    fn recv_now(&self, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: recv writes at most `buf.len()` bytes into `buf`.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        usize::try_from(n).ok()
    }

    /// Sends one IP datagram to the Ethernet broadcast address.
    pub fn send_broadcast(&self, datagram: &[u8]) -> Result<(), DhcpError> {
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        sll.sll_ifindex = self.ifindex;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&[0xff; 6]);
        // SAFETY: sendto reads `datagram.len()` bytes from `datagram` and the address from the
        // live local `sll`.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                datagram.as_ptr().cast(),
                datagram.len(),
                0,
                (&raw const sll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(last_os("sendto(AF_PACKET)"));
        }
        Ok(())
    }

    /// Waits up to `wait` for one datagram; `Ok(None)` when the time ran out.
    pub fn recv(&self, buf: &mut [u8], wait: Duration) -> Result<Option<usize>, DhcpError> {
        let ms = i32::try_from(wait.as_millis().max(1)).unwrap_or(i32::MAX);
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll reads and writes the one live local `pfd`.
        let rc = unsafe { libc::poll(&raw mut pfd, 1, ms) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(None);
            }
            return Err(io_err("poll")(e));
        }
        if rc == 0 {
            return Ok(None);
        }
        Ok(self.recv_now(buf))
    }
}

/// A random transaction id (`getrandom(2)`).
pub fn random_xid() -> Result<u32, DhcpError> {
    let mut b = [0u8; 4];
    // SAFETY: getrandom writes at most `b.len()` bytes into the live local `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if usize::try_from(n).ok() != Some(b.len()) {
        return Err(last_os("getrandom"));
    }
    Ok(u32::from_ne_bytes(b))
}

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
    sock.send_broadcast(&datagram)
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
