// Over 500 lines: claim status (KEP-4817) and Events share one rate limiter and one API client; about half is the JSON they send.
//! What dranet tells the API server about its work: the device status of ResourceClaims
//! (KEP-4817: conditions and `networkData` after an attach, applied server-side on the `status`
//! subresource, field manager = driver name, force) and Kubernetes events (`ClaimPrepareFailed`
//! on a claim; `NetworkDeviceAttachFailed` / `RDMADeviceAttachFailed` / `NetworkDeviceRescued`
//! on a pod).
//!
//! **Fire and forget.** [`Reporter`] spawns every report with a deadline ([`REPORT_TIMEOUT`])
//! and at most [`MAX_IN_FLIGHT`] at once (more are dropped with a warning): nothing here waits
//! on the API server inside a hook, and a failed or slow report never fails one.
//!
//! **Repeated events** are correlated as client-go's recorder does ([`correlate`]): the first
//! creates the Event, identical repeats PATCH its `count` and `lastTimestamp`, and a token
//! bucket per involved object holds back floods.
//!
//! Where reports go is a [`Sink`]: [`KubeSink`] (the API server) or [`FileSink`] (embedded mode
//! without a cluster: JSON files next to the local claims, so a demo shows them).

mod api;
pub mod correlate;
mod file;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

pub use api::KubeSink;
pub use correlate::{Correlator, CorrelatorOptions};
pub use file::FileSink;

use correlate::{Observed, Slot};

use crate::plan::DevicePlan;
use crate::rescue::activity::{Activity, ActivityKind};
use crate::state::{DeviceRecord, ReturnReason};

/// Deadline of one report (upstream: 3 s for the claim status).
pub const REPORT_TIMEOUT: Duration = Duration::from_secs(3);
/// Reports in flight at most; more are dropped.
pub const MAX_IN_FLIGHT: usize = 64;

/// Errors of reports (logged, never returned to a hook).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("applying the status of ResourceClaim {claim}")]
    Apply {
        /// `namespace/name`.
        claim: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("creating event {reason} for {object}")]
    Event {
        reason: String,
        /// `Kind namespace/name`.
        object: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("updating event {name} ({reason}) for {object}")]
    EventUpdate {
        name: String,
        reason: String,
        /// `Kind namespace/name`.
        object: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("encoding a report")]
    Encode(#[source] serde_json::Error),
    #[error("{name:?} is not usable as a file name")]
    BadName { name: String },
    #[error("{what} timed out after {after:?}")]
    Timeout { what: &'static str, after: Duration },
}

/// Where reports go.
pub trait Sink: Send + Sync + 'static {
    /// Server-side apply of `status.devices` of one claim.
    fn apply_claim_status<'a>(
        &'a self,
        apply: &'a ClaimStatusApply,
    ) -> BoxFuture<'a, Result<(), ReportError>>;
    /// Creates one event (an Event of that name existing already is success, and adds
    /// nothing: a report sent again under its fixed name is not a second one).
    fn event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), ReportError>>;
    /// Updates the Event of `event`'s name, created before, to `event`'s `count`,
    /// `lastTimestamp` and `message` ([`Event::patch`]). A sink without updates (files, test
    /// sinks) records the repeat as it stands, which is the default.
    fn patch_event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<Patched, ReportError>> {
        Box::pin(async move { self.event(event).await.map(|()| Patched::Updated) })
    }
}

/// What [`Sink::patch_event`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Patched {
    Updated,
    /// No such Event any more (its TTL ran out): create it again.
    Gone,
}

