//! Host-side rtnetlink connections: one for requests, and multicast monitors. Callers spawn
//! the returned [`Connection`] on their runtime (it drives the socket) and talk through the
//! [`Handle`].

use futures::channel::mpsc::UnboundedReceiver;
use netlink_packet_core::{NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkExtentMask, LinkMessage};
use netlink_sys::{AsyncSocket, SocketAddr};
pub use rtnetlink::{Handle, MulticastGroup};

/// The future that drives one rtnetlink socket.
pub type Connection = rtnetlink::proto::Connection<RouteNetlinkMessage>;

/// Unsolicited messages of a monitor (multicast) connection.
pub type Messages = UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>;

/// An rtnetlink socket in the calling thread's netns, for requests.
pub fn connect() -> std::io::Result<(Connection, Handle)> {
    let (conn, handle, _) = rtnetlink::new_connection()?;
    Ok((conn, handle))
}

/// An rtnetlink socket subscribed to `groups`. With `rcvbuf`, its receive buffer is forced to
/// that many bytes (`SO_RCVBUFFORCE`: we are root; `SO_RCVBUF` caps at `rmem_max`).
pub fn monitor(
    groups: &[MulticastGroup],
    rcvbuf: Option<usize>,
) -> std::io::Result<(Connection, Handle, Messages)> {
    let (mut conn, handle, messages) = rtnetlink::new_multicast_connection(groups)?;
    if let Some(bytes) = rcvbuf {
        conn.socket_mut().socket_ref().set_rx_buf_sz(bytes)?;
    }
    Ok((conn, handle, messages))
}

/// Host link changes (`RTNLGRP_LINK`), counted and never decoded: all a rescan trigger needs to
/// know is that some link changed. The rtnetlink monitor of [`monitor`] decodes every message into
/// a `LinkMessage` (all its attributes, the IPv6 statistics of `IFLA_AF_SPEC` among them: ~25 KiB
/// of heap each) on the async workers, and a device coming home makes several (issue 41).
pub struct LinkChanges {
    fd: tokio::io::unix::AsyncFd<netlink_sys::Socket>,
    /// One datagram's head: the rest of a longer one is cut off by the kernel, unread.
    buf: [u8; 64],
}

