//! Command line: one file per subcommand.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod inventory;
pub mod release_all;
pub mod run;
mod run_api;
mod run_nri;
mod run_sides;
pub mod status;
pub mod trace;
pub mod upstream;
pub mod validate_config;

/// dranet: Kubernetes DRA network driver with runtime-independent device return.
#[derive(Parser, Debug)]
#[command(name = "dranet", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the node daemon (DaemonSet entry point).
    Run(Box<run::RunArgs>),
    /// Show the network-namespace teardown timeline live (probe status, then one line per event).
    Trace(trace::TraceArgs),
    /// Bring every device home and remove every pin (before uninstalling).
    ReleaseAll(release_all::ReleaseAllArgs),
    /// Show the checkpoint: pods, pins, devices and their state.
    Status(status::StatusArgs),
    /// Check an opaque device config (claim `parameters`) with the rules Prepare applies.
    ValidateConfig(validate_config::ValidateConfigArgs),
    /// Scan the node's network devices once; print them (or the ResourceSlices) as JSON.
    Inventory(inventory::InventoryArgs),
}

/// Entry point of the binary.
#[must_use]
pub fn main() -> ExitCode {
    let cli = Cli::parse_from(upstream_argv(std::env::args_os().collect()));
    match cli.command {
        Command::Run(args) => run::main(&args),
        Command::Trace(args) => trace::main(&args),
        Command::ReleaseAll(args) => release_all::main(&args),
        Command::Status(args) => status::main(&args),
        Command::ValidateConfig(args) => validate_config::main(&args),
        Command::Inventory(args) => inventory::main(&args),
    }
}

/// Upstream's DaemonSet runs `/dranet --v=4 --hostname-override=...` (no subcommand; the
/// binary's path is the first argument when the image has an entrypoint). Such a command line
/// means `dranet run ...`: the upstream path is dropped and `run` put in front of the flags.
#[must_use]
pub fn upstream_argv(mut argv: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    if argv.get(1).is_some_and(|a| {
        a.to_str()
            .is_some_and(|s| s == "/dranet" || s.ends_with("/dranet"))
    }) {
        argv.remove(1);
    }
    let flags_first = argv
        .get(1)
        .and_then(|a| a.to_str())
        .is_some_and(|s| s.starts_with("--") && !matches!(s, "--help" | "--version"));
    if flags_first {
        argv.insert(1, "run".into());
    }
    argv
}

pub use crate::telemetry::log::{init_logging, init_logging_with};
