//! `dranet-bench`: the measurements behind `cargo xtask bench` (needs root). Prints a table and
//! writes the rows as JSON (`--out`, default `target/bench/results.json`).
//!
//! | metric | how |
//! |---|---|
//! | rescue reaction | umount2 return (CRI-O order) → the engine starting its first device move (timestamp the engine records, `Engine::last_rescue`) |
//! | rescue latency N | umount2 return → every device home (name, UP, MTU) as an independent rtnetlink listener sees it; baseline: direct rtnetlink moves started at umount2 return |
//! | attach latency N | `Engine::attach_pod` wall time (what the NRI hook calls); baseline: direct rtnetlink moves |
//! | watcher overhead | netns create+delete loop, probes loaded vs not, alternating runs |
//! | footprint | the real daemon idle (kubelet + NRI connected) with 256 and 1,024 devices published: VmRSS and where it is, context switches/s |
//! | inventory | scan + slice build of 256 veth devices in a private netns; baseline: bare link dump |
//! | dra prepare/unprepare N | NodePrepareResources / NodeUnprepareResources of N claims over the DRA unix socket (tonic, v1), engine plan store checkpointed; baseline: the same call with no claims |
mod baseline;
mod checkpoint;
mod churn;
mod dra;
mod drain;
mod fleet;
mod footprint;
mod idle;
mod inventory;
mod inventory1k;
mod latency;
mod listener;
mod loaded;
mod overhead;
mod stats;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Parser;
use serde_json::json;
use stats::{Row, pct};

#[derive(Parser, Debug)]
#[command(name = "dranet-bench", about = "dranet benchmarks (root)")]
struct Args {
    /// Few rounds (< 90 s in all).
    #[arg(long)]
    quick: bool,
    /// Print the JSON document on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/bench/results.json")]
    out: PathBuf,
    /// Rounds per latency figure (default 60; quick 8, and 4 for N=16).
    #[arg(long)]
    rounds: Option<usize>,
    /// Only these parts: rescue (reaction, rescue and attach latency), overhead, footprint, inventory,
    /// dra (Prepare/Unprepare over the kubelet socket); scale: drain, hol, inventory1k, checkpoint,
    /// loaded, churn.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Internal: the idle child of the footprint measurement.
    #[arg(long, hide = true)]
    idle_child: bool,
    /// Internal: a CPU hog of the `loaded` section.
    #[arg(long, hide = true)]
    hog: bool,
    /// Internal: the netns churn of the `loaded` section.
    #[arg(long, hide = true)]
    netns_churn: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.idle_child {
        return footprint::child();
    }
    if args.hog {
        loaded::hog();
    }
    if args.netns_churn {
        return loaded::netns_churn();
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("dranet-bench needs root (network namespaces, veth pairs, eBPF)");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(bench(&args))
}

fn want(args: &Args, part: &str) -> bool {
    args.only.is_empty() || args.only.iter().any(|p| p == part)
}

async fn bench(args: &Args) -> Result<()> {
    let started = Instant::now();
    let swept = fleet::sweep_stale()?;
    if swept != fleet::Swept::default() {
        eprintln!(
            "removed what killed bench runs left: {} daemons, {} links, {} netns",
            swept.daemons.len(),
            swept.links.len(),
            swept.netns.len()
        );
    }
    let rounds = args.rounds.unwrap_or(if args.quick { 8 } else { 60 });
    let mut rows = Vec::new();
    if want(args, "rescue") {
        // Quick: N=16 takes half the rounds (each returns 16 devices; at 8 rounds it was a
        // third of the whole quick run, which is to stay under 90 s).
        let wide = if args.quick && args.rounds.is_none() {
            (rounds / 2).max(2)
        } else {
            rounds
        };
        rows.extend(latency_rows(rounds, wide).await?);
    }
    if want(args, "overhead") {
        let (runs, iters) = if args.quick { (2, 40) } else { (8, 150) };
        rows.push(overhead_row(runs, iters).await?);
    }
    if want(args, "footprint") {
        rows.extend(footprint_rows(args.quick).await?);
    }
    if want(args, "inventory") {
        rows.push(inventory::row(if args.quick { 5 } else { 30 }).await?);
    }
    if want(args, "dra") {
        rows.extend(dra::rows(if args.quick { 10 } else { 100 }).await?);
    }
    if want(args, "inventory1k") {
        eprintln!("inventory, 1,024 devices ...");
        let (rounds, idle) = if args.quick { (5, 2) } else { (30, 5) };
        let f = inventory1k::run(rounds, Duration::from_secs(idle)).await?;
        rows.extend(inventory1k::rows(&f));
    }
    if want(args, "checkpoint") {
        eprintln!("checkpoint, 500 pod records ...");
        let f = checkpoint::run(if args.quick { 8 } else { 60 }, 500).await?;
        rows.extend(checkpoint_rows(&f));
    }
    if want(args, "drain") || want(args, "hol") {
        rows.extend(drain_rows(args).await?);
    }
    if want(args, "loaded") {
        eprintln!("reaction on a loaded node ...");
        let (quiet, loaded) = loaded::run(if args.quick { 8 } else { 60 }).await?;
        rows.push(loaded_row(&quiet, &loaded));
    }
    if want(args, "churn") {
        let pods = if args.quick { 32 } else { 256 };
        eprintln!("churn, {pods} pods through one NRI connection ...");
        let cx = churn::Ctx::start(pods).await?;
        let f = churn::run(&cx, if args.quick { 1 } else { 3 }).await?;
        rows.extend(churn_rows(pods, &f));
    }
    let doc = json!({
        "quick": args.quick,
        "rounds": rounds,
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "cpus": std::thread::available_parallelism().map(std::num::NonZero::get).unwrap_or(1),
        "elapsed_s": started.elapsed().as_secs_f64(),
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "rows": rows,
    });
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_vec_pretty(&doc)?)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", stats::table(&rows));
        println!(
            "\n{} rounds per latency figure, {:.0} s, results in {}",
            rounds,
            started.elapsed().as_secs_f64(),
            args.out.display()
        );
    }
    Ok(())
}

