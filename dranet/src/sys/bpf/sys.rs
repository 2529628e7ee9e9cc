//! The `bpf(2)` syscall: one entry point ([`bpf`]) and the few commands dranet needs, each with
//! its own `#[repr(C)]` attribute struct laid out as the matching anonymous struct of
//! `union bpf_attr` in `include/uapi/linux/bpf.h` (offsets checked by the unit tests below).
//!
//! Raw syscalls rather than aya: aya 0.14's `LinkInfo` has no ifindex for TCX/netkit/XDP links
//! and its TCX query returns program infos without the link ids, both of which dranet needs.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

// Commands (`enum bpf_cmd`).
pub const BPF_PROG_LOAD: u32 = 5;
pub const BPF_OBJ_PIN: u32 = 6;
pub const BPF_OBJ_GET: u32 = 7;
pub const BPF_PROG_ATTACH: u32 = 8;
pub const BPF_PROG_DETACH: u32 = 9;
pub const BPF_PROG_GET_FD_BY_ID: u32 = 13;
pub const BPF_OBJ_GET_INFO_BY_FD: u32 = 15;
pub const BPF_PROG_QUERY: u32 = 16;
pub const BPF_LINK_CREATE: u32 = 28;
pub const BPF_LINK_GET_FD_BY_ID: u32 = 30;
pub const BPF_LINK_DETACH: u32 = 34;

/// `BPF_PROG_TYPE_SCHED_CLS` (`enum bpf_prog_type`).
pub const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;

// Attach types (`enum bpf_attach_type`).
pub const BPF_TCX_INGRESS: u32 = 46;
pub const BPF_TCX_EGRESS: u32 = 47;
pub const BPF_NETKIT_PRIMARY: u32 = 54;
pub const BPF_NETKIT_PEER: u32 = 55;

// Link types (`enum bpf_link_type`).
pub const BPF_LINK_TYPE_XDP: u32 = 6;
pub const BPF_LINK_TYPE_TCX: u32 = 11;
pub const BPF_LINK_TYPE_NETKIT: u32 = 13;

/// Calls `bpf(cmd, attr, size_of::<T>())`; returns the non-negative result (an fd for the
/// commands that create one).
///
/// # Safety
///
/// `T` must be `#[repr(C)]`, laid out as the prefix of `union bpf_attr` that `cmd` reads, with
/// every pointer field pointing to memory valid for what the kernel reads or writes through it
/// for the duration of the call, and zero in every byte the command does not use.
pub unsafe fn bpf<T>(cmd: u32, attr: &mut T) -> io::Result<i64> {
    let size = std::mem::size_of::<T>();
    // SAFETY: the caller upholds the layout and pointer contract above; the kernel reads at
    // most `size` bytes of `attr` (and writes back into it only for commands that do so).
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Wraps a syscall result that is a new fd.
fn owned_fd(rc: i64) -> io::Result<OwnedFd> {
    let raw = i32::try_from(rc).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned `raw` as a new fd of ours; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn fd_u32(fd: BorrowedFd<'_>) -> u32 {
    // An open fd is never negative.
    u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX)
}

/// `BPF_OBJ_PIN` / `BPF_OBJ_GET` (`pathname`, `bpf_fd`, `file_flags`, `path_fd`).
#[repr(C)]
#[derive(Debug, Default)]
pub struct ObjAttr {
    pub pathname: u64,
    pub bpf_fd: u32,
    pub file_flags: u32,
    pub path_fd: i32,
    pub _pad: u32,
}

/// `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct InfoAttr {
    pub bpf_fd: u32,
    pub info_len: u32,
    pub info: u64,
}

/// `BPF_PROG_GET_FD_BY_ID` / `BPF_LINK_GET_FD_BY_ID`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct GetIdAttr {
    pub id: u32,
    pub next_id: u32,
    pub open_flags: u32,
    pub token_fd: i32,
}

/// `BPF_PROG_QUERY`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct QueryAttr {
    pub target_ifindex: u32,
    pub attach_type: u32,
    pub query_flags: u32,
    pub attach_flags: u32,
    pub prog_ids: u64,
    pub count: u32,
    pub _pad: u32,
    pub prog_attach_flags: u64,
    pub link_ids: u64,
    pub link_attach_flags: u64,
    pub revision: u64,
}

/// `BPF_PROG_ATTACH` / `BPF_PROG_DETACH`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct AttachAttr {
    pub target_ifindex: u32,
    pub attach_bpf_fd: u32,
    pub attach_type: u32,
    pub attach_flags: u32,
    pub replace_bpf_fd: u32,
    pub relative_id: u32,
    pub expected_revision: u64,
}

/// `BPF_LINK_DETACH`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct LinkDetachAttr {
    pub link_fd: u32,
}

