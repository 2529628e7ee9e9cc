//! `dranet run`: the node daemon.
//!
//! Start-up order matters: the watcher first (so no teardown is missed), then the engine and its
//! reconcile (pins re-opened, devices of pods torn down while we were away brought home), then
//! the event loop, then the runtime (NRI) side, then `/healthz` and `/readyz`, then the kubelet
//! (DRA) side. Nothing before the kubelet side touches the API server, and nothing there waits
//! for it or exits because of it: the node's devices are protected whatever the cluster does
//! (`/readyz` says what is missing). On SIGTERM the hooks stop; pins stay (pods keep running and
//! a restarted dranet re-adopts them).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use prometheus_client::registry::Registry;
use tracing::{error, info, warn};

use crate::http::{Endpoints, Server};
use crate::ready::Readiness;
use crate::rescue::{Engine, EngineOptions};
use crate::watch::{Watcher, WatcherOptions};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// This node's name (the ResourceSlice pool). Upstream spelling: --hostname-override.
    /// Not given (or empty): the host name, lower case, as upstream and kubelet.
    #[arg(
        long,
        env = "NODE_NAME",
        alias = "hostname-override",
        default_value = "",
        hide_default_value = true
    )]
    pub node_name: String,
    /// DRA driver name (as upstream dranet, so existing claims and DeviceClasses match).
    #[arg(long, env = "DRANET_DRIVER_NAME", default_value = "dra.net")]
    pub driver_name: String,
    /// kubelet root: registration socket in <dir>/plugins_registry, dra.sock in <dir>/plugins/<driver>.
    #[arg(long, env = "DRANET_KUBELET_ROOT_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_root_dir: PathBuf,
    /// The runtime's NRI socket (ignored when NRI_PLUGIN_SOCKET hands us a connected fd).
    #[arg(long, env = "DRANET_NRI_SOCKET", default_value = "/var/run/nri/nri.sock")]
    pub nri_socket: PathBuf,
    /// NRI plugin name.
    #[arg(long, env = "DRANET_NRI_PLUGIN_NAME", default_value = "dranet")]
    pub nri_plugin_name: String,
    /// NRI plugin index (two digits; orders plugins in the runtime).
    #[arg(long, env = "DRANET_NRI_PLUGIN_INDEX", default_value = "00")]
    pub nri_plugin_index: String,
    /// Checkpoint and pins (keep it on tmpfs, shared with the host mount namespace).
    #[arg(long, env = "DRANET_STATE_DIR", default_value = "/run/dranet")]
    pub state_dir: PathBuf,
    /// /healthz, /readyz and /metrics: HOST:PORT, or :PORT for every interface (as upstream).
    #[arg(long, env = "DRANET_BIND_ADDRESS", default_value = "0.0.0.0:9177")]
    pub bind_address: String,
    /// CEL filter over device attributes; empty publishes every device (upstream default hides veth).
    #[arg(
        long,
        env = "DRANET_FILTER",
        default_value = r#"!("dra.net/type" in attributes) || attributes["dra.net/type"].StringValue != "veth""#
    )]
    pub filter: String,
    /// Last resort for a physical NIC lost everywhere: PCI driver unbind/rebind through sysfs.
    #[arg(long, env = "DRANET_PCI_REBIND")]
    pub pci_rebind: bool,
    /// Write ResourceSlices as JSON files here instead of publishing them to the API server.
    #[arg(long, env = "DRANET_SLICES_DIR")]
    pub slices_dir: Option<PathBuf>,
    /// Read ResourceClaims from <dir>/<namespace>/<name>.json instead of the API server (no cluster:
    /// demos, the node simulator).
    #[arg(long, env = "DRANET_CLAIMS_DIR")]
    pub claims_dir: Option<PathBuf>,
    /// kubeconfig (default: in-cluster).
    #[arg(long, env = "DRANET_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Do not load the eBPF probes (rtnetlink + inotify only; the pins still protect devices).
    #[arg(long, env = "DRANET_NO_PROBES")]
    pub no_probes: bool,
    /// Do not connect to the runtime (tests, dry runs).
    #[arg(long, env = "DRANET_NO_NRI")]
    pub no_nri: bool,
    /// Do not serve kubelet (tests, dry runs).
    #[arg(long, env = "DRANET_NO_DRA")]
    pub no_dra: bool,
    /// Seconds a device gone from the host for good (in no pod, nothing pending) stays listed
    /// UNHEALTHY in the device health stream before it is dropped from the list.
    #[arg(long, env = "DRANET_HEALTH_GONE_GRACE_SECONDS", default_value_t = 300)]
    pub health_gone_grace_seconds: u64,
    #[arg(long, env = "DRANET_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// sysfs root (tests).
    #[arg(long, env = "DRANET_SYSFS", default_value = "/sys", hide = true)]
    pub sysfs: PathBuf,
    /// Base URL that replaces every cloud's instance metadata address (169.254.169.254,
    /// 100.100.100.200), e.g. http://127.0.0.1:8080 (tests).
    #[arg(long, env = "DRANET_CLOUD_METADATA_ENDPOINT", hide = true)]
    pub cloud_metadata_endpoint: Option<String>,
    /// Seconds to wait for another dranet (an old pod of a rolling update, `dranet
    /// release-all`) to let go of the state dir before giving up with its pid.
    #[arg(long, env = "DRANET_STATE_LOCK_WAIT_SECONDS", default_value_t = 30)]
    pub state_lock_wait_seconds: u64,
    #[command(flatten)]
    pub upstream: super::upstream::UpstreamArgs,
}

