//! One writer per state dir: an exclusive `flock` on `<state-dir>/lock`, held as long as the
//! [`StateLock`] lives (the kernel drops it when the process dies, so a SIGKILLed daemon never
//! leaves it behind). The holder writes its pid into the file, so a process that has to wait
//! can say who it waits for.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::StateError;

/// File name of the lock in the state dir.
pub const LOCK_FILE: &str = "lock";

/// How often a waiter tries again.
const POLL: Duration = Duration::from_millis(100);

/// The exclusive lock on a state dir; released on drop (or when the process dies).
#[derive(Debug)]
pub struct StateLock {
    /// Holds the `flock` (std's `File::try_lock`) until dropped.
    _file: File,
    path: PathBuf,
}

impl StateLock {
    /// Takes the lock of `dir`, waiting up to `wait` for a holder to let go (polled, so it never
    /// blocks an async worker: call it from async code with [`StateLock::acquire`]).
    pub fn try_acquire(dir: &Path) -> Result<Option<Self>, StateError> {
        let path = dir.join(LOCK_FILE);
        let lerr = |source| StateError::Lock {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(lerr)?;
        match file.try_lock() {
            Ok(()) => {
                let mut f = file;
                // Who holds it, for the message of a process that waits.
                let pid = format!("{}\n", std::process::id());
                let written = f
                    .set_len(0)
                    .and_then(|()| f.rewind())
                    .and_then(|()| f.write_all(pid.as_bytes()));
                if let Err(e) = written {
                    warn!(lock = %path.display(), error = %crate::telemetry::chain(&e), "cannot record the lock holder's pid");
                }
                Ok(Some(Self { _file: f, path }))
            }
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(lerr(e)),
        }
    }

    /// Takes the lock of `dir`, waiting up to `wait` (polling every 100 ms, logging once who
    /// holds it); [`StateError::Locked`] naming the holder after that.
    pub async fn acquire(dir: &Path, wait: Duration) -> Result<Self, StateError> {
        let started = Instant::now();
        let mut said = false;
        loop {
            if let Some(l) = Self::try_acquire(dir)? {
                if said {
                    info!(dir = %dir.display(), waited_ms = started.elapsed().as_millis(), "state dir lock taken");
                }
                return Ok(l);
            }
            let path = dir.join(LOCK_FILE);
            if started.elapsed() >= wait {
                return Err(StateError::Locked {
                    dir: dir.to_owned(),
                    holder: holder(&path),
                    path,
                    waited_s: wait.as_secs(),
                });
            }
            if !said {
                said = true;
                warn!(
                    dir = %dir.display(),
                    holder = holder(&path),
                    wait_s = wait.as_secs(),
                    "the state dir is locked by another dranet: waiting"
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The lock file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Who holds the lock, as its file says: `pid N (<command line>)`.
fn holder(path: &Path) -> String {
    let mut s = String::new();
    if File::open(path)
        .and_then(|mut f| f.read_to_string(&mut s))
        .is_err()
    {
        return "unknown process".into();
    }
    let Ok(pid) = s.trim().parse::<u32>() else {
        return "unknown process".into();
    };
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .take(3)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    if cmd.is_empty() {
        format!("pid {pid}")
    } else {
        format!("pid {pid}: {cmd}")
    }
}
