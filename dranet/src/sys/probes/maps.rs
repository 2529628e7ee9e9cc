//! The maps of the loaded probes, typed: the watched-path table, the event ring buffer, the
//! per-CPU count of events the probes could not queue, and the aya-log pump.

use std::time::Duration;

use aya::Ebpf;
use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use dranet_common::{Event, MAX_PREFIXES, PathKey, Prefix};
use tokio::io::unix::AsyncFd;
use tracing::debug;

use crate::sys::os::async_readable;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("eBPF map {map}: {detail}")]
    Map { map: &'static str, detail: String },
    #[error("path {path} is longer than {max} bytes and cannot be watched in the kernel", max = dranet_common::PATH_LEN - 1)]
    PathTooLong { path: String },
}

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> MapError {
    move |e| MapError::Map {
        map,
        detail: e.to_string(),
    }
}

fn missing(map: &'static str) -> MapError {
    MapError::Map {
        map,
        detail: "missing".into(),
    }
}

/// The exact paths the probes match (beside the prefixes), and the programs' lifetime.
pub struct Watched {
    watched: BpfHashMap<MapData, PathKey, u32>,
    count: Array<MapData, u32>,
    exact: usize,
    /// Keeps the programs attached.
    _ebpf: Ebpf,
}

impl Watched {
    /// Adds `path` to the exact paths matched in the kernel.
    pub fn add(&mut self, path: &str) -> Result<(), MapError> {
        let key = dranet_common::path_key(path.as_bytes()).ok_or_else(|| MapError::PathTooLong {
            path: path.to_owned(),
        })?;
        self.watched.insert(key, 1, 0).map_err(map_err("WATCHED"))?;
        self.exact += 1;
        self.publish_count()
    }

    /// Removes `path` from the exact paths (absent: nothing to do).
    pub fn remove(&mut self, path: &str) -> Result<(), MapError> {
        if let Some(key) = dranet_common::path_key(path.as_bytes())
            && self.watched.remove(&key).is_ok()
        {
            self.exact = self.exact.saturating_sub(1);
        }
        self.publish_count()
    }

    fn publish_count(&mut self) -> Result<(), MapError> {
        self.count
            .set(0, u32::try_from(self.exact).unwrap_or(u32::MAX), 0)
            .map_err(map_err("WATCHED_COUNT"))
    }
}

/// The ring buffer the probes write their events to, registered with tokio's reactor.
pub struct EventRing {
    fd: AsyncFd<RingBuf<MapData>>,
}

impl EventRing {
    /// Waits until events are queued and hands each to `f`. An error means the fd failed.
    pub async fn drain(&mut self, mut f: impl FnMut(&[u8])) -> std::io::Result<()> {
        let mut guard = self.fd.readable_mut().await?;
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            f(&item);
        }
        guard.clear_ready();
        Ok(())
    }
}

/// The per-CPU count of events the probes could not queue (ring buffer full).
pub struct LostCounter {
    map: PerCpuArray<MapData, u64>,
}

impl LostCounter {
    /// The sum over CPUs, `None` if the map cannot be read now.
    #[must_use]
    pub fn total(&self) -> Option<u64> {
        let values = self.map.get(&0, 0).ok()?;
        Some(values.iter().copied().fold(0, u64::wrapping_add))
    }
}

/// Forwards aya-log records to `log` (and so to `tracing`).
pub struct LogPump {
    fd: AsyncFd<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

impl LogPump {
    /// Runs until the logger's fd fails.
    pub async fn run(mut self) {
        while let Ok(mut guard) = self.fd.readable_mut().await {
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    }
}

/// Everything the watcher needs from a loaded object.
pub struct Maps {
    pub watched: Watched,
    pub ring: EventRing,
    pub lost: LostCounter,
    pub log: Option<LogPump>,
}

/// Takes the maps of a loaded object and writes the watched `prefixes` into it.
pub fn take(mut ebpf: Ebpf, prefixes: &[String]) -> Result<Maps, MapError> {
    let events = ebpf.take_map("EVENTS").ok_or_else(|| missing("EVENTS"))?;
    let ring = RingBuf::try_from(events).map_err(map_err("EVENTS"))?;
    {
        let map = ebpf.map_mut("PREFIXES").ok_or_else(|| missing("PREFIXES"))?;
        let mut arr: Array<&mut MapData, Prefix> = Array::try_from(map).map_err(map_err("PREFIXES"))?;
        for (i, p) in prefixes.iter().take(MAX_PREFIXES as usize).enumerate() {
            let key = dranet_common::path_key(p.as_bytes())
                .ok_or_else(|| MapError::PathTooLong { path: p.clone() })?;
            let prefix = Prefix {
                len: u32::try_from(p.len()).unwrap_or(0),
                _pad: 0,
                bytes: key.bytes,
            };
            arr.set(u32::try_from(i).unwrap_or(0), prefix, 0)
                .map_err(map_err("PREFIXES"))?;
        }
    }
    let watched = ebpf.take_map("WATCHED").ok_or_else(|| missing("WATCHED"))?;
    let watched = BpfHashMap::try_from(watched).map_err(map_err("WATCHED"))?;
    let count = ebpf
        .take_map("WATCHED_COUNT")
        .ok_or_else(|| missing("WATCHED_COUNT"))?;
    let count = Array::try_from(count).map_err(map_err("WATCHED_COUNT"))?;
    let lost = ebpf.take_map("LOST").ok_or_else(|| missing("LOST"))?;
    let lost: PerCpuArray<MapData, u64> = PerCpuArray::try_from(lost).map_err(map_err("LOST"))?;
    let log = log_pump(&mut ebpf);
    let fd = async_readable(ring).map_err(|e| MapError::Map {
        map: "EVENTS",
        detail: e.to_string(),
    })?;
    Ok(Maps {
        watched: Watched {
            watched,
            count,
            exact: 0,
            _ebpf: ebpf,
        },
        ring: EventRing { fd },
        lost: LostCounter { map: lost },
        log,
    })
}

fn log_pump(ebpf: &mut Ebpf) -> Option<LogPump> {
    match aya_log::EbpfLogger::init(ebpf) {
        Ok(logger) => match async_readable(logger) {
            Ok(fd) => Some(LogPump { fd }),
            Err(e) => {
                debug!(error = %crate::telemetry::chain(&e), "aya-log fd not pollable");
                None
            }
        },
        Err(e) => {
            debug!(error = %crate::telemetry::chain(&e), "aya-log not initialised");
            None
        }
    }
}

/// After a batch of events, the one more read of [`LostCounter`] that catches a loss counted
/// just after the batch was read (a probe increments it right after its reservation failed).
pub const LOST_RECHECK: Duration = Duration::from_millis(20);

/// One ring-buffer record as the probes wrote it; `None` when it is shorter than an [`Event`]
/// (a record of another kind or of a newer object).
#[must_use]
pub fn read_event(bytes: &[u8]) -> Option<Event> {
    if bytes.len() < size_of::<Event>() {
        return None;
    }
    // SAFETY: `bytes` holds at least size_of::<Event>() bytes; Event is plain old data (every
    // bit pattern valid) and read_unaligned copes with any alignment.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Event>()) })
}
