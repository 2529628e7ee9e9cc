//! Detach: bring every device of a pod home through its pin and restore its snapshot; then
//! release the pin. Used by StopPodSandbox, by the probe-triggered rescue, by rollback and by
//! reconcile: the same code whatever the order.

use tracing::{info, warn};

use super::activity::ActivityKind;
use super::{DetachOutcome, Engine, Inner, Live, RescueError};
use crate::link::{self, LinkError, Netlink, Returned};
use crate::netns::Netns;
use crate::netns::Pin;
use crate::state::{DeviceRecord, DeviceState, PodPhase, ReturnReason};
use crate::{pci, rdma};

impl Inner {
    pub(super) fn live_put(&self, uid: &str, live: Live) {
        super::lock(&self.live).insert(uid.to_owned(), live);
    }

    fn live_take(&self, uid: &str) -> Option<Live> {
        super::lock(&self.live).remove(uid)
    }
}

impl Engine {
    /// Brings every device of the pod home (idempotent: a second call is a fast no-op).
    pub async fn detach_pod(
        &self,
        pod_uid: &str,
        reason: ReturnReason,
    ) -> Result<DetachOutcome, RescueError> {
        let _owner = self.own(pod_uid).await;
        self.detach_locked(pod_uid, reason).await
    }

    /// [`Engine::detach_pod`] with the pod's lock already held.
    pub(super) async fn detach_locked(
        &self,
        uid: &str,
        reason: ReturnReason,
    ) -> Result<DetachOutcome, RescueError> {
        self.detach_timed(uid, reason, &mut None).await
    }

