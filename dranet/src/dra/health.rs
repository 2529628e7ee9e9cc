//! Device health for kubelet (KEP-4680): the `v1alpha1.DRAResourceHealth` service on the DRA
//! socket. [`HealthHub`] keeps where every device of the pool is and streams the full list to
//! every `NodeWatchResources` caller on each change, and again before the advertised
//! [`HEALTH_CHECK_TIMEOUT`] runs out (kubelet marks a device Unknown when its plugin is silent
//! for that long).
//!
//! A device is **healthy** while it is in the host inventory or inside the pod that owns it;
//! **unhealthy** while it is missing from the host and not in a pod, while the rescue engine is
//! bringing it home, and after a return or repair failed (until it is home again).
//!
//! Inputs: [`HealthHub::observe_scan`] from the inventory publish loop and
//! [`HealthHub::observe_activity`] from the rescue engine's activity feed, each with the
//! checkpoint as it stands. Streams are plain futures polled by the gRPC server: a caller that
//! goes away drops its stream, and no task is left behind.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::proto::health_v1alpha1 as pb;
use crate::rescue::activity::{Activity, ActivityKind};
use crate::state::{Checkpoint, DeviceState};

/// gRPC service name as kubelet lists it in `supported_versions`.
pub const HEALTH_SERVICE: &str = "v1alpha1.DRAResourceHealth";
/// `health_check_timeout_seconds` we advertise per device: kubelet 1.34–1.36 ignore the field
/// and use a fixed 30 s (`healthTimeout` in `pkg/kubelet/cm/dra/healthinfo.go`), so advertise
/// the same.
pub const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// The full list is sent again after this much silence (well inside the timeout).
pub const RESEND_INTERVAL: Duration = Duration::from_secs(10);

/// The health of one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceHealth {
    pub device: String,
    pub healthy: bool,
    /// Why (shown in the pod status by kubelet).
    pub message: String,
    /// Unix time (s) of the last change of `healthy` or `message`.
    pub since: i64,
}

/// What the hub knows about the devices.
#[derive(Debug, Default)]
struct State {
    /// Every device seen in the host or in a pod since start.
    known: BTreeSet<String>,
    /// In the host inventory at the last scan.
    host: BTreeSet<String>,
    /// In a pod, per the checkpoint: device → `namespace/name`.
    in_pod: BTreeMap<String, String>,
    /// The rescue engine is bringing these home: device → pod.
    returning: BTreeMap<String, String>,
    /// A return or repair failed: device → message.
    failed: BTreeMap<String, String>,
    /// Home, but under a temporary name (its own was taken): device → that name.
    name_busy: BTreeMap<String, String>,
    /// The last list, to keep `since` of unchanged entries.
    last: BTreeMap<String, DeviceHealth>,
}

