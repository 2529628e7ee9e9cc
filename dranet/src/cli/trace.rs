// Over 500 lines: the trace subcommand: human and JSON renderings of every event kind.
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

use crate::clock::MonoTime;
use crate::nri::hooks::PodHook;
use crate::rescue::activity::{Activity, ActivityKind};
use crate::state::ReturnReason;
use crate::sys::netns::NetnsId;
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
    /// A running daemon's activity socket: its hook calls and rescues join the timeline, and each
    /// pod gets an order verdict at the end.
    #[arg(long, value_name = "PATH", default_value = "/run/dranet/events.sock")]
    pub daemon_socket: PathBuf,
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
            eprintln!("dranet trace: {}", crate::telemetry::chain(&e));
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
    let mut daemon = connect_daemon(&args.daemon_socket).await;
    if !args.json {
        match &daemon {
            Some(_) => writeln!(
                out,
                "daemon: {} (hooks and rescues shown)",
                args.daemon_socket.display()
            )?,
            None => writeln!(out, "daemon: not running (kernel events only)")?,
        }
    }
    let filter = Filter::new(args);
    let start = watch::mono_now();
    let deadline = args
        .duration
        .map(|s| tokio::time::Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let mut verdicts = Verdicts::default();
    loop {
        let next = async {
            let daemon_next = async {
                match daemon.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => futures::future::pending().await,
                }
            };
            let either = async {
                tokio::select! {
                    ev = sub.recv() => ev.map(Item::Kernel),
                    a = daemon_next => Some(a.map_or(Item::DaemonGone, Item::Daemon)),
                }
            };
            match deadline {
                Some(d) => tokio::time::timeout_at(d, either).await.ok().flatten(),
                None => tokio::select! {
                    it = either => it,
                    _ = tokio::signal::ctrl_c() => None,
                },
            }
        };
        let Some(item) = next.await else { break };
        let line = match item {
            Item::Kernel(ev) => {
                verdicts.kernel(&ev);
                if !filter.accepts(&ev) {
                    continue;
                }
                if args.json {
                    json_line(&ev, start)
                } else {
                    text_line(&ev, start)
                }
            }
            Item::Daemon(a) => {
                verdicts.daemon(&a);
                if args.json {
                    daemon_json_line(&a, start)
                } else {
                    activity_line(&a, start)
                }
            }
            Item::DaemonGone => {
                daemon = None;
                continue;
            }
        };
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    for v in verdicts.lines() {
        if args.json {
            writeln!(out, "{}", json!({ "verdict": v }))?;
        } else {
            writeln!(out, "verdict: {v}")?;
        }
    }
    Ok(())
}

enum Item {
    Kernel(LifecycleEvent),
    Daemon(Activity),
    DaemonGone,
}

/// Reads the daemon's activity feed into a channel, if a daemon is listening.
async fn connect_daemon(path: &std::path::Path) -> Option<tokio::sync::mpsc::Receiver<Activity>> {
    use tokio::io::AsyncBufReadExt;
    let conn = tokio::net::UnixStream::connect(path).await.ok()?;
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(conn).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            if let Ok(a) = serde_json::from_str::<Activity>(&l)
                && tx.send(a).await.is_err()
            {
                break;
            }
        }
    });
    Some(rx)
}

fn rel(at: MonoTime, start: MonoTime) -> i64 {
    i64::try_from(at.offset_ns(start)).unwrap_or(i64::MAX)
}

/// A daemon line of `--json`: `t_us` in µs since the trace started, like the kernel lines.
fn daemon_json_line(a: &Activity, start: MonoTime) -> String {
    json!({"t_us": rel(a.at, start) / 1000, "daemon": a}).to_string()
}

fn activity_line(a: &Activity, start: MonoTime) -> String {
    let t = rel(a.at, start) / 1000;
    let who = if a.pod.is_empty() {
        a.pod_uid.clone()
    } else {
        format!("{} ({})", a.pod, a.pod_uid)
    };
    let (ev, detail) = match &a.kind {
        ActivityKind::Hook { name } => ("dranet_hook", format!("{name} pod {who}")),
        ActivityKind::Attached { devices, took_us } => (
            "dranet_attached",
            format!("pod {who} devices {devices:?} took={took_us}µs"),
        ),
        ActivityKind::RescueStarted { trigger } => ("dranet_rescue", format!("pod {who} trigger={trigger}")),
        ActivityKind::Returned {
            reason,
            devices,
            took_us,
        } => (
            "dranet_returned",
            format!("pod {who} devices {devices:?} reason={reason:?} took={took_us}µs"),
        ),
        ActivityKind::Failed { action, error, .. } => {
            ("dranet_failed", format!("pod {who} {action}: {error}"))
        }
        ActivityKind::Vanished {
            device, host_name, ..
        } => (
            "dranet_vanished",
            format!("pod {who} device {device} ({host_name}) no longer exists anywhere"),
        ),
        ActivityKind::ReturnStuck {
            devices,
            reason,
            error,
        } => (
            "dranet_return_stuck",
            format!("pod {who} devices {devices:?} still out after the retries ({reason}): {error}"),
        ),
    };
    format!("{t:>+12}  {ev:<22} {detail}")
}

