//! Link operations over rtnetlink (fenced: touches the kernel): snapshot a device's host state,
//! attach (one `RTM_NEWLINK` that moves, renames and sets MTU/MAC/GSO/GRO together), detach
//! (move back through the pinned netns) and full restore, and repair of a device the kernel
//! returned by itself.
//!
//! Offload features and private flags (ethtool) are part of the snapshot and of the restore,
//! through [`crate::sys::ethtool`]: the host's wanted state of every changeable feature is recorded
//! before the move, the claim's `ethtool` block is applied inside the pod after it, and every
//! feature or flag that differs from the snapshot when the device comes home is put back.
//!
//! Everything inside a pod netns goes through a [`Netlink`] whose socket was opened inside that
//! netns (on a throw-away thread, see [`crate::sys::netns::in_netns`]): no tokio worker ever
//! `setns`es.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

use futures::TryStreamExt;
use netlink_packet_core::{NLM_F_ACK, NetlinkPayload};
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage, Prop};
use netlink_packet_route::route::RouteScope;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::{Handle, RouteMessageBuilder};

use crate::config::RouteConfig;
use crate::ids::PodIfindex;
use crate::plan::DevicePlan;
use crate::sys::ethtool::{self, Dev, Ethtool, EthtoolError};
use crate::sys::netns::{Netns, NetnsError};

pub mod address;
mod attach;
mod detach;
mod move_socket;
mod ops;
pub mod parent;
mod snapshot;
mod spec;
pub mod sysctl;
mod vrf;