struct Inner {
    pool: String,
    timeout: Duration,
    resend: Duration,
    state: Mutex<State>,
    tx: watch::Sender<Arc<Vec<DeviceHealth>>>,
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
        Self::with_timing(pool, HEALTH_CHECK_TIMEOUT, RESEND_INTERVAL)
    }

    /// A hub that advertises `timeout` and re-sends after `resend` of silence (tests use short
    /// ones).
    #[must_use]
    pub fn with_timing(pool: impl Into<String>, timeout: Duration, resend: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool: pool.into(),
                timeout,
                resend,
                state: Mutex::new(State::default()),
                tx: watch::channel(Arc::new(Vec::new())).0,
            }),
        }
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
        let mut st = self.state();
        st.host = host.into_iter().map(str::to_owned).collect();
        locate(&mut st, cp);
        // Whatever is home again is settled, whoever brought it back.
        let home: Vec<String> = st
            .returning
            .keys()
            .chain(st.failed.keys())
            .filter(|d| st.host.contains(*d) && !st.in_pod.contains_key(*d))
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
        let mut st = self.state();
        locate(&mut st, cp);
        let pod = if a.pod.is_empty() {
            a.pod_uid.as_str()
        } else {
            a.pod.as_str()
        };
        // The pod's devices that are not home per the checkpoint.
        let out: Vec<String> = cp
            .pods
            .get(&a.pod_uid)
            .map(|r| {
                r.devices
                    .iter()
                    .filter(|d| !matches!(d.state, DeviceState::Home | DeviceState::HomeNameBusy))
                    .map(|d| d.device.clone())
                    .collect()
            })
            .unwrap_or_default();
        let all: Vec<(String, DeviceState)> = cp
            .pods
            .get(&a.pod_uid)
            .map(|r| r.devices.iter().map(|d| (d.device.clone(), d.state)).collect())
            .unwrap_or_default();
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
            } if action != "attach" => {
                // A repair names its device; a failed return concerns every device not home.
                let hit = match device {
                    Some(d) => vec![d.clone()],
                    None => out,
                };
                for d in hit {
                    st.known.insert(d.clone());
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
                        st.host.insert(d.clone());
                    }
                }
            }
            ActivityKind::Attached { .. } => {
                for (d, _) in &all {
                    st.returning.remove(d);
                    st.failed.remove(d);
                }
            }
            ActivityKind::Hook { .. } | ActivityKind::Failed { .. } => {}
        }
        self.publish(st);
    }

    /// The stream one `NodeWatchResources` caller reads: the list now, then on every change
    /// and after [`RESEND_INTERVAL`] of silence. Ends when the hub is dropped.
    pub fn stream(&self) -> impl Stream<Item = pb::NodeWatchResourcesResponse> + Send + 'static {
        self.stream_until(watch::channel(false).1)
    }

    /// [`HealthHub::stream`], ending as soon as `stop` turns true (the server's graceful
    /// shutdown waits for open streams: one that never ends would hang it).
    pub fn stream_until(
        &self,
        stop: watch::Receiver<bool>,
    ) -> impl Stream<Item = pb::NodeWatchResourcesResponse> + Send + 'static {
        let rx = self.inner.tx.subscribe();
        let (pool, timeout, resend) = (
            self.inner.pool.clone(),
            i64::try_from(self.inner.timeout.as_secs()).unwrap_or(i64::MAX),
            self.inner.resend,
        );
        futures::stream::unfold((rx, stop, true), move |(mut rx, mut stop, first)| {
            let pool = pool.clone();
            async move {
                if *stop.borrow() {
                    return None;
                }
                if !first {
                    tokio::select! {
                        r = rx.changed() => r.ok()?,
                        () = tokio::time::sleep(resend) => {}
                        () = stopped(&mut stop) => return None,
                    }
                }
                let list = rx.borrow_and_update().clone();
                let msg = pb::NodeWatchResourcesResponse {
                    devices: list.iter().map(|d| to_proto(d, &pool, timeout)).collect(),
                };
                Some((msg, (rx, stop, false)))
            }
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Recomputes the list and sends it when it changed.
    fn publish(&self, mut st: MutexGuard<'_, State>) {
        let now = unix_now();
        let list: Vec<DeviceHealth> = st
            .known
            .iter()
            .map(|d| {
                let (healthy, message) = judge(&st, d);
                let since = match st.last.get(d) {
                    Some(p) if p.healthy == healthy && p.message == message => p.since,
                    _ => now,
                };
                DeviceHealth {
                    device: d.clone(),
                    healthy,
                    message,
                    since,
                }
            })
            .collect();
        st.last = list.iter().map(|d| (d.device.clone(), d.clone())).collect();
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

/// Resolves once `stop` is true; never, if its sender is gone without saying so.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        futures::future::pending::<()>().await;
    }
}

/// Devices in pods per the checkpoint; every device seen becomes known.
fn locate(st: &mut State, cp: &Checkpoint) {
    st.in_pod = cp
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
    st.name_busy = cp
        .pods
        .values()
        .flat_map(|r| {
            r.devices
                .iter()
                .filter(|d| d.state == DeviceState::HomeNameBusy)
                .filter_map(|d| Some((d.device.clone(), d.temp_name.clone()?)))
        })
        .collect();
    let seen: Vec<String> = st
        .host
        .iter()
        .chain(st.in_pod.keys())
        .chain(st.name_busy.keys())
        .cloned()
        .collect();
    st.known.extend(seen);
}

fn judge(st: &State, d: &str) -> (bool, String) {
    if let Some(m) = st.failed.get(d) {
        return (false, m.clone());
    }
    if let Some(m) = st.returning.get(d) {
        return (false, m.clone());
    }
    if let Some(pod) = st.in_pod.get(d) {
        return (true, format!("attached to pod {pod}"));
    }
    if st.host.contains(d) {
        return (true, "in the host network namespace".to_owned());
    }
    if let Some(temp) = st.name_busy.get(d) {
        return (
            false,
            format!("back in the host as {temp}: its own name is taken (see dranet status)"),
        );
    }
    (
        false,
        "missing from the host network namespace and not attached to any pod".to_owned(),
    )
}

fn to_proto(d: &DeviceHealth, pool: &str, timeout: i64) -> pb::DeviceHealth {
    pb::DeviceHealth {
        device: Some(pb::DeviceIdentifier {
            pool_name: pool.to_owned(),
            device_name: d.device.clone(),
        }),
        health: if d.healthy {
            pb::HealthStatus::Healthy
        } else {
            pb::HealthStatus::Unhealthy
        } as i32,
        last_updated_time: d.since,
        health_check_timeout_seconds: timeout,
        message: d.message.clone(),
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Feeds `hub` from the engine's activity feed; runs until aborted (it holds the engine).
/// `rescan` is called when devices came home (and after missed entries), so the next
/// inventory scan settles the list.
pub async fn follow_engine(hub: HealthHub, engine: crate::rescue::Engine, rescan: impl Fn() + Send) {
    use tokio::sync::broadcast::error::RecvError;
    let mut rx = engine.activity();
    loop {
        match rx.recv().await {
            Ok(a) => {
                hub.observe_activity(&a, &engine.checkpoint());
                if matches!(a.kind, ActivityKind::Returned { .. }) {
                    rescan();
                }
            }
            Err(RecvError::Lagged(_)) => rescan(),
            Err(RecvError::Closed) => break,
        }
    }
}

/// The gRPC service over a hub; streams end when `stop` turns true.
pub(super) struct HealthService {
    pub(super) hub: HealthHub,
    pub(super) stop: watch::Receiver<bool>,
}

type HealthStream =
    Pin<Box<dyn Stream<Item = Result<pb::NodeWatchResourcesResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl pb::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _req: Request<pb::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        tracing::debug!("kubelet watches device health");
        Ok(Response::new(Box::pin(
            self.hub.stream_until(self.stop.clone()).map(Ok),
        )))
    }
}

#[cfg(test)]
#[path = "health_tests.rs"]
mod tests;
