// Over 500 lines: the attach of one sandbox in named phases (open, stage, write ahead, move, finish) with its roll-back and RDMA step; one file keeps the order visible.
//! Attach (RunPodSandbox): open + verify the pod netns, bring the devices home from an older
//! sandbox of the same pod, snapshot every device, write ahead, pin, move each device in; on any
//! failure bring the ones already moved back home.

use std::path::Path;

use tracing::{Instrument as _, info, warn};

use super::activity::{ActivityKind, FailedAction};
use super::kernel::AttachRequest;
use super::{AttachOutcome, Engine, Live, Owner, RescueError};
use crate::ids::{HostIfindex, IdError, PodIfindex, PodUid, SandboxId};
use crate::plan::DevicePlan;
use crate::state::{
    DeviceAt, DeviceRecord, DeviceState, Durability, PodPhase, PodRecord, RecordKey, ReturnReason, Transition,
};
use crate::sys::link::{self, AttachSpec, LinkError, Netlink, PodSocket};
use crate::sys::netns::{Netns, Pin};
use crate::sys::rdma::NetnsMode;

/// Identity of the pod sandbox being attached, as the runtime names it; its ids checked at the
/// boundary ([`PodRef::parse`]: the NRI hook, the late attach).
#[derive(Clone, Debug)]
pub struct PodRef<'a> {
    pub uid: PodUid,
    /// The runtime's sandbox id.
    pub sandbox: SandboxId,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl<'a> PodRef<'a> {
    /// The sandbox `sandbox` of pod `uid`, both checked here.
    ///
    /// # Errors
    /// The id that is not one ([`crate::ids`]).
    pub fn parse(uid: &str, sandbox: &str, namespace: &'a str, name: &'a str) -> Result<Self, IdError> {
        Ok(Self {
            uid: crate::ids::pod_uid(uid)?,
            sandbox: crate::ids::sandbox_id(sandbox)?,
            namespace,
            name,
        })
    }
}

/// What an attach has ready before anything is written or moved: the host and pod netlink
/// handles and every planned device, ready to move.
struct Staged<'p> {
    host_nl: Netlink,
    pod_nl: Netlink,
    /// `pod_nl`'s socket, kept for the sandbox's return once the attach is done.
    pod_socket: Option<PodSocket>,
    /// In the plan's order (which is the record's).
    devices: Vec<Ready<'p>>,
}

/// One planned device ready to move: its record (snapshot, pod-side name) as it is written
/// ahead, its checked spec, and the place chosen for it in the pod.
struct Ready<'p> {
    plan: &'p DevicePlan,
    record: DeviceRecord,
    spec: AttachSpec,
    /// Its ifindex in the pod netns, requested in the move (the record's `at`).
    place: DeviceAt,
}

/// A device that moved in: its pod-side name and its kernel identity in the pod.
struct InPod {
    name: String,
    at: DeviceAt,
}

impl Engine {
    /// Moves every planned device of the pod into the netns of its sandbox at `netns_path`.
    ///
    /// Phases: open the sandbox's netns; bring devices home from an older sandbox of the pod;
    /// [`Engine::stage_attach`] (snapshots, specs, pod-side ifindexes: every config error
    /// surfaces here); [`Engine::write_ahead`] (the record is durable, then the netns is pinned);
    /// [`Engine::move_devices`] (rolled back on failure); [`Engine::finish_attach`].
    ///
    /// Every line logged on the way carries the span's `pod` and `sandbox`.
    pub async fn attach_pod(&self, pod: PodRef<'_>, netns_path: &Path) -> Result<AttachOutcome, RescueError> {
        let span = tracing::info_span!("attach", pod = %pod.uid, sandbox = %pod.sandbox);
        self.attach_sandbox(pod, netns_path).instrument(span).await
    }

