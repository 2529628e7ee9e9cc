//! `dranet trace`.
use std::process::ExitCode;

/// Arguments of `dranet trace`.
#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    /// Print JSON lines instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `dranet trace`.
#[must_use]
pub fn main(_args: &TraceArgs) -> ExitCode {
    ExitCode::SUCCESS
}
