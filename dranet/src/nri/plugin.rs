//! The NRI plugin: connect, register, serve the Plugin service, reconnect.
//!
//! One session per connection: RegisterPlugin (conn 2, we are the client) → the runtime calls
//! Configure (we answer the event mask [`EVENTS`]) → Synchronize (possibly in chunks with `more`)
//! → pod and container hooks. Both dialects are served: the dedicated RunPodSandbox /
//! StopPodSandbox / RemovePodSandbox RPCs of NRI ≥ 0.12 and the older `StateChange` event; every
//! other method answers `UNIMPLEMENTED`. When the runtime closes the connection we reconnect
//! with backoff (100 ms doubling to 5 s) and register again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixStream;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::hooks::PodHooks;
use super::mux::{Mux, MuxOptions, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use super::pb::nri as pb;
use super::service::{PluginService, SyncLimits};
use super::ttrpc::{self, Client, TtrpcError};
pub use crate::telemetry::metrics::nri::{HookLabels, NriMetrics};

/// Fully qualified name of the service the plugin serves.
/// The NRI API version this plugin speaks (the dedicated pod RPCs came with v0.12.0), sent in
/// RegisterPlugin: runtimes log it, and containerd logs "NRI version unknown" without it.
pub const NRI_VERSION: &str = "v0.12.0";
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// Fully qualified name of the service the runtime serves.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
/// Environment variable with an already connected socket fd (runtime-launched plugins).
pub const ENV_PLUGIN_SOCKET: &str = "NRI_PLUGIN_SOCKET";
/// Environment variable overriding the plugin name (runtime-launched plugins).
pub const ENV_PLUGIN_NAME: &str = "NRI_PLUGIN_NAME";
/// Environment variable overriding the plugin index (runtime-launched plugins).
pub const ENV_PLUGIN_IDX: &str = "NRI_PLUGIN_IDX";

/// The mask bit of an event: `1 << (event - 1)`.
#[must_use]
pub const fn event_bit(e: pb::Event) -> i32 {
    1 << (e as i32 - 1)
}

/// Events dranet subscribes to: RunPodSandbox, StopPodSandbox, RemovePodSandbox,
/// CreateContainer (0xF).
pub const EVENTS: i32 = event_bit(pb::Event::RunPodSandbox)
    | event_bit(pb::Event::StopPodSandbox)
    | event_bit(pb::Event::RemovePodSandbox)
    | event_bit(pb::Event::CreateContainer);

/// What an operator does when the runtime's NRI socket is not there: NRI is off in the runtime
/// (containerd 1.7's default), or the socket is not mounted into dranet's container.
pub const ENABLE_NRI_HINT: &str = "is NRI enabled in the container runtime? containerd 1.7: set `disable = false` under [plugins.\"io.containerd.nri.v1.nri\"] in /etc/containerd/config.toml (on by default from containerd 2.0); CRI-O: `enable_nri = true` under [crio.nri] (on by default from CRI-O 1.30); then restart the runtime. The socket's directory must be mounted into dranet's container (the DaemonSet mounts /var/run/nri)";

/// How often the "NRI socket unreachable" warning repeats while the runtime stays unreachable
/// (the first failure is a WARN at once; the retries in between are debug lines).
pub const UNREACHABLE_WARN_EVERY: Duration = Duration::from_secs(300);

const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Errors of the NRI plugin.
#[derive(Debug, thiserror::Error)]
pub enum NriError {
    /// The configuration cannot be registered (the runtime would refuse it).
    #[error("invalid NRI plugin {field}: {value:?}")]
    InvalidConfig { field: &'static str, value: String },
    /// `NRI_PLUGIN_SOCKET` is not a usable fd.
    #[error("unusable {ENV_PLUGIN_SOCKET}={value:?}")]
    InheritedSocket {
        value: String,
        #[source]
        source: std::io::Error,
    },
    /// Dialling the runtime's socket failed.
    #[error("cannot connect to the NRI socket {}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// RegisterPlugin failed.
    #[error("RegisterPlugin failed")]
    Register(#[source] TtrpcError),
    /// The runtime did not call Configure in time.
    #[error("no Configure from the runtime within {0:?}")]
    NotConfigured(Duration),
    /// The runtime closed the connection during the handshake.
    #[error("the runtime closed the connection during registration: {0}")]
    ClosedDuringHandshake(String),
}

/// Plugin settings.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The runtime's NRI socket.
    pub socket: PathBuf,
    /// Plugin name (`[a-zA-Z0-9_.+-]+`).
    pub name: String,
    /// Invocation index: two digits; plugins run in ascending order.
    pub index: String,
    /// Time allowed for RegisterPlugin and for the runtime's Configure after it.
    pub registration_timeout: Duration,
    /// Timeout of our calls to the runtime.
    pub request_timeout: Duration,
    /// Where the plugin counts its hook calls (clone one registered with [`NriMetrics::register`]).
    pub metrics: NriMetrics,
    /// Where the plugin says whether it is registered with the runtime ([`crate::ready::NRI`]),
    /// and why not: set as the connection comes and goes, no polling.
    pub readiness: Option<crate::ready::Readiness>,
}

impl Default for PluginConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("/var/run/nri/nri.sock"),
            name: "dranet".into(),
            // The Go dranet registers as index 00: first in the runtime's plugin order.
            index: "00".into(),
            registration_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
            metrics: NriMetrics::default(),
            readiness: None,
        }
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c))
}

