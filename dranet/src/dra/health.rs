// Over 500 lines: two versions of one health service served from one hub.
//! Device health for kubelet (KEP-4680): the `v1.DRAResourceHealth` and
//! `v1alpha1.DRAResourceHealth` services on the DRA socket (the same messages under two package
//! names, served from one hub: [`HealthResponse`] is the only per-version code). [`HealthHub`]
//! keeps where every device of the pool is and streams the full list to every
//! `NodeWatchResources` caller on each change, and again before the advertised
//! [`HEALTH_CHECK_TIMEOUT`] runs out (kubelet marks a device Unknown when its plugin is silent
//! for that long).
//!
//! A device is **healthy** while it is in the host inventory or inside the pod that owns it;
//! **unhealthy** while it is missing from the host and not in a pod, while the rescue engine is
//! bringing it home, and after a return or repair failed (until it is home again).
//!
//! A device **gone for good** (missing from the host, in no pod, not being returned, no failed
//! return or repair pending) stays listed UNHEALTHY for [`GONE_GRACE`] and is then dropped from
//! the list. kubelet keeps a device that left the list at its last reported health until the
//! device's `health_check_timeout_seconds` ran out since its last report, then shows it Unknown
//! with no message (`updateHealthInfo` in `pkg/kubelet/cm/dra/healthinfo.go`): a pod that still
//! holds a claim on it first reads *why* it is unhealthy, for the grace period, and then that
//! the driver no longer vouches for a device which is not there. A device that comes back is
//! listed again, HEALTHY.
//!
//! Inputs: [`HealthHub::observe_scan`] from the inventory publish loop and
//! [`HealthHub::observe_activity`] from the rescue engine's activity feed, each with the
//! checkpoint as it stands. Streams are plain futures polled by the gRPC server: a caller that
//! goes away drops its stream, and no task is left behind.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::proto::{health_v1, health_v1alpha1};
use crate::rescue::activity::{Activity, ActivityKind, FailedAction};
use crate::state::{Checkpoint, DeviceState};

/// gRPC service name of health v1 as kubelet lists it in `supported_versions` (kubelet after
/// 1.36).
pub const HEALTH_SERVICE_V1: &str = "v1.DRAResourceHealth";
/// gRPC service name of health v1alpha1 (kubelet 1.34 and later).
pub const HEALTH_SERVICE_V1ALPHA1: &str = "v1alpha1.DRAResourceHealth";
/// `health_check_timeout_seconds` we advertise per device: kubelet 1.34–1.36 ignore the field
/// and use a fixed 30 s (`healthTimeout` in `pkg/kubelet/cm/dra/healthinfo.go`), so advertise
/// the same.
pub const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// The full list is sent again after this much silence (well inside the timeout).
pub const RESEND_INTERVAL: Duration = Duration::from_secs(10);
/// How long a device gone for good stays listed UNHEALTHY before it is dropped (default of
/// `--health-gone-grace-seconds`).
pub const GONE_GRACE: Duration = Duration::from_secs(300);

/// Unix time in seconds; tests substitute their own clock.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Timing of a hub.
#[derive(Clone)]
pub struct HealthOptions {
    /// Advertised `health_check_timeout_seconds`.
    pub timeout: Duration,
    /// Re-send after this much silence.
    pub resend: Duration,
    /// A device gone for good is dropped from the list after this long.
    pub gone_grace: Duration,
    pub clock: Clock,
}

impl Default for HealthOptions {
    fn default() -> Self {
        Self {
            timeout: HEALTH_CHECK_TIMEOUT,
            resend: RESEND_INTERVAL,
            gone_grace: GONE_GRACE,
            clock: Arc::new(unix_now),
        }
    }
}

impl std::fmt::Debug for HealthOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthOptions")
            .field("timeout", &self.timeout)
            .field("resend", &self.resend)
            .field("gone_grace", &self.gone_grace)
            .finish_non_exhaustive()
    }
}

/// A device's name, allocated once when the hub first sees the device: the hub's tables and
/// every list it publishes hold the same one.
pub type Name = Arc<str>;

