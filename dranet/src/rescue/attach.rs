//! Attach (RunPodSandbox): open + verify the pod netns, snapshot every device, write ahead,
//! pin, move each device in; on any failure bring the ones already moved back home.

use std::path::Path;

use tracing::{info, warn};

use super::activity::ActivityKind;
use super::{AttachOutcome, Engine, Live, RescueError};
use crate::link::{self, AttachSpec, LinkError, Netlink};
use crate::netns::{Netns, Pin};
use crate::plan::DevicePlan;
use crate::rdma::{self, NetnsMode};
use crate::state::{DeviceRecord, DeviceState, PodPhase, PodRecord, ReturnReason};

/// Identity of the pod being attached, as the runtime names it.
#[derive(Clone, Debug)]
pub struct PodRef<'a> {
    pub uid: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl Engine {
    /// Moves every planned device of the pod into the netns at `netns_path`.
    pub async fn attach_pod(&self, pod: PodRef<'_>, netns_path: &Path) -> Result<AttachOutcome, RescueError> {
        let started = std::time::Instant::now();
        let _owner = self.own(pod.uid).await;
        let Some(plan) = self.plan(pod.uid).filter(|p| !p.is_empty()) else {
            return Ok(AttachOutcome::NotOurs);
        };
        let netns = Netns::open_path(netns_path).map_err(|source| RescueError::Netns {
            pod: pod.uid.to_owned(),
            path: netns_path.to_owned(),
            source,
        })?;
        if netns.id() == self.inner.host.id() {
            return Err(RescueError::HostNetns {
                pod: pod.uid.to_owned(),
                path: netns_path.to_owned(),
            });
        }
        if let Some(done) = self.already_attached(pod.uid, &netns)? {
            return Ok(done);
        }
        self.check_free(pod.uid, &plan)?;
        let records = self.snapshots(pod.uid, &plan).await?;
        // Every config error surfaces here, before anything moves.
        let specs = plan
            .iter()
            .zip(&records)
            .map(|(d, r)| {
                AttachSpec::from_plan(d, &r.pod_ifname).map_err(|source| RescueError::Link {
                    pod: pod.uid.to_owned(),
                    device: d.device.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let pin_path = self.inner.store.pins_dir().join(pod.uid);
        // Write ahead: the snapshots are durable before anything moves.
        self.update(|cp| {
            cp.pods.insert(
                pod.uid.to_owned(),
                PodRecord {
                    pod_uid: pod.uid.to_owned(),
                    namespace: pod.namespace.to_owned(),
                    name: pod.name.to_owned(),
                    netns_path: netns_path.to_owned(),
                    netns: netns.id(),
                    pin: Some(pin_path.clone()),
                    phase: PodPhase::Attaching,
                    devices: records.clone(),
                },
            );
        })?;
        let pin = match Pin::create(&netns, &self.inner.store.pins_dir(), pod.uid) {
            Ok(p) => p,
            Err(source) => {
                self.abandon(pod.uid)?;
                return Err(RescueError::Pin {
                    pod: pod.uid.to_owned(),
                    source,
                });
            }
        };
        drop(netns);
        let pod_nl = match Netlink::in_netns(pin.netns()).await {
            Ok(nl) => nl,
            Err(source) => {
                let _ = pin.release();
                self.abandon(pod.uid)?;
                return Err(RescueError::PodNetlink {
                    pod: pod.uid.to_owned(),
                    source,
                });
            }
        };
        let live = Live {
            pin,
            netlink: Some(pod_nl),
        };
        let mut names = Vec::with_capacity(plan.len());
        for (i, d) in plan.iter().enumerate() {
            let spec = &specs[i];
            let attached = match &live.netlink {
                Some(pod_nl) => {
                    link::attach(
                        &self.inner.host_nl,
                        pod_nl,
                        live.pin.netns(),
                        &records[i].snapshot,
                        spec,
                    )
                    .await
                }
                None => Err(LinkError::NoPodNetlink),
            };
            let attached = match attached {
                Ok(_) => self.attach_rdma(pod.uid, i, d, live.pin.netns()).await,
                Err(source) => Err(RescueError::Link {
                    pod: pod.uid.to_owned(),
                    device: d.device.clone(),
                    source,
                }),
            };
            if let Err(err) = attached {
                warn!(pod = pod.uid, device = d.device, error = %err, "attach failed; rolling back");
                self.record(
                    pod.uid,
                    ActivityKind::Failed {
                        action: "attach".into(),
                        error: err.to_string(),
                        device: Some(d.device.clone()),
                    },
                );
                self.count(|c| {
                    c.attach_failures += 1;
                    c.rollbacks += 1;
                });
                // The failed device may be half-way (moved, not configured): detach handles both.
                self.set_device_state(pod.uid, i + 1, DeviceState::InPod)?;
                self.inner.live_put(pod.uid, live);
                if let Err(e) = self.detach_locked(pod.uid, ReturnReason::Rollback).await {
                    warn!(pod = pod.uid, error = %e, "rollback incomplete");
                }
                return Err(err);
            }
            names.push(records[i].pod_ifname.clone());
            if let Some((n, pause)) = self.inner.opts.pause_after_device
                && n == i
            {
                tokio::time::sleep(pause).await;
            }
        }
        let (path, id) = (netns_path.to_owned(), live.pin.netns().id());
        if let Some(w) = &self.inner.watcher
            && let Err(e) = w.watch_netns(&path, id, live.pin.netns().as_fd()).await
        {
            warn!(pod = pod.uid, error = %e, "cannot watch the pod netns; relying on hooks and rtnetlink");
        }
        self.inner.live_put(pod.uid, live);
        self.update(|cp| {
            if let Some(rec) = cp.pods.get_mut(pod.uid) {
                rec.phase = PodPhase::Attached;
                rec.devices.iter_mut().for_each(|d| d.state = DeviceState::InPod);
            }
        })?;
        self.count(|c| c.attached_pods += 1);
        self.inner
            .metrics
            .attach_latency
            .observe(started.elapsed().as_secs_f64());
        self.record(
            pod.uid,
            ActivityKind::Attached {
                devices: names.clone(),
                took_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            },
        );
        info!(pod = pod.uid, netns = %id, devices = ?names, "devices attached");
        Ok(AttachOutcome::Attached { devices: names })
    }

    /// In exclusive RDMA netns mode, moves the device's RDMA link into the pod too (recorded
    /// first, so a crash in between still brings it back). In shared mode every netns sees it.
    async fn attach_rdma(
        &self,
        uid: &str,
        i: usize,
        d: &DevicePlan,
        pod_ns: &Netns,
    ) -> Result<(), RescueError> {
        let (Some(name), Some(NetnsMode::Exclusive)) = (d.rdma_device.clone(), self.inner.rdma_mode) else {
            return Ok(());
        };
        self.update(|cp| {
            if let Some(dev) = cp.pods.get_mut(uid).and_then(|r| r.devices.get_mut(i)) {
                dev.rdma_in_pod = true;
            }
        })?;
        let err = |source| RescueError::Rdma {
            pod: uid.to_owned(),
            device: name.clone(),
            source,
        };
        let (host, pod_ns) = (
            self.inner.host.try_clone().map_err(RescueError::Host)?,
            pod_ns.try_clone().map_err(RescueError::Host)?,
        );
        let n = name.clone();
        tokio::task::spawn_blocking(move || rdma::move_device(&host, &n, &pod_ns))
            .await
            .map_err(|_| err(rdma::RdmaError::Decode("the RDMA move task failed".into())))?
            .map_err(err)
    }

    fn already_attached(&self, uid: &str, netns: &Netns) -> Result<Option<AttachOutcome>, RescueError> {
        let cp = self.cp();
        Ok(match cp.pods.get(uid) {
            Some(rec) if rec.phase == PodPhase::Attached && rec.netns == netns.id() => {
                Some(AttachOutcome::AlreadyAttached)
            }
            _ => None,
        })
    }

    /// Refuses a device another pod still holds.
    fn check_free(&self, uid: &str, plan: &[DevicePlan]) -> Result<(), RescueError> {
        let cp = self.cp();
        for rec in cp.pods.values().filter(|r| r.pod_uid != uid) {
            for d in rec.devices.iter().filter(|d| d.state != DeviceState::Home) {
                if let Some(p) = plan.iter().find(|p| p.device == d.device) {
                    return Err(RescueError::DeviceBusy {
                        pod: uid.to_owned(),
                        device: p.device.clone(),
                        other: rec.pod_uid.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    async fn snapshots(&self, uid: &str, plan: &[DevicePlan]) -> Result<Vec<DeviceRecord>, RescueError> {
        let mut out = Vec::with_capacity(plan.len());
        for d in plan {
            let (Some(host_if), Some(pod_if)) = (d.host_ifname.as_deref(), d.pod_ifname()) else {
                return Err(RescueError::NoInterface {
                    pod: uid.to_owned(),
                    device: d.device.clone(),
                });
            };
            let link_err = |source| RescueError::Link {
                pod: uid.to_owned(),
                device: d.device.clone(),
                source,
            };
            link::validate_ifname(pod_if).map_err(link_err)?;
            let snapshot = link::snapshot(&self.inner.host_nl, host_if)
                .await
                .map_err(link_err)?;
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
            });
        }
        Ok(out)
    }

    /// Marks devices `..upto` with `state` (the others are known not to have moved).
    fn set_device_state(&self, uid: &str, upto: usize, state: DeviceState) -> Result<(), RescueError> {
        self.update(|cp| {
            if let Some(rec) = cp.pods.get_mut(uid) {
                for (i, d) in rec.devices.iter_mut().enumerate() {
                    d.state = if i < upto { state } else { DeviceState::Home };
                }
            }
        })
    }

    /// Nothing moved: the pod record goes back to "returned".
    fn abandon(&self, uid: &str) -> Result<(), RescueError> {
        self.update(|cp| {
            if let Some(rec) = cp.pods.get_mut(uid) {
                rec.phase = PodPhase::Returned(ReturnReason::Rollback);
                rec.pin = None;
                rec.devices.iter_mut().for_each(|d| d.state = DeviceState::Home);
            }
        })
    }
}