/// The daemon's health, readiness and metrics.
pub(crate) struct Status {
    readiness: Readiness,
    registry: Registry,
}

impl Endpoints for Status {
    fn health(&self) -> Result<(), String> {
        self.readiness.health()
    }

    fn ready(&self) -> Result<(), String> {
        self.readiness.ready()
    }

    fn metrics(&self, format: crate::http::MetricsFormat) -> String {
        crate::telemetry::metrics::encode(&self.registry, format).unwrap_or_else(|e| {
            warn!(error = %crate::telemetry::chain(&e), "encoding metrics");
            String::new()
        })
    }
}

pub fn main(args: &RunArgs) -> ExitCode {
    // First, before any thread (glibc fixes the arena limit when the second arena is made): a
    // bounded number of malloc arenas, so what a burst freed is not kept once per thread that ran
    // it (the idle RSS with 1,024 devices dropped from 48 to 32 MiB).
    let arenas_capped = crate::sys::os::cap_malloc_arenas();
    match args.upstream.log_filter() {
        // `--v` given: it wins over RUST_LOG, as the flag is the more explicit of the two.
        Some(f) => super::init_logging_with(args.log_format == LogFormat::Json, f),
        None => super::init_logging(args.log_format == LogFormat::Json, "info"),
    }
    {
        use crate::telemetry::version::{REVISION, RUSTC, VERSION};
        info!(
            version = %VERSION,
            revision = %REVISION,
            rustc = %RUSTC,
            "dranet starting"
        );
    }
    if let Err(e) = args.upstream.check() {
        error!(error = %crate::telemetry::chain(&e), "bad flag");
        return ExitCode::FAILURE;
    }
    let mut args = args.clone();
    if args.node_name.trim().is_empty() {
        // As upstream (and kubelet): no --hostname-override / NODE_NAME, the host name.
        match crate::sys::os::node_hostname() {
            Some(h) => {
                info!(
                    node = h,
                    "no --node-name or NODE_NAME: the host name is the node's name"
                );
                args.node_name = h;
            }
            None => {
                error!(
                    "no node name: pass --node-name (or --hostname-override, or set NODE_NAME); the host name is empty"
                );
                return ExitCode::FAILURE;
            }
        }
    }
    // Input that can be checked before anything starts is checked here, so a typo fails at
    // once, not after the probes, the reconcile and the endpoint are up.
    if let Err(e) = preflight(&args) {
        error!(error = %format!("{e:#}"), "bad configuration");
        return ExitCode::FAILURE;
    }
    for note in args.upstream.notes() {
        warn!("{note}");
    }
    if !arenas_capped {
        warn!("cannot cap the malloc arenas: the idle RSS may stay at its peak");
    }
    if !crate::sys::os::malloc_tunables_set() {
        info!(
            recommended = crate::sys::os::MALLOC_TUNABLES,
            "GLIBC_TUNABLES lacks the image's malloc tunables: after a burst of pods the RSS stays a few MiB above where it was"
        );
    }
    // Before any thread or socket: every fd the hard limit allows, so the default soft limit
    // (often 1024) is not what a burst of connections or pods exhausts first.
    match crate::listen::raise_nofile_limit() {
        Ok(l) if l.old_soft != l.new_soft => {
            info!(
                old = l.old_soft,
                new = l.new_soft,
                hard = l.hard,
                "raised the soft RLIMIT_NOFILE to the hard limit"
            );
        }
        Ok(l) => info!(
            soft = l.old_soft,
            hard = l.hard,
            "RLIMIT_NOFILE already at the hard limit"
        ),
        Err(e) => warn!(error = %crate::telemetry::chain(&e), "cannot raise RLIMIT_NOFILE"),
    }
    let rt = match daemon_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            error!(error = %crate::telemetry::chain(&e), "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %crate::telemetry::chain(e.as_ref()), "dranet run failed");
            ExitCode::FAILURE
        }
    }
}