impl LinkChanges {
    /// A socket of the calling thread's netns subscribed to link changes.
    pub fn open() -> std::io::Result<Self> {
        let mut sock = netlink_sys::Socket::new(netlink_sys::constants::NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.add_membership(RTNLGRP_LINK)?;
        sock.set_non_blocking(true)?;
        Ok(Self {
            fd: super::os::async_readable(sock)?,
            buf: [0; 64],
        })
    }

    /// Waits for link changes; returns how many datagrams were read (each carries one or more
    /// changes). An overrun (`ENOBUFS`: changes were lost) counts as one.
    pub async fn next(&mut self) -> std::io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            let mut read = 0;
            loop {
                match guard.get_inner().recv(&mut &mut self.buf[..], libc::MSG_DONTWAIT) {
                    Ok(_) => read += 1,
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => read += 1,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        guard.clear_ready();
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            if read > 0 {
                return Ok(read);
            }
        }
    }
}

/// `RTNLGRP_LINK` (linux/rtnetlink.h).
const RTNLGRP_LINK: u32 = 1;

/// How a blocking dump failed.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("{what}: {step}")]
    Io {
        what: &'static str,
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: undecodable answer: {reason}")]
    Decode { what: &'static str, reason: String },
    #[error("{what}: the kernel refused the dump: {source}")]
    Refused {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// A blocking dump's receive waits at most this long for the kernel's next datagram.
const DUMP_RECV_TIMEOUT_SECS: libc::time_t = 10;
/// A dump interrupted by link changes (`NLM_F_DUMP_INTR`) is started over at most this often;
/// the last one's result is kept if every attempt was interrupted.
const DUMP_ATTEMPTS: u32 = 3;

/// Every link of the calling thread's netns, each decoded on its own and handed to `map` before
/// the next is decoded: the dump's transient memory is one datagram and one decoded message,
/// not every message at once. A decoded link with its `IFLA_AF_SPEC` and attribute vector
/// takes ~25 KiB of heap (the attribute enum is a few hundred bytes), so collecting a 1,024-link
/// dump first held ~25 MiB for a moment, which the allocator then kept fragmented. The IPv6
/// and ICMPv6 statistics of `IFLA_AF_SPEC` are not asked for (`RTEXT_FILTER_SKIP_STATS`):
/// nobody reads them, and the kernel sums them per CPU for every link.
///
/// Blocking: for a thread of its own (the inventory scan's), never an async worker. A dump the
/// kernel marks interrupted (links changed during it) is started over, up to [`DUMP_ATTEMPTS`]
/// times.
pub fn each_link<T>(mut map: impl FnMut(&LinkMessage) -> Option<T>) -> Result<Vec<T>, DumpError> {
    const WHAT: &str = "link dump";
    let io = |step| {
        move |source| DumpError::Io {
            what: WHAT,
            step,
            source,
        }
    };
    let mut sock = netlink_sys::Socket::new(netlink_sys::constants::NETLINK_ROUTE)
        .map_err(io("opening an rtnetlink socket"))?;
    sock.bind_auto().map_err(io("binding the socket"))?;
    crate::sys::ethtool::set_rcv_timeout(&sock, DUMP_RECV_TIMEOUT_SECS)
        .map_err(io("setting a receive timeout"))?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    for attempt in 1..=DUMP_ATTEMPTS {
        out.clear();
        let mut msg = LinkMessage::default();
        msg.attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        send_request(&sock, RouteNetlinkMessage::GetLink(msg), NLM_F_DUMP, attempt)
            .map_err(io("sending the request"))?;
        let interrupted = read_dump(&sock, &mut buf, attempt, &mut |m| {
            if let Some(t) = map(m) {
                out.push(t);
            }
        })?;
        if !interrupted {
            return Ok(out);
        }
    }
    // Links changing all the time: the last dump stands (a rescan follows their events).
    tracing::debug!(
        attempts = DUMP_ATTEMPTS,
        "link dump interrupted every time; keeping the last"
    );
    Ok(out)
}

/// Reads one dump's answers (sequence `seq`) up to its `NLMSG_DONE`, decoding one message at a
/// time. Returns whether the kernel marked any of them interrupted.
fn read_dump(
    sock: &netlink_sys::Socket,
    buf: &mut [u8],
    seq: u32,
    each: &mut dyn FnMut(&LinkMessage),
) -> Result<bool, DumpError> {
    const WHAT: &str = "link dump";
    let mut interrupted = false;
    loop {
        let n = sock.recv(&mut &mut buf[..], 0).map_err(|source| DumpError::Io {
            what: WHAT,
            step: "reading the answer",
            source,
        })?;
        for msg in messages(buf.get(..n).unwrap_or_default()) {
            let msg = msg.map_err(|reason| DumpError::Decode { what: WHAT, reason })?;
            if msg.header.sequence_number != seq {
                continue;
            }
            interrupted |= msg.header.flags & NLM_F_DUMP_INTR != 0;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(interrupted),
                NetlinkPayload::Error(e) => {
                    return Err(DumpError::Refused {
                        what: WHAT,
                        source: e.to_io(),
                    });
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) => each(&m),
                _ => {}
            }
        }
    }
}

/// A request carrying `payload`, with `NLM_F_REQUEST` and `flags`; the sender numbers it.
pub(crate) fn request(payload: RouteNetlinkMessage, flags: u16) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut req = NetlinkMessage::from(payload);
    req.header.flags = NLM_F_REQUEST | flags;
    req
}

/// Sends `payload` as one request (`NLM_F_REQUEST` and `flags`, sequence `seq`) to the kernel on
/// a socket of the fence's own; returns the request's length.
pub(crate) fn send_request(
    sock: &netlink_sys::Socket,
    payload: RouteNetlinkMessage,
    flags: u16,
    seq: u32,
) -> std::io::Result<usize> {
    let mut req = request(payload, flags);
    req.header.sequence_number = seq;
    req.finalize();
    let mut bytes = vec![0u8; req.buffer_len()];
    req.serialize(&mut bytes);
    sock.send_to(&bytes, &SocketAddr::new(0, 0), 0)?;
    Ok(bytes.len())
}

/// The messages the kernel packed into one datagram, decoded one at a time (4-byte aligned);
/// an undecodable one ends the iteration with its reason.
pub(crate) fn messages(
    mut rest: &[u8],
) -> impl Iterator<Item = Result<NetlinkMessage<RouteNetlinkMessage>, String>> + '_ {
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let decoded = NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest).map_err(|e| e.to_string());
        // A length below the header's would never advance.
        let len = decoded
            .as_ref()
            .map_or(0, |m| usize::try_from(m.header.length).unwrap_or(0));
        if len < 16 {
            rest = &[];
            return Some(decoded.and_then(|_| Err(format!("message length {len}"))));
        }
        rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some(decoded)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;
    use netlink_packet_route::link::{AfSpecInet6, AfSpecUnspec};

