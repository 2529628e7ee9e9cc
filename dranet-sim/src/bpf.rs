//! eBPF test objects for root tests: a minimal `SCHED_CLS` program (`r0 = 0; exit`), TCX
//! attachments (link or plain), clsact `bpf` filters, a unique directory on the host bpffs,
//! a private bpffs mount, and a seccomp filter that makes the kernel refuse detaches on one
//! thread. Everything goes through dranet's single `bpf(2)` entry point
//! ([`dranet::sys::bpf::sys::bpf`]). Test support only.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use dranet::sys::bpf::sys::{self, AttachAttr};

use crate::kernel::{sh, unique};

/// `BPF_FS_MAGIC`.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// `BPF_PROG_LOAD`'s attribute prefix up to `expected_attach_type` (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `BPF_LINK_CREATE` with the `tcx` member of its union.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    relative_id: u32,
    _pad: u32,
    expected_revision: u64,
}

const _: () = assert!(std::mem::size_of::<ProgLoadAttr>() == 72);
const _: () = assert!(std::mem::size_of::<LinkCreateAttr>() == 32);

fn fd_of(rc: i64) -> Result<OwnedFd> {
    let raw = i32::try_from(rc)?;
    // SAFETY: the kernel just returned `raw` as a new fd of ours.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn u32_fd(fd: BorrowedFd<'_>) -> u32 {
    u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX)
}

/// Loads `r0 = 0; exit` as a `SCHED_CLS` program named `name` (≤ 15 bytes), license GPL.
pub fn load_noop_sched_cls(name: &str) -> Result<OwnedFd> {
    // BPF_ALU64|BPF_MOV|BPF_K r0, 0 (0xb7), then BPF_JMP|BPF_EXIT (0x95); code in the low byte.
    let insns: [u64; 2] = [0xb7, 0x95];
    let license = c"GPL";
    let mut prog_name = [0u8; 16];
    let n = name.len().min(15);
    prog_name[..n].copy_from_slice(&name.as_bytes()[..n]);
    let mut attr = ProgLoadAttr {
        prog_type: sys::BPF_PROG_TYPE_SCHED_CLS,
        insn_cnt: 2,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name,
        ..ProgLoadAttr::default()
    };
    // SAFETY: ProgLoadAttr is the BPF_PROG_LOAD prefix; `insns` and `license` point to live
    // data for the duration of the call.
    fd_of(unsafe { sys::bpf(sys::BPF_PROG_LOAD, &mut attr) }.context("BPF_PROG_LOAD")?)
}

fn tcx_type(egress: bool) -> u32 {
    if egress {
        sys::BPF_TCX_EGRESS
    } else {
        sys::BPF_TCX_INGRESS
    }
}

/// Attaches `prog` to device `ifindex` (of the calling thread's netns) as a TCX **link**.
pub fn tcx_link(prog: BorrowedFd<'_>, ifindex: u32, egress: bool) -> Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: u32_fd(prog),
        target_ifindex: ifindex,
        attach_type: tcx_type(egress),
        ..LinkCreateAttr::default()
    };
    // SAFETY: LinkCreateAttr is the BPF_LINK_CREATE layout for tcx; no pointers.
    fd_of(unsafe { sys::bpf(sys::BPF_LINK_CREATE, &mut attr) }.context("BPF_LINK_CREATE tcx")?)
}

/// Attaches `prog` to device `ifindex` as a plain TCX attachment (`BPF_PROG_ATTACH`; it stays
/// after `prog` is closed, until detached or the device goes).
pub fn tcx_attach(prog: BorrowedFd<'_>, ifindex: u32, egress: bool) -> Result<()> {
    let mut attr = AttachAttr {
        target_ifindex: ifindex,
        attach_bpf_fd: u32_fd(prog),
        attach_type: tcx_type(egress),
        ..AttachAttr::default()
    };
    // SAFETY: AttachAttr is the BPF_PROG_ATTACH layout; no pointers.
    unsafe { sys::bpf(sys::BPF_PROG_ATTACH, &mut attr) }.context("BPF_PROG_ATTACH tcx")?;
    Ok(())
}