/// Checks what can be checked before start-up: the CEL `--filter` compiles, an explicit
/// `--kubeconfig` exists and reads as a kubeconfig.
///
/// # Errors
/// What is wrong, naming the flag.
pub fn preflight(args: &RunArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    crate::inventory::Filter::compile(&args.filter).context("--filter")?;
    if let Some(kc) = &args.kubeconfig {
        kube::config::Kubeconfig::read_from(kc).with_context(|| {
            format!(
                "--kubeconfig {}: cannot be read (an explicit kubeconfig must exist; without the flag, the in-cluster config is used)",
                kc.display()
            )
        })?;
    }
    super::upstream::bind_addresses(&args.bind_address).context("--bind-address")?;
    Ok(())
}

/// How long an idle thread of the blocking pool stays (tokio's default is 10 s).
pub const POOL_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(1);

/// The daemon's runtime: 2 workers, and a blocking pool whose threads leave [`POOL_KEEP_ALIVE`]
/// after their last job and ask for a heap trim as they go ([`crate::heap::after_burst`]).
///
/// A burst of pods (256 through one NRI connection) runs its kernel work on some 16 pool threads.
/// While they live, what they touched stays resident; after they leave, nothing else trims it on
/// an idle node (the trims follow inventory scans, and a pod's removal changes no link): churn
/// left the RSS 2.2 MiB up until the next link change. Now it comes down about 1.3 s after the
/// burst.
pub fn daemon_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_keep_alive(POOL_KEEP_ALIVE)
        .on_thread_stop(crate::heap::after_burst)
        .enable_all()
        .build()
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    // First: from here on a SIGTERM is held for whoever waits next, never lost between two
    // waits (one that landed as start-up completed used to be dropped, and the daemon ran on
    // until a second one).
    let mut signals = Signals::new();
    log_config(&args);
    let bind = super::upstream::bind_addresses(&args.bind_address)?;
    let readiness = Readiness::new();
    let watcher = match Watcher::start(WatcherOptions {
        ebpf: !args.no_probes,
        ..WatcherOptions::default()
    })
    .await
    {
        Ok(w) => {
            for s in w.status() {
                log_probe(s);
            }
            Some(w)
        }
        Err(e) => {
            warn!(error = %crate::telemetry::chain(&e), "lifecycle watcher unavailable: devices are still pinned and returned by the hooks");
            None
        }
    };
    let sub = watcher.as_ref().map(Watcher::subscribe);
    let probes = crate::telemetry::metrics::ProbeMetrics::default();
    if let Some(w) = &watcher {
        for s in w.status() {
            let active = matches!(s.state, crate::watch::ProbeState::Active);
            probes.set(&format!("{:?}", s.tier), s.name, active);
        }
    }
    let opts = EngineOptions {
        state_dir: args.state_dir.clone(),
        pci_rebind: args.pci_rebind,
        sysfs: args.sysfs.clone(),
        lock_wait: std::time::Duration::from_secs(args.state_lock_wait_seconds),
        device_filter: args.filter.clone(),
        ..EngineOptions::default()
    };
    // Never fails on the checkpoint's content (moved aside, `.prev`, the pins); it does fail
    // when another dranet keeps the state dir.
    let engine = Engine::new(opts, watcher).await?;
    // Subscribed before the reconcile: what it finds (a device vanished while dranet was down,
    // a return that keeps failing) reaches the reporter (pod event, claim status) and device
    // health (kubelet's health stream) once they start, instead of going to no subscriber.
    let startup_activity = super::run_sides::StartupActivity::subscribe(&engine);
    // The kubelet side's reporter confirms each vanished device's report: until it does, the
    // device's record says so and stays (a kill in between re-sends it at the next start).
    if !args.no_dra {
        engine.report_vanished_with_acks();
    }
    let report = engine.reconcile().await?;
    let (checkpoint, checkpoint_problem) = load_source(engine.load_source());
    if report.rebuilt.is_empty() {
        info!(
            adopted = report.adopted.len(),
            returned = report.returned.len(),
            failed = %report.failed.join(","),
            stray_pins = report.stray_pins,
            dropped = report.dropped,
            checkpoint,
            checkpoint_problem = %checkpoint_problem,
            "start-up reconcile"
        );
    } else {
        warn!(
            adopted = report.adopted.len(),
            returned = report.returned.len(),
            failed = %report.failed.join(","),
            stray_pins = report.stray_pins,
            dropped = report.dropped,
            rebuilt = %report.rebuilt.join(","),
            checkpoint,
            checkpoint_problem = %checkpoint_problem,
            "start-up reconcile: records rebuilt from pins"
        );
    }
    if let Some(sub) = sub {
        let e = engine.clone();
        tokio::spawn(async move { e.run_events(sub).await });
    }
    // Records of sandboxes whose netns is gone (a runtime that never sends Stop/Remove for them).
    let e = engine.clone();
    tokio::spawn(async move { e.sweep_forever().await });
    readiness.set_met(crate::ready::ENGINE);
    let mut registry = crate::telemetry::metrics::registry();
    engine.metrics().register(&mut registry);
    crate::listen::metrics().register(&mut registry);
    probes.register(&mut registry);
    let sock = args.state_dir.join(ACTIVITY_SOCKET);
    match serve_activity(&sock, engine.clone()) {
        Ok(()) => info!(socket = %sock.display(), "activity feed for `dranet trace`"),
        Err(e) => {
            warn!(socket = %sock.display(), error = %crate::telemetry::chain(&e), "no activity feed for `dranet trace`")
        }
    }
    let sock = args.state_dir.join(CONTROL_SOCKET);
    match serve_control(&sock, engine.clone()) {
        Ok(()) => {
            info!(socket = %sock.display(), "control socket for `dranet release-all` beside the daemon")
        }
        Err(e) => {
            warn!(socket = %sock.display(), error = %crate::telemetry::chain(&e), "no control socket: `dranet release-all` must wait for the daemon to stop")
        }
    }
    let runtime =
        super::run_sides::start_runtime(&args, &engine, &mut registry, &readiness, startup_activity).await?;
    let status = Arc::new(Status {
        readiness: readiness.clone(),
        registry,
    });
    let server = bind_server(&bind).await?;
    let addr = server.local_addr().map(|a| a.to_string()).unwrap_or_default();
    info!(addr = %addr, "serving /healthz, /readyz and /metrics");
    let ep: Arc<dyn Endpoints> = status.clone();
    tokio::spawn(server.run(ep));
    // The sides come up while the endpoint already answers; a signal meanwhile stops us.
    let extra = tokio::select! {
        s = super::run_sides::start_kubelet(&args, &engine, runtime) => s?,
        () = signals.recv() => {
            info!("stopping during start-up: pins stay");
            return Ok(());
        }
    };
    // The readiness marker on stdout (the node simulator and scripts wait for it); in JSON mode
    // a JSON line like every other.
    println!(
        "{}",
        crate::telemetry::log::ready_line(args.log_format == LogFormat::Json)
    );
    signals.recv().await;
    tokio::spawn(async move {
        signals.recv().await;
        warn!("second signal: exiting now");
        std::process::exit(130);
    });
    info!("stopping: pins stay, so running pods keep their devices and a restarted dranet re-adopts them");
    extra.stop().await;
    Ok(())
}