/// Sends reports in the background; cheap to clone. [`Reporter::disabled`] drops everything.
#[derive(Clone)]
pub struct Reporter {
    sink: Option<Arc<dyn Sink>>,
    slots: Arc<Semaphore>,
    timeout: Duration,
    driver: String,
    node: String,
    events: Arc<Mutex<Correlator>>,
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter")
            .field("enabled", &self.sink.is_some())
            .field("driver", &self.driver)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Reporter {
    /// Reports to `sink` as `driver` (field manager, event source) on `node`.
    #[must_use]
    pub fn new(sink: Arc<dyn Sink>, driver: impl Into<String>, node: impl Into<String>) -> Self {
        Self {
            sink: Some(sink),
            slots: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            timeout: REPORT_TIMEOUT,
            driver: driver.into(),
            node: node.into(),
            events: Arc::default(),
        }
    }

    /// Reports nothing (no API server and no local dir).
    #[must_use]
    pub fn disabled() -> Self {
        Self {
            sink: None,
            slots: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            timeout: REPORT_TIMEOUT,
            driver: String::new(),
            node: String::new(),
            events: Arc::default(),
        }
    }

    /// Another deadline per report (tests).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Other limits of the event correlation (tests).
    #[must_use]
    pub fn with_correlator(mut self, opts: CorrelatorOptions) -> Self {
        self.events = Arc::new(Mutex::new(Correlator::new(opts)));
        self
    }

    /// Entries of the event correlation caches (events, spam buckets).
    #[must_use]
    pub fn correlated(&self) -> (usize, usize) {
        self.correlator().len()
    }

    fn correlator(&self) -> std::sync::MutexGuard<'_, Correlator> {
        self.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[must_use]
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// Reports running right now.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        if self.sink.is_none() {
            return 0;
        }
        MAX_IN_FLIGHT - self.slots.available_permits()
    }

    /// Applies a claim's device status in the background.
    pub fn claim_status(&self, apply: ClaimStatusApply) {
        self.spawn("claim status", move |sink| {
            Box::pin(async move { sink.apply_claim_status(&apply).await })
        });
    }

    /// Creates an event in the background, or counts it on the Event of its identical
    /// predecessor ([`correlate`]). Returns at once.
    pub fn event(&self, event: Event) {
        let Some(sink) = self.sink.clone() else {
            return;
        };
        let (reason, object) = (event.reason.clone(), event.involved_object.name.clone());
        let observed = self.correlator().observe(event, Instant::now());
        let slot = match observed {
            Observed::Spam => {
                tracing::debug!(%reason, %object, "event held back by the spam filter (counted)");
                return;
            }
            Observed::Queued => return,
            Observed::Send(slot) => slot,
        };
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            tracing::warn!(
                what = "event",
                max = MAX_IN_FLIGHT,
                "too many reports in flight: dropping one"
            );
            correlate::lock(&slot).sending = false;
            return;
        };
        let timeout = self.timeout;
        tokio::spawn(async move {
            send_events(sink, slot, timeout).await;
            drop(permit);
        });
    }

    /// Creates `event` now and waits for the sink (at most the report deadline): no
    /// correlation, no spam filter. For reports that are confirmed once sent (a vanished
    /// device's, under a fixed name). Without a sink there is nothing to send: `Ok`.
    pub async fn event_now(&self, event: &Event) -> Result<(), ReportError> {
        let Some(sink) = &self.sink else {
            return Ok(());
        };
        tokio::time::timeout(self.timeout, sink.event(event))
            .await
            .unwrap_or(Err(ReportError::Timeout {
                what: "event",
                after: self.timeout,
            }))
    }

    /// Applies a claim's device status now and waits for the sink (at most the report
    /// deadline). Without a sink: `Ok`.
    pub async fn claim_status_now(&self, apply: &ClaimStatusApply) -> Result<(), ReportError> {
        let Some(sink) = &self.sink else {
            return Ok(());
        };
        tokio::time::timeout(self.timeout, sink.apply_claim_status(apply))
            .await
            .unwrap_or(Err(ReportError::Timeout {
                what: "claim status",
                after: self.timeout,
            }))
    }

    /// A Warning or Normal event about `object`, sourced from this driver and node.
    #[must_use]
    pub fn make_event(&self, object: ObjectRef, reason: EventReason, message: String) -> Event {
        Event::new(object, reason, message, &self.driver, &self.node)
    }

    fn spawn(
        &self,
        what: &'static str,
        f: impl FnOnce(Arc<dyn Sink>) -> BoxFuture<'static, Result<(), ReportError>> + Send + 'static,
    ) {
        let Some(sink) = self.sink.clone() else {
            return;
        };
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            tracing::warn!(
                what,
                max = MAX_IN_FLIGHT,
                "too many reports in flight: dropping one"
            );
            return;
        };
        let timeout = self.timeout;
        tokio::spawn(async move {
            match tokio::time::timeout(timeout, f(sink)).await {
                Ok(Ok(())) => tracing::debug!(what, "reported"),
                Ok(Err(e)) => tracing::warn!(what, error = %crate::telemetry::chain(&e), "report failed"),
                Err(_) => tracing::warn!(what, ?timeout, "report timed out"),
            }
            drop(permit);
        });
    }
}