/// Rescue and attach latency for 1, 4 and 16 devices: `rounds` each, `wide` for 16.
async fn latency_rows(rounds: usize, wide: usize) -> Result<Vec<Row>> {
    let cx = latency::Ctx::start().await?;
    let mut rows = Vec::new();
    let mut reaction = Vec::new();
    let mut from_event = Vec::new();
    let mut rescue = Vec::new();
    let mut attach = Vec::new();
    for n in [1, 4, 16] {
        eprintln!("latency, N = {n} ...");
        let f = latency::run(&cx, n, if n == 16 { wide } else { rounds }).await?;
        reaction.extend_from_slice(&f.reaction);
        from_event.extend_from_slice(&f.reaction_from_event);
        let r = Row::latency(
            format!("rescue latency N={n}"),
            "us",
            &f.rescue,
            Some(&f.rescue_base),
        );
        let limit = 1.5 * r.baseline_p99.unwrap_or(0.0) + 1000.0;
        let pass = r.p99.unwrap_or(f64::MAX) <= limit;
        rescue.push(
            r.goal("p99 <= 1.5 x base + 1 ms", pass)
                .note(format!("limit {limit:.0} us")),
        );
        let a = Row::latency(
            format!("attach latency N={n}"),
            "us",
            &f.attach,
            Some(&f.attach_base),
        );
        // The kernel floor: the same moves by direct rtnetlink (issue 41: 1.2, was 1.3).
        let limit = 1.2 * a.baseline_p99.unwrap_or(0.0);
        let pass = a.p99.unwrap_or(f64::MAX) <= limit;
        let mut a = a.goal("p99 <= 1.2 x base (kernel floor)", pass);
        a = if n == 16 {
            let share = a.p99.unwrap_or(0.0) / 2e6 * 100.0;
            a.note(format!(
                "limit {limit:.0} us; p99 uses {share:.2} % of NRI's 2 s budget (engine called directly, no NRI transport)"
            ))
        } else {
            a.note(format!("limit {limit:.0} us"))
        };
        attach.push(a);
    }
    let r = Row::latency(
        "rescue reaction (probe's kernel timestamp -> first move)".into(),
        "us",
        &from_event,
        None,
    );
    let pass = r.p99.unwrap_or(f64::MAX) <= 1000.0;
    rows.push(r.goal("p99 <= 1 ms", pass).note(format!(
        "from the probe's own event time (bpf_ktime_get_ns in the eBPF program, CLOCK_MONOTONIC) to the engine starting its first move (engine timestamp, same clock); all N. From umount2's return instead (the probe fires inside umount2, so this can be negative): p50 {:.0} us, p99 {:.0} us",
        pct(&reaction, 50.0),
        pct(&reaction, 99.0)
    )));
    rows.extend(rescue);
    rows.extend(attach);
    Ok(rows)
}

