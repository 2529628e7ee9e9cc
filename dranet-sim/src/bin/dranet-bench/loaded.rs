//! Reaction on a loaded node: the rescue reaction (CRI-O order, one device) with a CPU hog on
//! every core at nice 0 and a netns create + delete loop running beside it, each in its own
//! process; against the same rounds on the quiet machine, measured first in the same run.
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use dranet_sim::kernel::{PodNetns, unique};

use crate::latency::{Ctx, Devices, Figures};

/// `dranet-bench --hog`: spins until killed.
pub fn hog() -> ! {
    let mut x: u64 = 1;
    loop {
        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
    }
}

/// `dranet-bench --netns-churn`: creates and deletes netns (CRI-O style) until killed.
pub fn netns_churn() -> Result<()> {
    loop {
        let mut ns = PodNetns::create(&unique("drbench-churn-"))?;
        ns.remove_crio_style()?;
    }
}

/// The load: children killed on drop.
struct Load(Vec<Child>);

impl Load {
    fn start() -> Result<Self> {
        let exe = std::env::current_exe()?;
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let mut me = Self(Vec::new());
        for _ in 0..cpus {
            me.0.push(
                Command::new(&exe)
                    .arg("--hog")
                    .stdout(Stdio::null())
                    .spawn()
                    .context("spawning a CPU hog")?,
            );
        }
        me.0.push(
            Command::new(&exe)
                .arg("--netns-churn")
                .stdout(Stdio::null())
                .spawn()
                .context("spawning the netns churn")?,
        );
        Ok(me)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
        // The churn may have been killed between create and remove: its netns files go too.
        if let Ok(rd) = std::fs::read_dir("/run/netns") {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with("drbench-churn-") {
                    let _ = nix::mount::umount2(&e.path(), nix::mount::MntFlags::MNT_DETACH);
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

/// Quiet rounds first, then the same number under load.
pub async fn run(rounds: usize) -> Result<(Figures, Figures)> {
    let cx = Ctx::start().await?;
    let d = Devices::create(1)?;
    let mut quiet = Figures::default();
    for _ in 0..2 {
        cx.rescue_sample(&d, &mut Figures::default()).await?;
    }
    for _ in 0..rounds {
        cx.rescue_sample(&d, &mut quiet).await?;
    }
    let load = Load::start()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut loaded = Figures::default();
    for _ in 0..rounds {
        cx.rescue_sample(&d, &mut loaded).await?;
    }
    drop(load);
    Ok((quiet, loaded))
}