/// Resets `sending` of a slot whose sender ends without saying so (cancelled).
struct Sending {
    slot: Slot,
    armed: bool,
}

impl Drop for Sending {
    fn drop(&mut self) {
        if self.armed {
            correlate::lock(&self.slot).sending = false;
        }
    }
}

/// The sender of one event key: sends the newest state until the server has it (creating the
/// Event first, or again when it is gone), then ends; stops at the first failure (the next
/// occurrence tries again, with every repeat counted).
async fn send_events(sink: Arc<dyn Sink>, slot: Slot, timeout: Duration) {
    let mut guard = Sending {
        slot: slot.clone(),
        armed: true,
    };
    loop {
        let (ev, create) = {
            let mut st = correlate::lock(&slot);
            let created = st.created.as_ref() == Some(&st.event.metadata.name);
            if created && st.sent_count >= st.event.count {
                // Decided under the lock that marks it: a repeat from now on starts a sender.
                st.sending = false;
                guard.armed = false;
                return;
            }
            (st.event.clone(), !created)
        };
        let res = tokio::time::timeout(timeout, async {
            if !create && sink.patch_event(&ev).await? == Patched::Updated {
                return Ok(());
            }
            sink.event(&ev).await
        })
        .await;
        let mut st = correlate::lock(&slot);
        match res {
            Ok(Ok(())) => {
                tracing::debug!(reason = %ev.reason, count = ev.count, "event reported");
                // Unless a repeat after the window made it a new Event meanwhile.
                if st.event.metadata.name == ev.metadata.name {
                    st.created = Some(ev.metadata.name.clone());
                    st.sent_count = ev.count;
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(what = "event", error = %crate::telemetry::chain(&e), "report failed");
                st.sending = false;
                guard.armed = false;
                return;
            }
            Err(_) => {
                tracing::warn!(what = "event", ?timeout, "report timed out");
                st.sending = false;
                guard.armed = false;
                return;
            }
        }
    }
}

/// `metadata` of an apply body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyMeta {
    pub name: String,
    pub namespace: String,
}

/// The server-side apply body of a claim's `status` subresource.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatusApply {
    pub api_version: String,
    pub kind: String,
    pub metadata: ApplyMeta,
    pub status: ApplyStatus,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyStatus {
    pub devices: Vec<AllocatedDeviceStatus>,
}

/// `status.devices[]` of a ResourceClaim (resource.k8s.io/v1 `AllocatedDeviceStatus`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedDeviceStatus {
    pub driver: String,
    pub pool: String,
    pub device: String,
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data: Option<NetworkDeviceData>,
}

/// A `metav1.Condition`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition_time: String,
}

/// `networkData` of a device status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkDeviceData {
    pub interface_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hardware_address: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
}

fn condition(type_: &str, reason: &str, message: String, now: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: "True".to_owned(),
        reason: reason.to_owned(),
        message,
        last_transition_time: now.to_owned(),
    }
}