    /// [`Engine::attach_pod`] inside its span.
    async fn attach_sandbox(&self, pod: PodRef<'_>, netns_path: &Path) -> Result<AttachOutcome, RescueError> {
        let started = std::time::Instant::now();
        // Checked at the boundary ([`PodRef::parse`]): every key and path below is built from
        // these.
        let key = RecordKey::new(&pod.uid, &pod.sandbox);
        let _owner = self.own(&pod.uid).await;
        // Checked under the pod's lock: release-all takes it for each pod after setting the flag,
        // so an attach either finished before (and is brought home) or is refused.
        if self.attaching_stopped() && self.plan(&pod.uid).is_some_and(|p| !p.is_empty()) {
            return Err(RescueError::Uninstalling {
                pod: (&pod.uid).into(),
            });
        }
        // Returns of other pods wait while this runs (taken after the pod's lock: a return of
        // this pod's older sandbox may hold that lock and wait for the lane).
        let _first = self.inner.lane.foreground();
        let Some(plan) = self.plan(&pod.uid).filter(|p| !p.is_empty()) else {
            return Ok(AttachOutcome::NotOurs);
        };
        let netns = self.open_sandbox_netns(&pod.uid, netns_path)?;
        self.name_legacy_record(&pod.uid, &pod.sandbox, |r| r.netns == netns.id())
            .await?;
        self.name_recovered_record(&pod.uid, &pod.sandbox, |r| r.netns == netns.id())
            .await?;
        if self.already_attached(&key, &netns) {
            return Ok(AttachOutcome::AlreadyAttached);
        }
        // kubelet re-created the sandbox (no new Prepare: the claims stay prepared). Devices
        // still in an older sandbox of this pod, or on their way home from it, go home first.
        self.return_other_sandboxes(&pod.uid, &key, &netns).await?;
        self.check_free(&pod.uid, &plan)?;
        let mut times = Phases::start(started);
        let staged = self.stage_attach(&pod.uid, &plan, &netns).await?;
        times.staged = times.lap();
        let pin = self
            .write_ahead(&pod, &key, netns_path, netns, &staged.devices)
            .await?;
        times.written = times.lap();
        let moved = self.move_devices(&pod, &key, staged, pin).await?;
        times.moved = times.lap();
        self.finish_attach(&pod, &key, netns_path, moved, times).await
    }

    /// Opens the sandbox's netns at `netns_path`; the host's own is refused.
    fn open_sandbox_netns(&self, uid: &PodUid, netns_path: &Path) -> Result<Netns, RescueError> {
        let netns = self
            .inner
            .kernel
            .open_netns(netns_path)
            .map_err(|source| RescueError::Netns {
                pod: uid.into(),
                path: netns_path.to_owned(),
                source,
            })?;
        if netns.id() == self.inner.host.id() {
            return Err(RescueError::HostNetns {
                pod: uid.into(),
                path: netns_path.to_owned(),
            });
        }
        Ok(netns)
    }