/// The health of one device. Cloning it allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceHealth {
    pub device: Name,
    pub healthy: bool,
    /// Why (shown in the pod status by kubelet).
    pub message: Arc<str>,
    /// Unix time (s) of the last change of `healthy` or `message`.
    pub since: i64,
}

/// What the hub knows about the devices.
#[derive(Debug, Default)]
struct State {
    /// Every device seen in the host or in a pod since start.
    known: BTreeSet<Name>,
    /// In the host inventory at the last scan.
    host: BTreeSet<Name>,
    /// In a pod, per the checkpoint: device → `namespace/name`.
    in_pod: BTreeMap<String, String>,
    /// The rescue engine is bringing these home: device → pod.
    returning: BTreeMap<String, String>,
    /// A return or repair failed: device → message.
    failed: BTreeMap<String, String>,
    /// Home, but under a temporary name (its own was taken): device → that name.
    name_busy: BTreeMap<String, String>,
    /// Gone for good since (unix s): dropped once that is [`HealthOptions::gone_grace`] ago.
    gone_since: BTreeMap<Name, i64>,
}

impl State {
    /// The hub's one copy of the name `d` (it becomes known).
    fn name(&mut self, d: &str) -> Name {
        if let Some(n) = self.known.get(d) {
            return n.clone();
        }
        let n: Name = d.into();
        self.known.insert(n.clone());
        n
    }
}

struct Inner {
    pool: String,
    opts: HealthOptions,
    state: Mutex<State>,
    /// The list as last published, sorted by device.
    tx: watch::Sender<Arc<Vec<DeviceHealth>>>,
    /// The messages that name no pod, allocated once.
    fixed: [Arc<str>; 2],
}

/// Device health of one pool; cheap to clone.
#[derive(Clone)]
pub struct HealthHub {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HealthHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthHub")
            .field("pool", &self.inner.pool)
            .finish_non_exhaustive()
    }
}

impl HealthHub {
    /// A hub for `pool` (the node name) with the default timing.
    #[must_use]
    pub fn new(pool: impl Into<String>) -> Self {
        Self::with_options(pool, HealthOptions::default())
    }

    /// A hub that advertises `timeout` and re-sends after `resend` of silence (tests use short
    /// ones).
    #[must_use]
    pub fn with_timing(pool: impl Into<String>, timeout: Duration, resend: Duration) -> Self {
        Self::with_options(
            pool,
            HealthOptions {
                timeout,
                resend,
                ..HealthOptions::default()
            },
        )
    }