/// The status of one attached device, as upstream reports it: `Ready` (reason
/// `NetworkDeviceReady`) and `NetworkReady` for a netdev (dranet configures addresses, routes,
/// rules and neighbours as one step), plus `RDMALinkReady` when its RDMA link moved with it
/// (exclusive mode); `Ready` / `RDMAOnlyDeviceReady` for a device without a netdev.
#[must_use]
pub fn device_status(
    driver: &str,
    plan: &DevicePlan,
    rec: &DeviceRecord,
    now: &str,
) -> AllocatedDeviceStatus {
    let mut conditions = Vec::new();
    let network_data = if plan.host_ifname.is_some() {
        conditions.push(condition(
            "Ready",
            "NetworkDeviceReady",
            format!(
                "network device {} is in the pod as {}",
                plan.device, rec.pod_ifname
            ),
            now,
        ));
        conditions.push(condition(
            "NetworkReady",
            "NetworkReady",
            "addresses, routes, rules and neighbours configured".to_owned(),
            now,
        ));
        Some(NetworkDeviceData {
            interface_name: rec.pod_ifname.clone(),
            hardware_address: rec
                .pod_mac
                .clone()
                .or_else(|| rec.snapshot.mac.clone())
                .unwrap_or_default(),
            ips: plan.config.interface.addresses.clone(),
        })
    } else {
        conditions.push(condition(
            "Ready",
            "RDMAOnlyDeviceReady",
            format!("RDMA device {} is ready", plan.device),
            now,
        ));
        None
    };
    if rec.rdma_in_pod {
        conditions.push(condition(
            "RDMALinkReady",
            "RDMALinkReady",
            format!(
                "RDMA link {} is in the pod",
                rec.rdma_device.as_deref().unwrap_or_default()
            ),
            now,
        ));
    }
    AllocatedDeviceStatus {
        driver: driver.to_owned(),
        pool: plan.pool.clone(),
        device: plan.device.clone(),
        conditions,
        network_data,
    }
}

/// Adds `st` to the apply body of `p`'s claim in `out` (one body per claim).
fn push_claim_status(out: &mut Vec<ClaimStatusApply>, p: &DevicePlan, st: AllocatedDeviceStatus) {
    let key = ApplyMeta {
        name: p.claim.name.clone(),
        namespace: p.claim.namespace.clone(),
    };
    match out.iter_mut().find(|a| a.metadata == key) {
        Some(a) => a.status.devices.push(st),
        None => out.push(ClaimStatusApply {
            api_version: "resource.k8s.io/v1".to_owned(),
            kind: "ResourceClaim".to_owned(),
            metadata: key,
            status: ApplyStatus { devices: vec![st] },
        }),
    }
}

/// One apply body per claim for the devices of a pod just attached (devices of other drivers
/// are not ours to report; plans and records are matched by device name).
#[must_use]
pub fn claim_statuses(driver: &str, plans: &[DevicePlan], records: &[DeviceRecord]) -> Vec<ClaimStatusApply> {
    let now = rfc3339(SystemTime::now());
    let mut out: Vec<ClaimStatusApply> = Vec::new();
    for p in plans {
        let Some(rec) = records.iter().find(|r| r.device == p.device) else {
            continue;
        };
        let st = device_status(driver, p, rec, &now);
        push_claim_status(&mut out, p, st);
    }
    out
}

