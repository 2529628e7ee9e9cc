// Over 500 lines: netns handles, identity and pins: one kernel object.
//! Network namespace handles: open by path or pid, verify, identify, pin, and run a closure on a
//! thread inside a netns. (Fenced: touches the kernel.)
//!
//! * [`Netns`] — an owned nsfs fd, verified with `NS_GET_NSTYPE` to be a *network* namespace,
//!   identified by [`NetnsId`] (cookie + inode).
//! * [`Pin`] — a bind mount of a pod netns under `<state-dir>/pins/<name>` (the engine names it by
//!   sandbox id, `PodRecord::pin_name`) plus an fd: the
//!   netns cannot die while it holds our devices, even across a driver restart (see
//!   `rescue` for the decision).
//! * [`in_netns`] — runs a closure on a fresh OS thread that `setns`es into the netns and exits
//!   afterwards: tokio workers never change namespace.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, open};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, setns};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};

/// Identity of a network namespace: the 64-bit netns cookie (never reused while the system runs)
/// plus the nsfs inode number (reused at once after the netns dies, so never a key on its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NetnsId {
    pub cookie: NetnsCookie,
    pub inode: u64,
}

impl NetnsId {
    /// A made-up identity (tests, fixtures).
    #[cfg(any(test, feature = "test-support"))]
    #[must_use]
    pub const fn test(cookie: u64, inode: u64) -> Self {
        Self {
            cookie: NetnsCookie::from_raw(cookie),
            inode,
        }
    }
}

/// A netns cookie: the kernel's (`NS_GET_ID`, `SO_NETNS_COOKIE`, a probe's `net->net_cookie`),
/// or on kernels that cannot tell it a stand-in ([`inode_cookie`], marked with
/// [`INODE_COOKIE_BIT`]). On disk and in JSON the bare number.
///
/// [`NetnsCookie::UNKNOWN`] (0) is a real value, not an error: a probe on a kernel before 5.12
/// reads 0, and a netns the watcher does not know by its inode then keeps cookie 0 (in events,
/// and in a device's recorded place when it moved there, so also on disk). It equals no cookie
/// of a netns user space identified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NetnsCookie(u64);

impl NetnsCookie {
    /// No cookie: what a probe reads on a kernel before 5.12.
    pub const UNKNOWN: Self = Self(0);

    /// A cookie as the kernel or a BPF event gives it (0 is [`NetnsCookie::UNKNOWN`]).
    #[must_use]
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The bare number.
    #[must_use]
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// Not [`NetnsCookie::UNKNOWN`].
    #[must_use]
    pub const fn is_known(self) -> bool {
        self.0 != 0
    }

    /// A stand-in ([`inode_cookie`]), not a kernel cookie.
    #[must_use]
    pub const fn is_stand_in(self) -> bool {
        self.0 & INODE_COOKIE_BIT != 0
    }
}

