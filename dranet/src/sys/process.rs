//! This process's own resource use, read from procfs at scrape time for the standard Prometheus
//! process metrics (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...): CPU time
//! and start time from `/proc/self/stat`, memory from `/proc/self/statm`, open fds from
//! `/proc/self/fd`, the fd limit from `getrlimit(RLIMIT_NOFILE)`. A few small reads, no thread
//! or timer: cheap enough for every scrape.

use std::path::Path;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("reading {path}")]
    Read {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} has no field {field}")]
    Parse { path: &'static str, field: &'static str },
}

/// One sample of the process's resource use.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessStats {
    /// User + system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Resident set size, bytes.
    pub resident_bytes: u64,
    /// Virtual memory size, bytes.
    pub virtual_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft `RLIMIT_NOFILE` (`u64::MAX` when unlimited).
    pub max_fds: u64,
    /// Start time since the Unix epoch, seconds.
    pub start_time_seconds: f64,
}

const STAT: &str = "/proc/self/stat";
const STATM: &str = "/proc/self/statm";
const FD_DIR: &str = "/proc/self/fd";
const KERNEL_STAT: &str = "/proc/stat";

fn read(path: &'static str) -> Result<String, ProcessError> {
    std::fs::read_to_string(path).map_err(|source| ProcessError::Read { path, source })
}

fn sysconf(name: libc::c_int, fallback: u64) -> u64 {
    // SAFETY: sysconf takes no pointer and has no side effect.
    let v = unsafe { libc::sysconf(name) };
    u64::try_from(v).ok().filter(|v| *v > 0).unwrap_or(fallback)
}

/// Fields of `/proc/<pid>/stat` after the command name (which may hold spaces and parentheses,
/// so the split is after its last `)`): index 0 is field 3 (`state`).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_ascii_whitespace().collect())
}

/// `(utime + stime, starttime)` in clock ticks from a `/proc/<pid>/stat` line.
fn parse_stat(stat: &str) -> Result<(u64, u64), ProcessError> {
    let fields = stat_fields(stat).ok_or(ProcessError::Parse {
        path: STAT,
        field: "comm",
    })?;
    // Fields 14 (utime), 15 (stime), 22 (starttime), 1-based; index 0 here is field 3.
    let field = |n: usize, name: &'static str| {
        fields
            .get(n - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or(ProcessError::Parse {
                path: STAT,
                field: name,
            })
    };
    Ok((field(14, "utime")? + field(15, "stime")?, field(22, "starttime")?))
}

/// `(size, resident)` in pages from `/proc/<pid>/statm`.
fn parse_statm(statm: &str) -> Result<(u64, u64), ProcessError> {
    let mut it = statm.split_ascii_whitespace().map(str::parse::<u64>);
    let mut next = |field| {
        it.next()
            .and_then(Result::ok)
            .ok_or(ProcessError::Parse { path: STATM, field })
    };
    Ok((next("size")?, next("resident")?))
}

/// The boot time (`btime`, seconds since the epoch) from `/proc/stat`.
fn parse_btime(stat: &str) -> Result<u64, ProcessError> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
        .ok_or(ProcessError::Parse {
            path: KERNEL_STAT,
            field: "btime",
        })
}

fn count_fds(dir: &Path) -> Result<u64, ProcessError> {
    let entries = std::fs::read_dir(dir).map_err(|source| ProcessError::Read { path: FD_DIR, source })?;
    // The directory's own fd (open while it is read) is one of the entries: not counted.
    Ok((entries.count() as u64).saturating_sub(1))
}

fn max_fds() -> u64 {
    match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) if soft == nix::sys::resource::RLIM_INFINITY => u64::MAX,
        Ok((soft, _)) => soft,
        Err(_) => 0,
    }
}

/// Reads this process's resource use now.
///
/// # Errors
/// [`ProcessError`] when a procfs file cannot be read or parsed (no `/proc` mounted).
pub fn stats() -> Result<ProcessStats, ProcessError> {
    let ticks = sysconf(libc::_SC_CLK_TCK, 100) as f64;
    let page = sysconf(libc::_SC_PAGESIZE, 4096);
    let (cpu_ticks, start_ticks) = parse_stat(&read(STAT)?)?;
    let (size, resident) = parse_statm(&read(STATM)?)?;
    let btime = parse_btime(&read(KERNEL_STAT)?)?;
    Ok(ProcessStats {
        cpu_seconds: cpu_ticks as f64 / ticks,
        resident_bytes: resident * page,
        virtual_bytes: size * page,
        open_fds: count_fds(Path::new(FD_DIR))?,
        max_fds: max_fds(),
        start_time_seconds: btime as f64 + start_ticks as f64 / ticks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_with_spaces_and_parentheses_is_skipped() {
        // Fields 3.. of a real line, the command name made awkward.
        let line = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 12345 1000 200";
        assert_eq!(parse_stat(line).unwrap(), (300, 12345));
        assert!(parse_stat("42 no-parens").is_err());
        assert_eq!(parse_statm("2500 300 100 1 0 400 0\n").unwrap(), (2500, 300));
        assert_eq!(
            parse_btime("cpu 1 2 3\nbtime 1700000000\nprocesses 9\n").unwrap(),
            1_700_000_000
        );
    }

    #[test]
    fn this_process_reads_sane_values() {
        let s = stats().unwrap();
        assert!(
            s.resident_bytes > 0 && s.virtual_bytes >= s.resident_bytes,
            "{s:?}"
        );
        assert!(s.open_fds >= 3 && s.max_fds >= s.open_fds, "{s:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Started within the last day, not in the future (the clock ticks round down).
        assert!(
            s.start_time_seconds > now - 86_400.0 && s.start_time_seconds <= now + 1.0,
            "{s:?}"
        );
        assert!(s.cpu_seconds >= 0.0, "{s:?}");
    }
}
