//! `dranet release-all`: bring every device home and remove every pin (uninstall, or an operator
//! clearing a node). It takes the state dir's lock: beside a running `dranet run` it waits
//! `--lock-wait-seconds` for it to stop, then refuses, naming its pid. A checkpoint that does not
//! load is no obstacle: the devices are found through the pins.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::rescue::{Engine, EngineOptions};

#[derive(Args, Debug)]
pub struct ReleaseAllArgs {
    /// State dir of the daemon (checkpoint + pins).
    #[arg(long, default_value = "/run/dranet")]
    pub state_dir: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for a running dranet to let go of the state dir.
    #[arg(long, env = "DRANET_LOCK_WAIT_SECONDS", default_value_t = 10)]
    pub lock_wait_seconds: u64,
    /// The daemon's `--filter`: which links of a pin without a record are ours (only used when
    /// the checkpoint does not have the pin's record).
    #[arg(long, env = "DRANET_FILTER", default_value = crate::inventory::DEFAULT_FILTER)]
    pub filter: String,
}

pub fn main(args: &ReleaseAllArgs) -> ExitCode {
    super::init_logging(false, "info");
    // A typo must not create a state dir (and report "nothing to release").
    if let Err(why) = super::existing_state_dir(&args.state_dir) {
        eprintln!("dranet release-all: {why}");
        return ExitCode::FAILURE;
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dranet release-all: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        let opts = EngineOptions {
            state_dir: args.state_dir.clone(),
            lock_wait: std::time::Duration::from_secs(args.lock_wait_seconds),
            device_filter: args.filter.clone(),
            ..EngineOptions::default()
        };
        let engine = match Engine::new(opts, None).await {
            Ok(e) => e,
            Err(e) => {
                eprintln!("dranet release-all: {}", crate::telemetry::chain(&e));
                return ExitCode::FAILURE;
            }
        };
        match engine.release_all().await {
            Ok(report) => {
                if args.json {
                    println!("{}", serde_json::to_string(&report).unwrap_or_default());
                } else {
                    println!(
                        "returned {} pod(s), failed {}, stray pins released {}, rebuilt from pins {}",
                        report.returned.len(),
                        report.failed.len(),
                        report.stray_pins,
                        report.rebuilt.len()
                    );
                    for p in &report.failed {
                        println!("  not all devices home: pod {p}");
                    }
                }
                if report.failed.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("dranet release-all: {}", crate::telemetry::chain(&e));
                ExitCode::FAILURE
            }
        }
    })
}