impl fmt::Display for NetnsCookie {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for NetnsId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "netns:[{}]/cookie {}", self.inode, self.cookie)
    }
}

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("{path}: cannot open")]
    Open {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("{path}: not a namespace file ({what})")]
    NotANamespace { path: PathBuf, what: &'static str },
    #[error("{path}: a namespace, but not a network namespace (type {nstype:#x})")]
    WrongType { path: PathBuf, nstype: i32 },
    #[error("{path}: cannot identify the netns")]
    Identify {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("pin name {0:?} is not a safe file name")]
    PinName(String),
    #[error("pin {path}: {what}")]
    Pin {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: nix::Error,
    },
    #[error("pin {path} names netns {found}, not {expected}")]
    PinMismatch {
        path: PathBuf,
        expected: NetnsId,
        found: NetnsId,
    },
    #[error("listing pins in {dir}")]
    List {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting a thread to enter netns {0}")]
    Thread(NetnsId, #[source] std::io::Error),
    #[error("the thread inside netns {0} panicked")]
    ThreadPanicked(NetnsId),
    #[error("entering netns {id}")]
    Setns {
        id: NetnsId,
        #[source]
        source: nix::Error,
    },
}

/// `NS_GET_NSTYPE` = `_IO(0xb7, 0x3)`.
const NS_GET_NSTYPE: libc::c_ulong = (0xb7 << 8) | 0x3;
/// `NS_GET_ID` = `_IOR(0xb7, 13, __u64)`: the netns cookie of an nsfs fd (Linux 6.11+).
const NS_GET_ID: libc::c_ulong = (2 << 30) | (8 << 16) | (0xb7 << 8) | 13;
/// `NSFS_MAGIC`, the f_type of nsfs.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// An open, verified network namespace.
#[derive(Debug)]
pub struct Netns {
    fd: OwnedFd,
    id: NetnsId,
    /// Runs [`in_netns`] closures, entered once ([`worker`]).
    worker: worker::Worker,
}

impl Netns {
    /// Opens the netns at `path` (a bind mount like `/run/netns/x`, or `/proc/<pid>/ns/net`).
    /// Refuses anything that is not a network namespace — regular files, FIFOs, devices,
    /// directories, other namespace types — without reading from or writing to it.
    pub fn open_path(path: &Path) -> Result<Self, NetnsError> {
        let err = |source| NetnsError::Open {
            path: path.to_owned(),
            source,
        };
        // O_PATH first: stat without opening (a FIFO would block, a device could act on open).
        let opath = open(path, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty()).map_err(err)?;
        let st = nix::sys::stat::fstat(&opath).map_err(err)?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => {}
            libc::S_IFDIR => {
                return Err(NetnsError::NotANamespace {
                    path: path.to_owned(),
                    what: "directory",
                });
            }
            _ => {
                return Err(NetnsError::NotANamespace {
                    path: path.to_owned(),
                    what: "special file",
                });
            }
        }
        let fs = nix::sys::statfs::fstatfs(&opath).map_err(err)?;
        #[allow(clippy::unnecessary_cast)]
        if fs.filesystem_type().0 as i64 != NSFS_MAGIC {
            return Err(NetnsError::NotANamespace {
                path: path.to_owned(),
                what: "not on nsfs",
            });
        }
        let proc_path = format!("/proc/self/fd/{}", opath.as_raw_fd());
        let fd = open(
            proc_path.as_str(),
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(err)?;
        Self::from_fd(fd, path)
    }

    /// The netns of process `pid`.
    pub fn open_pid(pid: u32) -> Result<Self, NetnsError> {
        Self::open_path(&PathBuf::from(format!("/proc/{pid}/ns/net")))
    }

    /// The netns the driver runs in (the host's: the DaemonSet uses hostNetwork).
    pub fn host() -> Result<Self, NetnsError> {
        Self::open_path(Path::new("/proc/self/ns/net"))
    }

    fn from_fd(fd: OwnedFd, path: &Path) -> Result<Self, NetnsError> {
        // SAFETY: NS_GET_NSTYPE takes no argument and only returns the type of the namespace
        // behind a valid fd we own.
        let nstype = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE) };
        if nstype < 0 {
            return Err(NetnsError::NotANamespace {
                path: path.to_owned(),
                what: "NS_GET_NSTYPE refused",
            });
        }
        if nstype != libc::CLONE_NEWNET {
            return Err(NetnsError::WrongType {
                path: path.to_owned(),
                nstype,
            });
        }
        let id = identify(fd.as_fd()).map_err(|source| NetnsError::Identify {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            fd,
            id,
            worker: worker::Worker::default(),
        })
    }

    /// Cookie + inode.
    #[must_use]
    pub fn id(&self) -> NetnsId {
        self.id
    }

    /// The nsfs fd (for `IFLA_NET_NS_FD`, `RDMA_NLDEV_NET_NS_FD`, `setns`).
    #[must_use]
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A second handle on the same netns.
    pub fn try_clone(&self) -> Result<Self, NetnsError> {
        let fd = self.fd.try_clone().map_err(|e| NetnsError::Open {
            path: PathBuf::from(format!("fd {}", self.fd.as_raw_fd())),
            source: io_to_nix(&e),
        })?;
        Ok(Self {
            fd,
            id: self.id,
            worker: worker::Worker::default(),
        })
    }
}

/// Handles that name a netns and hold none, for the engine's unit tests (`rescue::engine_tests`):
/// only their fake kernel looks at them, by [`Netns::id`] and [`Pin::path`].
#[cfg(test)]
impl Netns {
    /// A handle named `id` whose fd is `/dev/null` (never entered, never passed to the kernel).
    pub(crate) fn inert(id: NetnsId) -> Self {
        let fd = OwnedFd::from(std::fs::File::open("/dev/null").expect("/dev/null opens"));
        Self {
            fd,
            id,
            worker: worker::Worker::default(),
        }
    }
}

#[cfg(test)]
impl Pin {
    /// A pin of the inert `netns` at `path`, mounting nothing.
    pub(crate) fn inert(path: PathBuf, netns: Netns) -> Self {
        Self { path, netns }
    }
}