    #[must_use]
    pub fn with_options(pool: impl Into<String>, opts: HealthOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool: pool.into(),
                opts,
                state: Mutex::new(State::default()),
                tx: watch::channel(Arc::new(Vec::new())).0,
                fixed: [HOME_MESSAGE.into(), GONE_MESSAGE.into()],
            }),
        }
    }

    /// Recomputes the list with the clock as it stands now (drops devices whose grace ran
    /// out). Streams call it before every re-send, so the list is pruned without new input.
    pub fn refresh(&self) {
        let st = self.state();
        self.publish(st);
    }

    /// The list as it stands.
    #[must_use]
    pub fn current(&self) -> Vec<DeviceHealth> {
        self.inner.tx.borrow().as_ref().clone()
    }

    /// Open `NodeWatchResources` streams right now.
    #[must_use]
    pub fn watchers(&self) -> usize {
        self.inner.tx.receiver_count()
    }

    /// An inventory scan: `host` are the devices found in the host (before devices in pods are
    /// added back for publishing).
    pub fn observe_scan<'a>(&self, host: impl IntoIterator<Item = &'a str>, cp: &Checkpoint) {
        self.observe_scan_located(host, Located::of(cp, None));
    }

    /// [`HealthHub::observe_scan`] with what it needs of the checkpoint already taken.
    pub fn observe_scan_located<'a>(&self, host: impl IntoIterator<Item = &'a str>, located: Located) {
        let mut st = self.state();
        // In place: a scan that finds the same devices allocates nothing that outlives it.
        let host: HashSet<&str> = host.into_iter().collect();
        st.host.retain(|d| host.contains(&**d));
        for d in host {
            if !st.host.contains(d) {
                let n = st.name(d);
                st.host.insert(n);
            }
        }
        locate(&mut st, located);
        // Whatever is home again is settled, whoever brought it back.
        let home: Vec<String> = st
            .returning
            .keys()
            .chain(st.failed.keys())
            .filter(|d| st.host.contains(d.as_str()) && !st.in_pod.contains_key(*d))
            .cloned()
            .collect();
        for d in home {
            st.returning.remove(&d);
            st.failed.remove(&d);
        }
        self.publish(st);
    }

    /// One entry of the rescue engine's activity feed.
    pub fn observe_activity(&self, a: &Activity, cp: &Checkpoint) {
        self.observe_activity_located(a, Located::of(cp, Some(&a.pod_uid)));
    }

    /// [`HealthHub::observe_activity`] with what it needs of the checkpoint already taken
    /// ([`Located::of`] the activity's pod).
    pub fn observe_activity_located(&self, a: &Activity, mut located: Located) {
        let all = std::mem::take(&mut located.pod);
        let mut st = self.state();
        locate(&mut st, located);
        let pod = if a.pod.is_empty() {
            a.pod_uid.as_str()
        } else {
            a.pod.as_str()
        };
        // The pod's devices that are not home per the checkpoint.
        let out: Vec<String> = all
            .iter()
            .filter(|(_, s)| !matches!(s, DeviceState::Home | DeviceState::HomeNameBusy))
            .map(|(d, _)| d.clone())
            .collect();
        match &a.kind {
            ActivityKind::RescueStarted { trigger } => {
                for d in out {
                    st.failed.remove(&d);
                    st.returning.insert(
                        d,
                        format!("being returned to the host from pod {pod} by the rescue engine ({trigger})"),
                    );
                }
            }
            ActivityKind::Failed {
                action,
                error,
                device,
            } if *action != FailedAction::Attach => {
                // A repair names its device; a failed return concerns every device not home.
                let hit = match device {
                    Some(d) => vec![d.clone()],
                    None => out,
                };
                for d in hit {
                    st.name(&d);
                    st.returning.remove(&d);
                    st.failed.insert(
                        d,
                        format!("{action} from pod {pod} failed, dranet retries: {error}"),
                    );
                }
            }
            ActivityKind::Returned { .. } => {
                // Home per the checkpoint: in the host until the next scan says otherwise (the
                // rescan follows, rate limited).
                for (d, state) in &all {
                    st.returning.remove(d);
                    st.failed.remove(d);
                    if *state == DeviceState::Home {
                        let n = st.name(d);
                        st.host.insert(n);
                    }
                }
            }
            ActivityKind::Attached { .. } => {
                for (d, _) in &all {
                    st.returning.remove(d);
                    st.failed.remove(d);
                }
            }
            ActivityKind::Vanished { device, .. } => {
                // Nothing pending any more: missing from the host and in no pod, so gone for
                // good (unhealthy, then dropped after the grace) unless it shows up again. Known
                // from now on even if this hub never saw it (found gone by the start-up
                // reconcile of a restart: in neither the host nor a pod since).
                st.name(device);
                st.returning.remove(device);
                st.failed.remove(device);
            }
            ActivityKind::ReturnStuck {
                devices,
                reason,
                error,
            } => {
                for d in devices {
                    st.name(d);
                    st.returning.remove(d);
                    st.failed.insert(
                        d.clone(),
                        format!("return from pod {pod} still failing after the rescue's retries ({reason}): {error}"),
                    );
                }
            }
            ActivityKind::Hook { .. } | ActivityKind::Failed { .. } => {}
        }
        self.publish(st);
    }

    /// The stream one `NodeWatchResources` caller reads, in the API version of `R`: the list
    /// now, then on every change and after [`RESEND_INTERVAL`] of silence. Ends when the hub
    /// is dropped.
    pub fn stream<R: HealthResponse>(&self) -> impl Stream<Item = R> + Send + 'static {
        self.stream_until(watch::channel(false).1)
    }

    /// [`HealthHub::stream`], ending as soon as `stop` turns true (the server's graceful
    /// shutdown waits for open streams: one that never ends would hang it).
    pub fn stream_until<R: HealthResponse>(
        &self,
        stop: watch::Receiver<bool>,
    ) -> impl Stream<Item = R> + Send + 'static {
        let rx = self.inner.tx.subscribe();
        // Weak: an open stream must not keep the hub (and so its sender) alive.
        let hub: Weak<Inner> = Arc::downgrade(&self.inner);
        let (pool, timeout, resend) = (
            self.inner.pool.clone(),
            i64::try_from(self.inner.opts.timeout.as_secs()).unwrap_or(i64::MAX),
            self.inner.opts.resend,
        );
        futures::stream::unfold((rx, stop, true), move |(mut rx, mut stop, first)| {
            let pool = pool.clone();
            let hub = hub.clone();
            async move {
                if *stop.borrow() {
                    return None;
                }
                if !first {
                    tokio::select! {
                        r = rx.changed() => r.ok()?,
                        () = tokio::time::sleep(resend) => {
                            // Silence: let the grace of gone devices run out before re-sending.
                            if let Some(inner) = hub.upgrade() {
                                HealthHub { inner }.refresh();
                            }
                        }
                        () = stopped(&mut stop) => return None,
                    }
                }
                let list = rx.borrow_and_update().clone();
                Some((R::from_list(&list, &pool, timeout), (rx, stop, false)))
            }
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Recomputes the list and sends it when it changed. An entry whose health and message are
    /// those of the last list is that entry again (its `since` kept), and an entry allocates
    /// nothing of its own (the names are the hub's, the messages that name no pod are made
    /// once): the hub publishes on every activity of a burst of pods, and fresh names and
    /// messages each time would be long-lived memory placed among the pods' short-lived
    /// memory, keeping those pages from being given back after the burst.
    fn publish(&self, mut st: MutexGuard<'_, State>) {
        let now = (self.inner.opts.clock)();
        let grace = i64::try_from(self.inner.opts.gone_grace.as_secs()).unwrap_or(i64::MAX);
        let last = self.inner.tx.borrow().clone();
        let mut list = Vec::with_capacity(st.known.len());
        let mut gone = BTreeMap::new();
        let mut pruned = Vec::new();
        for d in &st.known {
            let (healthy, message) = match judge(&st, d) {
                Verdict::Gone => {
                    let since = st.gone_since.get(d).copied().unwrap_or(now);
                    if now.saturating_sub(since) >= grace {
                        pruned.push(d.clone());
                        continue;
                    }
                    gone.insert(d.clone(), since);
                    (false, Cow::Borrowed(GONE_MESSAGE))
                }
                Verdict::Is(healthy, message) => (healthy, message),
            };
            let before = last
                .binary_search_by(|e| (*e.device).cmp(&**d))
                .ok()
                .and_then(|i| last.get(i));
            list.push(match before {
                Some(p) if p.healthy == healthy && *p.message == *message => p.clone(),
                _ => DeviceHealth {
                    device: d.clone(),
                    healthy,
                    message: self.message(message),
                    since: now,
                },
            });
        }
        // Anything no longer gone starts a fresh grace the next time it goes.
        st.gone_since = gone;
        for d in &pruned {
            tracing::info!(device = %d, grace = ?self.inner.opts.gone_grace,
                "device gone for good: dropped from the health list");
            st.known.remove(d);
        }
        drop(st);
        self.inner.tx.send_if_modified(|cur| {
            if cur.as_slice() == list.as_slice() {
                false
            } else {
                *cur = Arc::new(list);
                true
            }
        });
    }
}

impl HealthHub {
    /// `m` as an entry's message: one made at start when it names no pod.
    fn message(&self, m: Cow<'static, str>) -> Arc<str> {
        match m {
            Cow::Borrowed(s) => self
                .inner
                .fixed
                .iter()
                .find(|f| ***f == *s)
                .cloned()
                .unwrap_or_else(|| s.into()),
            Cow::Owned(s) => s.into(),
        }
    }
}

/// Resolves once `stop` is true; never, if its sender is gone without saying so.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        futures::future::pending::<()>().await;
    }
}