    /// The per-CPU-summed IPv6 and ICMPv6 statistics in `IFLA_AF_SPEC`, which
    /// `RTEXT_FILTER_SKIP_STATS` leaves out (the link's own `IFLA_STATS64` stays).
    fn has_inet6_stats(m: &LinkMessage) -> bool {
        m.attributes.iter().any(|a| match a {
            LinkAttribute::AfSpecUnspec(specs) => specs.iter().any(|s| match s {
                AfSpecUnspec::Inet6(v) => v
                    .iter()
                    .any(|x| matches!(x, AfSpecInet6::Stats(_) | AfSpecInet6::Icmp6Stats(_))),
                _ => false,
            }),
            _ => false,
        })
    }
    use rtnetlink::LinkVeth;

    fn bytes_of(payload: RouteNetlinkMessage, seq: u32) -> Vec<u8> {
        let mut req = request(payload, 0);
        req.header.sequence_number = seq;
        req.finalize();
        let mut b = vec![0u8; req.buffer_len()];
        req.serialize(&mut b);
        b
    }

    /// A datagram's messages come out one by one; a message whose length is below a header's
    /// is an error that ends the walk (it would never advance).
    #[test]
    fn a_datagram_is_walked_message_by_message_and_a_bad_length_ends_it() {
        let mut link = LinkMessage::default();
        link.attributes.push(LinkAttribute::IfName("abcde".into()));
        let mut dgram = bytes_of(RouteNetlinkMessage::NewLink(link), 7);
        dgram.extend(bytes_of(RouteNetlinkMessage::GetLink(LinkMessage::default()), 8));
        let seqs: Vec<u32> = messages(&dgram)
            .map(|m| m.map(|m| m.header.sequence_number))
            .collect::<Result<_, _>>()
            .unwrap_or_default();
        assert_eq!(seqs, [7, 8]);

        let mut bad = bytes_of(RouteNetlinkMessage::GetLink(LinkMessage::default()), 9);
        let good = bad.len();
        bad.extend(bytes_of(RouteNetlinkMessage::GetLink(LinkMessage::default()), 10));
        // The second message's nlmsg_len (its first 4 bytes) says 8.
        bad[good..good + 4].copy_from_slice(&8u32.to_ne_bytes());
        let out: Vec<_> = messages(&bad).collect();
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(out[0].as_ref().is_ok_and(|m| m.header.sequence_number == 9));
        assert!(out[1].is_err(), "{out:?}");
        assert!(messages(&[]).next().is_none());
    }

