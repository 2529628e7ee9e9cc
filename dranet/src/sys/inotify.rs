//! inotify on the netns directories: a fallback source of "netns file removed" events when no
//! unlink probe can run, and a cheap way to learn the identity of netns files as they appear.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::io::unix::AsyncFd;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum InotifyError {
    #[error("inotify_init")]
    Init(#[source] nix::Error),
    #[error("inotify watch on {path}")]
    Watch {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("registering the inotify fd with tokio")]
    Async(#[source] std::io::Error),
}

/// What inotify saw.
#[derive(Debug)]
pub enum DirEvent {
    Created(PathBuf),
    Removed(PathBuf),
}

struct Fd(Inotify);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl AsFd for Fd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// An inotify instance on a set of directories.
pub struct DirWatch {
    fd: AsyncFd<Fd>,
    dirs: Vec<(WatchDescriptor, PathBuf)>,
}

impl DirWatch {
    /// Watches each existing directory (duplicates by real path are skipped: /var/run is often a
    /// symlink to /run).
    pub fn new(dirs: &[PathBuf]) -> Result<Self, InotifyError> {
        let ino =
            Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(InotifyError::Init)?;
        let mut seen = Vec::new();
        let mut watched = Vec::new();
        for dir in dirs {
            let Ok(real) = std::fs::canonicalize(dir) else {
                continue;
            };
            if seen.contains(&real) {
                continue;
            }
            let wd = ino
                .add_watch(
                    &real,
                    AddWatchFlags::IN_CREATE | AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM,
                )
                .map_err(|source| InotifyError::Watch {
                    path: real.clone(),
                    source,
                })?;
            seen.push(real);
            watched.push((wd, dir.clone()));
        }
        let fd = super::os::async_readable(Fd(ino)).map_err(InotifyError::Async)?;
        Ok(Self { fd, dirs: watched })
    }

    /// Directories actually watched.
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.dirs.iter().map(|(_, p)| p.as_path())
    }

    /// Waits for the next batch of events.
    pub async fn next_batch(&mut self) -> std::io::Result<Vec<DirEvent>> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.get_inner().0.read_events() {
                Ok(events) => {
                    let mut out = Vec::with_capacity(events.len());
                    for ev in events {
                        let Some(name) = ev.name else { continue };
                        let Some((_, dir)) = self.dirs.iter().find(|(wd, _)| *wd == ev.wd) else {
                            continue;
                        };
                        let path = dir.join(name);
                        if ev.mask.contains(AddWatchFlags::IN_CREATE) {
                            out.push(DirEvent::Created(path));
                        } else {
                            out.push(DirEvent::Removed(path));
                        }
                    }
                    return Ok(out);
                }
                Err(nix::Error::EAGAIN) => guard.clear_ready(),
                Err(e) => return Err(e.into()),
            }
        }
    }
}