/// Binds the first address that works (`:PORT` tries `[::]` and then `0.0.0.0`).
async fn bind_server(addrs: &[String]) -> anyhow::Result<Server> {
    let mut last = None;
    for a in addrs {
        match Server::bind(a).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.map_or_else(|| anyhow::anyhow!("no bind address"), anyhow::Error::from))
}

/// File name of the control socket in the state dir (`dranet release-all` beside the daemon).
pub const CONTROL_SOCKET: &str = "control.sock";

/// What the control socket accepts: one line, answered with one JSON line, then closed.
pub const RELEASE_ALL_REQUEST: &str = "release-all";

/// Serves the root-only control socket: `release-all` stops every attach and brings every
/// device home ([`Engine::stop_attaching`], [`Engine::release_all`]); the answer is
/// `{"ok":true,"report":{...}}` or `{"ok":false,"error":"..."}`. Only a peer with uid 0 is
/// served (the socket is 0600 too); at most 4 clients at once.
fn serve_control(path: &std::path::Path, engine: Engine) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let mut incoming = crate::listen::Incoming::new(listener, "control", 4);
    tokio::spawn(async move {
        loop {
            match incoming.accept().await {
                crate::listen::Accepted::Admitted(conn) => {
                    tokio::spawn(control_client(conn, engine.clone()));
                }
                crate::listen::Accepted::OverCap(conn) => drop(conn),
            }
        }
    });
    Ok(())
}

