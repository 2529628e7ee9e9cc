//! Prepare time, host netns: unpin the bpffs-pinned links that target a device.
//!
//! A pinned link keeps its program attached for as long as the pin exists, whatever else
//! detaches it later, so upstream removes the pins first. The walk never follows a symlink,
//! never leaves the bpffs it started on (mount points below it are skipped), stops at
//! [`MAX_DEPTH`] directories and [`MAX_ENTRIES`] entries, and only ever unlinks a file that
//! the kernel says is a link of an interesting type targeting the device.

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::BpfError;
use super::sys::{self, BPF_LINK_TYPE_NETKIT, BPF_LINK_TYPE_TCX, BPF_LINK_TYPE_XDP};

/// Deepest directory level looked at below the root.
pub const MAX_DEPTH: usize = 16;
/// Most directory entries looked at in one walk.
pub const MAX_ENTRIES: usize = 100_000;

/// The kinds of links that target a network device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    Tcx,
    Netkit,
    Xdp,
}

impl LinkKind {
    fn of(link_type: u32) -> Option<Self> {
        match link_type {
            BPF_LINK_TYPE_TCX => Some(Self::Tcx),
            BPF_LINK_TYPE_NETKIT => Some(Self::Netkit),
            BPF_LINK_TYPE_XDP => Some(Self::Xdp),
            _ => None,
        }
    }
}

impl std::fmt::Display for LinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Tcx => "tcx",
            Self::Netkit => "netkit",
            Self::Xdp => "xdp",
        })
    }
}

/// One pin removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unpinned {
    pub path: PathBuf,
    pub kind: LinkKind,
    pub link_id: u32,
    pub prog_id: u32,
}

impl std::fmt::Display for Unpinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} link {} (program {}) pinned at {}",
            self.kind,
            self.link_id,
            self.prog_id,
            self.path.display()
        )
    }
}

/// The link ids attached to device `ifindex` of the calling thread's netns at its TCX and
/// netkit hooks (a hook the device does not have counts as empty). Used to make sure a pinned
/// link with a matching ifindex is not one of a same-numbered device in another netns.
fn local_link_ids(ifindex: u32) -> Vec<u32> {
    let mut ids = Vec::new();
    for at in [
        sys::BPF_TCX_INGRESS,
        sys::BPF_TCX_EGRESS,
        sys::BPF_NETKIT_PRIMARY,
        sys::BPF_NETKIT_PEER,
    ] {
        if let Ok(a) = sys::prog_query(ifindex, at) {
            ids.extend(a.link_ids.into_iter().filter(|id| *id != 0));
        }
    }
    ids
}

/// Whether the pinned file at `path` is a link to unpin for device `ifindex`; `Ok(None)` for
/// anything else (not a bpf object, a program, a map, another link type or device).
fn pinned_link_of(path: &Path, ifindex: u32, local: &[u32]) -> Option<Unpinned> {
    let fd = match sys::obj_get(path) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::trace!(path = %path.display(), error = %crate::telemetry::chain(&e), "not a pinned bpf object");
            return None;
        }
    };
    if sys::obj_kind(fd.as_fd()).ok()?.as_str() != "bpf-link" {
        return None;
    }
    let info = sys::link_info(fd.as_fd()).ok()?;
    let kind = LinkKind::of(info.link_type)?;
    if info.ifindex != ifindex {
        return None;
    }
    // ifindexes are per netns: TCX and netkit links are confirmed by the device's own hooks.
    // XDP has no such query; its ifindex is trusted (as upstream does for all three).
    if matches!(kind, LinkKind::Tcx | LinkKind::Netkit) && !local.contains(&info.id) {
        tracing::debug!(path = %path.display(), link = info.id, "same ifindex, another netns's device");
        return None;
    }
    Some(Unpinned {
        path: path.to_owned(),
        kind,
        link_id: info.id,
        prog_id: info.prog_id,
    })
}

/// The pinned links of device `ifindex` (in the calling thread's netns) under `root`.
pub fn find_pinned_links(root: &Path, ifindex: u32) -> Result<Vec<Unpinned>, BpfError> {
    let top = match std::fs::symlink_metadata(root) {
        Ok(m) if m.is_dir() => m,
        // No bpffs (or nothing mounted there): nothing can be pinned.
        Ok(_) => return Ok(Vec::new()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(BpfError::Walk {
                path: root.to_owned(),
                source,
            });
        }
    };
    let local = local_link_ids(ifindex);
    let mut found = Vec::new();
    let mut seen = 0usize;
    let mut stack: Vec<(PathBuf, usize)> = vec![(root.to_owned(), 0)];
    while let Some((dir, depth)) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %crate::telemetry::chain(&e), "bpffs directory skipped");
                continue;
            }
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > MAX_ENTRIES {
                tracing::warn!(root = %root.display(), "bpffs walk stopped at {MAX_ENTRIES} entries");
                return Ok(found);
            }
            let path = entry.path();
            // lstat: a symlink is never followed.
            let Ok(m) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if m.dev() != top.dev() {
                continue;
            }
            if m.is_dir() {
                if depth < MAX_DEPTH {
                    stack.push((path, depth + 1));
                }
            } else if m.is_file()
                && let Some(u) = pinned_link_of(&path, ifindex, &local)
            {
                found.push(u);
            }
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// Removes every pin of a link of device `ifname` (looked up in the calling thread's netns)
/// under `root`. A pin that vanished meanwhile counts as removed; any other failure stops with
/// [`BpfError::Unpin`], naming what was already unpinned.
pub fn unpin_links(root: &Path, ifname: &str) -> Result<Vec<Unpinned>, BpfError> {
    let ifindex = nix::net::if_::if_nametoindex(ifname).map_err(|source| BpfError::NoDevice {
        ifname: ifname.to_owned(),
        source,
    })?;
    let mut done = Vec::new();
    for u in find_pinned_links(root, ifindex)? {
        match std::fs::remove_file(&u.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(BpfError::Unpin {
                    path: u.path,
                    done: done.iter().map(ToString::to_string).collect(),
                    source,
                });
            }
        }
        tracing::info!(device = ifname, link = %u, "unpinned bpf link");
        done.push(u);
    }
    Ok(done)
}
