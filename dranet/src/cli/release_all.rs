//! `dranet release-all`: bring every device home and remove every pin (uninstall, or an operator
//! clearing a node). Safe to run while no `dranet run` is active on the node.

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
}

pub fn main(args: &ReleaseAllArgs) -> ExitCode {
    super::init_logging(false, "info");
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
            ..EngineOptions::default()
        };
        let engine = match Engine::new(opts, None).await {
            Ok(e) => e,
            Err(e) => {
                eprintln!("dranet release-all: {e}");
                return ExitCode::FAILURE;
            }
        };
        match engine.release_all().await {
            Ok(report) => {
                if args.json {
                    println!("{}", serde_json::to_string(&report).unwrap_or_default());
                } else {
                    println!(
                        "returned {} pod(s), failed {}, stray pins released {}",
                        report.returned.len(),
                        report.failed.len(),
                        report.stray_pins
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
                eprintln!("dranet release-all: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