/// Adds a clsact qdisc to device `dev` (in netns `netns` if given; `tc` needs no bpffs).
pub fn clsact(dev: &str, netns: Option<&str>) -> Result<()> {
    let mut args: Vec<&str> = Vec::new();
    if let Some(n) = netns {
        args.extend(["ip", "netns", "exec", n]);
    }
    args.extend(["tc", "qdisc", "add", "dev", dev, "clsact"]);
    sh(&args)?;
    Ok(())
}

/// Adds a direct-action `bpf` filter running `prog` (by fd, `TCA_BPF_FD`) at priority `prio`
/// on the clsact ingress or egress of device `ifindex`, over `handle` (whose socket's netns is
/// the device's).
pub async fn tc_bpf_filter(
    handle: &rtnetlink::Handle,
    ifindex: u32,
    egress: bool,
    prio: u16,
    prog: BorrowedFd<'_>,
    name: &str,
) -> Result<()> {
    use futures::StreamExt;
    use netlink_packet_core::{
        NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
    };
    use netlink_packet_route::RouteNetlinkMessage;
    use netlink_packet_route::tc::{
        TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcMessage, TcOption,
    };

    let mut m = TcMessage::with_index(i32::try_from(ifindex)?);
    m.header.parent = TcHandle {
        major: 0xffff,
        minor: if egress {
            TcHandle::MIN_EGRESS
        } else {
            TcHandle::MIN_INGRESS
        },
    };
    // tcm_info = prio << 16 | htons(ETH_P_ALL).
    m.header.info = (u32::from(prio) << 16) | u32::from(0x0003u16.to_be());
    m.attributes.push(TcAttribute::Kind("bpf".into()));
    m.attributes.push(TcAttribute::Options(vec![
        TcOption::Bpf(TcFilterBpfOption::ProgFd(u32_fd(prog))),
        TcOption::Bpf(TcFilterBpfOption::ProgName(name.into())),
        TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
    ]));
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewTrafficFilter(m));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    let mut h = handle.clone();
    let mut resp = h.request(req)?;
    while let Some(msg) = resp.next().await {
        if let NetlinkPayload::Error(e) = msg.payload
            && e.code.is_some()
        {
            bail!("adding a bpf filter: {e:?}");
        }
    }
    Ok(())
}

fn is_bpffs(path: &Path) -> bool {
    #[allow(clippy::unnecessary_cast)]
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type().0 as i64 == BPF_FS_MAGIC)
}

/// A unique directory on the host bpffs (`/sys/fs/bpf`, mounted first if it is not: that is
/// the standard mount point and it is left mounted). Removed with everything pinned in it at
/// drop.
pub struct BpffsDir {
    pub path: PathBuf,
}

