//! Netns identity of a path or fd (cookie via `NS_GET_ID`, inode via fstat), for mapping watched
//! paths and nsfs inodes to [`NetnsId`]s.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::sys::netns::NetnsId;

/// Identity of the namespace behind `fd`. Fails if `fd` is not a netns nsfs file or the kernel
/// can tell neither by `NS_GET_ID` nor by `SO_NETNS_COOKIE` (see [`crate::sys::netns::cookie`]).
pub fn identify_fd(fd: BorrowedFd<'_>) -> std::io::Result<NetnsId> {
    crate::sys::netns::identify(fd).map_err(std::io::Error::from)
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