/// Per-pod order verdicts: when the runtime removed the netns, when StopPodSandbox came, when
/// dranet had the devices home.
#[derive(Default)]
struct Verdicts {
    /// netns path → first umount/unlink time.
    removed: std::collections::HashMap<String, MonoTime>,
    pods: std::collections::BTreeMap<String, PodTimes>,
}

#[derive(Default)]
struct PodTimes {
    name: String,
    path: Option<String>,
    stop: Option<MonoTime>,
    returned: Option<(MonoTime, usize, ReturnReason)>,
}

impl Verdicts {
    fn kernel(&mut self, ev: &LifecycleEvent) {
        if let EventKind::NetnsUnmounted { path, ret: 0, .. }
        | EventKind::NetnsUnlinked { path, ret: 0, .. } = &ev.kind
        {
            self.removed.entry(path.clone()).or_insert(ev.time);
        }
    }

    fn daemon(&mut self, a: &Activity) {
        let p = self.pods.entry(a.pod_uid.clone()).or_default();
        if !a.pod.is_empty() {
            p.name.clone_from(&a.pod);
        }
        if a.netns_path.is_some() {
            p.path.clone_from(&a.netns_path);
        }
        match &a.kind {
            ActivityKind::Hook {
                name: PodHook::StopPodSandbox,
            } => {
                p.stop.get_or_insert(a.at);
            }
            ActivityKind::Returned { devices, reason, .. } => {
                p.returned.get_or_insert((a.at, devices.len(), *reason));
            }
            _ => {}
        }
    }

    fn lines(&self) -> Vec<String> {
        let ms = |a: MonoTime, b: MonoTime| a.offset_ns(b) as f64 / 1e6;
        let mut out = Vec::new();
        for (uid, p) in &self.pods {
            let Some((ret_at, n, reason)) = &p.returned else {
                continue;
            };
            let removed = p.path.as_ref().and_then(|x| {
                self.removed
                    .get(x)
                    .or_else(|| self.removed.get(crate::rescue::decide::normalize_path(x)))
            });
            let name = if p.name.is_empty() {
                uid.as_str()
            } else {
                p.name.as_str()
            };
            let order = match (removed, p.stop) {
                (Some(r), Some(s)) if *r < s => {
                    format!(
                        "runtime removed the netns {:.1} ms before StopPodSandbox",
                        ms(s, *r)
                    )
                }
                (Some(r), Some(s)) => format!(
                    "StopPodSandbox came {:.1} ms before the netns was removed",
                    ms(*r, s)
                ),
                (Some(_), None) => "runtime removed the netns; no StopPodSandbox seen".to_owned(),
                (None, Some(_)) => "StopPodSandbox while the netns lived".to_owned(),
                (None, None) => "no teardown seen".to_owned(),
            };
            let back = match (removed, p.stop) {
                (Some(r), _) if *reason == ReturnReason::NetnsTeardown => {
                    format!(
                        "dranet returned {n} device(s) {:.1} ms after the umount",
                        ms(*ret_at, *r)
                    )
                }
                (_, Some(s)) => {
                    format!(
                        "dranet returned {n} device(s) {:.1} ms after StopPodSandbox ({reason:?})",
                        ms(*ret_at, s)
                    )
                }
                _ => format!("dranet returned {n} device(s) ({reason:?})"),
            };
            out.push(format!("pod {name}: {order}; {back}"));
        }
        out
    }
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

fn rel_us(ev: &LifecycleEvent, start: MonoTime) -> i64 {
    i64::try_from(ev.time.offset_ns(start) / 1000).unwrap_or(i64::MAX)
}

fn json_line(ev: &LifecycleEvent, start: MonoTime) -> String {
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

fn text_line(ev: &LifecycleEvent, start: MonoTime) -> String {
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
            ev.time.since(*entered).as_micros(),
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

#[cfg(test)]
mod json_tests {
    use super::*;
    use crate::rescue::activity::ActivityKind;

    /// Kernel and daemon lines of `--json` share one time axis, in µs.
    #[test]
    fn daemon_and_kernel_lines_carry_t_us_in_microseconds() {
        let start = MonoTime::from_ns(1_000_000_000);
        let a = Activity {
            at: MonoTime::from_ns(1_002_500_000),
            pod_uid: "uid-1".into(),
            pod: "ns/p".into(),
            netns_path: None,
            kind: ActivityKind::Hook {
                name: PodHook::StopPodSandbox,
            },
        };
        let v: serde_json::Value = serde_json::from_str(&daemon_json_line(&a, start)).unwrap();
        assert_eq!(v["t_us"], 2500);
        let ev = LifecycleEvent {
            time: MonoTime::from_ns(1_002_500_000),
            source: crate::watch::Source::Rtnetlink,
            kind: crate::watch::EventKind::Lost { count: 1 },
        };
        let k: serde_json::Value = serde_json::from_str(&json_line(&ev, start)).unwrap();
        assert_eq!(k["t_us"], v["t_us"]);
    }
}