async fn overhead_row(runs: usize, iters: usize) -> Result<Row> {
    eprintln!("watcher overhead ...");
    let o = overhead::run(runs, iters).await?;
    let off50 = pct(&o.iters_off, 50.0);
    let iter_ratio = pct(&o.iters_on, 50.0) / off50.max(f64::MIN_POSITIVE);
    let mut r = Row::latency(
        "watcher overhead (netns create+delete)".into(),
        "us",
        &o.iters_on,
        Some(&o.iters_off),
    );
    // The iteration median: run means on this shared 2-core machine are dominated by bursts
    // of other tenants' work.
    r.ratio = Some(iter_ratio);
    let ops = |v: &[f64]| {
        let m = pct(v, 50.0);
        if m > 0.0 { 1e6 / m } else { 0.0 }
    };
    let probe = pct(&o.probe_us, 50.0);
    let share = if off50 > 0.0 { probe / off50 * 100.0 } else { 0.0 };
    let pass = iter_ratio <= 1.02 && share <= 2.0;
    Ok(r.goal("<= 2 % slower (iteration p50 ratio, probe CPU share)", pass).note(format!(
        "{runs} runs x {iters} iterations per mode, loop and dranet in separate processes; median run: {:.0}/s with dranet, {:.0}/s without (ratio of run times {:.3}); eBPF programs' own CPU (kernel BPF stats) {probe:.1} us per create+delete = {share:.1} % of an iteration",
        ops(&o.runs_on),
        ops(&o.runs_off),
        o.ratio(),
    )))
}

async fn footprint_rows(quick: bool) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    // The wake-up goal is judged over 60 s in a full run (256 devices).
    for (n, window, rss_goal) in [
        (256, if quick { 10 } else { 60 }, 16.0),
        (1024, if quick { 5 } else { 10 }, 24.0),
    ] {
        eprintln!("idle daemon, {n} devices ({window} s) ...");
        let f = idle::run(n, Duration::from_secs(window)).await?;
        let b = &f.breakdown;
        let rss = Row::latency(format!("idle RSS {}", f.devices), "MiB", &f.rss_mib, None);
        let pass = rss.p99.unwrap_or(f64::MAX) <= rss_goal;
        rows.push(rss.goal(format!("<= {rss_goal} MiB"), pass).note(format!(
            "dranet run (probes on) in a private netns of {n} veth devices, all published ({:.1} s after start), kubelet registered with a health stream open, NRI runtime connected; {}",
            f.published_s,
            b.summary()
        )));
        if n == 256 {
            let wk = Row::latency(format!("idle wake-ups {n}"), "1/s", &f.wakeups, None);
            #[allow(clippy::cast_precision_loss)]
            let mean = f.wakeups.iter().sum::<f64>() / f.wakeups.len().max(1) as f64;
            rows.push(wk.goal("<= 1 /s (mean)", mean <= 1.0).note(format!(
                "context switches of all the daemon's threads per second, mean {mean:.2}/s over {} s; the same daemon as idle RSS {n}",
                f.window.as_secs()
            )));
        }
    }
    Ok(rows)
}

