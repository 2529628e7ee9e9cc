//! Command line: one file per subcommand.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod inventory;
pub mod release_all;
pub mod run;
mod run_nri;
mod run_sides;
pub mod status;
pub mod trace;
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
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run::main(&args),
        Command::Trace(args) => trace::main(&args),
        Command::ReleaseAll(args) => release_all::main(&args),
        Command::Status(args) => status::main(&args),
        Command::ValidateConfig(args) => validate_config::main(&args),
        Command::Inventory(args) => inventory::main(&args),
    }
}

/// Sets up `tracing` (text or JSON) with `RUST_LOG`-style filtering, defaulting to `default`.
/// `log` records (aya-log from the probes) are forwarded to `tracing`.
pub fn init_logging(json: bool, default: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
