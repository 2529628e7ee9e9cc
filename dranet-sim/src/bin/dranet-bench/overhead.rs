//! Watcher overhead: a netns create + delete loop (CRI-O style: unshare + bind mount under
//! /run/netns, then umount2 + unlink: the paths the probes filter on) with the watcher's probes
//! loaded and a subscriber draining its events, against the same loop with nothing loaded.
//! Runs alternate; the figure is the ratio of the median run's time per iteration.
use std::time::{Duration, Instant};

use anyhow::Result;
use dranet::watch::{Watcher, WatcherOptions};
use dranet_sim::kernel::{PodNetns, unique};

use crate::stats::pct;

/// Per-iteration times (µs) of every run, and each run's mean, by mode.
#[derive(Default)]
pub struct Overhead {
    pub iters_off: Vec<f64>,
    pub iters_on: Vec<f64>,
    pub runs_off: Vec<f64>,
    pub runs_on: Vec<f64>,
    pub probes: Vec<String>,
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
            let loaded = if on {
                let w = Watcher::start(WatcherOptions::default()).await?;
                if o.probes.is_empty() {
                    o.probes = w
                        .status()
                        .iter()
                        .filter(|s| s.state == dranet::watch::ProbeState::Active)
                        .map(|s| s.name.to_string())
                        .collect();
                }
                let mut sub = w.subscribe();
                let drain = tokio::spawn(async move { while sub.recv().await.is_some() {} });
                Some((w, drain))
            } else {
                None
            };
            tokio::time::sleep(Duration::from_millis(200)).await;
            let times = tokio::task::spawn_blocking(move || one_run(iters)).await??;
            #[allow(clippy::cast_precision_loss)]
            let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
            if on {
                o.iters_on.extend(times);
                o.runs_on.push(mean);
            } else {
                o.iters_off.extend(times);
                o.runs_off.push(mean);
            }
            if let Some((w, drain)) = loaded {
                drain.abort();
                drop(w);
            }
            // Let the kernel's netns cleanup work of this run finish before the next one.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    Ok(o)
}