/// The object an event is about.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl ObjectRef {
    #[must_use]
    pub fn pod(namespace: &str, name: &str, uid: &str) -> Self {
        Self {
            api_version: "v1".to_owned(),
            kind: "Pod".to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
        }
    }

    #[must_use]
    pub fn claim(namespace: &str, name: &str, uid: &str) -> Self {
        Self {
            api_version: "resource.k8s.io/v1".to_owned(),
            kind: "ResourceClaim".to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventMeta {
    pub name: String,
    pub namespace: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventSource {
    pub component: String,
    pub host: String,
}

/// The reason of an Event dranet sends: its name on the wire (upstream's names, so a user's
/// alerts keep matching) and its type (Warning or Normal), fixed by the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventReason {
    /// A claim's Prepare failed (on the claim).
    ClaimPrepareFailed,
    /// The attach of a pod's network device failed (on the pod).
    NetworkDeviceAttachFailed,
    /// The attach of a pod's RDMA link failed (on the pod).
    RdmaDeviceAttachFailed,
    /// A pod's devices were attached after its sandbox ran without them (on the pod).
    NetworkDeviceLateAttach,
    /// The runtime tore the pod's netns down before StopPodSandbox and dranet brought the
    /// devices home (on the pod; Normal).
    NetworkDeviceRescued,
    /// A device no longer exists anywhere (on the pod).
    NetworkDeviceVanished,
    /// A return still fails after every retry (on the pod).
    NetworkDeviceReturnFailed,
}

impl EventReason {
    /// Every reason, for tests and documentation.
    pub const ALL: [Self; 7] = [
        Self::ClaimPrepareFailed,
        Self::NetworkDeviceAttachFailed,
        Self::RdmaDeviceAttachFailed,
        Self::NetworkDeviceLateAttach,
        Self::NetworkDeviceRescued,
        Self::NetworkDeviceVanished,
        Self::NetworkDeviceReturnFailed,
    ];

    /// The Event's `reason` field.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ClaimPrepareFailed => "ClaimPrepareFailed",
            Self::NetworkDeviceAttachFailed => "NetworkDeviceAttachFailed",
            Self::RdmaDeviceAttachFailed => "RDMADeviceAttachFailed",
            Self::NetworkDeviceLateAttach => "NetworkDeviceLateAttach",
            Self::NetworkDeviceRescued => "NetworkDeviceRescued",
            Self::NetworkDeviceVanished => "NetworkDeviceVanished",
            Self::NetworkDeviceReturnFailed => "NetworkDeviceReturnFailed",
        }
    }

    /// A Warning (something an operator must look at), else Normal.
    #[must_use]
    pub const fn is_warning(self) -> bool {
        !matches!(self, Self::NetworkDeviceRescued)
    }
}

impl std::fmt::Display for EventReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A core/v1 Event, as client-go's recorder writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub api_version: String,
    pub kind: String,
    pub metadata: EventMeta,
    pub involved_object: ObjectRef,
    pub reason: String,
    pub message: String,
    #[serde(rename = "type")]
    pub type_: String,
    pub source: EventSource,
    pub first_timestamp: String,
    pub last_timestamp: String,
    pub count: i32,
    pub reporting_component: String,
    pub reporting_instance: String,
}

impl Event {
    fn new(object: ObjectRef, reason: EventReason, message: String, driver: &str, node: &str) -> Self {
        let t = SystemTime::now();
        let nanos = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let now = rfc3339(t);
        Self {
            api_version: "v1".to_owned(),
            kind: "Event".to_owned(),
            metadata: EventMeta {
                // client-go's naming: `<object>.<unix nanos, hex>`.
                name: format!("{}.{nanos:x}", object.name),
                namespace: object.namespace.clone(),
            },
            involved_object: object,
            reason: reason.as_str().to_owned(),
            // The API caps messages at 1 KiB.
            message: truncate(message, 1024),
            type_: if reason.is_warning() { "Warning" } else { "Normal" }.to_owned(),
            source: EventSource {
                component: driver.to_owned(),
                host: node.to_owned(),
            },
            first_timestamp: now.clone(),
            last_timestamp: now,
            count: 1,
            reporting_component: driver.to_owned(),
            reporting_instance: node.to_owned(),
        }
    }
}

/// The strategic merge patch of a repeated Event: what client-go's `eventObserve` patches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventPatch {
    pub count: i32,
    pub last_timestamp: String,
    pub message: String,
}

impl Event {
    /// The patch that brings the server's copy of this Event to this one.
    #[must_use]
    pub fn patch(&self) -> EventPatch {
        EventPatch {
            count: self.count,
            last_timestamp: self.last_timestamp.clone(),
            message: self.message.clone(),
        }
    }
}

fn truncate(mut s: String, max: usize) -> String {
    let cut = crate::text::cut_at_char(&s, max).len();
    s.truncate(cut);
    s
}