/// The head of `struct bpf_link_info` and its union, which for XDP, TCX and netkit links starts
/// with the target ifindex (the union is 8-aligned: offset 16). The tail is room for the
/// largest union member; the kernel writes at most `info_len` bytes.
#[repr(C)]
#[derive(Debug)]
pub struct LinkInfo {
    pub link_type: u32,
    pub id: u32,
    pub prog_id: u32,
    pub _pad: u32,
    /// `xdp.ifindex`, `tcx.ifindex`, `netkit.ifindex`.
    pub ifindex: u32,
    /// `tcx.attach_type`, `netkit.attach_type`.
    pub attach_type: u32,
    pub _rest: [u8; 56],
}

impl Default for LinkInfo {
    fn default() -> Self {
        Self {
            link_type: 0,
            id: 0,
            prog_id: 0,
            _pad: 0,
            ifindex: 0,
            attach_type: 0,
            _rest: [0; 56],
        }
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Opens the object pinned at `path` (read-write: the kernel refuses other flags for links).
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let p = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: p.as_ptr() as u64,
        ..ObjAttr::default()
    };
    // SAFETY: ObjAttr is the BPF_OBJ_GET layout; `pathname` points to a NUL-terminated string
    // alive until the call returns.
    owned_fd(unsafe { bpf(BPF_OBJ_GET, &mut attr) }?)
}

/// Pins the object behind `fd` at `path` (on a bpffs).
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let p = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: p.as_ptr() as u64,
        bpf_fd: fd_u32(fd),
        ..ObjAttr::default()
    };
    // SAFETY: ObjAttr is the BPF_OBJ_PIN layout; `pathname` is a live NUL-terminated string.
    unsafe { bpf(BPF_OBJ_PIN, &mut attr) }.map(drop)
}

/// What kind of bpf object an fd is (the anon inode's name: `bpf-link`, `bpf-prog`, `bpf-map`).
pub fn obj_kind(fd: BorrowedFd<'_>) -> io::Result<String> {
    let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    let s = target.to_string_lossy();
    Ok(s.strip_prefix("anon_inode:").unwrap_or(&s).to_owned())
}

/// `BPF_OBJ_GET_INFO_BY_FD` on a **link** fd (the kernel fills a different struct for a
/// program or a map: check [`obj_kind`] first).
pub fn link_info(fd: BorrowedFd<'_>) -> io::Result<LinkInfo> {
    let mut info = LinkInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: fd_u32(fd),
        info_len: u32::try_from(std::mem::size_of::<LinkInfo>()).unwrap_or(0),
        info: std::ptr::from_mut(&mut info) as u64,
    };
    // SAFETY: InfoAttr is the BPF_OBJ_GET_INFO_BY_FD layout; `info` points to a zeroed,
    // writable LinkInfo of `info_len` bytes, alive until the call returns.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    Ok(info)
}

fn fd_by_id(cmd: u32, id: u32) -> io::Result<OwnedFd> {
    let mut attr = GetIdAttr {
        id,
        ..GetIdAttr::default()
    };
    // SAFETY: GetIdAttr is the BPF_*_GET_FD_BY_ID layout; it holds no pointers.
    owned_fd(unsafe { bpf(cmd, &mut attr) }?)
}

/// A new fd on the program with `id`.
pub fn prog_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    fd_by_id(BPF_PROG_GET_FD_BY_ID, id)
}

/// A new fd on the link with `id`.
pub fn link_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    fd_by_id(BPF_LINK_GET_FD_BY_ID, id)
}

/// What is attached at one multi-program hook (TCX, netkit) of a device: program ids, and for
/// each the id of the link that holds it (0 for a plain `BPF_PROG_ATTACH`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attached {
    pub prog_ids: Vec<u32>,
    pub link_ids: Vec<u32>,
    pub revision: u64,
}

/// Largest number of programs one query returns (the kernel caps an mprog hook at 64).
const QUERY_MAX: usize = 64;

/// `BPF_PROG_QUERY` of `attach_type` on device `ifindex`, **resolved in the calling thread's
/// netns**.
pub fn prog_query(ifindex: u32, attach_type: u32) -> io::Result<Attached> {
    let mut progs = [0u32; QUERY_MAX];
    let mut links = [0u32; QUERY_MAX];
    let mut attr = QueryAttr {
        target_ifindex: ifindex,
        attach_type,
        prog_ids: progs.as_mut_ptr() as u64,
        count: u32::try_from(QUERY_MAX).unwrap_or(0),
        link_ids: links.as_mut_ptr() as u64,
        ..QueryAttr::default()
    };
    // SAFETY: QueryAttr is the BPF_PROG_QUERY layout; `prog_ids` and `link_ids` point to
    // writable arrays of `count` u32 each, alive until the call returns.
    unsafe { bpf(BPF_PROG_QUERY, &mut attr) }?;
    let n = usize::try_from(attr.count).unwrap_or(0).min(QUERY_MAX);
    Ok(Attached {
        prog_ids: progs[..n].to_vec(),
        link_ids: links[..n].to_vec(),
        revision: attr.revision,
    })
}

/// `BPF_LINK_DETACH`: the link stays open (and pinned, if it is) but no longer attached.
pub fn link_detach(link: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = LinkDetachAttr {
        link_fd: fd_u32(link),
    };
    // SAFETY: LinkDetachAttr is the BPF_LINK_DETACH layout; it holds no pointers.
    unsafe { bpf(BPF_LINK_DETACH, &mut attr) }.map(drop)
}