fn io_to_nix(e: &std::io::Error) -> nix::Error {
    nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Identity of the namespace behind `fd` (must be an nsfs fd of a netns).
pub fn identify(fd: BorrowedFd<'_>) -> Result<NetnsId, nix::Error> {
    let cookie = cookie(fd)?;
    let st = nix::sys::stat::fstat(fd)?;
    Ok(NetnsId {
        cookie,
        inode: st.st_ino,
    })
}

/// The netns cookie behind an nsfs fd: `NS_GET_ID` (6.11+); on older kernels (ENOTTY, e.g.
/// Debian 6.1, seen in the qemu kernel matrix) `SO_NETNS_COOKIE` (5.14+) of a socket opened
/// inside it on a short-lived thread; on kernels with neither (ENOPROTOOPT: 5.10, e.g. Debian 11,
/// seen in the kernel matrix) a stand-in, [`inode_cookie`].
pub fn cookie(fd: BorrowedFd<'_>) -> Result<NetnsCookie, nix::Error> {
    match kernel_cookie(fd) {
        Err(nix::Error::ENOPROTOOPT) => inode_cookie(fd),
        other => other.map(NetnsCookie::from_raw),
    }
}

/// Marks a stand-in cookie ([`inode_cookie`]); kernel cookies are small counters, never this high.
pub const INODE_COOKIE_BIT: u64 = 1 << 63;

/// The stand-in for a netns cookie on kernels that cannot tell it to user space (before 5.14 no
/// `SO_NETNS_COOKIE`; before 5.12 the kernel makes a cookie only when a BPF program asks for one):
/// the change time of the netns's nsfs inode, in nanoseconds, with [`INODE_COOKIE_BIT`] set. The
/// nsfs inode is made when the first fd or bind mount of the netns opens it and lives as long as
/// any of them does (`ns->stashed`), so it is stable for every netns dranet handles (the runtime's
/// bind mount, then dranet's pin, hold it); a netns that died and whose inode number a new one
/// took gets a new nsfs inode with a later change time. Two netns with the same inode number and
/// the same change time would need the old one to die and the new one to be opened within one
/// clock tick (the coarse clock, a few ms).
pub fn inode_cookie(fd: BorrowedFd<'_>) -> Result<NetnsCookie, nix::Error> {
    let st = nix::sys::stat::fstat(fd)?;
    let ns = u64::try_from(st.st_ctime)
        .unwrap_or(0)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(u64::try_from(st.st_ctime_nsec).unwrap_or(0));
    Ok(NetnsCookie::from_raw(ns | INODE_COOKIE_BIT))
}

/// When the netns bind-mounted at `path` was made, as near as the kernel tells: the change time
/// of its nsfs inode, which the kernel sets when the first fd or bind mount opens the netns and
/// keeps while any does (`ns->stashed`; see [`inode_cookie`]). The runtime bind-mounts a pod's
/// netns right after making it, and that mount holds the inode for the sandbox's life, so this is
/// when the sandbox's netns was made (coarse clock: a few ms). `None` when `path` is not an nsfs
/// file or cannot be read.
#[must_use]
pub fn made_at(path: &Path) -> Option<std::time::SystemTime> {
    let fs = nix::sys::statfs::statfs(path).ok()?;
    #[allow(clippy::unnecessary_cast)]
    if fs.filesystem_type().0 as i64 != NSFS_MAGIC {
        return None;
    }
    let st = nix::sys::stat::stat(path).ok()?;
    let secs = u64::try_from(st.st_ctime).ok()?;
    let nanos = u32::try_from(st.st_ctime_nsec).ok()?;
    std::time::UNIX_EPOCH.checked_add(std::time::Duration::new(secs, nanos))
}

fn kernel_cookie(fd: BorrowedFd<'_>) -> Result<u64, nix::Error> {
    let mut cookie: u64 = 0;
    // SAFETY: NS_GET_ID writes one u64 through the pointer, which points at a live local.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_ID, &mut cookie as *mut u64) };
    if rc == 0 {
        return Ok(cookie);
    }
    let err = nix::Error::last();
    if err != nix::Error::ENOTTY {
        return Err(err);
    }
    std::thread::scope(|s| {
        // The thread switches only its own netns and exits right after, so no thread of the
        // process stays in a foreign netns.
        s.spawn(|| cookie_by_socket(fd))
            .join()
            .unwrap_or(Err(nix::Error::EIO))
    })
}

fn cookie_by_socket(fd: BorrowedFd<'_>) -> Result<u64, nix::Error> {
    setns(fd, CloneFlags::CLONE_NEWNET)?;
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: SO_NETNS_COOKIE writes at most `len` (8) bytes into the live local `cookie` and
    // updates `len`; `sock` is an open socket owned by this function.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(nix::Error::last());
    }
    Ok(cookie)
}

