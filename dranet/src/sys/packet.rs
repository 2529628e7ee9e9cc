//! The `AF_PACKET` socket of the DHCPv4 exchange ([`crate::dhcp`] says why a packet socket):
//! whole IPv4 datagrams sent to and received from one device, a classic BPF filter keeping only
//! UDP to one port. Blocking: used on a thread of the blocking pool inside the pod netns.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// Errors of this module: a socket call failed.
#[derive(Debug, thiserror::Error)]
#[error("packet socket: {what}")]
pub struct PacketError {
    pub what: &'static str,
    #[source]
    pub source: std::io::Error,
}

/// An `AF_PACKET`/`SOCK_DGRAM` socket for IPv4 bound to one device, filtered to one UDP port.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: i32,
}

fn io_err(what: &'static str) -> impl FnOnce(std::io::Error) -> PacketError {
    move |source| PacketError { what, source }
}

fn last_os(what: &'static str) -> PacketError {
    PacketError {
        what,
        source: std::io::Error::last_os_error(),
    }
}

/// Classic BPF over the IP header (a `SOCK_DGRAM` packet socket's filter sees the packet from
/// the network header): accept unfragmented UDP to `port`, drop the rest.
fn udp_port_filter(port: u16) -> [libc::sock_filter; 9] {
    let stmt = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u16, k: u32, jt: u8, jf: u8| libc::sock_filter { code, jt, jf, k };
    [
        stmt(0x30, 9),                     // ldb [9]            (protocol)
        jump(0x15, 17, 0, 6),              // jeq #UDP, next, drop
        stmt(0x28, 6),                     // ldh [6]            (flags, fragment offset)
        jump(0x45, 0x1fff, 4, 0),          // jset #0x1fff, drop, next
        stmt(0xb1, 0),                     // ldxb 4*([0]&0xf)   (header length)
        stmt(0x48, 2),                     // ldh [x+2]          (UDP destination port)
        jump(0x15, u32::from(port), 0, 1), // jeq #port, accept, drop
        stmt(0x06, 0xffff),                // ret #65535 (accept)
        stmt(0x06, 0),                     // ret #0 (drop)
    ]
}

impl PacketSocket {
    /// Opens the socket in the calling thread's netns, bound to `ifindex` of that netns,
    /// queueing only UDP datagrams to `udp_port`.
    pub fn open(ifindex: u32, udp_port: u16) -> Result<Self, PacketError> {
        let ifindex = i32::try_from(ifindex).map_err(|_| PacketError {
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
        let mut filter = udp_port_filter(udp_port);
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
    pub fn send_broadcast(&self, datagram: &[u8]) -> Result<(), PacketError> {
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
    pub fn recv(&self, buf: &mut [u8], wait: Duration) -> Result<Option<usize>, PacketError> {
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
pub fn random_xid() -> Result<u32, PacketError> {
    let mut b = [0u8; 4];
    // SAFETY: getrandom writes at most `b.len()` bytes into the live local `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if usize::try_from(n).ok() != Some(b.len()) {
        return Err(last_os("getrandom"));
    }
    Ok(u32::from_ne_bytes(b))
}
