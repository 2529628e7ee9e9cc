//! Types shared by the eBPF programs (`dranet-ebpf`) and user space (`dranet`).
//!
//! Everything crossing the kernel/user boundary is `#[repr(C)]`, has no implicit padding and no
//! `bool` or enum fields: kinds and flags are plain integers, checked at compile time by the size
//! assertions below.
#![no_std]

use core::mem::size_of;

/// Length of the path buffers (umount/unlink targets and watched paths), NUL included.
/// Runtime netns paths are ~50-60 bytes (`/var/run/netns/cni-<uuid>`).
pub const PATH_LEN: usize = 128;
/// Kernel `TASK_COMM_LEN`.
pub const COMM_LEN: usize = 16;
/// Kernel `IFNAMSIZ`.
pub const IFNAME_LEN: usize = 16;
/// Number of prefix slots in the `PREFIXES` map.
pub const MAX_PREFIXES: u32 = 8;
/// Capacity of the exact-path `WATCHED` map.
pub const MAX_WATCHED: u32 = 4096;
/// `NSFS_MAGIC` from `include/uapi/linux/magic.h`.
pub const NSFS_MAGIC: u64 = 0x6e73_6673;

/// Event kinds (`Event::kind`).
pub mod kind {
    /// `umount2(path, flags)` on a watched path returned (`ret`, `ktime_enter_ns` = entry time).
    pub const UMOUNT: u32 = 1;
    /// `unlink(path)` / `unlinkat(dfd, path, flags)` on a watched path returned.
    pub const UNLINK: u32 = 2;
    /// `cleanup_net` was queued on the netns workqueue: the last reference to a netns was dropped.
    pub const NETNS_CLEANUP_QUEUED: u32 = 3;
    /// A `cleanup_net` run started on its worker.
    pub const NETNS_CLEANUP_START: u32 = 4;
    /// A `cleanup_net` run ended.
    pub const NETNS_CLEANUP_END: u32 = 5;
    /// Tier B: `__put_net(net)`: netns `netns_inum`/`netns_cookie` lost its last active reference.
    pub const NETNS_PUT: u32 = 6;
    /// Tier B: `__dev_change_net_namespace(dev, net, ..)`: device `ifindex`/`name` moves from
    /// netns (`netns_inum`, `netns_cookie`) to (`netns2_inum`, `netns2_cookie`).
    pub const DEV_NETNS_MOVE: u32 = 7;
    /// Tier B: an nsfs mount is being unmounted (`lsm/sb_umount` or fentry `security_sb_umount`);
    /// `netns_inum` = nsfs inode number, `netns_cookie` set when the namespace is a netns.
    pub const NSFS_UMOUNT: u32 = 8;
}

/// Which syscall produced an `UNLINK` event (`Event::flags2`).
pub mod unlink_call {
    pub const UNLINK: u32 = 1;
    pub const UNLINKAT: u32 = 2;
}

/// One event in the `EVENTS` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    /// One of [`kind`].
    pub kind: u32,
    /// Syscall flags (umount2 flags, unlinkat flags).
    pub flags: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when the event was emitted.
    pub ktime_ns: u64,
    /// Syscall entry time for syscall events, else 0.
    pub ktime_enter_ns: u64,
    /// Syscall return value for syscall events, else 0.
    pub ret: i64,
    /// Thread group id (user-space pid) and thread id of the current task.
    pub tgid: u32,
    pub pid: u32,
    pub netns_inum: u32,
    pub ifindex: u32,
    pub netns_cookie: u64,
    pub netns2_inum: u32,
    /// New ifindex (device moves) or which syscall (`unlink_call`).
    pub flags2: u32,
    pub netns2_cookie: u64,
    pub comm: [u8; COMM_LEN],
    pub name: [u8; IFNAME_LEN],
    pub path: [u8; PATH_LEN],
}

const _: () = assert!(size_of::<Event>() == 72 + COMM_LEN + IFNAME_LEN + PATH_LEN);
const _: () = assert!(size_of::<Event>().is_multiple_of(8));

/// A watched path prefix (slot in the `PREFIXES` array map). `len == 0` marks an empty slot.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Prefix {
    pub len: u32,
    pub _pad: u32,
    pub bytes: [u8; PATH_LEN],
}

const _: () = assert!(size_of::<Prefix>() == 8 + PATH_LEN);

/// Key of the exact-path `WATCHED` hash map: the NUL-padded path.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PathKey {
    pub bytes: [u8; PATH_LEN],
}

const _: () = assert!(size_of::<PathKey>() == PATH_LEN);

/// Per-thread pending syscall (entry seen, exit not yet), keyed by thread id.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Pending {
    pub ktime_enter_ns: u64,
    pub flags: u32,
    pub call: u32,
    pub path: [u8; PATH_LEN],
}