    /// [`Engine::detach_locked`] that also records in `first_move` (CLOCK_MONOTONIC ns) when it
    /// sends the move of its first device home (or, without a pod netns, starts the host-side
    /// repair): the rescue's reaction time ends there.
    pub(super) async fn detach_timed(
        &self,
        uid: &str,
        reason: ReturnReason,
        first_move: &mut Option<u64>,
    ) -> Result<DetachOutcome, RescueError> {
        let started = std::time::Instant::now();
        let (devices, pin_path) = {
            let cp = self.cp();
            let Some(rec) = cp.pods.get(uid) else {
                return Ok(DetachOutcome::NotOurs);
            };
            if let PodPhase::Returned(why) = rec.phase
                && !rec.has_devices_out()
            {
                return Ok(DetachOutcome::AlreadyReturned { reason: why });
            }
            (rec.devices.clone(), rec.pin.clone())
        };
        let live = match self.inner.live_take(uid) {
            Some(l) => Some(l),
            None => self.repin(uid, pin_path.as_deref()),
        };
        self.update(|cp| {
            if let Some(rec) = cp.pods.get_mut(uid) {
                rec.phase = PodPhase::Returning;
            }
        })?;
        let pod_nl = match &live {
            Some(Live {
                netlink: Some(nl), ..
            }) => Some(nl.clone()),
            Some(Live { pin, netlink: None }) => match Netlink::in_netns(pin.netns()).await {
                Ok(nl) => Some(nl),
                Err(e) => {
                    warn!(pod = uid, error = %e, "no netlink in the pod netns");
                    None
                }
            },
            None => None,
        };
        let mut home = Vec::new();
        let mut busy = Vec::new();
        let mut failed = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            // RDMA first, as the kernel does at netns death: it needs the pod netns alive.
            if d.rdma_in_pod
                && let Err(e) = self
                    .detach_rdma(uid, i, d, live.as_ref().map(|l| l.pin.netns()))
                    .await
            {
                warn!(pod = uid, device = d.device, error = %e, "RDMA link not brought home");
                failed.push(e.to_string());
            }
            if matches!(d.state, DeviceState::Home | DeviceState::HomeNameBusy) {
                continue;
            }
            let res = match &pod_nl {
                Some(nl) => {
                    link::detach_timed(
                        nl,
                        &self.inner.host_nl,
                        &self.inner.host,
                        &d.pod_ifname,
                        &d.snapshot,
                        d.pod_mac.as_deref(),
                        first_move,
                    )
                    .await
                }
                None => {
                    first_move.get_or_insert_with(crate::watch::monotonic_ns);
                    link::find_and_repair(
                        &self.inner.host_nl,
                        &d.snapshot,
                        Some(&d.pod_ifname),
                        d.pod_mac.as_deref(),
                    )
                    .await
                }
            };
            let res = match res {
                Err(LinkError::Lost { .. }) if self.inner.opts.pci_rebind && d.pci_address.is_some() => {
                    self.last_resort(uid, d).await
                }
                other => other.map_err(|source| RescueError::Link {
                    pod: uid.to_owned(),
                    device: d.device.clone(),
                    source,
                }),
            };
            let state = match res {
                Ok(Returned::Restored) => {
                    home.push(d.snapshot.name.clone());
                    DeviceState::Home
                }
                Ok(Returned::NameBusy { temp_name }) => {
                    busy.push(temp_name.clone());
                    self.set_temp_name(uid, i, Some(temp_name))?;
                    DeviceState::HomeNameBusy
                }
                Err(e) => {
                    warn!(pod = uid, device = d.device, error = %e, "device not brought home");
                    failed.push(e.to_string());
                    continue;
                }
            };
            self.update(|cp| {
                if let Some(dev) = cp.pods.get_mut(uid).and_then(|r| r.devices.get_mut(i)) {
                    dev.state = state;
                }
            })?;
        }
        drop(pod_nl);
        if let Some(first) = failed.first() {
            if let Some(l) = live {
                self.inner.live_put(uid, l);
            }
            self.count(|c| c.return_failures += 1);
            self.record(
                uid,
                ActivityKind::Failed {
                    action: "return".into(),
                    error: first.clone(),
                    device: None,
                },
            );
            self.inner.metrics.failures.inc();
            return Err(RescueError::Incomplete {
                pod: uid.to_owned(),
                failed: failed.len(),
                total: devices.len(),
                first: first.clone(),
            });
        }
        self.finish_return(uid, live, reason)?;
        info!(pod = uid, ?reason, devices = ?home, name_busy = ?busy, "devices home");
        self.record(
            uid,
            ActivityKind::Returned {
                reason: format!("{reason:?}"),
                devices: home.iter().chain(&busy).cloned().collect(),
                took_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            },
        );
        Ok(DetachOutcome::Returned {
            devices: home,
            name_busy: busy,
        })
    }

    /// Re-opens the pod's pin; if it is gone, finds the netns by identity (the runtime's path,
    /// then `/proc/*/ns/net`) and pins it again. `None`: the netns is gone.
    pub(super) fn repin(&self, uid: &str, pin_path: Option<&std::path::Path>) -> Option<Live> {
        if let Some(p) = pin_path {
            match Pin::reopen(p) {
                Ok(pin) => return Some(Live { pin, netlink: None }),
                Err(e) => {
                    warn!(pod = uid, pin = %p.display(), error = %e, "pin is gone; looking for the netns by identity")
                }
            }
        }
        let (id, path) = self.cp().pods.get(uid).map(|r| (r.netns, r.netns_path.clone()))?;
        let ns = crate::netns::find_by_id(id, &[&path])?;
        match Pin::create(&ns, &self.inner.store.pins_dir(), uid) {
            Ok(pin) => {
                info!(pod = uid, netns = %id, "netns found alive: pinned again");
                let p = pin.path().to_owned();
                if let Err(e) = self.update(|cp| {
                    if let Some(r) = cp.pods.get_mut(uid) {
                        r.pin = Some(p);
                    }
                }) {
                    warn!(pod = uid, error = %e, "cannot record the new pin");
                }
                Some(Live { pin, netlink: None })
            }
            Err(e) => {
                warn!(pod = uid, error = %e, "cannot pin the netns again");
                None
            }
        }
    }

    /// Every device is home: release the pin, stop watching, record why.
    pub(super) fn finish_return(
        &self,
        uid: &str,
        live: Option<Live>,
        reason: ReturnReason,
    ) -> Result<(), RescueError> {
        let id = self.cp().pods.get(uid).map(|r| r.netns);
        if let Some(Live { pin, netlink }) = live {
            drop(netlink);
            if let Err(e) = pin.release() {
                warn!(pod = uid, error = %e, "releasing the pin failed");
            }
        }
        if let (Some(w), Some(id)) = (&self.inner.watcher, id) {
            w.unwatch_netns(id);
        }
        self.update(|cp| {
            if let Some(rec) = cp.pods.get_mut(uid) {
                rec.phase = PodPhase::Returned(reason);
                rec.pin = None;
            }
        })?;
        let m = &self.inner.metrics;
        match reason {
            ReturnReason::Hook => {
                m.returns
                    .get_or_create(&super::metrics::TriggerLabel {
                        trigger: "hook".into(),
                    })
                    .inc();
            }
            ReturnReason::Reconcile => {
                m.returns
                    .get_or_create(&super::metrics::TriggerLabel {
                        trigger: "reconcile".into(),
                    })
                    .inc();
            }
            ReturnReason::Rollback => {
                m.rollbacks.inc();
            }
            ReturnReason::NetnsTeardown => {}
        }
        self.count(|c| match reason {
            ReturnReason::Hook => c.returned_by_hook += 1,
            ReturnReason::NetnsTeardown => c.rescued_by_teardown += 1,
            ReturnReason::Reconcile => c.returned_by_reconcile += 1,
            ReturnReason::Rollback => {}
        });
        Ok(())
    }

    /// Moves an RDMA link back from the pod netns (`None`: the netns is gone, and the kernel
    /// returns exclusive-mode RDMA devices to the host when it destroys a netns).
    async fn detach_rdma(
        &self,
        uid: &str,
        i: usize,
        d: &DeviceRecord,
        pod_ns: Option<&Netns>,
    ) -> Result<(), RescueError> {
        let Some(name) = d.rdma_device.clone() else {
            return Ok(());
        };
        if let Some(pod_ns) = pod_ns {
            let err = |source| RescueError::Rdma {
                pod: uid.to_owned(),
                device: name.clone(),
                source,
            };
            let pod_ns = pod_ns.try_clone().map_err(RescueError::Host)?;
            let host = self.inner.host.try_clone().map_err(RescueError::Host)?;
            let n = name.clone();
            let r = tokio::task::spawn_blocking(move || rdma::move_device(&pod_ns, &n, &host))
                .await
                .map_err(|_| err(rdma::RdmaError::Decode("the RDMA move task failed".into())))?;
            match r {
                // Not in the pod netns: it never moved (crash between record and move) or is home.
                Ok(()) | Err(rdma::RdmaError::NotFound(_) | rdma::RdmaError::NoRdma) => {}
                Err(e) => return Err(err(e)),
            }
        }
        self.update(|cp| {
            if let Some(dev) = cp.pods.get_mut(uid).and_then(|r| r.devices.get_mut(i)) {
                dev.rdma_in_pod = false;
            }
        })
    }

    /// `--pci-rebind`: the device is nowhere; rebind its PCI driver so it reappears in the host,
    /// then restore it.
    async fn last_resort(&self, uid: &str, d: &DeviceRecord) -> Result<Returned, RescueError> {
        let pci = d.pci_address.as_deref().unwrap_or_default();
        let perr = |source| RescueError::Pci {
            pod: uid.to_owned(),
            device: d.device.clone(),
            source,
        };
        let lerr = |source| RescueError::Link {
            pod: uid.to_owned(),
            device: d.device.clone(),
            source,
        };
        warn!(
            pod = uid,
            device = d.device,
            pci,
            "device lost: rebinding its PCI driver"
        );
        let name = pci::rebind_and_wait(&self.inner.opts.sysfs, pci, std::time::Duration::from_secs(10))
            .await
            .map_err(perr)?;
        let index = self
            .inner
            .host_nl
            .link_by_name(&name)
            .await
            .map_err(lerr)?
            .map(|m| m.header.index)
            .ok_or_else(|| lerr(LinkError::NotFound(name.clone())))?;
        link::repair(&self.inner.host_nl, index, &d.snapshot)
            .await
            .map_err(lerr)
    }

    fn set_temp_name(&self, uid: &str, i: usize, name: Option<String>) -> Result<(), RescueError> {
        self.update(|cp| {
            if let Some(dev) = cp.pods.get_mut(uid).and_then(|r| r.devices.get_mut(i)) {
                dev.temp_name = name;
            }
        })
    }

    /// A managed device appeared in the host by itself: restore it (idempotent).
    pub async fn repair(&self, uid: &str, device: &str, ifindex: u32) -> Result<(), RescueError> {
        let _owner = self.own(uid).await;
        let Some((i, d)) = self.cp().pods.get(uid).and_then(|r| {
            r.devices
                .iter()
                .enumerate()
                .find(|(_, d)| {
                    d.device == device && matches!(d.state, DeviceState::InPod | DeviceState::Moving)
                })
                .map(|(i, d)| (i, d.clone()))
        }) else {
            return Ok(());
        };
        let res = link::repair(&self.inner.host_nl, ifindex, &d.snapshot)
            .await
            .map_err(|source| RescueError::Link {
                pod: uid.to_owned(),
                device: device.to_owned(),
                source,
            })?;
        let state = match res {
            Returned::Restored => DeviceState::Home,
            Returned::NameBusy { temp_name } => {
                self.set_temp_name(uid, i, Some(temp_name))?;
                DeviceState::HomeNameBusy
            }
        };
        self.update(|cp| {
            if let Some(dev) = cp.pods.get_mut(uid).and_then(|r| r.devices.get_mut(i)) {
                dev.state = state;
            }
        })?;
        self.count(|c| c.repaired_devices += 1);
        self.inner.metrics.repaired.inc();
        info!(
            pod = uid,
            device, ifindex, "device returned by the kernel: restored"
        );
        let all_home = self.cp().pods.get(uid).is_some_and(|r| !r.has_devices_out());
        if all_home {
            let live = self.inner.live_take(uid);
            self.finish_return(uid, live, ReturnReason::NetnsTeardown)?;
        }
        Ok(())
    }
}
