//! `dranet-soak`: the model-based life-cycle soak (see `dranet_sim::soak`), run by
//! `cargo xtask soak`. Needs root. Prints the seed first and `N passed, M failed` last; exits 1 on
//! a failure, with the seed and the steps that led to it.

use anyhow::Result;
use clap::Parser;
use dranet_sim::soak::{SoakOptions, run};

#[derive(Parser)]
#[command(about = "dranet's model-based life-cycle soak (root)")]
struct Args {
    /// Pod life cycles to complete.
    #[arg(long, default_value_t = 1000)]
    lifecycles: usize,
    /// Seed of every choice (default: from the clock). The same seed replays the same steps.
    #[arg(long)]
    seed: Option<u64>,
    /// Pods alive at once, at most.
    #[arg(long, default_value_t = 3)]
    max_pods: usize,
    /// Stand-in NICs.
    #[arg(long, default_value_t = 4)]
    nics: usize,
    /// Print every step.
    #[arg(long, short)]
    verbose: bool,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("the soak needs root (netns, veth, the daemon's probes)");
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    println!("soak: seed {seed}, {} life cycles", args.lifecycles);
    let opts = SoakOptions {
        lifecycles: args.lifecycles,
        seed,
        max_pods: args.max_pods,
        nics: args.nics,
        verbose: args.verbose,
    };
    let summary = run(&opts).await?;
    if let Some(f) = &summary.failure {
        eprintln!("{f}");
    }
    println!("{}", summary.line());
    if summary.failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