/// `YYYY-MM-DDTHH:MM:SSZ` (UTC), the API's time format.
#[must_use]
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The Normal `NetworkDeviceRescued` event for an activity entry: devices the engine brought
/// home because the runtime tore the pod netns down before StopPodSandbox (our addition to
/// upstream's events). `None` for anything else.
#[must_use]
pub fn rescue_event(reporter: &Reporter, a: &Activity) -> Option<Event> {
    let ActivityKind::Returned {
        reason,
        devices,
        took_us,
    } = &a.kind
    else {
        return None;
    };
    if *reason != ReturnReason::NetnsTeardown {
        return None;
    }
    let (namespace, name) = a.pod.split_once('/')?;
    Some(reporter.make_event(
        ObjectRef::pod(namespace, name, &a.pod_uid),
        EventReason::NetworkDeviceRescued,
        format!(
            "the runtime tore down the pod network namespace before StopPodSandbox; dranet brought {} home and restored in {} us",
            devices.join(", "),
            took_us
        ),
    ))
}

/// The Warning event and the claim status reason of a device in trouble: `NetworkDeviceVanished`
/// (it no longer exists anywhere: deleted while in the pod) or `NetworkDeviceReturnFailed` (its
/// move home still fails after the rescue's retries). `None` for any other activity.
#[must_use]
pub fn trouble_event(reporter: &Reporter, a: &Activity) -> Option<(Event, Vec<String>, EventReason, String)> {
    let (reason, devices, message) = match &a.kind {
        ActivityKind::Vanished {
            device, host_name, ..
        } => (
            EventReason::NetworkDeviceVanished,
            vec![device.clone()],
            format!(
                "network device {device} ({host_name}) no longer exists anywhere: it was deleted while in the pod (or its PCI function went away); nothing to bring home, its record ended"
            ),
        ),
        ActivityKind::ReturnStuck {
            devices,
            reason,
            error,
        } => (
            EventReason::NetworkDeviceReturnFailed,
            devices.clone(),
            format!(
                "network devices {} could not be brought home after every retry ({reason}): {error}; they stay in the pod network namespace, which dranet keeps, until the next hook, teardown signal or reconcile",
                devices.join(", ")
            ),
        ),
        _ => return None,
    };
    let (namespace, name) = a.pod.split_once('/')?;
    let mut ev = reporter.make_event(
        ObjectRef::pod(namespace, name, &a.pod_uid),
        reason,
        message.clone(),
    );
    if let ActivityKind::Vanished { device, record, .. } = &a.kind {
        ev.metadata.name = vanished_event_name(name, &a.pod_uid, record, device);
    }
    Some((ev, devices, reason, message))
}

/// The fixed name of the `NetworkDeviceVanished` event of `device` in sandbox record `record` of
/// pod `pod_uid` (named `pod`): `<pod>.vanished-<first 16 hex digits of SHA-256(uid, record,
/// device)>`, at most 253 bytes (the pod's name is cut). The same report sent again (a restart
/// after a kill before its confirmation was saved) has the same name, and the sink adds nothing.
#[must_use]
pub fn vanished_event_name(pod: &str, pod_uid: &str, record: &str, device: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{pod_uid}\n{record}\n{device}").as_bytes(),
    );
    let hex: String = digest
        .as_ref()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    let suffix = format!(".vanished-{hex}");
    let pod = crate::text::cut_at_char(pod, 253 - suffix.len());
    format!("{pod}{suffix}")
}

/// One apply body per claim for `devices` of a pod in trouble (see [`trouble_event`]): `Ready`
/// False with `reason`. Only those devices: the pod's others are home or still ready.
#[must_use]
pub fn trouble_statuses(
    driver: &str,
    plans: &[DevicePlan],
    devices: &[String],
    reason: EventReason,
    message: &str,
) -> Vec<ClaimStatusApply> {
    let now = rfc3339(SystemTime::now());
    let mut out: Vec<ClaimStatusApply> = Vec::new();
    for p in plans.iter().filter(|p| devices.contains(&p.device)) {
        let mut c = condition("Ready", reason.as_str(), message.to_owned(), &now);
        c.status = "False".to_owned();
        let st = AllocatedDeviceStatus {
            driver: driver.to_owned(),
            pool: p.pool.clone(),
            device: p.device.clone(),
            conditions: vec![c],
            network_data: None,
        };
        push_claim_status(&mut out, p, st);
    }
    out
}