    /// Everything an attach needs before it writes or moves anything: every device's snapshot and
    /// spec (every config error surfaces here) and the ifindex each device will have in the pod.
    async fn stage_attach<'p>(
        &self,
        uid: &PodUid,
        plan: &'p [DevicePlan],
        netns: &Netns,
    ) -> Result<Staged<'p>, RescueError> {
        let host_nl = self.host_netlink().await?;
        let records = self.snapshots(&host_nl, uid, plan).await?;
        let specs = plan
            .iter()
            .zip(&records)
            .map(|(d, r)| {
                AttachSpec::from_plan(d, &r.pod_ifname).map_err(|source| RescueError::Link {
                    pod: uid.into(),
                    device: d.device.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (pod_nl, pod_socket) = self
            .link_op(
                "rtnetlink in the pod netns",
                self.inner.kernel.pod_netlink_kept(
                    netns,
                    self.inner
                        .watcher
                        .as_ref()
                        .and_then(crate::watch::Watcher::reactor),
                ),
            )
            .await
            .map_err(|source| RescueError::PodNetlink {
                pod: uid.into(),
                source,
            })?;
        // Each device's ifindex in the pod is chosen now and written ahead with the snapshots:
        // it is the device's identity there from the moment it moves (whatever the pod renames
        // or creates), so even an attach cut short by a crash knows where to look.
        let places = self
            .link_op(
                "listing the pod's links",
                self.inner.kernel.link_indexes(&pod_nl, netns),
            )
            .await
            .map(|taken| pod_indices(taken, &records))
            .map_err(|source| RescueError::PodNetlink {
                pod: uid.into(),
                source,
            })?;
        let devices = plan
            .iter()
            .zip(records)
            .zip(specs)
            .zip(places)
            .map(|(((plan, mut record), spec), ifindex)| {
                let place = DeviceAt {
                    ifindex,
                    netns: netns.id(),
                };
                record.at = Some(place);
                Ready {
                    plan,
                    record,
                    spec,
                    place,
                }
            })
            .collect();
        Ok(Staged {
            host_nl,
            pod_nl,
            pod_socket,
            devices,
        })
    }

    /// Writes the sandbox's record (phase Attaching, every snapshot) and waits until it is
    /// durable, then pins the netns. Nothing has moved yet: a failed pin drops the record.
    async fn write_ahead(
        &self,
        pod: &PodRef<'_>,
        key: &RecordKey,
        netns_path: &Path,
        netns: Netns,
        devices: &[Ready<'_>],
    ) -> Result<Pin, RescueError> {
        let pin_path = self.inner.store.pins_dir().join(pod.sandbox.as_str());
        let record = PodRecord {
            pod_uid: pod.uid.to_string(),
            sandbox_id: pod.sandbox.to_string(),
            namespace: pod.namespace.to_owned(),
            name: pod.name.to_owned(),
            netns_path: netns_path.to_owned(),
            netns: netns.id(),
            pin: Some(pin_path),
            phase: PodPhase::Attaching,
            devices: devices.iter().map(|d| d.record.clone()).collect(),
            recovered: None,
        };
        // It replaces a record of this sandbox whose devices are all home (an attach again after
        // a rollback). One that still has devices out (an attach or a return in this very netns
        // that did not finish) is refused: an error before anything moved, and the record that
        // knows where they are stays.
        self.transition(key, Transition::WriteAhead(record.into()), Durability::Awaited)
            .await?;
        match self
            .inner
            .kernel
            .create_pin(&netns, &self.inner.store.pins_dir(), &pod.sandbox)
        {
            Ok(p) => Ok(p),
            Err(source) => {
                self.abandon(key).await?;
                Err(RescueError::Pin {
                    pod: (&pod.uid).into(),
                    source,
                })
            }
        }
    }

    /// Moves and configures each device in turn (then its RDMA link). On the first failure every
    /// device up to it goes home ([`Engine::roll_back`]) and the error is returned.
    async fn move_devices(
        &self,
        pod: &PodRef<'_>,
        key: &RecordKey,
        staged: Staged<'_>,
        pin: Pin,
    ) -> Result<(Vec<InPod>, Live), RescueError> {
        let Staged {
            host_nl,
            pod_nl,
            pod_socket,
            devices,
        } = staged;
        let live = Live {
            pin,
            socket: pod_socket,
        };
        let pod_id = live.pin.netns().id();
        let mut moved: Vec<InPod> = Vec::with_capacity(devices.len());
        for (i, dev) in devices.iter().enumerate() {
            let d = dev.plan;
            let attached = self
                .link_op(
                    "moving the device into the pod",
                    self.inner.kernel.attach(AttachRequest {
                        host_nl: &host_nl,
                        pod_nl: &pod_nl,
                        netns: live.pin.netns(),
                        snap: &dev.record.snapshot,
                        spec: &dev.spec,
                        pod_ifindex: dev.place.ifindex,
                    }),
                )
                .await;
            let attached = match attached {
                Ok(index) => {
                    moved.push(InPod {
                        name: dev.record.pod_ifname.clone(),
                        at: DeviceAt {
                            ifindex: index,
                            netns: pod_id,
                        },
                    });
                    self.attach_rdma(&pod.uid, key, i, d, live.pin.netns()).await
                }
                Err(source) => Err(RescueError::Link {
                    pod: (&pod.uid).into(),
                    device: d.device.clone(),
                    source,
                }),
            };
            if let Err(err) = attached {
                // The rollback makes its own connection on the kept socket: this one goes
                // first (two would read each other's answers).
                drop(pod_nl);
                let placed: Vec<DeviceAt> = moved.iter().map(|m| m.at).collect();
                self.roll_back(&pod.uid, key, i, &placed, live, &err).await?;
                return Err(err);
            }
            if let Some((n, pause)) = self.inner.opts.pause_after_device
                && n == i
            {
                tokio::time::sleep(pause).await;
            }
        }
        Ok((moved, live))
    }

    /// Every device is in: watch the netns, keep its handles, mark the record Attached, count.
    async fn finish_attach(
        &self,
        pod: &PodRef<'_>,
        key: &RecordKey,
        netns_path: &Path,
        (moved, live): (Vec<InPod>, Live),
        mut times: Phases,
    ) -> Result<AttachOutcome, RescueError> {
        let started = times.started;
        let pod_id = live.pin.netns().id();
        if let Some(w) = &self.inner.watcher
            && let Err(e) = w.watch_netns(netns_path, pod_id, live.pin.netns().as_fd()).await
        {
            warn!(error = %crate::telemetry::chain(&e), "cannot watch the pod netns; relying on hooks and rtnetlink");
        }
        self.inner.live_put(key, live);
        let (names, placed): (Vec<String>, Vec<DeviceAt>) = moved.into_iter().map(|m| (m.name, m.at)).unzip();
        self.transition(key, Transition::MarkAttached { placed }, Durability::Awaited)
            .await?;
        self.inner.metrics.attached.inc();
        self.inner
            .metrics
            .attach_latency
            .observe(started.elapsed().as_secs_f64());
        self.record(
            &pod.uid,
            ActivityKind::Attached {
                devices: names.clone(),
                took_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            },
        );
        let finished = times.lap();
        info!(
            netns = %pod_id,
            devices = ?names,
            took_ms = ms(started.elapsed()),
            before_ms = ms(times.before),
            snapshot_ms = ms(times.staged),
            write_ahead_ms = ms(times.written),
            move_ms = ms(times.moved),
            finish_ms = ms(finished),
            "devices attached"
        );
        Ok(AttachOutcome::Attached { devices: names })
    }

    /// Device `failed` could not be attached: every device up to it (it may be half-way: moved,
    /// not configured) is brought home.
    async fn roll_back(
        &self,
        uid: &PodUid,
        key: &RecordKey,
        failed: usize,
        placed: &[DeviceAt],
        live: Live,
        err: &RescueError,
    ) -> Result<(), RescueError> {
        let device = err.device().map(str::to_owned);
        // The error itself is logged once, by whoever handles it (the NRI service for a hook).
        info!(device = ?device, "attach failed; rolling back");
        self.record(
            uid,
            ActivityKind::Failed {
                action: FailedAction::Attach,
                error: crate::telemetry::chain(&err).to_string(),
                device,
            },
        );
        self.inner.metrics.attach_failures.inc();
        // The failed device may be half-way: the return finds it at its pod ifindex or at home.
        let t = Transition::RollingBack {
            failed,
            placed: placed.to_vec(),
        };
        self.transition(key, t, Durability::Awaited).await?;
        self.inner.live_put(key, live);
        if let Err(e) = self.detach_locked(key, ReturnReason::Rollback).await {
            warn!(error = %crate::telemetry::chain(&e), "rollback incomplete");
        }
        Ok(())
    }

    /// In exclusive RDMA netns mode, moves the device's RDMA link into the pod too (recorded
    /// first, so a crash in between still brings it back). In shared mode every netns sees it.
    async fn attach_rdma(
        &self,
        uid: &PodUid,
        key: &RecordKey,
        i: usize,
        d: &DevicePlan,
        pod_ns: &Netns,
    ) -> Result<(), RescueError> {
        let (Some(name), Some(NetnsMode::Exclusive)) = (d.rdma_device.clone(), self.inner.rdma_mode) else {
            return Ok(());
        };
        let t = Transition::RdmaInPod {
            device: i,
            in_pod: true,
        };
        self.transition(key, t, Durability::Awaited).await?;
        let (host, pod_ns) = (
            self.inner.host.try_clone().map_err(RescueError::Host)?,
            pod_ns.try_clone().map_err(RescueError::Host)?,
        );
        let (ops, n) = (self.inner.rdma.clone(), name.clone());
        // Bounded: a move the kernel never answers fails the attach (rolled back) instead of
        // holding the pod's lock, and with it every later hook of the pod, for ever.
        self.blocking_op(uid, &d.device, "RDMA move into the pod", move || {
            ops.move_device(&host, &n, &pod_ns)
        })
        .await?
        .map_err(|source| RescueError::Rdma {
            pod: uid.into(),
            device: name.clone(),
            source,
        })
    }

    fn already_attached(&self, key: &RecordKey, netns: &Netns) -> bool {
        self.cp()
            .pods
            .get(key)
            .is_some_and(|rec| rec.phase == PodPhase::Attached && rec.netns == netns.id())
    }

    /// Brings home the devices of every other sandbox of pod `uid` (and of a record under this
    /// very key that names another netns). A device that cannot come home fails the attach: it
    /// would be taken from a sandbox that may still use it.
    async fn return_other_sandboxes(
        &self,
        uid: &PodUid,
        key: &RecordKey,
        netns: &Netns,
    ) -> Result<(), RescueError> {
        let others: Vec<RecordKey> = self
            .cp()
            .records_of(uid)
            .filter(|r| r.has_devices_out() && (r.key() != *key || r.netns != netns.id()))
            .map(crate::state::PodRecord::key)
            .collect();
        for other in others {
            info!(from = %other, to = %key, "new sandbox of the pod: devices come home from the old one first");
            self.detach_locked(&other, ReturnReason::Replaced).await?;
        }
        Ok(())
    }

    /// Refuses a device another pod still holds.
    fn check_free(&self, uid: &PodUid, plan: &[DevicePlan]) -> Result<(), RescueError> {
        let cp = self.cp();
        for rec in cp.pods.values().filter(|r| r.pod_uid != uid.as_str()) {
            for d in rec.devices.iter().filter(|d| d.state != DeviceState::Home) {
                if let Some(p) = plan.iter().find(|p| p.device == d.device) {
                    return Err(RescueError::DeviceBusy {
                        pod: uid.into(),
                        device: p.device.clone(),
                        other: Owner::of(rec),
                    });
                }
            }
        }
        Ok(())
    }

    async fn snapshots(
        &self,
        host_nl: &Netlink,
        uid: &PodUid,
        plan: &[DevicePlan],
    ) -> Result<Vec<DeviceRecord>, RescueError> {
        let mut out = Vec::with_capacity(plan.len());
        for d in plan {
            let (Some(host_if), Some(pod_if)) = (d.host_ifname.as_deref(), d.pod_ifname()) else {
                return Err(RescueError::NoInterface {
                    pod: uid.into(),
                    device: d.device.clone(),
                });
            };
            let link_err = |source| RescueError::Link {
                pod: uid.into(),
                device: d.device.clone(),
                source,
            };
            link::validate_ifname(pod_if).map_err(link_err)?;
            let snapshot = self.host_device(host_nl, d, host_if).await.map_err(link_err)?;
            out.push(DeviceRecord {
                device: d.device.clone(),
                pod_ifname: pod_if.to_owned(),
                pci_address: d.pci_address.clone(),
                permanent_mac: d.permanent_mac.clone(),
                rdma_device: d.rdma_device.clone(),
                rdma_in_pod: false,
                pod_mac: d.config.interface.hardware_addr.clone().filter(|m| !m.is_empty()),
                snapshot,
                state: DeviceState::Moving,
                temp_name: None,
                at: None,
                rebuilt: false,
                return_error: None,
                vanish_unreported: false,
            });
        }
        Ok(out)
    }

    /// The host state of plan device `d`, found by kernel identity: the link named `host_if`
    /// if it is the device (its PCI function, else the permanent MAC or MAC recorded at
    /// Prepare), else the link under the temporary name a record gave the device when its name
    /// was taken (and that is the device by the record's snapshot). A host link that merely
    /// took the device's name is never touched.
    async fn host_device(
        &self,
        host_nl: &Netlink,
        d: &DevicePlan,
        host_if: &str,
    ) -> Result<link::LinkSnapshot, LinkError> {
        let by_name = self
            .link_op(
                "snapshot of the host device",
                self.inner.kernel.snapshot(host_nl, host_if),
            )
            .await;
        if let Ok(s) = &by_name
            && plan_identity_matches(d, s, &self.inner.opts.sysfs)
        {
            return by_name;
        }
        let waiting: Vec<(String, link::LinkSnapshot)> = self
            .cp()
            .pods
            .values()
            .flat_map(|r| r.devices.iter())
            .filter(|r| r.device == d.device && r.state == DeviceState::HomeNameBusy)
            .filter_map(|r| Some((r.temp_name.clone()?, r.snapshot.clone())))
            .collect();
        for (temp, recorded) in waiting {
            if let Ok(s) = self
                .link_op(
                    "snapshot of the host device",
                    self.inner.kernel.snapshot(host_nl, &temp),
                )
                .await
                && plan_identity_matches(d, &s, &self.inner.opts.sysfs)
                && link::same_identity(&s, &recorded)
            {
                // Its snapshot says the temporary name; its home name is the plan's.
                return Ok(link::LinkSnapshot {
                    name: recorded.name,
                    ..s
                });
            }
        }
        match by_name {
            Ok(_) => Err(LinkError::NotTheDevice {
                index: 0,
                device: format!("{} (the host link named {host_if} is another link)", d.device),
            }),
            Err(e) => Err(e),
        }
    }

    /// Nothing moved: the sandbox record goes back to "returned".
    async fn abandon(&self, key: &RecordKey) -> Result<(), RescueError> {
        self.transition(key, Transition::Abandon, Durability::Awaited)
            .await
    }
}

/// The ifindex each device gets in the pod: its host ifindex when the pod has no link there (the
/// kernel keeps it anyway), else a free one above everything in the pod. Requested in the move
/// (`IFLA_NEW_IFINDEX`), so it is known before the device moves.
fn pod_indices(taken: Vec<PodIfindex>, records: &[DeviceRecord]) -> Vec<PodIfindex> {
    let mut taken: std::collections::BTreeSet<PodIfindex> = taken.into_iter().collect();
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        let want = PodIfindex::same_as(HostIfindex::new(r.snapshot.ifindex));
        let pick = if want.is_known() && !taken.contains(&want) {
            want
        } else {
            PodIfindex::new(
                taken
                    .last()
                    .copied()
                    .unwrap_or(PodIfindex::new(1))
                    .max(want)
                    .get()
                    .saturating_add(1),
            )
        };
        taken.insert(pick);
        out.push(pick);
    }
    out
}

/// How long each phase of an attach took, from the hook's arrival: logged with "devices
/// attached", so a slow attach says where its time went (on a draining node, the first RTNL
/// request of the snapshot waits for the moves queued ahead of it).
struct Phases {
    started: std::time::Instant,
    last: std::time::Instant,
    before: std::time::Duration,
    staged: std::time::Duration,
    written: std::time::Duration,
    moved: std::time::Duration,
}

impl Phases {
    /// From the hook's arrival `started` to now: the pod's lock, the checks and the return of
    /// an older sandbox's devices are `before`.
    fn start(started: std::time::Instant) -> Self {
        let now = std::time::Instant::now();
        Self {
            started,
            last: now,
            before: now.duration_since(started),
            staged: std::time::Duration::ZERO,
            written: std::time::Duration::ZERO,
            moved: std::time::Duration::ZERO,
        }
    }

    /// The time since the last lap (or the start).
    fn lap(&mut self) -> std::time::Duration {
        let now = std::time::Instant::now();
        let d = now.duration_since(self.last);
        self.last = now;
        d
    }
}

/// A duration in ms with 0.1 ms precision, for logs.
fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

/// Whether the host link of snapshot `s` is plan device `d` by what Prepare recorded of its
/// identity: its PCI function, else its permanent MAC (or MAC, for a device without one).
///
/// The PCI function is the link's parent device when that is on the PCI bus (`pci/<address>`),
/// or the PCI function behind it otherwise: a virtio-net link's parent is its virtio device
/// (`virtio/virtio2`), whose PCI function the inventory published (read from `sysfs`).
fn plan_identity_matches(d: &DevicePlan, s: &link::LinkSnapshot, sysfs: &std::path::Path) -> bool {
    if let Some(pci) = &d.pci_address {
        return s.parent.as_deref().is_some_and(|parent| {
            parent.strip_prefix("pci/") == Some(pci.as_str())
                || super::adopt::parent_pci_address(sysfs, parent).as_deref() == Some(pci.as_str())
        });
    }
    let Some(want) = d.permanent_mac.as_deref() else {
        return true;
    };
    let want = link::parse_mac(want).ok();
    [s.perm_mac.as_deref(), s.mac.as_deref()]
        .into_iter()
        .flatten()
        .any(|m| want.is_some() && link::parse_mac(m).ok() == want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A device keeps its host ifindex in the pod when the pod has that index free; otherwise,
    /// and for one whose host index is unknown (0), it gets one above everything in the pod.
    #[test]
    fn a_device_asks_for_its_host_index_in_the_pod_when_free() {
        let with_host = |i: u32| {
            let mut r = crate::test_support::device_record("d", DeviceState::Moving);
            r.snapshot.ifindex = i;
            r
        };
        let taken = [1, 2, 9].map(PodIfindex::new).to_vec();
        let records = [with_host(5), with_host(9), with_host(0), with_host(5)];
        assert_eq!(
            pod_indices(taken, &records),
            [5, 10, 11, 12].map(PodIfindex::new).to_vec()
        );
    }

    /// A virtio-net link's parent device is its virtio device (`virtio/virtio2`), not the PCI
    /// function the inventory published and Prepare recorded: found in the kernel matrix, where
    /// every attach of a real virtio NIC was refused as "another link".
    #[test]
    fn a_virtio_nic_is_its_pci_function_and_a_squatter_is_not() {
        let sysfs = std::env::temp_dir().join(format!("dranet-virtio-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&sysfs);
        let dev = sysfs.join("devices/pci0000:00/0000:00:05.0/virtio2");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(sysfs.join("bus/virtio/devices")).unwrap();
        std::os::unix::fs::symlink(&dev, sysfs.join("bus/virtio/devices/virtio2")).unwrap();
        let plan = DevicePlan {
            device: "pci-0000-00-05-0".into(),
            pool: "node-a".into(),
            request: "nic".into(),
            claim: crate::plan::ClaimRef {
                namespace: "ns".into(),
                name: "c".into(),
                uid: "uid-c".into(),
            },
            host_ifname: Some("eth1".into()),
            pci_address: Some("0000:00:05.0".into()),
            permanent_mac: None,
            rdma_device: None,
            config: crate::config::NetworkConfig::default(),
            char_devices: vec![],
        };
        let link = |parent: Option<&str>| link::LinkSnapshot {
            parent: parent.map(str::to_owned),
            ..link::LinkSnapshot::default()
        };
        assert!(plan_identity_matches(
            &plan,
            &link(Some("pci/0000:00:05.0")),
            &sysfs
        ));
        assert!(plan_identity_matches(
            &plan,
            &link(Some("virtio/virtio2")),
            &sysfs
        ));
        assert!(!plan_identity_matches(
            &plan,
            &link(Some("virtio/virtio3")),
            &sysfs
        ));
        assert!(!plan_identity_matches(
            &plan,
            &link(Some("pci/0000:00:06.0")),
            &sysfs
        ));
        assert!(!plan_identity_matches(&plan, &link(None), &sysfs));
        let _ = std::fs::remove_dir_all(&sysfs);
    }

    #[test]
    fn the_phases_of_an_attach_add_up_to_its_time() {
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        let mut p = Phases::start(started);
        std::thread::sleep(Duration::from_millis(10));
        p.staged = p.lap();
        p.written = p.lap();
        std::thread::sleep(Duration::from_millis(3));
        p.moved = p.lap();
        let total = started.elapsed();
        assert!(p.before >= Duration::from_millis(5), "{:?}", p.before);
        assert!(p.staged >= Duration::from_millis(10), "{:?}", p.staged);
        assert!(p.written < p.staged, "{:?} {:?}", p.written, p.staged);
        assert!(p.moved >= Duration::from_millis(3), "{:?}", p.moved);
        assert!(p.before + p.staged + p.written + p.moved <= total);
        assert!((ms(Duration::from_micros(12_345)) - 12.3).abs() < 1e-9);
    }
}