async fn drain_rows(args: &Args) -> Result<Vec<Row>> {
    let (pods, rounds, hol_rounds) = if args.quick { (16, 1, 1) } else { (64, 5, 10) };
    let drain = want(args, "drain");
    let hol = want(args, "hol");
    let orders: &[drain::Order] = if drain {
        &[drain::Order::Crio, drain::Order::Containerd]
    } else {
        &[drain::Order::Crio]
    };
    eprintln!("drain: {pods} pods x 2 devices ...");
    let cx = drain::Ctx::start(pods, listener::Listener::start()?).await?;
    let figs = drain::run(&cx, orders, rounds, hol_rounds, !args.quick, hol).await?;
    let mut rows = Vec::new();
    for (order, f) in &figs {
        let name = order.name();
        if drain {
            let r = Row::latency(
                format!("drain {pods} pods x 2 ({name} order)"),
                "ms",
                &f.drain,
                Some(&f.base),
            );
            let pass = r.ratio.is_some_and(|x| x <= 1.1);
            let span = if f.unmount_span.is_empty() {
                String::new()
            } else {
                format!(
                    "; all {pods} netns unmounted within p50 {:.1} ms",
                    pct(&f.unmount_span, 50.0)
                )
            };
            let start = if *order == drain::Order::Crio {
                "first unmount"
            } else {
                "first StopPodSandbox"
            };
            rows.push(r.goal("p99 <= 1.1 x base", pass).note(format!(
                "{start} -> last of {} devices home (name, UP, MTU) per the rtnetlink listener; baseline: the same moves + restores, direct rtnetlink, 8 pods at a time, each netns let go after its pod{span}",
                2 * pods
            )));
            #[allow(clippy::cast_precision_loss)]
            let per_device: Vec<f64> = f.cpu.iter().map(|c| c / (2.0 * pods as f64)).collect();
            let c = Row::latency(
                format!("drain CPU of dranet per device ({name} order)"),
                "ms",
                &per_device,
                None,
            );
            let pass = c.p99.unwrap_or(f64::MAX) <= 1.0;
            rows.push(c.goal("p99 <= 1 ms per device moved", pass).note(format!(
                "user + system CPU of the daemon process over the drain (/proc/PID/stat utime + stime) / {} devices; whole drain p50 {:.0} ms",
                2 * pods,
                pct(&f.cpu, 50.0)
            )));
        }
        let h = Row::latency(
            format!("drain: slowest NRI hook ({name} order)"),
            "ms",
            &f.slowest_hook,
            None,
        );
        let pass = h.p99.unwrap_or(f64::MAX) <= 2000.0 && f.hook_errors.is_empty();
        let errs = if f.hook_errors.is_empty() {
            "no hook failed".to_owned()
        } else {
            format!(
                "{} hooks failed, first: {}",
                f.hook_errors.len(),
                f.hook_errors[0]
            )
        };
        rows.push(
            h.goal("every hook <= 2 s, none failed", pass)
                .note(format!("slowest Stop/Remove/Run hook of each round; {errs}")),
        );
        if hol && !f.hol.is_empty() {
            let r = Row::latency(
                "hol: RunPodSandbox (1 device) during a drain".into(),
                "ms",
                &f.hol,
                Some(&f.hol_base),
            );
            let pass = r.ratio.is_some_and(|x| x <= 1.2);
            rows.push(r.goal("p99 <= 1.2 x base", pass).note(format!(
                "hook sent {} ms into the {name}-order drain of {pods} pods; baseline: a bare attach (one RTM_NEWLINK: move + name + MTU; UP inside) at the same point of a baseline drain returning one pod at a time, so it waits for the least RTNL a drain puts ahead of it",
                150
            )));
        }
    }
    Ok(rows)
}