/// What the hub needs of the checkpoint: taken under the engine's lock (no copy of the
/// checkpoint: with hundreds of sandboxes a copy per activity was most of the daemon's CPU in a
/// churn of pods).
#[derive(Debug, Default)]
pub struct Located {
    /// Device → `namespace/name` of the pod it is in (or on its way to or from).
    in_pod: BTreeMap<String, String>,
    /// Device → its temporary name (home, its name taken).
    name_busy: BTreeMap<String, String>,
    /// The devices of one pod's sandboxes and their states, if a pod was asked for.
    pod: Vec<(String, DeviceState)>,
}

impl Located {
    #[must_use]
    pub fn of(cp: &Checkpoint, pod_uid: Option<&str>) -> Self {
        let in_pod = cp
            .pods
            .values()
            .flat_map(|r| {
                r.devices
                    .iter()
                    .filter(|d| {
                        matches!(
                            d.state,
                            DeviceState::InPod | DeviceState::Moving | DeviceState::Returning
                        )
                    })
                    .map(|d| (d.device.clone(), format!("{}/{}", r.namespace, r.name)))
            })
            .collect();
        let name_busy = cp
            .pods
            .values()
            .flat_map(|r| {
                r.devices
                    .iter()
                    .filter(|d| d.state == DeviceState::HomeNameBusy)
                    .filter_map(|d| Some((d.device.clone(), d.temp_name.clone()?)))
            })
            .collect();
        let pod = pod_uid
            .map(|uid| {
                cp.records_of(uid)
                    .flat_map(|r| r.devices.iter().map(|d| (d.device.clone(), d.state)))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            in_pod,
            name_busy,
            pod,
        }
    }
}

/// Devices in pods per the checkpoint; every device seen becomes known.
fn locate(st: &mut State, located: Located) {
    update_in_place(&mut st.in_pod, located.in_pod);
    update_in_place(&mut st.name_busy, located.name_busy);
    // (The host's are known already.)
    let new: Vec<Name> = st
        .in_pod
        .keys()
        .chain(st.name_busy.keys())
        .filter(|d| !st.known.contains(d.as_str()))
        .map(|d| Name::from(d.as_str()))
        .collect();
    st.known.extend(new);
}

/// Makes `into` equal to `from`, keeping the entries it already has: only what changed is
/// moved into the long-lived map.
fn update_in_place(into: &mut BTreeMap<String, String>, from: BTreeMap<String, String>) {
    into.retain(|k, _| from.contains_key(k));
    for (k, v) in from {
        match into.get_mut(&k) {
            Some(old) if *old == v => {}
            Some(old) => *old = v,
            None => {
                into.insert(k, v);
            }
        }
    }
}

/// The message of a device gone for good (missing, in no pod, nothing pending).
const GONE_MESSAGE: &str = "missing from the host network namespace and not attached to any pod";
/// The message of a device in the host.
const HOME_MESSAGE: &str = "in the host network namespace";

enum Verdict {
    /// (healthy, message).
    Is(bool, Cow<'static, str>),
    /// Missing from the host, in no pod, nothing pending: unhealthy, then dropped.
    Gone,
}

fn judge(st: &State, d: &str) -> Verdict {
    if let Some(m) = st.failed.get(d) {
        return Verdict::Is(false, m.clone().into());
    }
    if let Some(m) = st.returning.get(d) {
        return Verdict::Is(false, m.clone().into());
    }
    if let Some(pod) = st.in_pod.get(d) {
        return Verdict::Is(true, format!("attached to pod {pod}").into());
    }
    if st.host.contains(d) {
        return Verdict::Is(true, HOME_MESSAGE.into());
    }
    if let Some(temp) = st.name_busy.get(d) {
        return Verdict::Is(
            false,
            format!("back in the host as {temp}: its own name is taken (see dranet status)").into(),
        );
    }
    Verdict::Gone
}

/// A `NodeWatchResourcesResponse` of one version of the health API, built from the hub's
/// version-neutral list. The versions differ only in their proto package name, so the
/// conversion (and the gRPC service glue) is written once, in [`health_api`].
pub trait HealthResponse: Send + 'static {
    /// The gRPC service name as listed in `supported_versions`.
    const SERVICE: &'static str;
    fn from_list(list: &[DeviceHealth], pool: &str, timeout_secs: i64) -> Self;
}

/// [`HealthResponse`] and the `DRAResourceHealth` server of the health API module `$m`.
macro_rules! health_api {
    ($m:ident, $service:expr) => {
        impl HealthResponse for $m::NodeWatchResourcesResponse {
            const SERVICE: &'static str = $service;

            fn from_list(list: &[DeviceHealth], pool: &str, timeout_secs: i64) -> Self {
                let devices = list
                    .iter()
                    .map(|d| $m::DeviceHealth {
                        device: Some($m::DeviceIdentifier {
                            pool_name: pool.to_owned(),
                            device_name: d.device.to_string(),
                        }),
                        health: if d.healthy {
                            $m::HealthStatus::Healthy
                        } else {
                            $m::HealthStatus::Unhealthy
                        } as i32,
                        last_updated_time: d.since,
                        health_check_timeout_seconds: timeout_secs,
                        message: d.message.to_string(),
                    })
                    .collect();
                Self { devices }
            }
        }

        #[tonic::async_trait]
        impl $m::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream = HealthStream<$m::NodeWatchResourcesResponse>;

            async fn node_watch_resources(
                &self,
                _req: Request<$m::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                Ok(Response::new(
                    self.watch::<$m::NodeWatchResourcesResponse>(),
                ))
            }
        }
    };
}

