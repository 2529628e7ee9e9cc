//! The typed lifecycle events the watcher emits, and their decoding from the eBPF ring buffer.

use serde::Serialize;

use crate::sys::netns::{NetnsCookie, NetnsId};
use dranet_common::{self as common, Event, kind, unlink_call};

/// Nanoseconds of CLOCK_MONOTONIC (the clock of `bpf_ktime_get_ns`).
pub use crate::clock::MonoTime;

/// Where an event came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// An eBPF probe (tier A or B).
    Probe,
    /// The rtnetlink monitor in the host netns.
    Rtnetlink,
    /// The inotify fallback on the netns directories.
    Inotify,
    /// The daemon itself (hooks, rescue actions; see `dranet trace` with a running daemon).
    Daemon,
}

/// The task that caused an event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Task {
    /// User-space pid (thread group id).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    pub comm: String,
}

/// Which unlink syscall.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnlinkCall {
    Unlink,
    Unlinkat,
    /// Seen by inotify (no syscall details).
    Unknown,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// `umount2(path, flags)` on a watched netns path returned `ret`.
    NetnsUnmounted {
        path: String,
        flags: u32,
        ret: i64,
        /// Syscall entry time.
        entered: MonoTime,
        task: Task,
        netns: Option<NetnsId>,
    },
    /// `unlink`/`unlinkat` of a watched netns path returned `ret` (or inotify saw the delete).
    NetnsUnlinked {
        path: String,
        ret: i64,
        call: UnlinkCall,
        task: Task,
        netns: Option<NetnsId>,
    },
    /// Tier B: an nsfs mount (inode `inode`) is being unmounted.
    NsfsUnmounting {
        inode: u64,
        flags: u32,
        task: Task,
        /// Set when the inode belongs to a netns the watcher knows.
        netns: Option<NetnsId>,
    },
    /// `cleanup_net` was queued: some netns lost its last reference (tier A, no identity).
    NetnsCleanupQueued { task: Task },
    /// A `cleanup_net` batch started on its worker.
    NetnsCleanupStarted { task: Task },
    /// A `cleanup_net` batch ended.
    NetnsCleanupFinished { task: Task },
    /// Tier B: `__put_net`: this netns lost its last active reference and will be destroyed.
    NetnsReleased { netns: NetnsId, task: Task },
    /// Tier B: `__dev_change_net_namespace`: a device is moving between namespaces.
    DeviceMoving {
        ifindex: u32,
        name: String,
        new_ifindex: i32,
        from: NetnsId,
        to: NetnsId,
        task: Task,
    },
    /// rtnetlink: the host netns got an nsid for a peer netns.
    NsidAdded { nsid: i32, netns: Option<NetnsId> },
    /// rtnetlink: a peer netns's nsid went away: that netns is being destroyed (`cleanup_net`).
    NsidRemoved { nsid: i32, netns: Option<NetnsId> },
    /// rtnetlink: a device left the host netns for netns `nsid` (RTM_DELLINK + IFLA_NEW_NETNSID).
    LinkLeftHost {
        ifindex: u32,
        name: String,
        nsid: i32,
        new_ifindex: Option<i32>,
        to: Option<NetnsId>,
    },
    /// rtnetlink: a device appeared in the host netns (created, or moved/returned here).
    LinkAppeared {
        ifindex: u32,
        name: String,
        up: bool,
        mac: Option<String>,
        perm_mac: Option<String>,
        /// Parent device, `<bus>/<name>` (`pci/0000:3b:00.1`), when it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent: Option<String>,
        /// Link kind (`veth`, ...); `None` for a physical device.
        #[serde(default, rename = "link_kind", skip_serializing_if = "Option::is_none")]
        kind: Option<String>,
    },
    /// rtnetlink: a host device changed name or admin state.
    LinkChanged { ifindex: u32, name: String, up: bool },
    /// rtnetlink: a device was deleted from the host netns.
    LinkDeleted { ifindex: u32, name: String },
    /// Events were lost (ring buffer full or a slow subscriber): reconcile from scratch.
    Lost { count: u64 },
}

/// One event of the lifecycle stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LifecycleEvent {
    /// CLOCK_MONOTONIC ns when the kernel (probes) or the watcher (netlink, inotify) saw it.
    pub time: MonoTime,
    pub source: Source,
    #[serde(flatten)]
    pub kind: EventKind,
}

