//! Watcher overhead: a netns create + delete loop (CRI-O style: unshare + bind mount under
//! /run/netns, then umount2 + unlink: the paths the probes filter on) while a separate dranet
//! process (the idle child: watcher with its probes loaded + the engine's event loop) runs,
//! against the same loop with no dranet process. The loop and dranet are separate processes, as
//! a runtime and dranet are. Runs alternate; the figure is the ratio of the median run's time
//! per iteration.
use std::time::{Duration, Instant};

use anyhow::Result;
use dranet_sim::kernel::{PodNetns, sh, unique};

use crate::footprint::IdleChild;
use crate::stats::pct;

/// Per-iteration times (µs) of every run, and each run's mean, by mode.
#[derive(Default)]
pub struct Overhead {
    pub iters_off: Vec<f64>,
    pub iters_on: Vec<f64>,
    pub runs_off: Vec<f64>,
    pub runs_on: Vec<f64>,
    /// CPU time of dranet's eBPF programs per loop iteration (µs), from the kernel's BPF
    /// statistics (`kernel.bpf_stats_enabled`), per "on" run.
    pub probe_us: Vec<f64>,
}

impl Overhead {
    /// Median run mean with probes / without.
    pub fn ratio(&self) -> f64 {
        let off = pct(&self.runs_off, 50.0);
        if off > 0.0 {
            pct(&self.runs_on, 50.0) / off
        } else {
            0.0
        }
    }
}

/// `(id, run_time_ns)` of every loaded program whose name starts with `dranet_`.
fn prog_times() -> Result<Vec<(u64, u64)>> {
    let out = sh(&["bpftool", "-j", "prog", "show"])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("dranet_")))
                .filter_map(|p| Some((p["id"].as_u64()?, p["run_time_ns"].as_u64().unwrap_or(0))))
                .collect()
        })
        .unwrap_or_default())
}

/// Sum of `run_time_ns` over the programs in `ids`.
fn time_of(ids: &[u64]) -> Result<u64> {
    Ok(prog_times()?
        .into_iter()
        .filter(|(id, _)| ids.contains(id))
        .map(|(_, t)| t)
        .sum())
}

/// Turns the kernel's BPF run-time statistics on for its lifetime (restoring the old value).
struct BpfStats(String);

impl BpfStats {
    fn enable() -> Result<Self> {
        let old = std::fs::read_to_string(STATS)?.trim().to_owned();
        std::fs::write(STATS, "1")?;
        Ok(Self(old))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(STATS, &self.0);
    }
}

const STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

fn one_run(iters: usize) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let mut ns = PodNetns::create(&unique("drbench-o-"))?;
        ns.remove_crio_style()?;
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(out)
}

pub async fn run(runs: usize, iters: usize) -> Result<Overhead> {
    let mut o = Overhead::default();
    // Warm-up, unrecorded.
    tokio::task::spawn_blocking(move || one_run(iters / 4 + 1)).await??;
    for r in 0..runs {
        let order = if r % 2 == 0 { [false, true] } else { [true, false] };
        for on in order {
            let before: Vec<u64> = prog_times()?.into_iter().map(|(id, _)| id).collect();
            let loaded = if on { Some(IdleChild::spawn().await?) } else { None };
            // The child's programs: the dranet_* ones that were not loaded before it started
            // (other dranet processes on the machine keep theirs out of the sum).
            let ids: Vec<u64> = prog_times()?
                .into_iter()
                .map(|(id, _)| id)
                .filter(|id| !before.contains(id))
                .collect();
            tokio::time::sleep(Duration::from_millis(200)).await;
            let stats = if on { Some(BpfStats::enable()?) } else { None };
            let t0 = if on { time_of(&ids)? } else { 0 };
            let times = tokio::task::spawn_blocking(move || one_run(iters)).await??;
            if on {
                #[allow(clippy::cast_precision_loss)]
                o.probe_us
                    .push(time_of(&ids)?.saturating_sub(t0) as f64 / 1000.0 / iters.max(1) as f64);
            }
            drop(stats);
            #[allow(clippy::cast_precision_loss)]
            let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
            if on {
                o.iters_on.extend(times);
                o.runs_on.push(mean);
            } else {
                o.iters_off.extend(times);
                o.runs_off.push(mean);
            }
            drop(loaded);
            // Let the kernel's netns cleanup work of this run finish before the next one.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    Ok(o)
}