fn valid_index(s: &str) -> bool {
    s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit())
}

/// The connected socket a runtime passes to a plugin it launched (once per process).
fn inherited_socket() -> Result<Option<UnixStream>, NriError> {
    let Ok(value) = std::env::var(ENV_PLUGIN_SOCKET) else {
        return Ok(None);
    };
    let bad = |source| NriError::InheritedSocket {
        value: value.clone(),
        source,
    };
    let Some(std_stream) = crate::sys::os::take_inherited_socket(&value).map_err(bad)? else {
        return Ok(None);
    };
    std_stream.set_nonblocking(true).map_err(bad)?;
    UnixStream::from_std(std_stream).map(Some).map_err(bad)
}

/// Runs the plugin until `shutdown` turns true (or its sender is dropped): connects (or uses
/// the fd in `NRI_PLUGIN_SOCKET`), registers, serves the hooks, and reconnects with backoff
/// whenever the runtime goes away.
///
/// # Errors
/// Only [`NriError::InvalidConfig`] and [`NriError::InheritedSocket`]: connection trouble is
/// retried, not returned.
pub async fn run<H: PodHooks>(
    mut cfg: PluginConfig,
    hooks: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), NriError> {
    if let Ok(n) = std::env::var(ENV_PLUGIN_NAME) {
        cfg.name = n;
    }
    if let Ok(i) = std::env::var(ENV_PLUGIN_IDX) {
        cfg.index = i;
    }
    if !valid_name(&cfg.name) {
        return Err(NriError::InvalidConfig {
            field: "name",
            value: cfg.name,
        });
    }
    if !valid_index(&cfg.index) {
        return Err(NriError::InvalidConfig {
            field: "index",
            value: cfg.index,
        });
    }
    let mut inherited = inherited_socket()?;
    let mut backoff = BACKOFF_START;
    let mut warned: Option<std::time::Instant> = None;
    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        let stream = match inherited.take() {
            Some(s) => Ok(s),
            None => UnixStream::connect(&cfg.socket)
                .await
                .map_err(|source| NriError::Connect {
                    path: cfg.socket.clone(),
                    source,
                }),
        };
        let end = match stream {
            Ok(s) => session(s, &cfg, &hooks, &mut shutdown).await,
            Err(e) => Err(e),
        };
        match end {
            Ok(SessionEnd::Shutdown) => return Ok(()),
            Ok(SessionEnd::Lost(why)) => {
                warn!(reason = %why, "NRI connection lost; reconnecting");
                if let Some(r) = &cfg.readiness {
                    r.set_unmet(
                        crate::ready::NRI,
                        format!("NRI connection lost ({why}); reconnecting"),
                    );
                }
                backoff = BACKOFF_START;
            }
            Err(e) => {
                let unreachable = matches!(e, NriError::Connect { .. });
                let reason = if unreachable {
                    format!("{}; {ENABLE_NRI_HINT}", crate::telemetry::chain(&e))
                } else {
                    crate::telemetry::chain(&e).to_string()
                };
                if let Some(r) = &cfg.readiness {
                    r.set_unmet(crate::ready::NRI, reason.clone());
                }
                if unreachable && warned.is_none_or(|t| t.elapsed() >= UNREACHABLE_WARN_EVERY) {
                    warned = Some(std::time::Instant::now());
                    warn!(
                        socket = %cfg.socket.display(),
                        error = %crate::telemetry::chain(&e),
                        hint = ENABLE_NRI_HINT,
                        "cannot reach the runtime's NRI socket: pods started meanwhile run without their devices until dranet registers (then it attaches them); retrying"
                    );
                } else {
                    debug!(error = %crate::telemetry::chain(&e), retry_in = ?backoff, "NRI connection attempt failed");
                }
            }
        }
        cfg.metrics.connection_losses.inc();
        cfg.metrics.connected.store(false, Ordering::Relaxed);
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stopped(&mut shutdown) => return Ok(()),
        }
        backoff = next_backoff(backoff);
    }
}

/// 100 ms, 200 ms, 400 ms, … capped at 5 s.
fn next_backoff(d: Duration) -> Duration {
    (d * 2).min(BACKOFF_MAX)
}

async fn stopped(rx: &mut watch::Receiver<bool>) {
    // A dropped sender also means stop: nobody can ask for a clean shutdown any more.
    let _ = rx.wait_for(|v| *v).await;
}

enum SessionEnd {
    Shutdown,
    /// The connection was registered and configured, then lost.
    Lost(String),
}