const _: () = assert!(size_of::<Pending>() == 16 + PATH_LEN);

/// Kernel facts resolved by user space at load time (BTF offsets, kallsyms addresses) and written
/// into the object's read-only global `CONFIG` before loading. An offset of `u32::MAX` means
/// "not available on this kernel": programs that need it do nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Address of `cleanup_net` from /proc/kallsyms (0 = unknown).
    pub cleanup_net_addr: u64,
    /// `work_struct.func`.
    pub work_func: u32,
    /// `net.ns` + `ns_common.inum`.
    pub net_inum: u32,
    /// `net.net_cookie`.
    pub net_cookie: u32,
    /// `net.ns` (offset of the embedded `ns_common`).
    pub net_ns: u32,
    /// `ns_common.inum`.
    pub ns_common_inum: u32,
    /// `net_device.ifindex`.
    pub dev_ifindex: u32,
    /// `net_device.name`.
    pub dev_name: u32,
    /// `net_device.nd_net` (a `possible_net_t` whose first member is `struct net *`).
    pub dev_nd_net: u32,
    /// `vfsmount.mnt_root`.
    pub mnt_root: u32,
    /// `vfsmount.mnt_sb`.
    pub mnt_sb: u32,
    /// `super_block.s_magic`.
    pub sb_magic: u32,
    /// `dentry.d_inode`.
    pub dentry_inode: u32,
    /// `inode.i_ino`.
    pub inode_ino: u32,
    /// `inode.i_private` (for nsfs: the `ns_common *`).
    pub inode_private: u32,
    /// Nonzero: emit every umount/unlink, watched or not (debugging, `dranet trace --all`).
    pub trace_all: u32,
    /// `ns_common.count` (5.11–6.17) or `ns_common.__ns_ref` (6.18+): the namespace's refcount.
    pub ns_common_count: u32,
    /// `net.count`: the netns refcount where it is not in `ns_common` yet (≤ 5.10).
    pub net_count: u32,
    /// Explicit padding (the struct is `Pod`: no implicit padding).
    pub pad: u32,
}

impl Config {
    /// Offset value meaning "unknown on this kernel".
    pub const MISSING: u32 = u32::MAX;

    /// A configuration with every offset missing.
    #[must_use]
    pub const fn empty() -> Self {
        Self {
            cleanup_net_addr: 0,
            work_func: Self::MISSING,
            net_inum: Self::MISSING,
            net_cookie: Self::MISSING,
            net_ns: Self::MISSING,
            ns_common_inum: Self::MISSING,
            dev_ifindex: Self::MISSING,
            dev_name: Self::MISSING,
            dev_nd_net: Self::MISSING,
            mnt_root: Self::MISSING,
            mnt_sb: Self::MISSING,
            sb_magic: Self::MISSING,
            dentry_inode: Self::MISSING,
            inode_ino: Self::MISSING,
            inode_private: Self::MISSING,
            trace_all: 0,
            ns_common_count: Self::MISSING,
            net_count: Self::MISSING,
            pad: 0,
        }
    }
}

const _: () = assert!(size_of::<Config>() == 8 + 18 * 4);

#[cfg(feature = "user")]
mod user {
    // SAFETY: `Event` is `#[repr(C)]`, made only of integers and byte arrays, with no padding
    // (checked by the size assertions above); every bit pattern is a valid value.
    unsafe impl aya::Pod for super::Event {}
    // SAFETY: as above; `Prefix` has an explicit pad field and no implicit padding.
    unsafe impl aya::Pod for super::Prefix {}
    // SAFETY: a plain byte array.
    unsafe impl aya::Pod for super::PathKey {}
    // SAFETY: integers and a byte array, no implicit padding (size asserted).
    unsafe impl aya::Pod for super::Pending {}
    // SAFETY: integers only, explicit padding field, size asserted.
    unsafe impl aya::Pod for super::Config {}
}

/// Copies `s` into a NUL-padded fixed buffer; `None` if it does not fit with its NUL.
#[must_use]
pub fn path_key(s: &[u8]) -> Option<PathKey> {
    if s.len() >= PATH_LEN {
        return None;
    }
    let mut bytes = [0u8; PATH_LEN];
    let mut i = 0;
    while i < s.len() {
        bytes[i] = s[i];
        i += 1;
    }
    Some(PathKey { bytes })
}

/// The bytes of a NUL-terminated buffer up to its first NUL.
#[must_use]
pub fn until_nul(buf: &[u8]) -> &[u8] {
    let mut n = 0;
    while n < buf.len() && buf[n] != 0 {
        n += 1;
    }
    &buf[..n]
}