/// Sends [`rescue_event`]s and [`trouble_event`]s (with the claims' status, from the pod's plans
/// as `plans` gives them) for the engine's activity feed `rx`; runs until the feed closes.
/// Vanished devices' reports are not confirmed ([`rescue_events_confirmed`]).
pub async fn rescue_events(
    reporter: Reporter,
    rx: tokio::sync::broadcast::Receiver<Activity>,
    plans: impl Fn(&str) -> Option<Vec<DevicePlan>> + Send,
) {
    rescue_events_confirmed(reporter, rx, plans, |_: &Activity| async {}).await;
}

/// Attempts of a vanished device's report before it is confirmed all the same (logged): a
/// record must not wait for an API server that does not answer.
const VANISHED_ATTEMPTS: u32 = 3;

/// [`rescue_events`], and each vanished device's report (its event under a fixed name, the
/// claims' status) is sent right away in a task of its own, awaited, and then confirmed:
/// `confirm(&activity)` runs once the sink took it (or after [`VANISHED_ATTEMPTS`] failed
/// attempts). `dranet run` confirms to the engine ([`crate::rescue::Engine::vanish_reported`]),
/// which keeps the device's record until then.
pub async fn rescue_events_confirmed<C, F>(
    reporter: Reporter,
    mut rx: tokio::sync::broadcast::Receiver<Activity>,
    plans: impl Fn(&str) -> Option<Vec<DevicePlan>> + Send,
    confirm: C,
) where
    C: Fn(&Activity) -> F + Send,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match rx.recv().await {
            Ok(a) => {
                if let Some(ev) = rescue_event(&reporter, &a) {
                    reporter.event(ev);
                }
                if matches!(a.kind, ActivityKind::Vanished { .. })
                    && let Some((ev, devices, reason, message)) = trouble_event(&reporter, &a)
                {
                    let plans = plans(&a.pod_uid).unwrap_or_default();
                    let applies = trouble_statuses(reporter.driver(), &plans, &devices, reason, &message);
                    let (r, done) = (reporter.clone(), confirm(&a));
                    tokio::spawn(async move {
                        send_vanished(&r, &ev, &applies).await;
                        done.await;
                    });
                } else if let Some((ev, devices, reason, message)) = trouble_event(&reporter, &a) {
                    reporter.event(ev);
                    let plans = plans(&a.pod_uid).unwrap_or_default();
                    for apply in trouble_statuses(reporter.driver(), &plans, &devices, reason, &message) {
                        reporter.claim_status(apply);
                    }
                }
            }
            Err(RecvError::Lagged(n)) => tracing::debug!(missed = n, "activity feed lagged"),
            Err(RecvError::Closed) => break,
        }
    }
}

/// Sends a vanished device's event and claim statuses, each retried up to [`VANISHED_ATTEMPTS`]
/// times a second apart; failures are logged.
async fn send_vanished(r: &Reporter, ev: &Event, applies: &[ClaimStatusApply]) {
    let retried = |what: &'static str, attempt: u32, e: &ReportError| {
        tracing::warn!(what, attempt, event = ev.metadata.name, error = %crate::telemetry::chain(e), "vanished device report failed");
    };
    for attempt in 1..=VANISHED_ATTEMPTS {
        match r.event_now(ev).await {
            Ok(()) => break,
            Err(e) => retried("event", attempt, &e),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for apply in applies {
        for attempt in 1..=VANISHED_ATTEMPTS {
            match r.claim_status_now(apply).await {
                Ok(()) => break,
                Err(e) => retried("claim status", attempt, &e),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

#[cfg(test)]
mod tests;