async fn control_client(mut conn: crate::listen::Guarded<tokio::net::UnixStream>, engine: Engine) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let root = conn.get_ref().peer_cred().is_ok_and(|c| c.uid() == 0);
    let mut line = String::new();
    // One short line, within 10 s.
    let read = {
        let mut r = tokio::io::BufReader::new(conn.get_mut().take(256));
        tokio::time::timeout(std::time::Duration::from_secs(10), r.read_line(&mut line)).await
    };
    let answer = match (root, read, line.trim()) {
        (false, ..) => serde_json::json!({"ok": false, "error": "only root may use the control socket"}),
        (_, Ok(Ok(_)), RELEASE_ALL_REQUEST) => {
            warn!("release-all asked over the control socket: no more attaches, every device comes home");
            engine.stop_attaching();
            match engine.release_all().await {
                Ok(report) => serde_json::json!({"ok": true, "report": report}),
                Err(e) => serde_json::json!({"ok": false, "error": crate::telemetry::chain(&e).to_string()}),
            }
        }
        (_, Ok(Ok(_)), other) => {
            serde_json::json!({"ok": false, "error": format!("unknown request {:?} (known: {RELEASE_ALL_REQUEST})", crate::text::cut_at_char(other, 64))})
        }
        _ => serde_json::json!({"ok": false, "error": "no request within 10 s"}),
    };
    let mut out = answer.to_string();
    out.push('\n');
    let _ = conn.write_all(out.as_bytes()).await;
}

/// File name of the activity socket in the state dir.
pub const ACTIVITY_SOCKET: &str = "events.sock";

/// Clients of the activity socket served at once (`dranet trace` sessions); more are closed.
const ACTIVITY_MAX_CLIENTS: usize = 16;

/// Serves the engine's activity feed as JSON lines to every client of a root-only unix socket.
/// The accept loop backs off on errors and never ends; a client that hangs up is noticed at once
/// (not at the next activity), so its slot frees.
fn serve_activity(path: &std::path::Path, engine: Engine) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let mut incoming = crate::listen::Incoming::new(listener, "events", ACTIVITY_MAX_CLIENTS);
    tokio::spawn(async move {
        loop {
            match incoming.accept().await {
                crate::listen::Accepted::Admitted(conn) => {
                    tokio::spawn(feed_activity(conn, engine.activity()));
                }
                crate::listen::Accepted::OverCap(conn) => drop(conn),
            }
        }
    });
    Ok(())
}