impl BpffsDir {
    pub fn create(tag: &str) -> Result<Self> {
        let root = Path::new(dranet::sys::bpf::BPFFS_ROOT);
        if !is_bpffs(root) {
            std::fs::create_dir_all(root)?;
            // Another test may have mounted it meanwhile: then this one fails with EBUSY.
            let r = nix::mount::mount(
                Some("bpf"),
                root,
                Some("bpf"),
                nix::mount::MsFlags::empty(),
                Some("mode=0700"),
            );
            if r.is_err() && !is_bpffs(root) {
                r.context("mounting bpffs at /sys/fs/bpf")?;
            }
        }
        let path = root.join(unique(&format!("dranet-test-{tag}-")));
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for BpffsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A private bpffs instance mounted on a fresh temporary directory, unmounted and removed at
/// drop.
pub struct PrivateBpffs {
    pub path: PathBuf,
}

impl PrivateBpffs {
    pub fn mount(tag: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(unique(&format!("dranet-bpffs-{tag}-")));
        std::fs::create_dir(&path)?;
        if let Err(e) = nix::mount::mount(
            Some("bpf"),
            &path,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            Some("mode=0700"),
        ) {
            let _ = std::fs::remove_dir(&path);
            bail!("mounting a private bpffs at {}: {e}", path.display());
        }
        Ok(Self { path })
    }
}

impl Drop for PrivateBpffs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// TCX programs on host device `ifindex` (calling thread's netns), through dranet's query.
pub fn tcx_programs(ifindex: u32) -> Result<Vec<dranet::sys::bpf::TcxProgram>> {
    Ok(dranet::sys::bpf::tcx::programs(ifindex)?)
}

/// The target ifindex the kernel reports for link `fd` (0 once the link is detached).
pub fn link_ifindex(fd: BorrowedFd<'_>) -> Result<u32> {
    Ok(sys::link_info(fd)?.ifindex)
}

/// `bpftool net show dev <dev>` (inside netns `netns` if given) as JSON: an independent view of
/// the tc filters and TCX programs of a device.
pub fn bpftool_net(dev: &str, netns: Option<&str>) -> Result<serde_json::Value> {
    let mut args: Vec<&str> = Vec::new();
    if let Some(n) = netns {
        args.extend(["ip", "netns", "exec", n]);
    }
    args.extend(["bpftool", "-j", "net", "show", "dev", dev]);
    let out = sh(&args)?;
    serde_json::from_str(&out).with_context(|| format!("bpftool output {out:?}"))
}

/// Number of tc and tcx entries in a [`bpftool_net`] view.
#[must_use]
pub fn bpftool_tc_count(v: &serde_json::Value) -> usize {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("tc").and_then(|t| t.as_array()))
        .map(Vec::len)
        .sum()
}

/// Installs, on the **calling thread only** (and threads it creates later), a seccomp filter
/// that makes `bpf(BPF_PROG_DETACH)` and `bpf(BPF_LINK_DETACH)` fail with `EPERM`: a real
/// kernel refusal for the failure paths. The thread keeps it until it exits, so call it on a
/// thread made for the purpose.
pub fn refuse_bpf_detach_on_this_thread() -> Result<()> {
    // seccomp_data: nr (u32) at 0, arch at 4, ip at 8, args[0] at 16 (low half first on x86_64).
    let deny = 0x0005_0000 | (libc::EPERM as u32 & 0xffff); // SECCOMP_RET_ERRNO | EPERM
    let allow = 0x7fff_0000u32; // SECCOMP_RET_ALLOW
    let nr = u32::try_from(libc::SYS_bpf)?;
    let ld = |k: u32| libc::sock_filter {
        code: 0x20, // BPF_LD | BPF_W | BPF_ABS
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: 0x15, // BPF_JMP | BPF_JEQ | BPF_K
        jt,
        jf,
        k,
    };
    let ret = |k: u32| libc::sock_filter {
        code: 0x06, // BPF_RET | BPF_K
        jt: 0,
        jf: 0,
        k,
    };
    let mut prog = [
        ld(0),
        jeq(nr, 0, 3),
        ld(16),
        jeq(sys::BPF_PROG_DETACH, 2, 0),
        jeq(sys::BPF_LINK_DETACH, 1, 0),
        ret(allow),
        ret(deny),
    ];
    // Jumps are relative to the next instruction: from index 1, jf 3 lands on the allow (5);
    // from 3, jt 2 and from 4, jt 1 land on the deny (6).
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len())?,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: PR_SET_SECCOMP with SECCOMP_MODE_FILTER reads a sock_fprog whose filter points to
    // `prog`, alive for the call; the filter applies to this thread (no TSYNC).
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            std::ptr::from_ref(&fprog),
        )
    };
    if rc != 0 {
        bail!("PR_SET_SECCOMP: {}", std::io::Error::last_os_error());
    }
    Ok(())
}