impl LifecycleEvent {
    /// Short machine name of the event kind (`netns_unmounted`, ...).
    #[must_use]
    pub fn kind_name(&self) -> &'static str {
        match &self.kind {
            EventKind::NetnsUnmounted { .. } => "netns_unmounted",
            EventKind::NetnsUnlinked { .. } => "netns_unlinked",
            EventKind::NsfsUnmounting { .. } => "nsfs_unmounting",
            EventKind::NetnsCleanupQueued { .. } => "netns_cleanup_queued",
            EventKind::NetnsCleanupStarted { .. } => "netns_cleanup_started",
            EventKind::NetnsCleanupFinished { .. } => "netns_cleanup_finished",
            EventKind::NetnsReleased { .. } => "netns_released",
            EventKind::DeviceMoving { .. } => "device_moving",
            EventKind::NsidAdded { .. } => "nsid_added",
            EventKind::NsidRemoved { .. } => "nsid_removed",
            EventKind::LinkLeftHost { .. } => "link_left_host",
            EventKind::LinkAppeared { .. } => "link_appeared",
            EventKind::LinkChanged { .. } => "link_changed",
            EventKind::LinkDeleted { .. } => "link_deleted",
            EventKind::Lost { .. } => "lost",
        }
    }

    /// The netns path the event names, if any.
    #[must_use]
    pub fn path(&self) -> Option<&str> {
        match &self.kind {
            EventKind::NetnsUnmounted { path, .. } | EventKind::NetnsUnlinked { path, .. } => Some(path),
            _ => None,
        }
    }

    /// The netns identity the event names, if known.
    #[must_use]
    pub fn netns(&self) -> Option<NetnsId> {
        match &self.kind {
            EventKind::NetnsUnmounted { netns, .. }
            | EventKind::NetnsUnlinked { netns, .. }
            | EventKind::NsfsUnmounting { netns, .. }
            | EventKind::NsidAdded { netns, .. }
            | EventKind::NsidRemoved { netns, .. } => *netns,
            EventKind::LinkLeftHost { to, .. } => *to,
            EventKind::NetnsReleased { netns, .. } => Some(*netns),
            EventKind::DeviceMoving { to, .. } => Some(*to),
            _ => None,
        }
    }

    /// Device names the event mentions.
    #[must_use]
    pub fn device(&self) -> Option<&str> {
        match &self.kind {
            EventKind::DeviceMoving { name, .. }
            | EventKind::LinkLeftHost { name, .. }
            | EventKind::LinkAppeared { name, .. }
            | EventKind::LinkChanged { name, .. }
            | EventKind::LinkDeleted { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// A netns named by a probe. A kernel before 5.12 makes a netns cookie only when a BPF program
/// asks for one, so a probe reads 0 there (Debian 11's 5.10, in the kernel matrix); the netns is
/// then the one the watcher knows by that inode (user space identified it with a stand-in cookie,
/// `sys::netns::inode_cookie`), else [`NetnsCookie::UNKNOWN`] and the inode.
fn probe_netns(cookie: u64, inum: u32, resolve_inode: &impl Fn(u64) -> Option<NetnsId>) -> NetnsId {
    let (cookie, inode) = (NetnsCookie::from_raw(cookie), u64::from(inum));
    if !cookie.is_known()
        && let Some(id) = resolve_inode(inode)
    {
        return id;
    }
    NetnsId { cookie, inode }
}

fn text(buf: &[u8]) -> String {
    String::from_utf8_lossy(common::until_nul(buf)).into_owned()
}

fn task_of(ev: &Event) -> Task {
    Task {
        pid: ev.tgid,
        tid: ev.pid,
        comm: text(&ev.comm),
    }
}

/// Decodes one ring-buffer record. `resolve` maps a path or an nsfs inode to a known netns.
/// Returns `None` for records of unknown kind or size (a newer object with an older daemon).
pub fn decode(
    bytes: &[u8],
    resolve_path: impl Fn(&str) -> Option<NetnsId>,
    resolve_inode: impl Fn(u64) -> Option<NetnsId>,
) -> Option<LifecycleEvent> {
    let ev: Event = crate::sys::probes::maps::read_event(bytes)?;
    let task = task_of(&ev);
    let kind = match ev.kind {
        kind::UMOUNT => {
            let path = text(&ev.path);
            EventKind::NetnsUnmounted {
                netns: resolve_path(&path),
                path,
                flags: ev.flags,
                ret: ev.ret,
                entered: MonoTime::from_ns(ev.ktime_enter_ns),
                task,
            }
        }
        kind::UNLINK => {
            let path = text(&ev.path);
            EventKind::NetnsUnlinked {
                netns: resolve_path(&path),
                path,
                ret: ev.ret,
                call: if ev.flags2 == unlink_call::UNLINKAT {
                    UnlinkCall::Unlinkat
                } else {
                    UnlinkCall::Unlink
                },
                task,
            }
        }
        kind::NETNS_CLEANUP_QUEUED => EventKind::NetnsCleanupQueued { task },
        kind::NETNS_CLEANUP_START => EventKind::NetnsCleanupStarted { task },
        kind::NETNS_CLEANUP_END => EventKind::NetnsCleanupFinished { task },
        kind::NETNS_PUT => EventKind::NetnsReleased {
            netns: probe_netns(ev.netns_cookie, ev.netns_inum, &resolve_inode),
            task,
        },
        kind::DEV_NETNS_MOVE => EventKind::DeviceMoving {
            ifindex: ev.ifindex,
            name: text(&ev.name),
            new_ifindex: ev.flags2 as i32,
            from: probe_netns(ev.netns_cookie, ev.netns_inum, &resolve_inode),
            to: probe_netns(ev.netns2_cookie, ev.netns2_inum, &resolve_inode),
            task,
        },
        kind::NSFS_UMOUNT => {
            let inode = u64::from(ev.netns_inum);
            let cookie = NetnsCookie::from_raw(ev.netns_cookie);
            let netns = resolve_inode(inode).filter(|id| !cookie.is_known() || id.cookie == cookie);
            EventKind::NsfsUnmounting {
                inode,
                flags: ev.flags,
                task,
                netns,
            }
        }
        _ => return None,
    };
    Some(LifecycleEvent {
        time: MonoTime::from_ns(ev.ktime_ns),
        source: Source::Probe,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(ev: &Event) -> Vec<u8> {
        // SAFETY: Event is plain old data; viewing it as bytes is sound.
        unsafe { std::slice::from_raw_parts((ev as *const Event).cast::<u8>(), size_of::<Event>()) }.to_vec()
    }

    fn blank(k: u32) -> Event {
        Event {
            kind: k,
            flags: 2,
            ktime_ns: 1000,
            ktime_enter_ns: 900,
            ret: 0,
            tgid: 42,
            pid: 43,
            netns_inum: 4026532249,
            ifindex: 7,
            netns_cookie: 99,
            netns2_inum: 4026531833,
            flags2: 0,
            netns2_cookie: 1,
            comm: *b"crio\0\0\0\0\0\0\0\0\0\0\0\0",
            name: *b"eth1\0\0\0\0\0\0\0\0\0\0\0\0",
            path: [0; common::PATH_LEN],
        }
    }

    #[test]
    fn decodes_umount_with_identity() {
        let mut ev = blank(kind::UMOUNT);
        ev.path[..15].copy_from_slice(b"/run/netns/pod1");
        let id = NetnsId::test(5, 6);
        let got = decode(&raw(&ev), |p| (p == "/run/netns/pod1").then_some(id), |_| None);
        let got = got.unwrap();
        assert_eq!(got.time, MonoTime::from_ns(1000));
        assert_eq!(got.path(), Some("/run/netns/pod1"));
        assert_eq!(got.netns(), Some(id));
        match got.kind {
            EventKind::NetnsUnmounted {
                flags, entered, task, ..
            } => {
                assert_eq!(flags, 2);
                assert_eq!(entered, MonoTime::from_ns(900));
                assert_eq!(task.comm, "crio");
                assert_eq!(task.pid, 42);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn decodes_device_move_and_rejects_short_or_unknown() {
        let mut ev = blank(kind::DEV_NETNS_MOVE);
        ev.flags2 = (-1i32) as u32;
        let got = decode(&raw(&ev), |_| None, |_| None).unwrap();
        assert_eq!(got.device(), Some("eth1"));
        match got.kind {
            EventKind::DeviceMoving {
                new_ifindex,
                from,
                to,
                ..
            } => {
                assert_eq!(new_ifindex, -1);
                assert_eq!(from.inode, 4026532249);
                assert_eq!(to.cookie.raw(), 1);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(decode(&raw(&ev)[..10], |_| None, |_| None).is_none());
        assert!(decode(&raw(&blank(999)), |_| None, |_| None).is_none());
    }

    /// 5.10 makes a netns cookie only for BPF programs that ask: the probes read 0, and the
    /// netns is the one known by that inode (identified in user space with a stand-in cookie).
    #[test]
    fn a_probe_without_a_cookie_names_the_netns_known_by_its_inode() {
        let known = NetnsId::test(1 << 63 | 5, 4026532249);
        let mut ev = blank(kind::NETNS_PUT);
        ev.netns_cookie = 0;
        let by_inode = |i: u64| (i == known.inode).then_some(known);
        assert_eq!(
            decode(&raw(&ev), |_| None, by_inode).unwrap().netns(),
            Some(known)
        );
        // Unknown inode: cookie 0 and the inode, as read.
        let got = decode(&raw(&ev), |_| None, |_| None).unwrap();
        assert_eq!(got.netns(), Some(NetnsId::test(0, 4026532249)));
        // A kernel cookie is never replaced.
        ev.netns_cookie = 99;
        let got = decode(&raw(&ev), |_| None, by_inode).unwrap();
        assert_eq!(got.netns().map(|n| n.cookie.raw()), Some(99));
        let mut mv = blank(kind::DEV_NETNS_MOVE);
        mv.netns_cookie = 0;
        match decode(&raw(&mv), |_| None, by_inode).unwrap().kind {
            EventKind::DeviceMoving { from, to, .. } => {
                assert_eq!(from, known);
                assert_eq!(to.cookie.raw(), 1);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn nsfs_umount_checks_cookie() {
        let ev = blank(kind::NSFS_UMOUNT);
        let known = NetnsId::test(99, 4026532249);
        let other = NetnsId::test(98, 4026532249);
        let hit = decode(&raw(&ev), |_| None, |_| Some(known)).unwrap();
        assert_eq!(hit.netns(), Some(known));
        // Same (reused) inode, other cookie: not the netns we know.
        let miss = decode(&raw(&ev), |_| None, |_| Some(other)).unwrap();
        assert_eq!(miss.netns(), None);
    }
}
