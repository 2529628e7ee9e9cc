//! dranet's kernel programs.
//!
//! Tier A (tracepoint / tp_btf: loads on kernels without BPF trampolines, e.g. the project VM):
//! * `sys_enter/exit_umount`, `sys_enter/exit_unlink`, `sys_enter/exit_unlinkat`: the runtime
//!   unmounting / unlinking a pod netns bind mount. Paths are filtered here, in the kernel, against
//!   the watched prefixes and exact paths user space puts in `PREFIXES` / `WATCHED`, so an unrelated
//!   unlink costs one string read and a few byte compares.
//! * `tp_btf/workqueue_queue_work`, `workqueue_execute_start`, `workqueue_execute_end`, filtered on
//!   `work->func == cleanup_net`: a netns lost its last reference, and the cleanup run's bounds.
//!
//! Tier B (fentry / lsm: kernels with trampolines):
//! * `fentry/__dev_change_net_namespace`: a device moves between namespaces; on kernels that
//!   lack it (≤ 5.10: the move is `dev_change_net_namespace` itself, three arguments)
//!   `fentry/dev_change_net_namespace`.
//! * `fentry/__put_net`: a netns lost its last active reference (with its identity).
//! * `fentry/netns_put`: the same when nsfs drops the last reference (where `__put_net` is inlined).
//! * `lsm/sb_umount` and, as an alternative when the BPF LSM is off, `fentry/security_sb_umount`:
//!   an nsfs mount is unmounted (with the namespace inode).
//!
//! Struct offsets come from user space (`CONFIG`, resolved from /sys/kernel/btf/vmlinux at load
//! time); nothing here hard-codes a kernel layout.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_buf, bpf_probe_read_user_str_bytes,
    },
    macros::{btf_tracepoint, fentry, lsm, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf, ring_buf::RingBufEntry},
    programs::{BtfTracePointContext, FEntryContext, LsmContext, TracePointContext},
};
use aya_log_ebpf::info;
use dranet_common::{
    COMM_LEN, Config, Event, IFNAME_LEN, MAX_PREFIXES, MAX_WATCHED, NSFS_MAGIC, PATH_LEN, PathKey, Pending,
    Prefix, kind, unlink_call,
};

/// Kernel facts from user space (offsets, `cleanup_net` address). Overridden before load.
#[unsafe(no_mangle)]
static CONFIG: Config = Config::empty();

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// `[0]` = events dropped because `EVENTS` was full, per CPU. User space sums it after each batch
/// it reads from `EVENTS` (a full buffer wakes it) and turns an increase into a `Lost` event (then
/// a reconcile): a dropped teardown signal must not go unnoticed.
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Reserves one event in the ring buffer, counting it in `LOST` when the buffer is full.
#[inline(always)]
fn reserve() -> Option<RingBufEntry<Event>> {
    let entry = EVENTS.reserve::<Event>(0);
    if entry.is_none()
        && let Some(n) = LOST.get_ptr_mut(0)
    {
        // SAFETY: a per-CPU array slot of this CPU; a BPF program is not preempted by another
        // program on the same CPU for this map, so the read-modify-write is not torn.
        unsafe { *n += 1 };
    }
    entry
}

/// Watched path prefixes (e.g. `/run/netns/`, `/var/run/netns/`).
#[map]
static PREFIXES: Array<Prefix> = Array::with_max_entries(MAX_PREFIXES, 0);

/// Watched exact paths (pod netns bind mounts outside the prefixes).
#[map]
static WATCHED: HashMap<PathKey, u32> = HashMap::with_max_entries(MAX_WATCHED, 0);

/// `[0]` = number of entries in `WATCHED` (skip the hash lookup while it is zero).
#[map]
static WATCHED_COUNT: Array<u32> = Array::with_max_entries(1, 0);

/// Syscalls on watched paths that entered and have not returned yet, by thread id.
#[map]
static PENDING: HashMap<u32, Pending> = HashMap::with_max_entries(1024, 0);

/// Scratch buffer for reading paths (too large for comfortable stack use next to the event).
#[map]
static SCRATCH: PerCpuArray<Pending> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn config() -> Config {
    // SAFETY: CONFIG is a plain read-only global; the volatile read keeps the compiler from
    // constant-folding the default values (user space overrides them in .rodata before load).
    unsafe { core::ptr::read_volatile(&CONFIG) }
}