pub use address::AddrSnapshot;
pub use attach::*;
pub use detach::*;
pub use move_socket::MoveSocket;
pub use ops::*;
pub use snapshot::*;
pub use spec::*;
pub use sysctl::PodSysctl;
use vrf::*;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("interface {0:?} not found")]
    NotFound(String),
    #[error(
        "link {index} is not device {device} by its kernel identity (kind, parent device, permanent MAC)"
    )]
    NotTheDevice { index: u32, device: String },
    #[error("device {name} (mac {mac:?}) is neither in the pod nor in the host")]
    Lost { name: String, mac: Option<String> },
    #[error("netlink {what}")]
    Netlink {
        what: &'static str,
        #[source]
        source: Box<rtnetlink::Error>,
    },
    #[error("opening an rtnetlink socket")]
    Socket(#[source] std::io::Error),
    #[error("netlink {what}: {step}")]
    Transport {
        what: &'static str,
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("netlink {what}: undecodable reply: {reason}")]
    Reply { what: &'static str, reason: String },
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("invalid interface name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("invalid hardware address {0:?}")]
    InvalidMac(String),
    #[error("invalid address {0:?} (want CIDR like 10.0.0.2/24)")]
    InvalidAddress(String),
    #[error("invalid route {0}")]
    InvalidRoute(String),
    #[error("interface name {0:?} is already taken in the pod netns")]
    NameTaken(String),
    #[error("{0}: the blocking task failed")]
    Blocking(&'static str),
    #[error(transparent)]
    Ethtool(#[from] EthtoolError),
    #[error("ethtool.{field}: {reason}")]
    Offload { field: String, reason: String },
    #[error("sysctl {key}: {reason}")]
    Sysctl { key: String, reason: String },
    #[error("interface.vrf {name:?}: {reason}")]
    Vrf { name: String, reason: String },
    #[error(transparent)]
    Ebpf(#[from] crate::sys::bpf::BpfError),
    #[error("{what}: no answer from the kernel within {after:?}")]
    Timeout {
        what: &'static str,
        after: std::time::Duration,
    },
}

impl LinkError {
    /// The kernel's errno for a netlink error, if this is one.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Netlink { source, .. } => errno_of(source),
            _ => None,
        }
    }
}

fn nl(what: &'static str) -> impl FnOnce(rtnetlink::Error) -> LinkError {
    move |source| LinkError::Netlink {
        what,
        source: Box::new(source),
    }
}

/// An rtnetlink connection bound to one netns. Cheap to clone; the connection task ends when
/// the last clone is dropped.
///
/// On a kernel whose link messages cannot name a link's parent device (before 5.15:
/// [`parent::kernel_names_parents`]), it keeps a second fd of its socket, and the links it
/// returns carry `IFLA_PARENT_DEV_BUS_NAME`/`IFLA_PARENT_DEV_NAME` read through ethtool
/// ([`parent::parent_by_ethtool`], in the socket's netns) for every link without a link kind,
/// so every identity check downstream reads the same attributes on every kernel.
#[derive(Clone, Debug)]
pub struct Netlink {
    handle: Handle,
    parents: Option<std::sync::Arc<OwnedFd>>,
}

impl Netlink {
    /// rtnetlink in the driver's own (host) netns, with strict checking of get requests
    /// (`NETLINK_GET_STRICT_CHK`, Linux ≥ 4.20): the kernel then honours a dump's filters, so
    /// [`Netlink::addresses`] gets one link's addresses, not every address of the host (on a
    /// node with 1,024 devices, thousands of messages decoded per attach and per restore).
    /// Every get this socket sends is one the strict checks accept (links by name or index, the
    /// link dump, address dumps). A kernel without it answers as before, and the dump is
    /// filtered here.
    pub async fn host() -> Result<Self, LinkError> {
        use netlink_sys::AsyncSocket as _;
        let (mut conn, handle, _) = rtnetlink::new_connection().map_err(LinkError::Socket)?;
        if let Err(e) = conn.socket_mut().socket_ref().set_netlink_get_strict_chk(true) {
            tracing::debug!(error = %e, "no strict rtnetlink checking: address dumps are filtered in user space");
        }
        let parents = if parent::kernel_names_parents() {
            None
        } else {
            let raw = conn.socket_mut().socket_ref().as_raw_fd();
            // SAFETY: `raw` is the connection's open socket, borrowed only to duplicate it here.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) };
            Some(std::sync::Arc::new(
                fd.try_clone_to_owned().map_err(LinkError::Socket)?,
            ))
        };
        tokio::spawn(conn);
        Ok(Self { handle, parents })
    }

    /// This connection, answering links with their parent device read through ethtool where
    /// the message has none, whatever the kernel (tests of the fallback on a kernel that names
    /// parents itself). `sock` is any socket of the connection's netns.
    #[must_use]
    pub fn with_parent_fallback(mut self, sock: OwnedFd) -> Self {
        self.parents = Some(std::sync::Arc::new(sock));
        self
    }

    /// rtnetlink inside `netns`: the socket is created on a thread inside it.
    pub async fn in_netns(netns: &Netns) -> Result<Self, LinkError> {
        Ok(Self::on_socket(route_socket_in(netns)?, None))
    }

    /// [`Netlink::in_netns`] with the socket's I/O (its connection task) on the runtime `rt`
    /// (default: the caller's), and the same socket kept idle for later connections
    /// ([`PodSocket::connect`]): what the engine keeps for each sandbox it put devices in. The
    /// engine puts a pod's connections on the rescue reactor, so a rescue's requests in the
    /// pod are answered without an async worker.
    pub async fn in_netns_kept(
        netns: &Netns,
        rt: Option<&tokio::runtime::Handle>,
    ) -> Result<(Self, PodSocket), LinkError> {
        let fd = route_socket_in(netns)?;
        let kept = fd.try_clone().map_err(LinkError::Socket)?;
        Ok((Self::on_socket(fd, rt), PodSocket { fd: kept }))
    }

    /// A connection on the netlink socket `fd`, its task spawned on `rt` (default: the
    /// caller's runtime).
    fn on_socket(fd: OwnedFd, rt: Option<&tokio::runtime::Handle>) -> Self {
        // A failed dup only costs the fallback (the links then have no parent, as before it).
        let parents = if parent::kernel_names_parents() {
            None
        } else {
            fd.try_clone().ok().map(std::sync::Arc::new)
        };
        let raw = fd.into_raw_fd();
        // The socket registers with the I/O driver of the runtime entered here.
        let entered = rt.map(tokio::runtime::Handle::enter);
        // SAFETY: `raw` is an owned, non-blocking netlink socket we just released from its
        // OwnedFd; TokioSocket takes over its ownership (and closes it on drop).
        let sock = unsafe { netlink_sys::TokioSocket::from_raw_fd(raw) };
        let (conn, handle, _) = rtnetlink::from_socket(sock);
        match rt {
            Some(rt) => drop(rt.spawn(conn)),
            None => drop(tokio::spawn(conn)),
        }
        drop(entered);
        Self { handle, parents }
    }

    /// The raw handle (for the watcher and tests).
    #[must_use]
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// A link by name.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<LinkMessage>, LinkError> {
        let mut s = self.handle.link().get().match_name(name.to_owned()).execute();
        match s.try_next().await {
            Ok(Some(m)) => Ok(self.with_parents(vec![m]).await?.pop()),
            Ok(None) => Ok(None),
            Err(e) if errno_of(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(nl("get link by name")(e)),
        }
    }

    /// A link by index.
    pub async fn link_by_index(&self, index: u32) -> Result<Option<LinkMessage>, LinkError> {
        let mut s = self.handle.link().get().match_index(index).execute();
        match s.try_next().await {
            Ok(Some(m)) => Ok(self.with_parents(vec![m]).await?.pop()),
            Ok(None) => Ok(None),
            Err(e) if errno_of(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(nl("get link by index")(e)),
        }
    }

    /// Every link.
    pub async fn links(&self) -> Result<Vec<LinkMessage>, LinkError> {
        let all = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(nl("dump links"))?;
        self.with_parents(all).await
    }

    /// `msgs` with the parent device read through ethtool added to each link that has neither a
    /// link kind nor a parent in its message, when this connection keeps a socket for that
    /// ([`Netlink`]); on the blocking pool (the ioctl waits for RTNL). A link renamed or gone
    /// meanwhile, or whose driver info names no device, stays without a parent.
    async fn with_parents(&self, mut msgs: Vec<LinkMessage>) -> Result<Vec<LinkMessage>, LinkError> {
        let Some(sock) = self.parents.clone() else {
            return Ok(msgs);
        };
        let wanted: Vec<(usize, u32, String)> = msgs
            .iter()
            .enumerate()
            .filter(|(_, m)| {
                !m.attributes.iter().any(|a| {
                    matches!(a, LinkAttribute::ParentDevName(_))
                        || matches!(a, LinkAttribute::LinkInfo(i) if kind_of(i).is_some())
                })
            })
            .filter_map(|(i, m)| {
                m.attributes.iter().find_map(|a| match a {
                    LinkAttribute::IfName(n) => Some((i, m.header.index, n.clone())),
                    _ => None,
                })
            })
            .collect();
        if wanted.is_empty() {
            return Ok(msgs);
        }
        let found = off_async("reading parent devices", move || {
            wanted
                .into_iter()
                .filter_map(|(i, index, name)| {
                    match parent::parent_by_ethtool(
                        std::os::fd::AsFd::as_fd(&*sock),
                        &name,
                        index,
                        std::path::Path::new("/sys"),
                    ) {
                        Ok(p) => p.map(|p| (i, p)),
                        Err(e) => {
                            tracing::debug!(link = %name, error = %e, "no parent device through ethtool");
                            None
                        }
                    }
                })
                .collect::<Vec<_>>()
        })
        .await?;
        for (i, (bus, name)) in found {
            if let Some(m) = msgs.get_mut(i) {
                m.attributes.push(LinkAttribute::ParentDevBusName(bus));
                m.attributes.push(LinkAttribute::ParentDevName(name));
            }
        }
        Ok(msgs)
    }

    /// The addresses of link `index`, IPv4 then IPv6: the kernel filters on a strict socket
    /// ([`Netlink::host`]); on any other the dump is of every link, filtered here.
    ///
    /// One dump per family: the kernel answers each under RCU (`RTNL_FLAG_DUMP_UNLOCKED`, Linux
    /// ≥ 6.10), while a dump of every family (`AF_UNSPEC`: `rtnl_dump_all`) holds RTNL, so an
    /// attach's snapshot waited behind every move in flight (`perf` of the churn bench:
    /// `rtnl_dumpit` among the daemon's RTNL waits). Before 6.10 each family's dump holds RTNL
    /// too; the snapshot runs them beside its two ethtool reads, so it waits for RTNL at most
    /// twice in a row there (three times before). A kernel without a family's own handler
    /// answers with every family; only the asked one is kept.
    async fn addresses(&self, index: u32) -> Result<Vec<AddressMessage>, LinkError> {
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut req = self.handle.address().get().set_link_index_filter(index);
            req.message_mut().header.index = index;
            req.message_mut().header.family = family;
            let got: Vec<AddressMessage> = req.execute().try_collect().await.map_err(nl("dump addresses"))?;
            out.extend(got.into_iter().filter(|m| m.header.family == family));
        }
        Ok(out)
    }

    /// Sends one RTM_NEWLINK modifying an existing link (no NLM_F_CREATE/EXCL: `do_setlink`).
    async fn newlink(&self, msg: LinkMessage, what: &'static str) -> Result<(), LinkError> {
        let req = crate::sys::rtnl::request(RouteNetlinkMessage::NewLink(msg), NLM_F_ACK);
        let mut h = self.handle.clone();
        let mut resp = h.request(req).map_err(nl(what))?;
        while let Some(m) = futures::StreamExt::next(&mut resp).await {
            if let Some(done) = ack_of(what, m.payload) {
                return done;
            }
        }
        Ok(())
    }
}

/// What an answer to an `NLM_F_ACK` request says: `Some` for the ack (`Ok`) or the kernel's
/// error; `None` for anything else. Both ways of sending an RTM_NEWLINK read their answer here.
fn ack_of(what: &'static str, payload: NetlinkPayload<RouteNetlinkMessage>) -> Option<Result<(), LinkError>> {
    match payload {
        NetlinkPayload::Error(e) if e.code.is_some() => Some(Err(LinkError::Netlink {
            what,
            source: Box::new(rtnetlink::Error::NetlinkError(e)),
        })),
        NetlinkPayload::Error(_) => Some(Ok(())),
        _ => None,
    }
}

/// An rtnetlink socket opened inside a pod's netns and kept idle: no connection task, no
/// buffers (a connection's reader alone takes 64 KiB, held for as long as the pod runs), one fd.
/// It keeps the return path free of a thread hop into the netns: [`PodSocket::connect`] makes a
/// connection on it when one is needed. One connection at a time: the caller drops one before
/// it makes the next (two would read each other's answers).
#[derive(Debug)]
pub struct PodSocket {
    fd: OwnedFd,
}

impl PodSocket {
    /// A connection on this socket, its task on `rt` (default: the caller's runtime). Answers
    /// an earlier connection left unread (a request it gave up on) are discarded first.
    pub fn connect(&self, rt: Option<&tokio::runtime::Handle>) -> Result<Netlink, LinkError> {
        let fd = self.fd.try_clone().map_err(LinkError::Socket)?;
        discard_pending(&fd);
        Ok(Netlink::on_socket(fd, rt))
    }
}

/// Reads and drops what is queued on the non-blocking netlink socket `fd` (at most 1,024
/// messages: the queue is bounded by the socket's receive buffer anyway).
fn discard_pending(fd: &OwnedFd) {
    let mut buf = [0u8; 1024];
    for _ in 0..1024 {
        // A message longer than `buf` is truncated, and the rest of it dropped (datagram).
        match nix::sys::socket::recv(fd.as_raw_fd(), &mut buf, nix::sys::socket::MsgFlags::MSG_DONTWAIT) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

/// A non-blocking rtnetlink socket created inside `netns` (on its worker thread).
fn route_socket_in(netns: &Netns) -> Result<OwnedFd, LinkError> {
    crate::sys::netns::socket_in(netns, netlink_sys::constants::NETLINK_ROUTE)?.map_err(LinkError::Socket)
}

/// One `RTM_NEWLINK` modifying an existing link of `netns`, sent from the calling thread on a
/// socket of its own and answered before it returns: for the blocking pool. The kernel runs a
/// netlink request in its sender's context, so a netns move's wait for RTNL and its RCU grace
/// periods (tens of ms) hold the sending thread. Sent this way, they hold a pool thread, not
/// the runtime thread that drives a pod's socket, and two returns' moves queue on RTNL side by
/// side instead of one behind the other on that thread.
pub(crate) fn newlink_blocking(netns: &Netns, msg: LinkMessage, what: &'static str) -> Result<(), LinkError> {
    newlink_on(&blocking_route_socket_in(netns)?, msg, what, 1)
}

/// Sets link `index` of the calling thread's netns up or down (as `ops::set_up`), on a blocking
/// socket of its own, answered before it returns: for a blocking-pool thread (the host netns).
pub(crate) fn set_up_blocking(index: u32, up: bool) -> Result<(), LinkError> {
    let what = if up { "set link up" } else { "set link down" };
    let sock = netlink_sys::Socket::new(netlink_sys::constants::NETLINK_ROUTE).map_err(LinkError::Socket)?;
    let mut m = LinkMessage::default();
    m.header.index = index;
    m.header.change_mask = LinkFlags::Up;
    if up {
        m.header.flags = LinkFlags::Up;
    }
    newlink_on(&sock, m, what, 1)
}

/// A blocking rtnetlink socket created inside `netns` (on its worker thread).
fn blocking_route_socket_in(netns: &Netns) -> Result<netlink_sys::Socket, LinkError> {
    let fd = route_socket_in(netns)?;
    // SAFETY: `fd` is an owned netlink socket just released from its OwnedFd; the Socket takes
    // over its ownership and closes it on drop.
    let sock = unsafe { netlink_sys::Socket::from_raw_fd(fd.into_raw_fd()) };
    sock.set_non_blocking(false)
        .map_err(|source| LinkError::Transport {
            what: "opening a socket in the pod netns",
            step: "making the socket blocking",
            source,
        })?;
    Ok(sock)
}

/// One `RTM_NEWLINK` (sequence `seq`) on the blocking socket `sock`, answered before it returns
/// (see [`newlink_blocking`]). Answers to other sequence numbers (left by an earlier request on
/// the same socket) are skipped.
fn newlink_on(
    sock: &netlink_sys::Socket,
    msg: LinkMessage,
    what: &'static str,
    seq: u32,
) -> Result<(), LinkError> {
    let io = |step| move |source| LinkError::Transport { what, step, source };
    let len = crate::sys::rtnl::send_request(sock, RouteNetlinkMessage::NewLink(msg), NLM_F_ACK, seq)
        .map_err(io("sending the request"))?;
    // The kernel has answered by the time the send returns: the ack (an error quotes the
    // request back) is already queued.
    let mut buf = vec![0u8; len + 4096];
    loop {
        let n = sock
            .recv(&mut &mut buf[..], libc::MSG_DONTWAIT)
            .map_err(io("reading the answer"))?;
        for reply in crate::sys::rtnl::messages(buf.get(..n).unwrap_or_default()) {
            let reply = reply.map_err(|reason| LinkError::Reply { what, reason })?;
            if reply.header.sequence_number != seq {
                continue;
            }
            if let Some(done) = ack_of(what, reply.payload) {
                return done;
            }
        }
    }
}

fn errno_of(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;

/// Runs a synchronous kernel call (ethtool genetlink, `/proc/sys` writes) on the blocking pool.
/// Each of them takes RTNL, and behind a netns move that is tens of ms: on an async thread that
/// wait stalled every other hook and return scheduled there.
pub(crate) async fn off_async<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, LinkError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| LinkError::Blocking(what))
}
