//! Netns identity of a path or fd (cookie via `NS_GET_ID`, inode via fstat), for mapping watched
//! paths and nsfs inodes to [`NetnsId`]s.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::netns::NetnsId;

/// `NS_GET_ID` = `_IOR(0xb7, 13, __u64)`: the netns cookie of an nsfs fd (Linux 6.11+ uapi).
const NS_GET_ID: libc::c_ulong = (2 << 30) | (8 << 16) | (0xb7 << 8) | 13;

/// Identity of the namespace behind `fd`. Fails if `fd` is not a netns nsfs file or the kernel
/// lacks `NS_GET_ID`.
pub fn identify_fd(fd: BorrowedFd<'_>) -> std::io::Result<NetnsId> {
    let mut cookie: u64 = 0;
    // SAFETY: NS_GET_ID writes one u64 through the pointer, which points at a live local.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_ID, &mut cookie as *mut u64) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let st = nix::sys::stat::fstat(fd).map_err(std::io::Error::from)?;
    Ok(NetnsId {
        cookie,
        inode: st.st_ino,
    })
}

/// Identity of the netns bind-mounted (or linked) at `path`.
pub fn identify_path(path: &Path) -> std::io::Result<NetnsId> {
    let f = File::open(path)?;
    // A plain file left behind after an unmount has the tmpfs inode, not an nsfs one.
    let meta = f.metadata()?;
    if meta.dev() == 0 && meta.ino() == 0 {
        return Err(std::io::ErrorKind::InvalidData.into());
    }
    identify_fd(f.as_fd())
}
