//! Command line: one file per subcommand.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// dranet: Kubernetes DRA network driver with runtime-independent device return.
#[derive(Parser, Debug)]
#[command(name = "dranet", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show the network-namespace teardown timeline live (probe status, then one line per event).
    Trace(crate::cli::trace::TraceArgs),
}

pub mod trace;

/// Entry point of the binary.
#[must_use]
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Trace(args) => trace::main(&args),
    }
}