async fn feed_activity(
    mut conn: crate::listen::Guarded<tokio::net::UnixStream>,
    mut rx: tokio::sync::broadcast::Receiver<crate::rescue::activity::Activity>,
) {
    use std::os::fd::AsFd;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::broadcast::error::RecvError;
    let mut sink = [0u8; 256];
    // Clients send nothing. End of file means the client hung up, or only shut its sending side
    // (`socat ... </dev/null`): then it is still fed, and its hang-up shows at the next write.
    let mut reading = true;
    loop {
        let a = tokio::select! {
            r = rx.recv() => match r {
                Ok(a) => a,
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => break,
            },
            n = conn.get_mut().read(&mut sink), if reading => match n {
                Ok(0) if crate::listen::peer_hung_up(conn.get_ref().as_fd()) => break,
                Ok(0) => {
                    reading = false;
                    continue;
                }
                Ok(_) => continue,
                Err(_) => break,
            },
        };
        let Ok(mut line) = serde_json::to_string(&a) else {
            continue;
        };
        line.push('\n');
        if conn.write_all(line.as_bytes()).await.is_err() {
            break;
        }
    }
}

/// The configuration, once at start, as fields (paths and strings as text, flags as booleans).
fn log_config(args: &RunArgs) {
    let opt = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
    info!(
        node_name = %args.node_name,
        driver_name = %args.driver_name,
        kubelet_root_dir = %args.kubelet_root_dir.display(),
        nri_socket = %args.nri_socket.display(),
        nri_plugin_name = %args.nri_plugin_name,
        nri_plugin_index = %args.nri_plugin_index,
        state_dir = %args.state_dir.display(),
        bind_address = %args.bind_address,
        filter = %args.filter,
        pci_rebind = args.pci_rebind,
        slices_dir = %opt(&args.slices_dir),
        claims_dir = %opt(&args.claims_dir),
        kubeconfig = %opt(&args.kubeconfig),
        no_probes = args.no_probes,
        no_nri = args.no_nri,
        no_dra = args.no_dra,
        health_gone_grace_seconds = args.health_gone_grace_seconds,
        log_format = match args.log_format {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        },
        sysfs = %args.sysfs.display(),
        cloud_metadata_endpoint = %args.cloud_metadata_endpoint.as_deref().unwrap_or_default(),
        state_lock_wait_seconds = args.state_lock_wait_seconds,
        "configuration"
    );
    let u = &args.upstream;
    info!(
        verbosity = u.verbosity.map(i64::from).unwrap_or(-1),
        db_path = %u.db_path.as_deref().unwrap_or_default(),
        inventory_min_poll_interval = %u.inventory_min_poll_interval.as_deref().unwrap_or_default(),
        inventory_max_poll_interval = %u.inventory_max_poll_interval.as_deref().unwrap_or_default(),
        inventory_poll_burst = u.inventory_poll_burst.map(i64::from).unwrap_or(-1),
        move_ib_interfaces = %u.move_ib_interfaces.map(|b| b.to_string()).unwrap_or_default(),
        feature_gates = %u.feature_gates.as_deref().unwrap_or_default(),
        cloud_provider_hint = %u.cloud_provider_hint.as_deref().unwrap_or_default(),
        profile_provider = %u.profile_provider.as_deref().unwrap_or_default(),
        webhook_url = %u.webhook_url.as_deref().unwrap_or_default(),
        "configuration: upstream flags (empty or -1: not given)"
    );
}

/// One probe's state as fields: `probe`, `tier`, `state` (active, unsupported, failed), `reason`.
fn log_probe(s: &crate::sys::probes::ProbeStatus) {
    use crate::watch::ProbeState;
    let (state, reason) = match &s.state {
        ProbeState::Active => ("active", ""),
        ProbeState::Unsupported(r) => ("unsupported", r.as_str()),
        ProbeState::Failed(e) => ("failed", e.as_str()),
    };
    info!(probe = s.name, tier = %s.tier, state, reason, what = s.what, "probe");
}

