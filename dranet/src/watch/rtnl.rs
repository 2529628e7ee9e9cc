//! rtnetlink monitor in the host netns: links appearing, changing, leaving (with the target
//! nsid) or being deleted, and peer netns ids being added or removed. Also answers nsid queries
//! (RTM_GETNSID / RTM_NEWNSID with NETNSA_FD) so nsids map to netns identities.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use futures::StreamExt;
use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::nsid::{NsidAttribute, NsidMessage};
use rtnetlink::{Handle, MulticastGroup};

use super::event::{EventKind, LifecycleEvent, Source};
use super::mono_now;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum RtnlError {
    #[error("opening the rtnetlink monitor socket")]
    Socket(#[source] std::io::Error),
    #[error("rtnetlink request {what} failed: {detail}")]
    Request { what: &'static str, detail: String },
}

/// A host link the monitor knows.
#[derive(Clone, Copy, Debug)]
struct KnownLink {
    name: IfName,
    up: bool,
}

/// A link name kept inline (a kernel link name is at most 15 bytes: IFNAMSIZ with its NUL). The
/// table holds one per host link for the daemon's life; heap copies, made again each time a
/// device comes back from a pod, would sit among a drain's short-lived memory and keep those
/// pages from being given back after it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct IfName {
    len: u8,
    bytes: [u8; 15],
}

impl IfName {
    /// `name`, cut to 15 bytes at a character boundary (the kernel never sends a longer one).
    fn new(name: &str) -> Self {
        let kept = crate::text::cut_at_char(name, 15).as_bytes();
        let mut bytes = [0; 15];
        bytes[..kept.len()].copy_from_slice(kept);
        Self {
            len: kept.len() as u8,
            bytes,
        }
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl std::fmt::Debug for IfName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// The monitor's view of host links, used to tell new links from changes and to name deletions.
#[derive(Default)]
pub struct LinkTable {
    links: HashMap<u32, KnownLink>,
}

/// A link-layer address as the events carry it: the rule of the snapshots it is compared with
/// ([`crate::mac::Mac::from_kernel`]: any length, IPoIB's 20 bytes too; none when all zeros).
fn mac_string(bytes: &[u8]) -> Option<String> {
    crate::mac::Mac::from_kernel(bytes).map(|m| m.to_string())
}

struct LinkInfo {
    ifindex: u32,
    name: String,
    up: bool,
    mac: Option<String>,
    perm_mac: Option<String>,
    new_nsid: Option<i32>,
    new_ifindex: Option<i32>,
    parent: Option<String>,
    kind: Option<String>,
}

fn link_info(msg: &LinkMessage) -> LinkInfo {
    let mut info = LinkInfo {
        ifindex: msg.header.index,
        name: String::new(),
        up: msg.header.flags.contains(LinkFlags::Up),
        mac: None,
        perm_mac: None,
        new_nsid: None,
        new_ifindex: None,
        parent: None,
        kind: None,
    };
    let mut bus = None;
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => info.name.clone_from(n),
            LinkAttribute::Address(a) => info.mac = mac_string(a),
            LinkAttribute::PermAddress(a) => info.perm_mac = mac_string(a),
            LinkAttribute::NewNetnsId(id) => info.new_nsid = Some(*id),
            LinkAttribute::NewIfIndex(i) => info.new_ifindex = Some(*i),
            LinkAttribute::ParentDevBusName(b) => bus = Some(b.clone()),
            LinkAttribute::ParentDevName(n) => info.parent = Some(n.clone()),
            LinkAttribute::LinkInfo(infos) => {
                info.kind = infos.iter().find_map(|i| match i {
                    netlink_packet_route::link::LinkInfo::Kind(k) => Some(k.to_string()),
                    _ => None,
                });
            }
            _ => {}
        }
    }
    info.parent = info.parent.map(|p| format!("{}/{p}", bus.unwrap_or_default()));
    // Before Linux 5.15 no link message names a parent device: a physical device's (no link
    // kind) is read through ethtool, as every snapshot there records it (`sys::link::parent`).
    if info.parent.is_none() && info.kind.is_none() && !info.name.is_empty() {
        info.parent = crate::sys::link::parent::parent_here(&info.name, info.ifindex);
    }
    info
}

impl LinkTable {
    /// Turns one rtnetlink message into an event (or none for uninteresting changes).
    pub fn handle(&mut self, msg: &RouteNetlinkMessage) -> Option<EventKind> {
        match msg {
            RouteNetlinkMessage::NewLink(m) => {
                let info = link_info(m);
                let known = KnownLink {
                    name: IfName::new(&info.name),
                    up: info.up,
                };
                match self.links.insert(info.ifindex, known) {
                    None => Some(EventKind::LinkAppeared {
                        ifindex: info.ifindex,
                        name: info.name,
                        up: info.up,
                        mac: info.mac,
                        perm_mac: info.perm_mac,
                        parent: info.parent,
                        kind: info.kind,
                    }),
                    Some(old) if old.name.as_str() != info.name || old.up != info.up => {
                        Some(EventKind::LinkChanged {
                            ifindex: info.ifindex,
                            name: info.name,
                            up: info.up,
                        })
                    }
                    Some(_) => None,
                }
            }
            RouteNetlinkMessage::DelLink(m) => {
                let info = link_info(m);
                let old = self.links.remove(&info.ifindex);
                let name = if info.name.is_empty() {
                    old.map(|o| o.name.as_str().to_owned()).unwrap_or_default()
                } else {
                    info.name
                };
                Some(match info.new_nsid {
                    Some(nsid) => EventKind::LinkLeftHost {
                        ifindex: info.ifindex,
                        name,
                        nsid,
                        new_ifindex: info.new_ifindex,
                        to: None,
                    },
                    None => EventKind::LinkDeleted {
                        ifindex: info.ifindex,
                        name,
                    },
                })
            }
            RouteNetlinkMessage::NewNsId(m) => {
                nsid_of(m).map(|nsid| EventKind::NsidAdded { nsid, netns: None })
            }
            RouteNetlinkMessage::DelNsId(m) => {
                nsid_of(m).map(|nsid| EventKind::NsidRemoved { nsid, netns: None })
            }
            _ => None,
        }
    }

    /// Seeds the table from a link dump (no events).
    pub fn seed(&mut self, msg: &LinkMessage) {
        let info = link_info(msg);
        self.links.insert(
            info.ifindex,
            KnownLink {
                name: IfName::new(&info.name),
                up: info.up,
            },
        );
    }
}

fn nsid_of(m: &NsidMessage) -> Option<i32> {
    m.attributes.iter().find_map(|a| match a {
        NsidAttribute::Id(id) => Some(*id),
        _ => None,
    })
}

/// A running monitor: its request handle and the unsolicited message stream.
pub struct Monitor {
    pub handle: Handle,
    pub messages: crate::sys::rtnl::Messages,
    pub table: LinkTable,
}

/// Opens the monitor socket (RTNLGRP_LINK + RTNLGRP_NSID), spawns its connection and seeds the
/// link table with a dump. With `pause` (tests only), the connection is not read for that long
/// once the table is seeded, so a burst of events overflows the receive buffer.
pub async fn open(rcvbuf: usize, pause: Option<Duration>) -> Result<Monitor, RtnlError> {
    let (conn, handle, messages) =
        crate::sys::rtnl::monitor(&[MulticastGroup::Link, MulticastGroup::Nsid], Some(rcvbuf))
            .map_err(RtnlError::Socket)?;
    let (seeded_tx, seeded_rx) = tokio::sync::oneshot::channel::<()>();
    match pause {
        None => {
            tokio::spawn(conn);
        }
        Some(pause) => {
            tokio::spawn(async move {
                let mut conn = std::pin::pin!(conn);
                tokio::select! {
                    () = &mut conn => return,
                    _ = seeded_rx => {}
                }
                tokio::time::sleep(pause).await;
                conn.await;
            });
        }
    }
    let mut table = LinkTable::default();
    reseed(&mut table, &handle).await?;
    let _ = seeded_tx.send(());
    Ok(Monitor {
        handle,
        messages,
        table,
    })
}

/// Re-reads every host link into `table` (at start, and after an overflow lost messages).
pub async fn reseed(table: &mut LinkTable, handle: &Handle) -> Result<(), RtnlError> {
    let mut fresh = LinkTable::default();
    let mut dump = handle.link().get().execute();
    while let Some(item) = dump.next().await {
        match item {
            Ok(msg) => fresh.seed(&msg),
            Err(e) => {
                return Err(RtnlError::Request {
                    what: "link dump",
                    detail: e.to_string(),
                });
            }
        }
    }
    *table = fresh;
    Ok(())
}

/// Converts an unsolicited message to a lifecycle event.
/// An `Overrun` (the socket's receive buffer overflowed: ENOBUFS) becomes [`EventKind::Lost`].
pub fn to_event(table: &mut LinkTable, msg: NetlinkMessage<RouteNetlinkMessage>) -> Option<LifecycleEvent> {
    let kind = match msg.payload {
        NetlinkPayload::InnerMessage(inner) => table.handle(&inner)?,
        NetlinkPayload::Overrun(_) => EventKind::Lost { count: 1 },
        _ => return None,
    };
    Some(LifecycleEvent {
        time: mono_now(),
        source: Source::Rtnetlink,
        kind,
    })
}

async fn nsid_request(handle: &mut Handle, msg: RouteNetlinkMessage) -> Result<Option<i32>, RtnlError> {
    let mut req = NetlinkMessage::from(msg);
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    let mut responses = handle.request(req).map_err(|e| RtnlError::Request {
        what: "nsid",
        detail: e.to_string(),
    })?;
    let mut found = None;
    while let Some(resp) = responses.next().await {
        match resp.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNsId(m)) => found = nsid_of(&m),
            NetlinkPayload::Error(e) if e.code.is_some() => {
                return Err(RtnlError::Request {
                    what: "nsid",
                    detail: format!("{:?}", e.to_io()),
                });
            }
            _ => {}
        }
    }
    Ok(found.filter(|id| *id >= 0))
}