#[inline(always)]
fn present(off: u32) -> bool {
    off != Config::MISSING
}

/// Reads a `T` at `base + off` from kernel memory.
#[inline(always)]
fn read_at<T>(base: u64, off: u32) -> Option<T> {
    if base == 0 || !present(off) {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel validates the address; a bad pointer returns an error.
    unsafe { bpf_probe_read_kernel((base + u64::from(off)) as *const T).ok() }
}

#[inline(always)]
fn comm() -> [u8; COMM_LEN] {
    bpf_get_current_comm().unwrap_or([0; COMM_LEN])
}

/// Fills the common part of an event.
#[inline(always)]
fn event_header(ev: &mut Event, k: u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ev.kind = k;
    ev.flags = 0;
    // SAFETY: helper without preconditions.
    ev.ktime_ns = unsafe { bpf_ktime_get_ns() };
    ev.ktime_enter_ns = 0;
    ev.ret = 0;
    ev.tgid = (pid_tgid >> 32) as u32;
    ev.pid = pid_tgid as u32;
    ev.netns_inum = 0;
    ev.ifindex = 0;
    ev.netns_cookie = 0;
    ev.netns2_inum = 0;
    ev.flags2 = 0;
    ev.netns2_cookie = 0;
    ev.comm = comm();
    ev.name = [0; IFNAME_LEN];
}

/// Does `path` (NUL-padded) start with one of the watched prefixes or equal a watched path?
#[inline(always)]
fn is_watched(path: &[u8; PATH_LEN]) -> bool {
    let cfg = config();
    if cfg.trace_all != 0 {
        return true;
    }
    let mut slot = 0u32;
    while slot < MAX_PREFIXES {
        if let Some(p) = PREFIXES.get(slot) {
            let len = p.len as usize;
            if len > 0 && len < PATH_LEN && prefix_eq(&p.bytes, path, len) {
                return true;
            }
        }
        slot += 1;
    }
    let count = WATCHED_COUNT.get(0).copied().unwrap_or(0);
    if count == 0 {
        return false;
    }
    // SAFETY: PathKey is a plain byte array with the same layout as the path buffer.
    let key: &PathKey = unsafe { &*(path as *const [u8; PATH_LEN]).cast::<PathKey>() };
    // SAFETY: the value is only tested for presence.
    unsafe { WATCHED.get(key).is_some() }
}

#[inline(always)]
fn prefix_eq(prefix: &[u8; PATH_LEN], path: &[u8; PATH_LEN], len: usize) -> bool {
    let mut i = 0usize;
    while i < PATH_LEN {
        if i >= len {
            return true;
        }
        if prefix[i] != path[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Syscall entry on a path argument: read the path, filter it, remember it for the exit.
#[inline(always)]
fn syscall_enter(path_ptr: u64, flags: u32, call: u32) {
    if path_ptr == 0 {
        return;
    }
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU scratch slot, used only for the duration of this program run.
    let pending = unsafe { &mut *scratch };
    pending.path = [0; PATH_LEN];
    // SAFETY: the helper validates the user pointer and bounds the copy by the buffer length.
    if unsafe { bpf_probe_read_user_str_bytes(path_ptr as *const u8, &mut pending.path) }.is_err() {
        return;
    }
    if !is_watched(&pending.path) {
        return;
    }
    // SAFETY: helper without preconditions.
    pending.ktime_enter_ns = unsafe { bpf_ktime_get_ns() };
    pending.flags = flags;
    pending.call = call;
    let tid = bpf_get_current_pid_tgid() as u32;
    let _ = PENDING.insert(tid, *pending, 0);
}

/// Syscall exit: if the entry was on a watched path, emit the event with the result.
#[inline(always)]
fn syscall_exit(ret: i64) {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: the entry is copied out before it is removed.
    let Some(p) = (unsafe { PENDING.get(tid) }).copied() else {
        return;
    };
    let _ = PENDING.remove(tid);
    let Some(mut entry) = reserve() else {
        return;
    };
    let k = if p.call == 0 { kind::UMOUNT } else { kind::UNLINK };
    {
        let ev = &mut *entry;
        // SAFETY: the reservation is sized for an Event; every field is written below.
        let ev = unsafe { ev.assume_init_mut() };
        event_header(ev, k);
        ev.flags = p.flags;
        ev.flags2 = p.call;
        ev.ktime_enter_ns = p.ktime_enter_ns;
        ev.ret = ret;
        ev.path = p.path;
    }
    entry.submit(0);
}

// Tracepoint record layouts (include/trace/events/syscalls.h, stable ABI): 8 bytes of common
// fields, `int __syscall_nr` at 8, then the arguments as 8-byte slots from 16; exits carry
// `long ret` at 16.
const ARG0: usize = 16;
const ARG1: usize = 24;
const ARG2: usize = 32;

#[tracepoint(category = "syscalls", name = "sys_enter_umount")]
pub fn dranet_enter_umount(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets within the tracepoint record documented above.
    let path: u64 = unsafe { ctx.read_at(ARG0) }.unwrap_or(0);
    // SAFETY: as above.
    let flags: u64 = unsafe { ctx.read_at(ARG1) }.unwrap_or(0);
    syscall_enter(path, flags as u32, 0);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_umount")]
pub fn dranet_exit_umount(ctx: TracePointContext) -> u32 {
    // SAFETY: `long ret` at offset 16 of a sys_exit record.
    let ret: i64 = unsafe { ctx.read_at(ARG0) }.unwrap_or(0);
    syscall_exit(ret);
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_unlink")]
pub fn dranet_enter_unlink(ctx: TracePointContext) -> u32 {
    // SAFETY: `const char *pathname` at offset 16.
    let path: u64 = unsafe { ctx.read_at(ARG0) }.unwrap_or(0);
    syscall_enter(path, 0, unlink_call::UNLINK);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_unlink")]
pub fn dranet_exit_unlink(ctx: TracePointContext) -> u32 {
    // SAFETY: `long ret` at offset 16.
    let ret: i64 = unsafe { ctx.read_at(ARG0) }.unwrap_or(0);
    syscall_exit(ret);
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_unlinkat")]
pub fn dranet_enter_unlinkat(ctx: TracePointContext) -> u32 {
    // SAFETY: `int dfd` at 16, `const char *pathname` at 24, `int flag` at 32.
    let path: u64 = unsafe { ctx.read_at(ARG1) }.unwrap_or(0);
    // SAFETY: as above.
    let flags: u64 = unsafe { ctx.read_at(ARG2) }.unwrap_or(0);
    syscall_enter(path, flags as u32, unlink_call::UNLINKAT);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_unlinkat")]
pub fn dranet_exit_unlinkat(ctx: TracePointContext) -> u32 {
    // SAFETY: `long ret` at offset 16.
    let ret: i64 = unsafe { ctx.read_at(ARG0) }.unwrap_or(0);
    syscall_exit(ret);
    0
}

/// Is this work item the netns cleanup work (`net_cleanup_work`, func = `cleanup_net`)?
#[inline(always)]
fn is_cleanup_work(work: u64) -> bool {
    let cfg = config();
    if cfg.cleanup_net_addr == 0 {
        return false;
    }
    matches!(read_at::<u64>(work, cfg.work_func), Some(f) if f == cfg.cleanup_net_addr)
}

#[inline(always)]
fn emit_simple(k: u32) {
    if let Some(mut entry) = reserve() {
        {
            let ev = &mut *entry;
            // SAFETY: the reservation is sized for an Event; the header writes every scalar
            // field and the path is cleared here.
            let ev = unsafe { ev.assume_init_mut() };
            event_header(ev, k);
            ev.path = [0; PATH_LEN];
        }
        entry.submit(0);
    }
}

#[btf_tracepoint(function = "workqueue_queue_work")]
pub fn dranet_wq_queue(ctx: BtfTracePointContext) -> i32 {
    // TP_PROTO(int req_cpu, struct pool_workqueue *pwq, struct work_struct *work)
    let work: u64 = ctx.arg(2);
    if is_cleanup_work(work) {
        emit_simple(kind::NETNS_CLEANUP_QUEUED);
        info!(
            &ctx,
            "cleanup_net queued by pid {} (last reference to a netns dropped)",
            ctx.tgid()
        );
    }
    0
}

#[btf_tracepoint(function = "workqueue_execute_start")]
pub fn dranet_wq_start(ctx: BtfTracePointContext) -> i32 {
    // TP_PROTO(struct work_struct *work)
    let work: u64 = ctx.arg(0);
    if is_cleanup_work(work) {
        emit_simple(kind::NETNS_CLEANUP_START);
    }
    0
}

#[btf_tracepoint(function = "workqueue_execute_end")]
pub fn dranet_wq_end(ctx: BtfTracePointContext) -> i32 {
    // TP_PROTO(struct work_struct *work, work_func_t function): the function-pointer argument is
    // rejected by the verifier (FUNC_PROTO), so re-read work->func from the work item.
    let work: u64 = ctx.arg(0);
    if is_cleanup_work(work) {
        emit_simple(kind::NETNS_CLEANUP_END);
    }
    0
}

/// Identity (inum, cookie) of a `struct net *`.
#[inline(always)]
fn net_identity(cfg: &Config, net: u64) -> (u32, u64) {
    let inum = read_at::<u32>(net, cfg.net_inum).unwrap_or(0);
    let cookie = read_at::<u64>(net, cfg.net_cookie).unwrap_or(0);
    (inum, cookie)
}

#[fentry(function = "__dev_change_net_namespace")]
pub fn dranet_dev_netns(ctx: FEntryContext) -> u32 {
    // (struct net_device *dev, struct net *net, const char *pat, int new_ifindex, ...)
    let new_ifindex: i32 = ctx.arg(3);
    dev_netns_event(ctx.arg(0), ctx.arg(1), new_ifindex as u32)
}

#[fentry(function = "dev_change_net_namespace")]
pub fn dranet_dev_netns_legacy(ctx: FEntryContext) -> u32 {
    // ≤ 5.10: int dev_change_net_namespace(struct net_device *dev, struct net *net, const char
    // *pat); no new_ifindex (reported as 0: the kernel picks).
    dev_netns_event(ctx.arg(0), ctx.arg(1), 0)
}

/// One `DEV_NETNS_MOVE` event for both device-move probes: the device's ifindex and name, the
/// netns it leaves (`netns_*`), the one it enters (`netns2_*`), and the ifindex it asked for
/// (`flags2`, 0 when the kernel picks).
#[inline(always)]
fn dev_netns_event(dev: u64, net: u64, new_ifindex: u32) -> u32 {
    let cfg = config();
    let Some(mut entry) = reserve() else {
        return 0;
    };
    {
        let ev = &mut *entry;
        // SAFETY: the reservation is sized for an Event; every field is written below.
        let ev = unsafe { ev.assume_init_mut() };
        event_header(ev, kind::DEV_NETNS_MOVE);
        ev.path = [0; PATH_LEN];
        ev.ifindex = read_at::<i32>(dev, cfg.dev_ifindex).unwrap_or(0) as u32;
        if present(cfg.dev_name) {
            // SAFETY: the helper validates the kernel address.
            let _ = unsafe {
                bpf_probe_read_kernel_buf((dev + u64::from(cfg.dev_name)) as *const u8, &mut ev.name)
            };
        }
        let src = read_at::<u64>(dev, cfg.dev_nd_net).unwrap_or(0);
        let (inum, cookie) = net_identity(&cfg, src);
        ev.netns_inum = inum;
        ev.netns_cookie = cookie;
        let (inum2, cookie2) = net_identity(&cfg, net);
        ev.netns2_inum = inum2;
        ev.netns2_cookie = cookie2;
        ev.flags2 = new_ifindex;
    }
    entry.submit(0);
    0
}

#[fentry(function = "__put_net")]
pub fn dranet_put_net(ctx: FEntryContext) -> u32 {
    let cfg = config();
    let net: u64 = ctx.arg(0);
    if let Some(mut entry) = reserve() {
        {
            let ev = &mut *entry;
            // SAFETY: the reservation is sized for an Event; every field is written below.
            let ev = unsafe { ev.assume_init_mut() };
            event_header(ev, kind::NETNS_PUT);
            ev.path = [0; PATH_LEN];
            let (inum, cookie) = net_identity(&cfg, net);
            ev.netns_inum = inum;
            ev.netns_cookie = cookie;
        }
        entry.submit(0);
    }
    0
}

/// `PROC_NET_INIT_INO`: the inode number of init_net (include/linux/proc_ns.h).
const PROC_NET_INIT_INO: u32 = 0xEFFF_FFF9;

#[fentry(function = "netns_put")]
pub fn dranet_nsfs_put(ctx: FEntryContext) -> u32 {
    // static void netns_put(struct ns_common *ns): nsfs drops its reference. Only the put that
    // takes the count from 1 to 0 releases the netns; report that one, with its identity.
    let cfg = config();
    let ns: u64 = ctx.arg(0);
    if !present(cfg.net_ns) {
        return 0;
    }
    let net = ns.wrapping_sub(u64::from(cfg.net_ns));
    // The refcount is in ns_common from 5.11, in struct net before (net.count).
    let count = if present(cfg.ns_common_count) {
        read_at::<u32>(ns, cfg.ns_common_count)
    } else if present(cfg.net_count) {
        read_at::<u32>(net, cfg.net_count)
    } else {
        return 0;
    };
    if count != Some(1) {
        return 0;
    }
    let (inum, cookie) = net_identity(&cfg, net);
    // init_net is never freed; on 7.x its refcount is not maintained, so a put "from 1" on it is
    // no release (seen on Debian 7.3 for an nsfs file of the host netns).
    if inum == PROC_NET_INIT_INO {
        return 0;
    }
    if let Some(mut entry) = reserve() {
        {
            let ev = &mut *entry;
            // SAFETY: the reservation is sized for an Event; every field is written below.
            let ev = unsafe { ev.assume_init_mut() };
            event_header(ev, kind::NETNS_PUT);
            ev.path = [0; PATH_LEN];
            ev.netns_inum = inum;
            ev.netns_cookie = cookie;
        }
        entry.submit(0);
    }
    0
}

/// Shared body of the nsfs-umount probes: `mnt` is the `struct vfsmount *` being unmounted.
#[inline(always)]
fn nsfs_umount(mnt: u64, flags: u32) {
    let cfg = config();
    let sb = read_at::<u64>(mnt, cfg.mnt_sb).unwrap_or(0);
    if read_at::<u64>(sb, cfg.sb_magic) != Some(NSFS_MAGIC) {
        return;
    }
    let root = read_at::<u64>(mnt, cfg.mnt_root).unwrap_or(0);
    let inode = read_at::<u64>(root, cfg.dentry_inode).unwrap_or(0);
    let ino = read_at::<u64>(inode, cfg.inode_ino).unwrap_or(0);
    let ns = read_at::<u64>(inode, cfg.inode_private).unwrap_or(0);
    let Some(mut entry) = reserve() else {
        return;
    };
    {
        let ev = &mut *entry;
        // SAFETY: the reservation is sized for an Event; every field is written below.
        let ev = unsafe { ev.assume_init_mut() };
        event_header(ev, kind::NSFS_UMOUNT);
        ev.path = [0; PATH_LEN];
        ev.flags = flags;
        ev.netns_inum = ino as u32;
        // `ns` points at the ns_common embedded in its namespace; for a netns that is
        // `&net->ns`, so the cookie sits at `ns - net.ns + net.net_cookie`. For other namespace
        // types the value is meaningless; user space only trusts it for inodes it knows as netns.
        if ns != 0 && present(cfg.net_ns) && present(cfg.net_cookie) {
            let net = ns.wrapping_sub(u64::from(cfg.net_ns));
            ev.netns_cookie = read_at::<u64>(net, cfg.net_cookie).unwrap_or(0);
        }
    }
    entry.submit(0);
}

#[lsm(hook = "sb_umount")]
pub fn dranet_lsm_sb_umount(ctx: LsmContext) -> i32 {
    // int security_sb_umount(struct vfsmount *mnt, int flags): observe only, always allow.
    let mnt: u64 = ctx.arg(0);
    let flags: i32 = ctx.arg(1);
    nsfs_umount(mnt, flags as u32);
    0
}

#[fentry(function = "security_sb_umount")]
pub fn dranet_fentry_sb_umount(ctx: FEntryContext) -> u32 {
    let mnt: u64 = ctx.arg(0);
    let flags: i32 = ctx.arg(1);
    nsfs_umount(mnt, flags as u32);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