/// Where the checkpoint came from, one word, and what went wrong loading it (empty if nothing).
fn load_source(s: &crate::state::LoadSource) -> (&'static str, String) {
    use crate::state::LoadSource;
    let aside = |a: &Option<PathBuf>| {
        a.as_ref()
            .map(|a| format!(" (moved to {})", a.display()))
            .unwrap_or_default()
    };
    match s {
        LoadSource::Absent => ("absent", String::new()),
        LoadSource::Current => ("current", String::new()),
        LoadSource::Previous { problem, aside: a } => ("previous", format!("{problem}{}", aside(a))),
        LoadSource::Nothing {
            problem,
            prev_problem,
            aside: a,
        } => ("nothing", format!("{problem}{}; .prev: {prev_problem}", aside(a))),
    }
}

/// SIGTERM and SIGINT, listened to from the start of `run` to its end: a signal that arrives
/// while nobody waits is held for the next [`Signals::recv`].
struct Signals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        let (term, int) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
        if let Err(e) = &term {
            warn!(error = %e, "cannot listen for SIGTERM");
        }
        Self {
            term: term.ok(),
            int: int.ok(),
        }
    }

    /// The next SIGTERM or SIGINT (held since the last call); never, without listeners.
    async fn recv(&mut self) {
        async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => futures::future::pending::<()>().await,
            }
        }
        tokio::select! {
            () = next(&mut self.term) => {}
            () = next(&mut self.int) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listen::{Accepted, Incoming};
    use crate::rescue::activity::{Activity, ActivityKind};
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::net::{UnixListener, UnixStream};

    fn hook(uid: &str) -> Activity {
        Activity {
            at: crate::clock::MonoTime::from_ns(1),
            pod_uid: uid.into(),
            pod: String::new(),
            netns_path: None,
            kind: ActivityKind::Hook {
                name: crate::nri::hooks::PodHook::RunPodSandbox,
            },
        }
    }

    /// A client that hangs up frees its slot at once; one that only shuts its sending side is
    /// still fed.
    #[tokio::test]
    async fn activity_clients_hang_up_or_half_close() {
        let dir = std::env::temp_dir().join(format!("dranet-activity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("events.sock");
        let _ = std::fs::remove_file(&path);
        let mut inc = Incoming::new(UnixListener::bind(&path).unwrap(), "test-events", 4);
        let (tx, _) = tokio::sync::broadcast::channel(16);
        let mut admit = async || {
            let Accepted::Admitted(conn) = inc.accept().await else {
                panic!("refused")
            };
            conn
        };
        let gone = UnixStream::connect(&path).await.unwrap();
        let feeder = tokio::spawn(feed_activity(admit().await, tx.subscribe()));
        drop(gone);
        tokio::time::timeout(std::time::Duration::from_secs(2), feeder)
            .await
            .expect("the feed of a client that hung up did not end")
            .unwrap();
        let half = UnixStream::connect(&path).await.unwrap();
        let _feeder = tokio::spawn(feed_activity(admit().await, tx.subscribe()));
        let (rd, mut wr) = half.into_split();
        tokio::io::AsyncWriteExt::shutdown(&mut wr).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        tx.send(hook("u-half")).unwrap();
        let line = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            BufReader::new(rd).lines().next_line(),
        )
        .await
        .expect("a half-closed client was not fed")
        .unwrap()
        .unwrap();
        assert!(line.contains("u-half"), "{line}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A pool thread that went idle is gone after [`POOL_KEEP_ALIVE`] (the next job gets a new
    /// thread), and a heap trim follows its leaving.
    #[test]
    fn an_idle_pool_thread_leaves_and_the_heap_is_trimmed_after_it() {
        let rt = daemon_runtime().unwrap();
        let pool_thread = || {
            rt.block_on(async {
                tokio::task::spawn_blocking(|| std::thread::current().id())
                    .await
                    .unwrap()
            })
        };
        let first = pool_thread();
        let trims_before = crate::heap::trims();
        std::thread::sleep(POOL_KEEP_ALIVE + std::time::Duration::from_secs(2));
        let next = pool_thread();
        assert_ne!(
            next, first,
            "the idle pool thread was still there after {POOL_KEEP_ALIVE:?}"
        );
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while crate::heap::trims() == trims_before {
            assert!(
                std::time::Instant::now() < until,
                "no heap trim after the pool thread left"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
