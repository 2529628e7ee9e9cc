//! The process's own syscalls: the monotonic clock, `RLIMIT_NOFILE`, errno classification,
//! registering fds with tokio's reactor, handing freed heap back to the kernel, and raising the
//! scheduling priority of the thread that reacts to netns teardowns.

use crate::clock::MonoTime;
use tokio::io::unix::AsyncFd;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum OsError {
    /// `getrlimit`/`setrlimit` failed.
    #[error("{call}(RLIMIT_NOFILE) failed")]
    Rlimit {
        call: &'static str,
        #[source]
        source: nix::Error,
    },
    /// Neither `SCHED_FIFO` nor a negative nice value could be set on the calling thread.
    #[error("cannot raise the thread's priority (SCHED_FIFO: {fifo}; nice {nice}: {nice_error})")]
    Priority {
        fifo: std::io::Error,
        nice: i32,
        nice_error: std::io::Error,
    },
}

/// The scheduling a thread got from [`raise_thread_priority`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// `SCHED_FIFO` at this real-time priority.
    Fifo(i32),
    /// `SCHED_OTHER` at this (negative) nice value.
    Nice(i32),
}

/// Raises the calling thread (only it, not the process) to `SCHED_FIFO` at `fifo`, or, where
/// that is not allowed (no `CAP_SYS_NICE`, `RLIMIT_RTPRIO` 0, a cgroup without real-time
/// runtime), to nice `nice` under `SCHED_OTHER`. Either way with `SCHED_RESET_ON_FORK`: threads
/// the caller starts (a runtime's blocking pool, a netns worker) run at the normal priority.
///
/// # Errors
/// [`OsError::Priority`] when neither could be set; the thread keeps its scheduling.
pub fn raise_thread_priority(fifo: i32, nice: i32) -> Result<Priority, OsError> {
    let param = libc::sched_param { sched_priority: fifo };
    // SAFETY: sched_setscheduler reads `param` (a valid, initialized sched_param on our stack)
    // and changes only the scheduling of the calling thread (pid 0).
    let rc = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &raw const param)
    };
    if rc == 0 {
        return Ok(Priority::Fifo(fifo));
    }
    let fifo_error = std::io::Error::last_os_error();
    let other = libc::sched_param { sched_priority: 0 };
    // SAFETY: as above; SCHED_OTHER with priority 0 keeps the thread's nice value and only adds
    // the reset-on-fork flag (no privilege needed).
    let rc = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_OTHER | libc::SCHED_RESET_ON_FORK, &raw const other)
    };
    if rc != 0 {
        return Err(OsError::Priority {
            fifo: fifo_error,
            nice,
            nice_error: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority(PRIO_PROCESS, tid) changes the nice value of the one thread `tid`,
    // which is the calling thread; no memory is passed.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, u32::try_from(tid).unwrap_or(0), nice) };
    if rc != 0 {
        return Err(OsError::Priority {
            fifo: fifo_error,
            nice,
            nice_error: std::io::Error::last_os_error(),
        });
    }
    Ok(Priority::Nice(nice))
}

/// CLOCK_MONOTONIC now (the clock of `bpf_ktime_get_ns`): the one place dranet reads it.
#[must_use]
pub fn mono_now() -> MonoTime {
    MonoTime::from_ns(
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(|t| {
                u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
                    + u64::try_from(t.tv_nsec()).unwrap_or(0)
            })
            .unwrap_or(0),
    )
}

/// The soft `RLIMIT_NOFILE` before and after [`raise_nofile_limit`], and the hard limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NofileLimit {
    pub old_soft: u64,
    pub new_soft: u64,
    pub hard: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (a no-op when they are equal).
///
/// # Errors
/// [`OsError::Rlimit`] when the limit cannot be read or set.
pub fn raise_nofile_limit() -> Result<NofileLimit, OsError> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|source| OsError::Rlimit {
        call: "getrlimit",
        source,
    })?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(|source| OsError::Rlimit {
            call: "setrlimit",
            source,
        })?;
    }
    Ok(NofileLimit {
        old_soft: soft,
        new_soft: soft.max(hard),
        hard,
    })
}

/// Is `e` an `EPROTO` (a protocol error on one pending connection)?
#[must_use]
pub fn is_eproto(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EPROTO)
}

/// Is `e` an `EPERM`?
#[must_use]
pub fn is_eperm(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EPERM)
}