    /// Link changes wake [`LinkChanges`] without being decoded: nothing while the netns is quiet,
    /// then at least one datagram for a new pair, and one for a rename; a burst queued before the
    /// read comes out of one wake. Runs in a private netns on its own thread.
    #[test]
    fn link_changes_wake_the_counter_and_a_quiet_netns_does_not() {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("unshare(CLONE_NEWNET): run as root");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut changes = LinkChanges::open().unwrap();
                let quiet = tokio::time::timeout(std::time::Duration::from_millis(200), changes.next()).await;
                assert!(quiet.is_err(), "woke in a quiet netns: {quiet:?}");
                let (conn, handle) = connect().unwrap();
                let task = tokio::spawn(conn);
                for i in 0..5 {
                    let (a, b) = (format!("lc{i}a"), format!("lc{i}b"));
                    handle
                        .link()
                        .add(LinkVeth::new(&a, &b).build())
                        .execute()
                        .await
                        .unwrap();
                }
                let wait = std::time::Duration::from_secs(5);
                let burst = tokio::time::timeout(wait, changes.next()).await.unwrap().unwrap();
                assert!(
                    burst >= 2,
                    "5 new pairs queued before the read came out as {burst} datagrams"
                );
                // Everything queued was read: the next wake is the rename's.
                let quiet = tokio::time::timeout(std::time::Duration::from_millis(200), changes.next()).await;
                assert!(quiet.is_err(), "woke again for the same burst: {quiet:?}");
                let mut msg = LinkMessage::default();
                msg.header.index = index_of("lc0a");
                msg.attributes.push(LinkAttribute::IfName("lc0renamed".into()));
                handle.link().set(msg).execute().await.unwrap();
                let renamed = tokio::time::timeout(wait, changes.next()).await.unwrap().unwrap();
                assert!(renamed >= 1);
                task.abort();
            });
        })
        .join()
        .unwrap();
    }

    fn index_of(name: &str) -> u32 {
        nix::net::if_::if_nametoindex(name).unwrap()
    }

    /// A dump of more links than one datagram carries (the kernel packs ~32 KiB per datagram):
    /// every link comes back exactly once, decoded, and without the statistics nobody reads.
    /// Runs in a private netns on its own thread (it dies with the thread).
    #[test]
    fn a_link_dump_spanning_many_datagrams_is_read_whole_without_statistics() {
        const N: usize = 300;
        let seen = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("unshare(CLONE_NEWNET): run as root");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let (conn, handle) = connect().unwrap();
                let task = tokio::spawn(conn);
                for i in (0..N).step_by(2) {
                    let (a, b) = (format!("dd{i}"), format!("dd{}", i + 1));
                    handle
                        .link()
                        .add(LinkVeth::new(&a, &b).build())
                        .execute()
                        .await
                        .unwrap();
                }
                // The same links through rtnetlink, with statistics: the dump is many datagrams.
                let full: Vec<LinkMessage> = handle.link().get().execute().try_collect().await.unwrap();
                assert_eq!(full.len(), N + 1);
                assert!(full.iter().all(has_inet6_stats), "a plain dump carries them");
                task.abort();
            });
            each_link(|m| {
                let name = m.attributes.iter().find_map(|a| match a {
                    LinkAttribute::IfName(n) => Some(n.clone()),
                    _ => None,
                });
                Some((m.header.index, name, has_inet6_stats(m)))
            })
            .unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(seen.len(), N + 1, "lo and {N} veths");
        let names: std::collections::BTreeSet<String> =
            seen.iter().filter_map(|(_, n, _)| n.clone()).collect();
        assert_eq!(names.len(), N + 1, "each link once");
        for i in 0..N {
            assert!(names.contains(&format!("dd{i}")), "dd{i}");
        }
        assert!(names.contains("lo"));
        assert!(
            seen.iter().all(|(_, _, stats)| !stats),
            "statistics were not asked for"
        );
    }
}