fn nsid_msg(fd: BorrowedFd<'_>, id: Option<i32>) -> NsidMessage {
    let mut m = NsidMessage::default();
    let raw = u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX);
    m.attributes.push(NsidAttribute::Fd(raw));
    if let Some(id) = id {
        m.attributes.push(NsidAttribute::Id(id));
    }
    m
}

/// The nsid the host netns uses for the netns behind `fd`, if it has one.
pub async fn get_nsid(handle: &mut Handle, fd: BorrowedFd<'_>) -> Result<Option<i32>, RtnlError> {
    nsid_request(handle, RouteNetlinkMessage::GetNsId(nsid_msg(fd, None))).await
}

/// The nsid the host netns uses for the netns behind `fd`, assigning one if it has none, so
/// later RTM_DELLINK / RTM_DELNSID messages can be mapped to that netns.
pub async fn ensure_nsid(handle: &mut Handle, fd: BorrowedFd<'_>) -> Result<i32, RtnlError> {
    if let Some(id) = nsid_request(handle, RouteNetlinkMessage::GetNsId(nsid_msg(fd, None))).await? {
        return Ok(id);
    }
    // -1: let the kernel pick a free id. EEXIST means a concurrent assignment won: re-read.
    let _ = nsid_request(handle, RouteNetlinkMessage::NewNsId(nsid_msg(fd, Some(-1)))).await;
    nsid_request(handle, RouteNetlinkMessage::GetNsId(nsid_msg(fd, None)))
        .await?
        .ok_or(RtnlError::Request {
            what: "nsid assignment",
            detail: "no nsid after RTM_NEWNSID".into(),
        })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use netlink_packet_route::link::{InfoKind, LinkInfo, LinkLayerType};

    /// The 20-byte link-layer address of an IPoIB port: 4 bytes of queue pair number, then the
    /// port's 16-byte GID.
    pub(crate) const IPOIB_ADDR: [u8; 20] = [
        0x80, 0x00, 0x02, 0x08, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x0c, 0x42, 0xa1, 0x03, 0x00, 0x7b, 0x3c, 0x4e,
    ];
    /// [`IPOIB_ADDR`] as dranet writes link-layer addresses.
    pub(crate) const IPOIB_ADDR_STR: &str = "80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:7b:3c:4e";

    /// An RTM_NEWLINK for an IPoIB link (ARPHRD_INFINIBAND, link kind `ipoib`) carrying
    /// [`IPOIB_ADDR`] as IFLA_ADDRESS and IFLA_PERM_ADDRESS, as the monitor receives it: written
    /// to the bytes of a netlink message, then decoded by the same parser the socket uses.
    pub(crate) fn ipoib_newlink(index: u32, name: &str) -> NetlinkMessage<RouteNetlinkMessage> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.header.link_layer_type = LinkLayerType::Infiniband;
        m.attributes.push(LinkAttribute::IfName(name.into()));
        m.attributes.push(LinkAttribute::Address(IPOIB_ADDR.to_vec()));
        m.attributes.push(LinkAttribute::PermAddress(IPOIB_ADDR.to_vec()));
        m.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Ipoib)]));
        let mut sent = NetlinkMessage::from(RouteNetlinkMessage::NewLink(m));
        sent.finalize();
        let mut bytes = vec![0; sent.buffer_len()];
        sent.serialize(&mut bytes);
        NetlinkMessage::deserialize(&bytes).unwrap()
    }

    #[test]
    fn an_ipoib_link_keeps_its_20_byte_addresses() {
        let mut t = LinkTable::default();
        let ev = to_event(&mut t, ipoib_newlink(31, "ib0")).unwrap();
        match ev.kind {
            EventKind::LinkAppeared {
                ifindex,
                mac,
                perm_mac,
                kind,
                ..
            } => {
                assert_eq!(ifindex, 31);
                assert_eq!(mac.as_deref(), Some(IPOIB_ADDR_STR));
                assert_eq!(perm_mac.as_deref(), Some(IPOIB_ADDR_STR));
                assert_eq!(kind.as_deref(), Some("ipoib"));
            }
            other => panic!("not a link_appeared: {other:?}"),
        }
        // An address of zeros (loopback's) is no address, as in a snapshot.
        let ev = t.handle(&RouteNetlinkMessage::NewLink(link(
            1,
            "lo",
            true,
            vec![LinkAttribute::Address(vec![0; 6])],
        )));
        assert!(
            matches!(ev, Some(EventKind::LinkAppeared { mac: None, .. })),
            "{ev:?}"
        );
    }

    fn link(index: u32, name: &str, up: bool, extra: Vec<LinkAttribute>) -> LinkMessage {
        let mut m = LinkMessage::default();
        m.header.index = index;
        if up {
            m.header.flags = LinkFlags::Up;
        }
        m.attributes.push(LinkAttribute::IfName(name.into()));
        m.attributes.extend(extra);
        m
    }

    #[test]
    fn an_overrun_is_a_lost_event() {
        let mut t = LinkTable::default();
        let mut hdr = netlink_packet_core::NetlinkHeader::default();
        hdr.message_type = netlink_packet_core::NLMSG_OVERRUN;
        let msg = NetlinkMessage::new(hdr, NetlinkPayload::Overrun(Vec::new()));
        let ev = to_event(&mut t, msg).unwrap();
        assert_eq!(ev.kind, EventKind::Lost { count: 1 });
        assert_eq!(ev.source, Source::Rtnetlink);
    }

    #[test]
    fn link_table_classifies_messages() {
        let mut t = LinkTable::default();
        t.seed(&link(1, "lo", true, vec![]));
        // Known link, no change: nothing.
        assert_eq!(
            t.handle(&RouteNetlinkMessage::NewLink(link(1, "lo", true, vec![]))),
            None
        );
        // New link.
        let ev = t.handle(&RouteNetlinkMessage::NewLink(link(
            7,
            "eth1",
            false,
            vec![LinkAttribute::Address(vec![2, 0, 0, 0, 0, 1])],
        )));
        assert!(
            matches!(ev, Some(EventKind::LinkAppeared { ifindex: 7, ref name, up: false, ref mac, .. })
            if name == "eth1" && mac.as_deref() == Some("02:00:00:00:00:01"))
        );
        // Change of admin state.
        let ev = t.handle(&RouteNetlinkMessage::NewLink(link(7, "eth1", true, vec![])));
        assert!(matches!(ev, Some(EventKind::LinkChanged { up: true, .. })));
        // Left for nsid 3.
        let ev = t.handle(&RouteNetlinkMessage::DelLink(link(
            7,
            "eth1",
            false,
            vec![LinkAttribute::NewNetnsId(3), LinkAttribute::NewIfIndex(7)],
        )));
        assert!(matches!(
            ev,
            Some(EventKind::LinkLeftHost {
                nsid: 3,
                new_ifindex: Some(7),
                ..
            })
        ));
        // Deleted (name from the table when the message lacks it).
        t.seed(&link(9, "veth9", true, vec![]));
        let mut del = LinkMessage::default();
        del.header.index = 9;
        let ev = t.handle(&RouteNetlinkMessage::DelLink(del));
        assert!(matches!(ev, Some(EventKind::LinkDeleted { ifindex: 9, ref name }) if name == "veth9"));
        // A rename to a name of the full 15 bytes, then one byte different: both seen.
        t.seed(&link(10, "a", true, vec![]));
        let ev = t.handle(&RouteNetlinkMessage::NewLink(link(
            10,
            "abcdefghijklmno",
            true,
            vec![],
        )));
        assert!(matches!(ev, Some(EventKind::LinkChanged { ref name, .. }) if name == "abcdefghijklmno"));
        let ev = t.handle(&RouteNetlinkMessage::NewLink(link(
            10,
            "abcdefghijklmnp",
            true,
            vec![],
        )));
        assert!(matches!(ev, Some(EventKind::LinkChanged { .. })));
    }

    #[test]
    fn a_link_name_is_kept_inline_up_to_15_bytes() {
        assert_eq!(IfName::new("abcdefghijklmno").as_str(), "abcdefghijklmno");
        assert_eq!(IfName::new("").as_str(), "");
        // Never longer than the kernel's 15 bytes; cut at a character boundary.
        assert_eq!(IfName::new("abcdefghijklmnop").as_str(), "abcdefghijklmno");
        assert_eq!(IfName::new("abcdefghijklmn\u{e9}").as_str(), "abcdefghijklmn");
    }
}