fn checkpoint_rows(f: &checkpoint::Figures) -> Vec<Row> {
    let n = f.records;
    let mut a = Row::latency(
        format!("attach N=2, {n} pod records in the checkpoint"),
        "us",
        &f.attach_full,
        Some(&f.attach_empty),
    );
    // Judged on the medians of alternating rounds: a 5 % goal is below the p99 noise of a
    // shared 2-core machine (other tenants' bursts).
    let p50_ratio = pct(&f.attach_full, 50.0) / pct(&f.attach_empty, 50.0).max(f64::MIN_POSITIVE);
    let p99_ratio = a.ratio.unwrap_or(0.0);
    a.ratio = Some(p50_ratio);
    let a = a.goal("p50 <= 1.05 x base (empty checkpoint)", p50_ratio <= 1.05).note(format!(
        "Engine::attach_pod of 2 devices; baseline: the same with an empty checkpoint, rounds alternating; p99 ratio {p99_ratio:.2}; checkpoint {:.1} MiB",
        f.bytes as f64 / 1048576.0
    ));
    let w = Row::latency(
        format!("checkpoint write, {n} pod records"),
        "us",
        &f.save_full,
        Some(&f.save_empty),
    );
    let w = w.note(format!(
        "one save as the engine's writer does it on every update (one record changed: stage = every record compared with its last value (by pointer unless written to since), the changed one encoded, then its file written + fsync + rename, dir fsync, awaited), tmpfs; baseline: a checkpoint of 1 record; {:.1} MiB of records",
        f.bytes as f64 / 1048576.0
    ));
    vec![a, w]
}

fn loaded_row(quiet: &latency::Figures, loaded: &latency::Figures) -> Row {
    let r = Row::latency(
        "rescue reaction, loaded (probe event -> first move)".into(),
        "us",
        &loaded.reaction_from_event,
        Some(&quiet.reaction_from_event),
    );
    let pass = r.p99.unwrap_or(f64::MAX) <= 1000.0;
    r.goal("p99 <= 1 ms", pass).note(format!(
        "a CPU hog per core (nice 0) + a netns create/delete loop, each its own process; baseline: the same rounds on the quiet machine first; umount2 return -> first move: loaded p50 {:.0} us, p99 {:.0} us (quiet p99 {:.0} us)",
        pct(&loaded.reaction, 50.0),
        pct(&loaded.reaction, 99.0),
        pct(&quiet.reaction, 99.0),
    ))
}

#[allow(clippy::cast_precision_loss)]
fn churn_rows(pods: usize, f: &churn::Figures) -> Vec<Row> {
    // Throughput: higher is better, so the ratio is dranet's rate over the baseline's.
    let mut r = Row::latency(
        format!("churn: {pods} pods started + stopped, 8 hooks in flight"),
        "pods/s",
        &f.rate,
        Some(&f.base_rate),
    );
    let ratio = pct(&f.rate, 50.0) / pct(&f.base_rate, 50.0).max(f64::MIN_POSITIVE);
    r.ratio = Some(ratio);
    let errs = if f.hook_errors.is_empty() {
        "no hook failed".to_owned()
    } else {
        format!(
            "{} hooks failed, first: {}",
            f.hook_errors.len(),
            f.hook_errors[0]
        )
    };
    let r = r
        .goal("rate p50 >= 0.9 x base", ratio >= 0.9 && f.hook_errors.is_empty())
        .note(format!(
            "one NRI connection: RunPodSandbox, then StopPodSandbox + netns removed + RemovePodSandbox (containerd order); baseline: the same attaches and detaches by direct rtnetlink, 8 at a time; slowest hook {:.0} ms; {errs}",
            f.slowest_hook_ms
        ));
    let growth: Vec<f64> = f
        .rss_before
        .iter()
        .zip(&f.rss_after)
        .map(|(b, a)| (*a as f64 - *b as f64) / 1024.0)
        .collect();
    let g = Row::latency(
        "churn: daemon RSS growth after all pods gone".into(),
        "MiB",
        &growth,
        None,
    );
    let pass = g.p99.unwrap_or(f64::MAX) <= 1.0;
    let g = g.goal("<= 1 MiB", pass).note(format!(
        "VmRSS before / after each round (KiB): {:?} / {:?}",
        f.rss_before, f.rss_after
    ));
    vec![r, g]
}
