//! `dranet trace`: a live teardown timeline for operators.
//!
//! Prints the probe status first, then one line per lifecycle event: relative time in µs, event
//! kind, netns path / identity, devices, pid and comm, syscall result. A person reading it should
//! see at a glance "crio unmounted /run/netns/X, unlinked it, the netns died 12 ms later, eth1 was
//! deleted".

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::json;

use crate::netns::NetnsId;
use crate::watch::{self, EventKind, LifecycleEvent, ProbeStatus, Watcher, WatcherOptions};

/// Arguments of `dranet trace`.
#[derive(clap::Args, Debug, Clone)]
pub struct TraceArgs {
    /// Print JSON lines instead of text (first line: probe status).
    #[arg(long)]
    pub json: bool,
    /// Only events about this netns path (and events that name no netns, like cleanup runs).
    #[arg(long, value_name = "PATH")]
    pub netns: Option<PathBuf>,
    /// Only events about this device name (and events that name no device).
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// Stop after this many seconds (default: until interrupted).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Report every umount/unlink on the node, not only netns paths.
    #[arg(long)]
    pub all: bool,
    /// Do not load eBPF probes (rtnetlink + inotify only).
    #[arg(long)]
    pub no_ebpf: bool,
}

/// Runs `dranet trace`.
#[must_use]
pub fn main(args: &TraceArgs) -> ExitCode {
    crate::cli::init_logging(false, "warn");
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dranet trace: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args, &mut std::io::stdout())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dranet trace: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Errors of `dranet trace`.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(
        "starting the watcher (needs root: CAP_NET_ADMIN for rtnetlink, CAP_BPF + CAP_PERFMON for probes)"
    )]
    Watch(#[from] watch::WatchError),
    #[error("writing output")]
    Output(#[from] std::io::Error),
}

/// Filters from the command line.
struct Filter {
    paths: Vec<String>,
    netns: Option<NetnsId>,
    device: Option<String>,
}

impl Filter {
    fn new(args: &TraceArgs) -> Self {
        let paths = args
            .netns
            .as_ref()
            .map(|p| {
                let s = p.display().to_string();
                let mut v = vec![s.clone()];
                if let Some(rest) = s.strip_prefix("/var/run/") {
                    v.push(format!("/run/{rest}"));
                } else if let Some(rest) = s.strip_prefix("/run/") {
                    v.push(format!("/var/run/{rest}"));
                }
                v
            })
            .unwrap_or_default();
        let netns = args.netns.as_ref().and_then(|p| watch::identify_path(p).ok());
        Self {
            paths,
            netns,
            device: args.device.clone(),
        }
    }

    fn accepts(&self, ev: &LifecycleEvent) -> bool {
        if !self.paths.is_empty() {
            let path_ok = ev.path().map(|p| self.paths.iter().any(|f| f == p));
            let id_ok = ev.netns().map(|id| Some(id) == self.netns);
            match (path_ok, id_ok) {
                (Some(true), _) | (_, Some(true)) => {}
                (None, None) => {}
                _ => return false,
            }
        }
        if let Some(dev) = &self.device
            && ev.device().is_some_and(|d| d != dev)
        {
            return false;
        }
        true
    }
}

/// Runs the trace, writing to `out`.
pub async fn run(args: &TraceArgs, out: &mut dyn std::io::Write) -> Result<(), TraceError> {
    let opts = WatcherOptions {
        ebpf: !args.no_ebpf,
        trace_all: args.all,
        learn_dirs: true,
        cleanup_probes: true,
        prefixes: watch::DEFAULT_PREFIXES.iter().map(|s| (*s).to_owned()).collect(),
        ..WatcherOptions::default()
    };
    let watcher = Watcher::start(opts).await?;
    let mut sub = watcher.subscribe();
    print_status(args.json, watcher.status(), watcher.notes(), out)?;
    let filter = Filter::new(args);
    let start = watch::monotonic_ns();
    let deadline = args
        .duration
        .map(|s| tokio::time::Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    loop {
        let next = async {
            match deadline {
                Some(d) => tokio::time::timeout_at(d, sub.recv()).await.ok().flatten(),
                None => tokio::select! {
                    ev = sub.recv() => ev,
                    _ = tokio::signal::ctrl_c() => None,
                },
            }
        };
        let Some(ev) = next.await else { break };
        if !filter.accepts(&ev) {
            continue;
        }
        let line = if args.json {
            json_line(&ev, start)
        } else {
            text_line(&ev, start)
        };
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    Ok(())
}

fn print_status(
    json: bool,
    status: &[ProbeStatus],
    notes: &[String],
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    if json {
        let line = json!({ "type": "probes", "probes": status, "notes": notes });
        writeln!(out, "{line}")?;
    } else {
        writeln!(out, "probes:")?;
        for s in status {
            writeln!(out, "  {s}")?;
        }
        for n in notes {
            writeln!(out, "  {n}")?;
        }
        writeln!(out, "{:>12}  {:<22} details", "t(µs)", "event")?;
    }
    out.flush()
}

fn rel_us(ev: &LifecycleEvent, start: u64) -> i64 {
    let d = i128::from(ev.time) - i128::from(start);
    i64::try_from(d / 1000).unwrap_or(i64::MAX)
}

fn json_line(ev: &LifecycleEvent, start: u64) -> String {
    let mut v = serde_json::to_value(ev).unwrap_or_else(|_| json!({}));
    if let Some(obj) = v.as_object_mut() {
        obj.insert("type".into(), json!("event"));
        obj.insert("t_us".into(), json!(rel_us(ev, start)));
    }
    v.to_string()
}

fn umount_flags(flags: u32) -> String {
    let mut names = Vec::new();
    for (bit, name) in [
        (1, "MNT_FORCE"),
        (2, "MNT_DETACH"),
        (4, "MNT_EXPIRE"),
        (8, "UMOUNT_NOFOLLOW"),
    ] {
        if flags & bit != 0 {
            names.push(name);
        }
    }
    if names.is_empty() {
        format!("{flags:#x}")
    } else {
        names.join("|")
    }
}

fn id(n: Option<NetnsId>) -> String {
    n.map_or_else(
        || "netns:?".to_owned(),
        |n| format!("netns:[{}] cookie={}", n.inode, n.cookie),
    )
}

fn ret(r: i64) -> String {
    if r >= 0 {
        format!("ret={r}")
    } else {
        let errno = nix::errno::Errno::from_raw(i32::try_from(-r).unwrap_or(0));
        format!("ret={r} ({errno})")
    }
}

fn text_line(ev: &LifecycleEvent, start: u64) -> String {
    let mut d = String::new();
    let task = |t: &watch::Task| {
        if t.pid == 0 {
            String::new()
        } else {
            format!(" pid={} comm={}", t.pid, t.comm)
        }
    };
    let _ = match &ev.kind {
        EventKind::NetnsUnmounted {
            path,
            flags,
            ret: r,
            task: t,
            netns,
            entered,
        } => write!(
            d,
            "{path} {} flags={} {} took={}µs{}",
            id(*netns),
            umount_flags(*flags),
            ret(*r),
            ev.time.saturating_sub(*entered) / 1000,
            task(t)
        ),
        EventKind::NetnsUnlinked {
            path,
            ret: r,
            call,
            task: t,
            netns,
        } => write!(d, "{path} {} {call:?} {}{}", id(*netns), ret(*r), task(t)),
        EventKind::NsfsUnmounting {
            inode,
            flags,
            task: t,
            netns,
        } => write!(
            d,
            "nsfs inode {inode} {} flags={}{}",
            id(*netns),
            umount_flags(*flags),
            task(t)
        ),
        EventKind::NetnsCleanupQueued { task: t } => {
            write!(
                d,
                "last reference to a netns dropped (cleanup_net queued){}",
                task(t)
            )
        }
        EventKind::NetnsCleanupStarted { task: t } => write!(d, "cleanup_net batch started{}", task(t)),
        EventKind::NetnsCleanupFinished { task: t } => write!(d, "cleanup_net batch finished{}", task(t)),
        EventKind::NetnsReleased { netns, task: t } => {
            write!(d, "{} released, will be destroyed{}", id(Some(*netns)), task(t))
        }
        EventKind::DeviceMoving {
            ifindex,
            name,
            new_ifindex,
            from,
            to,
            task: t,
        } => write!(
            d,
            "{name} (ifindex {ifindex}) {} -> {} new_ifindex={new_ifindex}{}",
            id(Some(*from)),
            id(Some(*to)),
            task(t)
        ),
        EventKind::NsidAdded { nsid, netns } => write!(d, "nsid {nsid} = {}", id(*netns)),
        EventKind::NsidRemoved { nsid, netns } => {
            write!(d, "nsid {nsid} = {} is being destroyed", id(*netns))
        }
        EventKind::LinkLeftHost {
            ifindex,
            name,
            nsid,
            new_ifindex,
            to,
        } => write!(
            d,
            "{name} (ifindex {ifindex}) moved to nsid {nsid} {} new_ifindex={}",
            id(*to),
            new_ifindex.map_or_else(|| "?".into(), |i| i.to_string())
        ),
        EventKind::LinkAppeared {
            ifindex,
            name,
            up,
            mac,
            ..
        } => write!(
            d,
            "{name} (ifindex {ifindex}) in host netns, {} mac={}",
            if *up { "UP" } else { "DOWN" },
            mac.as_deref().unwrap_or("-")
        ),
        EventKind::LinkChanged { ifindex, name, up } => {
            write!(
                d,
                "{name} (ifindex {ifindex}) now {}",
                if *up { "UP" } else { "DOWN" }
            )
        }
        EventKind::LinkDeleted { ifindex, name } => write!(d, "{name} (ifindex {ifindex}) deleted"),
        EventKind::Lost { count } => write!(d, "{count} events lost"),
    };
    format!(
        "{:>12}  {:<22} {d}",
        format!("+{}", rel_us(ev, start)),
        ev.kind_name()
    )
}