/// `BPF_PROG_DETACH` of program `prog` from hook `attach_type` of device `ifindex` (in the
/// calling thread's netns).
pub fn prog_detach(ifindex: u32, prog: BorrowedFd<'_>, attach_type: u32) -> io::Result<()> {
    let mut attr = AttachAttr {
        target_ifindex: ifindex,
        attach_bpf_fd: fd_u32(prog),
        attach_type,
        ..AttachAttr::default()
    };
    // SAFETY: AttachAttr is the BPF_PROG_DETACH layout; it holds no pointers.
    unsafe { bpf(BPF_PROG_DETACH, &mut attr) }.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    // Offsets of the anonymous structs of `union bpf_attr` (include/uapi/linux/bpf.h, 6.18).
    #[test]
    fn attr_layouts_match_the_uapi() {
        assert_eq!(offset_of!(ObjAttr, pathname), 0);
        assert_eq!(offset_of!(ObjAttr, bpf_fd), 8);
        assert_eq!(offset_of!(ObjAttr, file_flags), 12);
        assert_eq!(offset_of!(ObjAttr, path_fd), 16);
        assert_eq!(size_of::<ObjAttr>(), 24);

        assert_eq!(offset_of!(InfoAttr, info_len), 4);
        assert_eq!(offset_of!(InfoAttr, info), 8);
        assert_eq!(size_of::<InfoAttr>(), 16);

        assert_eq!(offset_of!(GetIdAttr, next_id), 4);
        assert_eq!(offset_of!(GetIdAttr, open_flags), 8);
        assert_eq!(size_of::<GetIdAttr>(), 16);

        assert_eq!(offset_of!(QueryAttr, attach_type), 4);
        assert_eq!(offset_of!(QueryAttr, query_flags), 8);
        assert_eq!(offset_of!(QueryAttr, attach_flags), 12);
        assert_eq!(offset_of!(QueryAttr, prog_ids), 16);
        assert_eq!(offset_of!(QueryAttr, count), 24);
        assert_eq!(offset_of!(QueryAttr, prog_attach_flags), 32);
        assert_eq!(offset_of!(QueryAttr, link_ids), 40);
        assert_eq!(offset_of!(QueryAttr, link_attach_flags), 48);
        assert_eq!(offset_of!(QueryAttr, revision), 56);
        assert_eq!(size_of::<QueryAttr>(), 64);

        assert_eq!(offset_of!(AttachAttr, attach_bpf_fd), 4);
        assert_eq!(offset_of!(AttachAttr, attach_type), 8);
        assert_eq!(offset_of!(AttachAttr, attach_flags), 12);
        assert_eq!(offset_of!(AttachAttr, replace_bpf_fd), 16);
        assert_eq!(offset_of!(AttachAttr, relative_id), 20);
        assert_eq!(offset_of!(AttachAttr, expected_revision), 24);
        assert_eq!(size_of::<AttachAttr>(), 32);

        assert_eq!(size_of::<LinkDetachAttr>(), 4);

        // struct bpf_link_info: type, id, prog_id, then the 8-aligned union.
        assert_eq!(offset_of!(LinkInfo, id), 4);
        assert_eq!(offset_of!(LinkInfo, prog_id), 8);
        assert_eq!(offset_of!(LinkInfo, ifindex), 16);
        assert_eq!(offset_of!(LinkInfo, attach_type), 20);
        assert_eq!(size_of::<LinkInfo>(), 80);
    }

    #[test]
    fn query_attr_bytes_carry_ifindex_type_and_buffers() {
        let attr = QueryAttr {
            target_ifindex: 7,
            attach_type: BPF_TCX_EGRESS,
            prog_ids: 0x1122_3344_5566_7788,
            count: 64,
            link_ids: 0x0102_0304_0506_0708,
            ..QueryAttr::default()
        };
        // SAFETY: QueryAttr is repr(C) with only integer fields and explicit padding, so all
        // of its 64 bytes are initialised.
        let bytes: [u8; 64] = unsafe { std::mem::transmute(attr) };
        assert_eq!(&bytes[0..4], &7u32.to_ne_bytes());
        assert_eq!(&bytes[4..8], &47u32.to_ne_bytes());
        assert_eq!(&bytes[16..24], &0x1122_3344_5566_7788u64.to_ne_bytes());
        assert_eq!(&bytes[24..28], &64u32.to_ne_bytes());
        assert_eq!(&bytes[40..48], &0x0102_0304_0506_0708u64.to_ne_bytes());
        assert!(
            bytes[8..16]
                .iter()
                .chain(&bytes[28..40])
                .chain(&bytes[48..])
                .all(|b| *b == 0)
        );
    }

    #[test]
    fn a_missing_pin_is_an_io_error_not_a_panic() {
        let e = obj_get(Path::new("/nonexistent/dranet-pin")).unwrap_err();
        assert!(e.raw_os_error().is_some(), "{e}");
        let e = obj_get(Path::new("/sys/fs/bpf\0x")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }
}