/// Registers an fd-owning object with tokio's reactor for readability.
pub fn async_readable<T: std::os::fd::AsRawFd>(inner: T) -> std::io::Result<AsyncFd<T>> {
    // SAFETY: every `T` used here (ring buffer, aya-log logger, inotify instance, netlink socket)
    // owns its fd for its whole lifetime and always returns the same fd from `as_raw_fd`.
    unsafe { AsyncFd::register_with_interest(inner, tokio::io::Interest::READABLE) }
        .map_err(std::io::Error::from)
}

/// The most malloc arenas the daemon's threads may spread over. glibc's default is 8 per core,
/// and an arena never gives back the pages at the top of its heap that `malloc_trim` skips: each
/// thread that ran a burst (the probe load, an inventory scan of 1,024 devices, a blocking-pool
/// thread during a drain) left its own arena holding several MiB. Two arenas serve the two
/// workers without lock contention; the reactor and the blocking pool share them.
pub const MALLOC_ARENAS: i32 = 2;

/// The glibc tunables the daemon's image sets (`GLIBC_TUNABLES`, read by glibc at exec, so
/// not settable from inside the process): no per-thread cache (`tcache`) and no fast bins.
/// Both keep freed chunks out of the arena's free lists, where they would coalesce, so after a
/// burst of pods the chunks each thread cached pinned pages that `malloc_trim` cannot return.
/// Measured by `dranet-bench --only churn` (256 pods, 3 rounds): the RSS growth per round was
/// +3.1..+3.9 MiB with the defaults, +1.5 MiB without tcache alone, no better with `mxfast=0`
/// alone, and -0.3..+1.4 MiB (p50 under 0.3) with both; the churn rate was unchanged.
pub const MALLOC_TUNABLES: &str = "glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0";

/// Whether this process runs with every tunable of [`MALLOC_TUNABLES`] (always `true` off
/// glibc, where they mean nothing).
#[must_use]
pub fn malloc_tunables_set() -> bool {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return true;
    }
    let set = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    MALLOC_TUNABLES
        .split(':')
        .all(|want| set.split(':').any(|have| have == want))
}

/// Caps the malloc arenas at [`MALLOC_ARENAS`]. Call before the first thread is spawned (the cap
/// applies to arenas created after it). Returns whether the allocator took it (always `false`
/// off glibc).
pub fn cap_malloc_arenas() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter under the allocator's own lock; it has no
    // pointer arguments and is safe to call from any thread at any time.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS) == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

/// Loading the probes parses the kernel's BTF (several MiB of short-lived allocations); glibc
/// keeps the freed heap mapped, which would double the idle daemon's RSS. Hand it back once.
/// Inventory scans call it too (a scan of 1,024 devices allocates tens of MiB, in the arena of
/// whichever thread ran it).
pub fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and trims the allocator's own free lists; it takes the
    // allocator's locks and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

static INHERITED_TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The connected Unix socket a parent process left open for this one at fd `value` (decimal),
/// as an NRI runtime does for a plugin it launches. Taken at most once per process: `Ok(None)`
/// on every later call.
///
/// # Errors
/// `InvalidInput` when `value` is not a non-negative fd number.
pub fn take_inherited_socket(value: &str) -> std::io::Result<Option<std::os::unix::net::UnixStream>> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let fd: i32 = value
        .trim()
        .parse()
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    if fd < 0 {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    if INHERITED_TAKEN.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return Ok(None);
    }
    // SAFETY: the parent started this process with `fd` open and connected for it; nothing
    // else in the process owns it, and INHERITED_TAKEN makes sure it is wrapped once.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(Some(std::os::unix::net::UnixStream::from(owned)))
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod arena_tests {
    #[test]
    fn glibc_takes_the_arena_cap() {
        assert!(super::cap_malloc_arenas(), "mallopt(M_ARENA_MAX) refused");
    }
}

/// The machine's host name (`uname -n`), as kubelet names a node by default: lower case, without
/// surrounding blanks. `None` when the kernel's answer is empty or not UTF-8.
#[must_use]
pub fn node_hostname() -> Option<String> {
    let h = nix::unistd::gethostname().ok()?.into_string().ok()?;
    let h = h.trim().to_lowercase();
    (!h.is_empty()).then_some(h)
}

#[cfg(test)]
mod tunables_tests {
    /// The image sets exactly the tunables the daemon checks for (and the harness runs it with).
    #[test]
    fn the_image_sets_the_malloc_tunables() {
        let dockerfile = include_str!("../../../deploy/Dockerfile");
        let line = format!("ENV GLIBC_TUNABLES={}", super::MALLOC_TUNABLES);
        assert!(
            dockerfile.lines().any(|l| l == line),
            "deploy/Dockerfile lacks {line:?}"
        );
    }
}