/// Runs `f` inside `netns` on the netns's worker thread ([`worker`]: entered once, reused by
/// every call on this `Netns` until it is idle for [`worker::IDLE`]), so no thread of the
/// process but that one is ever in a foreign netns. Blocks until `f` returns. Used to open
/// sockets inside a pod netns, for sysctls, TCX detach and the inventory of a pinned netns.
pub fn in_netns<R, F>(netns: &Netns, f: F) -> Result<R, NetnsError>
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    netns.worker.run(&netns.fd, netns.id, f)
}

/// Runs `f` on a new OS thread inside `netns` that exits afterwards: for a call that may hang
/// (an RDMA move has no kernel timeout), so a hung one never holds up the netns's worker.
pub fn in_netns_alone<R, F>(netns: &Netns, f: F) -> Result<R, NetnsError>
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    let id = netns.id();
    let fd = netns.try_clone()?.fd;
    let handle = std::thread::Builder::new()
        .name("dranet-netns-1".into())
        .spawn(move || -> Result<R, NetnsError> {
            setns(&fd, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Setns { id, source })?;
            Ok(f())
        })
        .map_err(|e| NetnsError::Thread(id, e))?;
    handle.join().map_err(|_| NetnsError::ThreadPanicked(id))?
}

/// A pod netns held by dranet: a bind mount under the pins dir plus an open fd.
///
/// Released only by [`Pin::release`], once every device is home. Dropping a `Pin` closes the
/// fd but leaves the bind mount, on purpose: a crash must not free the netns.
#[derive(Debug)]
pub struct Pin {
    path: PathBuf,
    netns: Netns,
}

impl Pin {
    /// Pins `netns` at `<dir>/<name>` (replacing a stale pin of that name).
    pub fn create(netns: &Netns, dir: &Path, name: &str) -> Result<Self, NetnsError> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
            return Err(NetnsError::PinName(name.to_owned()));
        }
        let path = dir.join(name);
        if let Ok(old) = Self::reopen(&path) {
            if old.netns.id() == netns.id() {
                return Ok(old);
            }
            old.release()?;
        }
        let perr = |what, source| NetnsError::Pin {
            path: path.clone(),
            what,
            source,
        };
        match std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
        {
            Ok(_) => {}
            Err(e) => return Err(perr("creating the mount point", io_to_nix(&e))),
        }
        let src = format!("/proc/self/fd/{}", netns.as_fd().as_raw_fd());
        mount(
            Some(src.as_str()),
            &path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| perr("bind mount", e))?;
        let pin = Self::reopen(&path)?;
        if pin.netns.id() != netns.id() {
            let found = pin.netns.id();
            let _ = pin.release();
            return Err(NetnsError::PinMismatch {
                path,
                expected: netns.id(),
                found,
            });
        }
        Ok(pin)
    }

    /// Re-opens an existing pin (after a restart). Fails if nothing is mounted there.
    pub fn reopen(path: &Path) -> Result<Self, NetnsError> {
        let netns = Netns::open_path(path)?;
        Ok(Self {
            path: path.to_owned(),
            netns,
        })
    }

    /// Re-opens the pin a record names, which must still hold the record's netns `id` (cookie
    /// and inode): a pin that holds another netns (another sandbox's, a path a record file should
    /// never have named) is not ours to release. Does not follow a symlink at `path`.
    pub fn reopen_as(path: &Path, id: NetnsId) -> Result<Self, NetnsError> {
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(NetnsError::NotANamespace {
                path: path.to_owned(),
                what: "a symlink",
            });
        }
        let pin = Self::reopen(path)?;
        let found = pin.netns.id();
        if found != id {
            return Err(NetnsError::PinMismatch {
                path: path.to_owned(),
                expected: id,
                found,
            });
        }
        Ok(pin)
    }

    /// All pin paths in `dir`.
    pub fn list(dir: &Path) -> Result<Vec<PathBuf>, NetnsError> {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(NetnsError::List {
                    dir: dir.to_owned(),
                    source,
                });
            }
        };
        let mut out = Vec::new();
        for e in rd {
            let e = e.map_err(|source| NetnsError::List {
                dir: dir.to_owned(),
                source,
            })?;
            if e.file_name().as_bytes().starts_with(b".") {
                continue;
            }
            // dranet never makes a symlink here: one would lead a release out of the pins dir.
            if e.file_type().is_ok_and(|t| t.is_symlink()) {
                continue;
            }
            out.push(e.path());
        }
        out.sort();
        Ok(out)
    }

    #[must_use]
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Unmounts and removes the pin; the netns may die once the runtime lets go too.
    pub fn release(self) -> Result<(), NetnsError> {
        let Self { path, netns } = self;
        drop(netns);
        release_path(&path)
    }
}

