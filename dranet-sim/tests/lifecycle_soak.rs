//! The model-based life-cycle soak, bounded for CI: 150 life cycles on a fixed seed (or
//! `DRANET_SOAK_SEED`, `DRANET_SOAK_LIFECYCLES`). `cargo xtask soak` runs the full one.

use anyhow::{Result, bail};
use dranet_sim::root_or_skip;
use dranet_sim::soak::{SoakOptions, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_soak() -> Result<()> {
    root_or_skip!("lifecycle_soak");
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
    let opts = SoakOptions {
        lifecycles: env("DRANET_SOAK_LIFECYCLES").map_or(150, |v: u64| v as usize),
        seed: env("DRANET_SOAK_SEED").unwrap_or(20_261_204),
        verbose: std::env::var("DRANET_SOAK_VERBOSE").is_ok(),
        ..SoakOptions::default()
    };
    eprintln!("soak: seed {}, {} life cycles", opts.seed, opts.lifecycles);
    let summary = run(&opts).await?;
    eprintln!("soak: {}", summary.line());
    if let Some(f) = summary.failure {
        bail!("{f}");
    }
    Ok(())
}