/// Sets its flag when dropped (the session ended, whatever the way).
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn session<H: PodHooks>(
    stream: UnixStream,
    cfg: &PluginConfig,
    hooks: &Arc<H>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<SessionEnd, NriError> {
    let mut mux = Mux::new(stream, MuxOptions::default());
    let plugin_conn = mux.open(PLUGIN_SERVICE_CONN);
    let runtime_conn = mux.open(RUNTIME_SERVICE_CONN);
    let mut trunk = mux.start();
    let (configured_tx, mut configured) = watch::channel(None);
    // Hooks still running when the connection goes (their handlers outlive the server task) see
    // it here: their answers never reach the runtime.
    let gone = Arc::new(AtomicBool::new(false));
    let _gone_on_drop = SetOnDrop(gone.clone());
    let svc = Arc::new(PluginService {
        hooks: hooks.clone(),
        metrics: cfg.metrics.clone(),
        sync: Mutex::default(),
        sync_limits: SyncLimits::default(),
        configured: configured_tx,
        gone,
        in_flight: watch::channel(0).0,
    });
    let _server = AbortOnDrop(tokio::spawn(ttrpc::serve(plugin_conn, svc.clone())));
    let client = Client::new(runtime_conn);
    let req = pb::RegisterPluginRequest {
        plugin_name: cfg.name.clone(),
        plugin_idx: cfg.index.clone(),
        nri_version: NRI_VERSION.to_owned(),
    };
    let handshake = async {
        client
            .call_msg::<_, pb::Empty>(RUNTIME_SERVICE, "RegisterPlugin", &req, cfg.registration_timeout)
            .await
            .map_err(NriError::Register)?;
        tokio::time::timeout(cfg.registration_timeout, configured.wait_for(Option::is_some))
            .await
            .map_err(|_| NriError::NotConfigured(cfg.registration_timeout))?
            .map(|v| v.clone())
            .map_err(|_| NriError::ClosedDuringHandshake("server ended".into()))
    };
    let runtime = tokio::select! {
        r = handshake => r?,
        why = trunk.closed() => return Err(NriError::ClosedDuringHandshake(why)),
        () = stopped(shutdown) => return Ok(SessionEnd::Shutdown),
    };
    cfg.metrics.registrations.inc();
    cfg.metrics.connected.store(true, Ordering::Relaxed);
    if let Some(r) = &cfg.readiness {
        r.set_met(crate::ready::NRI);
    }
    if let Some((name, version)) = runtime {
        info!(runtime = %name, version = %version, plugin = %cfg.name, index = %cfg.index, "NRI plugin registered");
    }
    tokio::select! {
        why = trunk.closed() => Ok(SessionEnd::Lost(why)),
        () = stopped(shutdown) => {
            // The hooks in flight are answered before the connection closes, and it closes
            // once no request came for SHUTDOWN_QUIET: a request cut off by the close, or sent
            // just after it (a pod's CreateContainer follows its RunPodSandbox within tens of
            // milliseconds), is one the runtime completes without dranet (containerd: "closing
            // plugin …, failed to handle … request: ttrpc: closed"). At most SHUTDOWN_DRAIN.
            let deadline = tokio::time::Instant::now() + SHUTDOWN_DRAIN;
            loop {
                if tokio::time::timeout_at(deadline, svc.idle()).await.is_err() {
                    break;
                }
                let quiet = (tokio::time::Instant::now() + SHUTDOWN_QUIET).min(deadline);
                if tokio::time::timeout_at(quiet, svc.busy()).await.is_err() {
                    break;
                }
            }
            drop(client);
            trunk.close_flushed(SHUTDOWN_FLUSH).await;
            Ok(SessionEnd::Shutdown)
        }
    }
}

/// How long a shutdown waits for the hooks in flight (the runtime gives a request 2 s).
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(2);

/// How long a shutdown waits without a request before it closes the connection.
const SHUTDOWN_QUIET: Duration = Duration::from_millis(200);

/// How long a shutdown lets the answers already made reach the socket.
const SHUTDOWN_FLUSH: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_mask_is_0xf() {
        assert_eq!(EVENTS, 0xF);
        assert_eq!(event_bit(pb::Event::CreateContainer), 8);
    }

    #[test]
    fn backoff_doubles_to_five_seconds() {
        let mut d = BACKOFF_START;
        let mut seen = vec![d];
        for _ in 0..8 {
            d = next_backoff(d);
            seen.push(d);
        }
        let ms: Vec<u128> = seen.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    }

    #[test]
    fn names_and_indexes() {
        assert!(valid_name("dranet") && valid_name("dra.net") && valid_name("a_b+c-1"));
        assert!(!valid_name("") && !valid_name("bad name") && !valid_name("x/y"));
        assert!(valid_index("00") && valid_index("99"));
        assert!(!valid_index("0") && !valid_index("100") && !valid_index("a1"));
        let d = PluginConfig::default();
        assert_eq!((d.name.as_str(), d.index.as_str()), ("dranet", "00"));
        assert_eq!(d.socket, PathBuf::from("/var/run/nri/nri.sock"));
    }
}