health_api!(health_v1, HEALTH_SERVICE_V1);
health_api!(health_v1alpha1, HEALTH_SERVICE_V1ALPHA1);

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Feeds `hub` from the engine's activity feed; runs until aborted (it holds the engine).
/// `rescan` is called when devices came home (and after missed entries), so the next
/// inventory scan settles the list.
pub async fn follow_engine(hub: HealthHub, engine: crate::rescue::Engine, rescan: impl Fn() + Send) {
    let rx = engine.activity();
    follow_engine_from(hub, engine, rx, rescan).await;
}

/// [`follow_engine`] from `rx`, subscribed earlier: `dranet run` subscribes before the start-up
/// reconcile, so a device the reconcile finds gone reaches kubelet's health stream.
pub async fn follow_engine_from(
    hub: HealthHub,
    engine: crate::rescue::Engine,
    mut rx: tokio::sync::broadcast::Receiver<Activity>,
    rescan: impl Fn() + Send,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match rx.recv().await {
            Ok(a) => {
                let located = engine.with_checkpoint(|cp| Located::of(cp, Some(&a.pod_uid)));
                hub.observe_activity_located(&a, located);
                if matches!(a.kind, ActivityKind::Returned { .. }) {
                    rescan();
                }
            }
            Err(RecvError::Lagged(_)) => rescan(),
            Err(RecvError::Closed) => break,
        }
    }
}

/// The gRPC services (every version) over one hub; streams end when `stop` turns true.
#[derive(Clone)]
pub(super) struct HealthService {
    pub(super) hub: HealthHub,
    pub(super) stop: watch::Receiver<bool>,
}

type HealthStream<R> = Pin<Box<dyn Stream<Item = Result<R, Status>> + Send + 'static>>;

impl HealthService {
    fn watch<R: HealthResponse>(&self) -> HealthStream<R> {
        tracing::debug!(service = R::SERVICE, "kubelet watches device health");
        Box::pin(self.hub.stream_until::<R>(self.stop.clone()).map(Ok))
    }
}

#[cfg(test)]
#[path = "health_tests.rs"]
mod tests;
