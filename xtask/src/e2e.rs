//! `cargo xtask e2e --runtime containerd`: the real-containerd suite alone
//! (`dranet-sim/tests/containerd.rs`) against every containerd `cargo xtask runtimes` fetches.
//! Prints the versions it runs and ends with `N passed, M failed`.
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::runtimes;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeKind {
    /// Debian's containerd 1.7 (trixie) and 2.x (sid), real, driven over CRI.
    Containerd,
}

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Which real runtime's suite to run.
    #[arg(long, value_enum, default_value = "containerd")]
    pub runtime: RuntimeKind,
    /// Only the tests whose name contains this (a `cargo test` filter).
    pub filter: Option<String>,
}

/// Sums the `test result:` lines of libtest's output: (passed, failed).
pub fn tally(output: &str) -> (u32, u32) {
    let mut passed = 0;
    let mut failed = 0;
    for l in output.lines() {
        let Some(rest) = l.trim().strip_prefix("test result:") else {
            continue;
        };
        for part in rest.split(';') {
            let mut w = part.split_whitespace().rev();
            match (w.next(), w.next()) {
                (Some("passed"), Some(n)) => passed += n.parse::<u32>().unwrap_or(0),
                (Some("failed"), Some(n)) => failed += n.parse::<u32>().unwrap_or(0),
                _ => {}
            }
        }
    }
    (passed, failed)
}

pub fn run(opts: &Options) -> Result<()> {
    let RuntimeKind::Containerd = opts.runtime;
    let rts = runtimes::fetch(&runtimes::Options::default())?;
    crate::build_ebpf::run(&crate::build_ebpf::Options::default())?;
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(crate::root())
        .args([
            "test",
            "--locked",
            "-p",
            "dranet-sim",
            "--test",
            "containerd",
            "--",
        ])
        .args(opts.filter.iter())
        .args(["--nocapture", "--test-threads=2"])
        .env("CI", "true")
        .stdout(Stdio::piped());
    let start = std::time::Instant::now();
    let mut child = cmd.spawn().context("spawning cargo test")?;
    let stdout = child.stdout.take().context("cargo test stdout")?;
    let mut text = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        text.push_str(&line);
        text.push('\n');
    }
    let status = child.wait()?;
    let (passed, failed) = tally(&text);
    for r in &rts {
        println!("containerd {} (Debian {})", r.version, r.suite);
    }
    println!("suite time {:.0?}", start.elapsed());
    println!("{passed} passed, {failed} failed");
    if !status.success() || failed > 0 || passed == 0 {
        bail!("the containerd suite failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_sums_libtest_results() {
        let out = "running 2 tests\ntest a ... ok\n\ntest result: ok. 14 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 61.2s\n\ntest result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out\n";
        assert_eq!(tally(out), (15, 2));
        assert_eq!(tally("nothing"), (0, 0));
    }
}