/// Unmounts (lazily) and removes a pin path; absent or unmounted paths are fine.
pub fn release_path(path: &Path) -> Result<(), NetnsError> {
    // Unmount every layer (a pin re-created over a stale one could stack).
    for _ in 0..8 {
        // Never through a symlink: a pin is the mount point itself.
        match umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) => {}
            Err(nix::Error::EINVAL | nix::Error::ENOENT) => break,
            Err(source) => {
                return Err(NetnsError::Pin {
                    path: path.to_owned(),
                    what: "unmount",
                    source,
                });
            }
        }
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(NetnsError::Pin {
            path: path.to_owned(),
            what: "remove",
            source: io_to_nix(&e),
        }),
    }
}

/// Finds a live netns by identity: first at the `hints` (the runtime's path, an old pin), then
/// through every process's `/proc/<pid>/ns/net`. Used when a pin is gone but the netns may live.
#[must_use]
pub fn find_by_id(id: NetnsId, hints: &[&Path]) -> Option<Netns> {
    for h in hints {
        if let Ok(ns) = Netns::open_path(h)
            && ns.id() == id
        {
            return Some(ns);
        }
    }
    let rd = std::fs::read_dir("/proc").ok()?;
    for e in rd.filter_map(Result::ok) {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        // Cheap inode check first (stat of the ns link), then the full open + cookie check.
        let p = PathBuf::from(format!("/proc/{pid}/ns/net"));
        match nix::sys::stat::stat(&p) {
            Ok(st) if st.st_ino == id.inode => {}
            _ => continue,
        }
        if let Ok(ns) = Netns::open_path(&p)
            && ns.id() == id
        {
            return Some(ns);
        }
    }
    None
}

/// The bind mounts of netns `id` in this mount namespace (from `/proc/self/mountinfo`: an nsfs
/// mount whose root is `net:[<inode>]`), outside `skip` (our pins), each checked by opening it.
/// A runtime's netns path is one of these: a record rebuilt from a pin finds it here. Blocking
/// (reads the mount table).
#[must_use]
pub fn bind_mounts_of(id: NetnsId, skip: &Path) -> Vec<PathBuf> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let root = format!("net:[{}]", id.inode);
    let mut out: Vec<PathBuf> = Vec::new();
    for line in table.lines() {
        let mut f = line.split(' ');
        let (Some(r), Some(mnt)) = (f.nth(3), f.next()) else {
            continue;
        };
        if r != root {
            continue;
        }
        let path = PathBuf::from(unescape_mountinfo(mnt));
        if path.starts_with(skip) || out.contains(&path) {
            continue;
        }
        if Netns::open_path(&path).is_ok_and(|ns| ns.id() == id) {
            out.push(path);
        }
    }
    out
}

/// Mount points in mountinfo escape space, tab, newline and backslash as `\ooo` (octal).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0')));
        match octal.and_then(|v| u8::try_from(v).ok()) {
            Some(v) => {
                out.push(v);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `path` currently has a netns mounted on it (used by tests and `dranet status`).
#[must_use]
pub fn is_pinned(path: &Path) -> bool {
    Netns::open_path(path).is_ok()
}

/// Opens a netlink socket of `protocol` inside `netns` (the socket stays bound to that netns
/// for its whole life, whichever thread uses it later).
pub fn socket_in(netns: &Netns, protocol: isize) -> Result<std::io::Result<OwnedFd>, NetnsError> {
    in_netns(netns, move || {
        let s = netlink_sys::Socket::new(protocol)?;
        s.set_non_blocking(true)?;
        let raw = std::os::fd::IntoRawFd::into_raw_fd(s);
        // SAFETY: `raw` was just released by the socket that owned it; nothing else holds it.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    })
}

mod worker;

#[cfg(test)]
mod tests;
