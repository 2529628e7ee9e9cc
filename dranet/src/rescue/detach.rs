// Over 500 lines: the detach of one sandbox in named phases (plan, move, restore, release) and their retry.
//! Detach: bring every device of a pod home through its pin and restore its snapshot; then
//! release the pin. Used by StopPodSandbox, by the probe-triggered rescue, by rollback and by
//! reconcile: the same code whatever the order.

use tracing::{Instrument as _, info, warn};

use super::activity::{ActivityKind, FailedAction};
use super::{DetachOutcome, Engine, Inner, Live, Owner, RescueError, lane};
use crate::pci;
use crate::state::{
    DeviceAt, DeviceRecord, DeviceState, Durability, PodPhase, RecordKey, ReturnCount, ReturnReason,
    Transition,
};
use crate::sys::link::{self, LinkError, Netlink, Returned};
use crate::sys::netns::Netns;
use crate::sys::rdma;

impl Inner {
    pub(super) fn live_put(&self, key: &RecordKey, live: Live) {
        super::lock(&self.live).insert(key.to_owned(), live);
    }

    pub(super) fn live_take(&self, key: &RecordKey) -> Option<Live> {
        let mut live = super::lock(&self.live);
        let taken = live.remove(key);
        crate::heap::shrink_sparse(&mut live);
        taken
    }
}

impl Engine {
    /// [`Engine::detach_timed`] without the timing.
    pub(super) async fn detach_locked(
        &self,
        key: &RecordKey,
        reason: ReturnReason,
    ) -> Result<DetachOutcome, RescueError> {
        self.detach_timed(key, reason, &mut None).await
    }

    /// Brings every device of the sandbox `key` home, the pod's lock held, and records in
    /// `first_move` (the monotonic time) when it sends the move of its first device home (or,
    /// without a pod netns, starts the host-side repair): the rescue's reaction time ends there.
    ///
    /// Phases: [`Engine::begin_return`] (the record, the pin, `Returning`), the pod netns's
    /// netlink, one [`Engine::return_device`] per device, then [`Engine::finish_return`] or, with
    /// a device still out, [`Engine::incomplete_return`] (the engine retries).
    ///
    /// Every line logged on the way carries the span's `pod`, `record` and `reason`.
    pub(super) async fn detach_timed(
        &self,
        key: &RecordKey,
        reason: ReturnReason,
        first_move: &mut Option<crate::clock::MonoTime>,
    ) -> Result<DetachOutcome, RescueError> {
        let span =
            tracing::info_span!("return", pod = tracing::field::Empty, record = %key, reason = ?reason);
        self.return_sandbox(key, reason, first_move)
            .instrument(span)
            .await
    }

    /// [`Engine::detach_timed`] inside its span.
    async fn return_sandbox(
        &self,
        key: &RecordKey,
        reason: ReturnReason,
        first_move: &mut Option<crate::clock::MonoTime>,
    ) -> Result<DetachOutcome, RescueError> {
        let started = std::time::Instant::now();
        let (owner, devices, live) = match self.begin_return(key, reason).await? {
            Begun::Ready { owner, devices, live } => (owner, devices, live),
            Begun::Done(outcome) => return Ok(outcome),
        };
        tracing::Span::current().record("pod", tracing::field::display(&owner));
        let owner = &owner;
        let pod_nl = self.pod_netlink(live.as_ref()).await;
        // Its own socket: the kernel runs one dump at a time per netlink socket.
        let host_nl = self.host_netlink().await?;
        let mut home = Vec::new();
        let mut busy = Vec::new();
        let mut failed = Vec::new();
        // Part of an attach (its rollback, its pod's older sandbox): never behind the lane.
        let foreground = reason.is_foreground();
        // A rescue sends its moves from the reactor (its thread, its priority); any other
        // return from a pool thread, so the reactor is never held by a hook's move and two
        // returns' moves wait on RTNL side by side: on one socket for the whole return.
        let move_from = live
            .as_ref()
            .filter(|_| reason != ReturnReason::NetnsTeardown)
            .and_then(|l| match link::MoveSocket::new(l.pin.netns()) {
                Ok(s) => Some(s),
                Err(e) => {
                    warn!(error = %crate::telemetry::chain(&e), "no socket for the moves home from the pool: sending them over the pod's netlink");
                    None
                }
            });
        let host_nsid = std::sync::OnceLock::new();
        for (i, d) in devices.iter().enumerate() {
            let ctx = ReturnCtx {
                owner,
                key,
                live: live.as_ref(),
                pod_nl: pod_nl.as_ref(),
                host_nl: &host_nl,
                foreground,
                move_from: move_from.as_ref(),
                host_nsid: &host_nsid,
            };
            match self.return_device(&ctx, i, d, first_move).await? {
                DeviceReturn::AlreadyHome => {}
                DeviceReturn::Home(name) => home.push(name),
                DeviceReturn::NameBusy(name) => busy.push(name),
                DeviceReturn::Gone => {}
                DeviceReturn::Failed(why) => failed.extend(why),
            }
        }
        // The pod's sockets go before its pin does (they hold the netns).
        drop((pod_nl, move_from));
        if let Some(first) = failed.first() {
            return Err(self.incomplete_return(owner, key, live, failed.len(), devices.len(), first));
        }
        self.finish_return(key, live, reason).await?;
        self.say_what_was_not_restored(key, &devices);
        info!(devices = ?home, name_busy = ?busy, "devices home");
        self.record(
            owner,
            ActivityKind::Returned {
                reason,
                devices: home.iter().chain(&busy).cloned().collect(),
                took_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            },
        );
        Ok(DetachOutcome::Returned {
            devices: home,
            name_busy: busy,
        })
    }

    /// Phase 1: the sandbox's record (none: not ours; nothing out: already home), its pin (taken
    /// from the live set, or re-opened), and the record marked `Returning`.
    ///
    /// A hook's return waits until `Returning` is on disk before moving anything. A rescue only
    /// stages it: the return's last save (which waits) carries it. A crash in
    /// between leaves the record `Attached`, and the restart's reconcile returns the devices all
    /// the same: the runtime's path no longer names the netns, so it is not re-adopted. Waiting
    /// here would put the checkpoint thread's wake-up and `fsync` before the first move: ms on a
    /// loaded node.
    async fn begin_return(&self, key: &RecordKey, reason: ReturnReason) -> Result<Begun, RescueError> {
        let (owner, devices, pin_path) = {
            let cp = self.cp();
            let Some(rec) = cp.pods.get(key) else {
                return Ok(Begun::Done(DetachOutcome::NotOurs));
            };
            if let PodPhase::Returned(why) = rec.phase
                && !rec.has_devices_out()
            {
                return Ok(Begun::Done(DetachOutcome::AlreadyReturned { reason: why }));
            }
            (Owner::of(rec), rec.devices.clone(), rec.pin.clone())
        };
        let live = match self.inner.live_take(key) {
            Some(l) => Some(l),
            None => self.repin(key, pin_path.as_deref()).await,
        };
        let durability = if reason == ReturnReason::NetnsTeardown {
            Durability::Staged
        } else {
            Durability::Awaited
        };
        self.transition(key, Transition::MarkReturning, durability)
            .await?;
        Ok(Begun::Ready { owner, devices, live })
    }

    /// Phase 2: rtnetlink inside the pod netns (the live one, or a new socket through the pin);
    /// `None` without a netns: the devices are repaired in the host instead.
    async fn pod_netlink(&self, live: Option<&Live>) -> Option<Netlink> {
        let live = live?;
        // On the kept socket (no thread hop into the netns), its task on the rescue reactor as
        // the attach's was; else (none kept, or it fails) a new socket through the pin.
        if let Some(socket) = &live.socket {
            let rt = self
                .inner
                .watcher
                .as_ref()
                .and_then(crate::watch::Watcher::reactor);
            match self.inner.kernel.connect(socket, rt) {
                Ok(nl) => return Some(nl),
                Err(e) => {
                    warn!(error = %crate::telemetry::chain(&e), "the kept pod netlink socket failed; opening a new one");
                }
            }
        }
        match self
            .link_op(
                "rtnetlink in the pod netns",
                self.inner.kernel.pod_netlink(live.pin.netns()),
            )
            .await
        {
            Ok(nl) => Some(nl),
            Err(e) => {
                warn!(error = %crate::telemetry::chain(&e), "no netlink in the pod netns");
                None
            }
        }
    }

    /// Phase 3, one device: its RDMA link first (it needs the pod netns alive), then the netdev
    /// ([`NetdevStep`]: nothing to do, or brought home by [`Engine::bring_netdev_home`]). A
    /// device that does not come home is `Failed` (logged here, once).
    async fn return_device(
        &self,
        ctx: &ReturnCtx<'_>,
        i: usize,
        d: &DeviceRecord,
        first_move: &mut Option<crate::clock::MonoTime>,
    ) -> Result<DeviceReturn, RescueError> {
        let step = NetdevStep::of(d.state);
        // Returns of other pods wait for an attach (the lane): only a return that asks the
        // kernel for something, and is not itself part of an attach, takes a background slot.
        let asks_kernel = step == NetdevStep::BringHome || d.rdma_in_pod;
        let slot = if asks_kernel && !ctx.foreground {
            Some(self.inner.lane.background().await)
        } else {
            None
        };
        let rdma_failed = self.return_rdma(ctx, i, d).await;
        let netdev = match step {
            NetdevStep::AlreadyHome => DeviceReturn::AlreadyHome,
            NetdevStep::Gone => DeviceReturn::Gone,
            NetdevStep::BringHome => self.bring_netdev_home(ctx, i, d, first_move, slot).await?,
        };
        Ok(netdev.after_rdma(rdma_failed))
    }

    /// The device's RDMA link home, if it is in the pod; the error, logged, if it is not home.
    async fn return_rdma(&self, ctx: &ReturnCtx<'_>, i: usize, d: &DeviceRecord) -> Option<Failure> {
        if !d.rdma_in_pod {
            return None;
        }
        let e = self
            .detach_rdma(ctx.owner, ctx.key, i, d, ctx.live.map(|l| l.pin.netns()))
            .await
            .err()?;
        warn!(device = d.device, error = %crate::telemetry::chain(&e), "RDMA link not brought home");
        Some(Failure::of(&e))
    }

    /// A device that is out: home by the ifindex recorded in the pinned netns (or repaired in
    /// the host without one), judged gone, or rebound (`--pci-rebind`); then its state recorded.
    /// `slot` (the lane) is held for the kernel's part only.
    async fn bring_netdev_home(
        &self,
        ctx: &ReturnCtx<'_>,
        i: usize,
        d: &DeviceRecord,
        first_move: &mut Option<crate::clock::MonoTime>,
        slot: Option<lane::Slot>,
    ) -> Result<DeviceReturn, RescueError> {
        let (owner, key) = (ctx.owner, ctx.key);
        let res = match self.move_netdev_home(ctx, d, first_move).await {
            Err(LinkError::Lost { .. }) if self.vanished(ctx, d) => {
                drop(slot);
                self.mark_gone(owner, key, i, d).await?;
                return Ok(DeviceReturn::Gone);
            }
            Err(LinkError::Lost { .. }) if self.inner.opts.pci_rebind && d.pci_address.is_some() => {
                self.last_resort(ctx.host_nl, owner, d).await
            }
            other => other.map_err(|source| RescueError::Link {
                pod: owner.into(),
                device: d.device.clone(),
                source,
            }),
        };
        // The kernel's part is done: the next return may start while this one's state is
        // saved (the save's fsync needs no RTNL, and held the lane idle).
        drop(slot);
        match res {
            Ok(returned) => {
                let (t, durability, ret) = home_transition(i, d, returned);
                self.transition(key, t, durability).await?;
                Ok(ret)
            }
            Err(e) => {
                warn!(device = d.device, error = %crate::telemetry::chain(&e), "device not brought home");
                Ok(DeviceReturn::Failed(vec![Failure::of(&e)]))
            }
        }
    }

    /// The kernel's part of a netdev's return: moved home through the pod netns when we hold
    /// it, else found in the host by its identity and restored.
    async fn move_netdev_home(
        &self,
        ctx: &ReturnCtx<'_>,
        d: &DeviceRecord,
        first_move: &mut Option<crate::clock::MonoTime>,
    ) -> Result<Returned, LinkError> {
        let (Some(nl), Some(live)) = (ctx.pod_nl, ctx.live) else {
            first_move.get_or_insert_with(crate::watch::mono_now);
            return self
                .link_op(
                    "repairing the device in the host",
                    self.inner.kernel.find_and_repair(ctx.host_nl, &d.snapshot),
                )
                .await;
        };
        // Only the ifindex recorded in the netns we pinned identifies the device in the pod (a
        // pod may have renamed it and made an impostor under its name).
        let pod_ifindex =
            d.at.filter(|a| live.pin.netns().id() == a.netns)
                .map(|a| a.ifindex);
        let req = link::DetachRequest {
            pod_nl: nl,
            host_nl: ctx.host_nl,
            host: &self.inner.host,
            snap: &d.snapshot,
            pod_ifindex,
            pod_ifname: &d.pod_ifname,
            move_from: ctx.move_from,
            host_nsid: Some(ctx.host_nsid),
        };
        self.link_op(
            "bringing the device home",
            self.inner.kernel.detach(&req, live.pin.netns(), first_move),
        )
        .await
    }

    /// Phase 4, when a device is still out: the pin stays live (the engine retries), the failure
    /// is counted and recorded, and the error names the first cause.
    fn incomplete_return(
        &self,
        owner: &Owner,
        key: &RecordKey,
        live: Option<Live>,
        failed: usize,
        total: usize,
        first: &Failure,
    ) -> RescueError {
        if let Some(l) = live {
            self.inner.live_put(key, l);
        }
        self.record(
            owner,
            ActivityKind::Failed {
                action: FailedAction::Return,
                error: first.error.clone(),
                device: None,
            },
        );
        self.inner.metrics.failures.inc();
        RescueError::Incomplete {
            pod: owner.into(),
            failed,
            total,
            first: first.error.clone(),
            stuck: first.reason,
        }
    }

    /// Re-opens the pod's pin; if it is gone, finds the netns by identity (the runtime's path,
    /// then `/proc/*/ns/net`, scanned on the blocking pool) and pins it again. `None`: the netns
    /// is gone.
    pub(super) async fn repin(&self, key: &RecordKey, pin_path: Option<&std::path::Path>) -> Option<Live> {
        let (id, path, name) = self
            .cp()
            .pods
            .get(key)
            .map(|r| (r.netns, r.netns_path.clone(), r.pin_name()))?;
        if let Some(p) = pin_path {
            match self.inner.kernel.reopen_pin(p) {
                // The pin must still hold the netns the record attached to.
                Ok(pin) if pin.netns().id() == id => return Some(Live { pin, socket: None }),
                Ok(pin) => {
                    warn!(record = %key, pin = %p.display(), found = %pin.netns().id(), expected = %id, "pin holds another netns; ignoring it");
                }
                Err(e) => {
                    warn!(record = %key, pin = %p.display(), error = %crate::telemetry::chain(&e), "pin is gone; looking for the netns by identity")
                }
            }
        }
        let kernel = self.inner.kernel.clone();
        let ns = tokio::task::spawn_blocking(move || kernel.find_netns(id, &[&path]))
            .await
            .ok()
            .flatten()?;
        match self
            .inner
            .kernel
            .create_pin(&ns, &self.inner.store.pins_dir(), &name)
        {
            Ok(pin) => {
                info!(record = %key, netns = %id, "netns found alive: pinned again");
                let p = pin.path().to_owned();
                if let Err(e) = self
                    .transition(key, Transition::SetPin(Some(p)), Durability::Awaited)
                    .await
                {
                    warn!(record = %key, error = %crate::telemetry::chain(&e), "cannot record the new pin");
                }
                Some(Live { pin, socket: None })
            }
            Err(e) => {
                warn!(record = %key, error = %crate::telemetry::chain(&e), "cannot pin the netns again");
                None
            }
        }
    }

    /// Every device is home: release the pin, stop watching, record why.
    pub(super) async fn finish_return(
        &self,
        key: &RecordKey,
        live: Option<Live>,
        reason: ReturnReason,
    ) -> Result<(), RescueError> {
        if let Some(Live { pin, socket }) = live {
            drop(socket);
            // The pod's netlink socket and snapshots go now, and RemovePodSandbox may come
            // much later: after a burst of returns, hand the freed heap back.
            crate::heap::after_burst();
            // The umount waits for an RCU grace period (up to most of a second on a loaded
            // node: docs/bench.md, "Figures behind the code's comments"). Never on the reactor,
            // where it held up every later event, nor on an async worker.
            let kernel = self.inner.kernel.clone();
            match tokio::task::spawn_blocking(move || kernel.release_pin(pin)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(record = %key, error = %crate::telemetry::chain(&e), "releasing the pin failed");
                }
                Err(_) => warn!(record = %key, "releasing the pin: the blocking task failed"),
            }
        }
        // Counted before the record changes: whoever sees the record say "returned" sees the
        // return counted too (the save is awaited below).
        let m = &self.inner.metrics;
        match reason.counted_as() {
            ReturnCount::Returns { trigger } => {
                m.returns
                    .get_or_create(&crate::telemetry::metrics::rescue::TriggerLabel {
                        trigger: trigger.into(),
                    })
                    .inc();
            }
            ReturnCount::Rollback => {
                m.rollbacks.inc();
            }
            ReturnCount::Rescued => {
                m.rescued.inc();
            }
        }
        // The netns stays watched while the record stays: its teardown drops the record.
        self.transition(key, Transition::MarkReturned(reason), Durability::Awaited)
            .await?;
        // The runtime tore the netns down (CRI-O order, a rescue, a reconcile): the sandbox can
        // never run again, so its record goes now. Otherwise (containerd order, a new sandbox)
        // it waits for RemovePodSandbox, Synchronize or the sweep.
        self.drop_if_torn_down(key).await?;
        Ok(())
    }

    /// Moves an RDMA link back from the pod netns (`None`: the netns is gone, and the kernel
    /// returns exclusive-mode RDMA devices to the host when it destroys a netns).
    async fn detach_rdma(
        &self,
        owner: &Owner,
        key: &RecordKey,
        i: usize,
        d: &DeviceRecord,
        pod_ns: Option<&Netns>,
    ) -> Result<(), RescueError> {
        let Some(name) = d.rdma_device.clone() else {
            return Ok(());
        };
        if let Some(pod_ns) = pod_ns {
            let err = |source| RescueError::Rdma {
                pod: owner.into(),
                device: name.clone(),
                source,
            };
            let pod_ns = pod_ns.try_clone().map_err(RescueError::Host)?;
            let host = self.inner.host.try_clone().map_err(RescueError::Host)?;
            let (ops, n) = (self.inner.rdma.clone(), name.clone());
            let r = self
                .blocking_op(owner, &d.device, "RDMA move back to the host", move || {
                    ops.move_device(&pod_ns, &n, &host)
                })
                .await?;
            match r {
                // Not in the pod netns: it never moved (crash between record and move) or is home.
                Ok(()) | Err(rdma::RdmaError::NotFound(_) | rdma::RdmaError::NoRdma) => {}
                Err(e) => return Err(err(e)),
            }
        }
        let t = Transition::RdmaInPod {
            device: i,
            in_pod: false,
        };
        self.transition(key, t, Durability::Awaited).await
    }

    /// `--pci-rebind`: the device is nowhere; rebind its PCI driver so it reappears in the host,
    /// then restore it.
    async fn last_resort(
        &self,
        host_nl: &Netlink,
        owner: &Owner,
        d: &DeviceRecord,
    ) -> Result<Returned, RescueError> {
        let pci = d.pci_address.as_deref().unwrap_or_default();
        let perr = |source| RescueError::Pci {
            pod: owner.into(),
            device: d.device.clone(),
            source,
        };
        let lerr = |source| RescueError::Link {
            pod: owner.into(),
            device: d.device.clone(),
            source,
        };
        warn!(device = d.device, pci, "device lost: rebinding its PCI driver");
        let name = pci::rebind_and_wait(&self.inner.opts.sysfs, pci, std::time::Duration::from_secs(10))
            .await
            .map_err(perr)?;
        let index = host_nl
            .link_by_name(&name)
            .await
            .map_err(lerr)?
            .map(|m| m.header.index)
            .ok_or_else(|| lerr(LinkError::NotFound(name.clone())))?;
        self.inner
            .kernel
            .repair(host_nl, index, &d.snapshot)
            .await
            .map_err(lerr)
    }

    /// Whether device `d`, found neither at its place in the pod nor in the host by its kernel
    /// identity ([`LinkError::Lost`]), no longer exists anywhere:
    /// * with the pod netns held: the index recorded for it there is free or another link's, and
    ///   no move out of that netns was recorded (tier B records one in `at`); a device whose place
    ///   in the pod netns is not recorded (`at` unset or naming another netns) is not judged;
    /// * with the pod netns gone: the kernel deleted a virtual device with it and returned any
    ///   other to the host, where it is not;
    /// * and, for a device behind a PCI function, that function is gone from sysfs too (a VF
    ///   destroyed, a hot-unplug): while it is there its netdev is somewhere, and is waited for.
    fn vanished(&self, ctx: &ReturnCtx<'_>, d: &DeviceRecord) -> bool {
        let placed = match (ctx.live, d.at) {
            (Some(l), Some(at)) => ctx.pod_nl.is_some() && at.netns == l.pin.netns().id(),
            (Some(_), None) => false,
            (None, _) => true,
        };
        let function_left = d
            .pci_address
            .as_deref()
            .is_some_and(|a| crate::pci::function_exists(&self.inner.opts.sysfs, a));
        placed && !function_left
    }

    /// A rescue gave up with devices still out: each gets the error in its record (`dranet
    /// status`), and each device not reported yet since it was last home is reported once: a WARN, the activity feed (the pod's Warning event,
    /// its claim's status, device health) and `dranet_return_stuck_total{reason}`.
    pub(super) async fn report_stuck(&self, owner: &Owner, key: &RecordKey, stuck: StuckReason, error: &str) {
        let reason = stuck.label();
        // Reported once: a second rescue of the same teardown (the unlink after the umount)
        // gives up too. The pod's record is gone: nothing to report.
        let Some(devices) = self.cp().record(key).map(|r| {
            r.devices
                .iter()
                .filter(|d| d.return_error.is_none() && out(d.state))
                .map(|d| d.device.clone())
                .collect::<Vec<_>>()
        }) else {
            return;
        };
        let t = Transition::ReturnStuck {
            error: error.to_owned(),
        };
        let saved = self.transition(key, t, Durability::Awaited).await;
        if let Err(e) = saved {
            warn!(record = %key, error = %crate::telemetry::chain(&e), "cannot record why the devices are still out");
        }
        if devices.is_empty() {
            return;
        }
        self.inner
            .metrics
            .stuck
            .get_or_create(&crate::telemetry::metrics::rescue::ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
        warn!(
            pod = %owner,
            record = %key,
            devices = ?devices,
            reason,
            error,
            "devices still out after every retry of the rescue: reported; retried at the next hook, teardown signal or reconcile"
        );
        self.record(
            owner,
            ActivityKind::ReturnStuck {
                devices,
                reason: stuck,
                error: error.to_owned(),
            },
        );
    }

    /// A device home under a temporary name: if its host name is free now, it gets it back
    /// (and the rest of its snapshot, as the rename took it down). Idempotent; the link that
    /// held the name is never touched.
    pub async fn rename_home(&self, owner: &Owner, key: &RecordKey, device: &str) -> Result<(), RescueError> {
        let _owner = self.own(owner).await;
        let Some((i, d)) = self.cp().pods.get(key).and_then(|r| {
            r.devices
                .iter()
                .enumerate()
                .find(|(_, d)| d.device == device && d.state == DeviceState::HomeNameBusy)
                .map(|(i, d)| (i, d.clone()))
        }) else {
            return Ok(());
        };
        let Some(temp) = d.temp_name.clone() else {
            return Ok(());
        };
        let _slot = self.inner.lane.background().await;
        let host_nl = self.host_netlink().await?;
        let res = self
            .link_op(
                "giving the device its name back",
                self.inner.kernel.reclaim_name(&host_nl, &temp, &d.snapshot),
            )
            .await
            .map_err(|source| RescueError::Link {
                pod: owner.into(),
                device: device.to_owned(),
                source,
            })?;
        match res {
            Some(Returned::Restored) => {
                self.transition(key, Transition::NameBack { device: i }, Durability::Awaited)
                    .await?;
                info!(
                    pod = %owner,
                    record = %key,
                    device,
                    from = temp,
                    to = d.snapshot.name,
                    "host name free again: device renamed back"
                );
                // The record may have stayed for this alone (its sandbox gone meanwhile).
                self.drop_if_torn_down(key).await?;
            }
            Some(Returned::NameBusy { .. }) => {}
            None => {
                // Not under its temporary name any more (a later sandbox took it, someone
                // renamed it): this record no longer waits for it.
                warn!(
                    pod = %owner,
                    record = %key,
                    device,
                    temp_name = temp,
                    "device no longer under its temporary name: not renamed, no longer waited for"
                );
                self.transition(key, Transition::NameBack { device: i }, Durability::Awaited)
                    .await?;
                self.drop_if_torn_down(key).await?;
            }
        }
        Ok(())
    }

    /// A managed device appeared in the host by itself: restore it (idempotent). The link at
    /// `ifindex` must be the device by its kernel identity (`link::repair` checks).
    pub async fn repair(
        &self,
        owner: &Owner,
        key: &RecordKey,
        device: &str,
        ifindex: u32,
    ) -> Result<(), RescueError> {
        let _owner = self.own(owner).await;
        let Some((i, d)) = self.cp().pods.get(key).and_then(|r| {
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
        let _slot = self.inner.lane.background().await;
        let host_nl = self.host_netlink().await?;
        let res = self
            .link_op(
                "repairing the device",
                self.inner.kernel.repair(&host_nl, ifindex, &d.snapshot),
            )
            .await
            .map_err(|source| RescueError::Link {
                pod: owner.into(),
                device: device.to_owned(),
                source,
            })?;
        // Counted before the record changes (see `finish_return`).
        self.inner.metrics.repaired.inc();
        let t = match res {
            Returned::Restored => Transition::DeviceHome { device: i },
            Returned::NameBusy { temp_name } => Transition::HomeNameBusy { device: i, temp_name },
        };
        self.transition(key, t, Durability::Awaited).await?;
        info!(
            pod = %owner,
            record = %key,
            device,
            ifindex,
            "device returned by the kernel: restored"
        );
        let all_home = self.cp().pods.get(key).is_some_and(|r| !r.has_devices_out());
        if all_home {
            let live = self.inner.live_take(key);
            self.finish_return(key, live, ReturnReason::NetnsTeardown).await?;
        }
        Ok(())
    }

    /// Tier B saw a device we placed change netns: record where it is now; if that is the host,
    /// restore it.
    pub async fn moved(
        &self,
        owner: &Owner,
        key: &RecordKey,
        device: &str,
        to: DeviceAt,
    ) -> Result<(), RescueError> {
        if to.netns == self.inner.host.id() {
            return self.repair(owner, key, device, to.ifindex.get()).await;
        }
        let _owner = self.own(owner).await;
        // The record may have gone since the event was decided (RemovePodSandbox meanwhile):
        // nothing to record then.
        let known = self
            .cp()
            .record(key)
            .is_some_and(|r| r.devices.iter().any(|d| d.device == device));
        if !known {
            return Ok(());
        }
        let t = Transition::DeviceMoved {
            device: device.to_owned(),
            to,
        };
        self.transition(key, t, Durability::Awaited).await
    }
}

/// Whether a device in state `s` may still be outside the host.
fn out(s: DeviceState) -> bool {
    matches!(
        s,
        DeviceState::Moving | DeviceState::InPod | DeviceState::Returning
    )
}

/// Why a return keeps failing, as `dranet_return_stuck_total{reason}` and the `ReturnStuck`
/// activity name it. Decided from the typed error, before it becomes text. On the activity feed
/// as its label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StuckReason {
    /// The kernel refused the move with `EEXIST`: every name it may take is in use in the host.
    NameTaken,
    /// The kernel did not answer within the bound ([`LinkError::Timeout`],
    /// [`RescueError::Timeout`]).
    Timeout,
    /// Any other cause.
    Other,
}

impl StuckReason {
    /// The reason of error `e`: the first cause in its chain (`e`, then its sources) that is
    /// a timeout or an `EEXIST` of the kernel (netlink, RDMA netlink, or an OS error).
    pub(super) fn of(e: &(dyn std::error::Error + 'static)) -> Self {
        std::iter::successors(Some(e), |e| e.source())
            .find_map(Self::of_one)
            .unwrap_or(Self::Other)
    }

    /// The reason one error of a chain gives by itself, without its sources.
    fn of_one(e: &(dyn std::error::Error + 'static)) -> Option<Self> {
        let exists = |errno: i32| {
            (std::io::Error::from_raw_os_error(errno).kind() == std::io::ErrorKind::AlreadyExists)
                .then_some(Self::NameTaken)
        };
        if let Some(l) = e.downcast_ref::<LinkError>() {
            return match l {
                LinkError::Timeout { .. } => Some(Self::Timeout),
                _ => l.errno().and_then(exists),
            };
        }
        if let Some(RescueError::Timeout { .. }) = e.downcast_ref::<RescueError>() {
            return Some(Self::Timeout);
        }
        if let Some(rdma::RdmaError::Kernel { errno, .. }) = e.downcast_ref::<rdma::RdmaError>() {
            return exists(*errno);
        }
        e.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .and_then(exists)
    }

    /// The metric label: `name_taken`, `timeout` or `other`.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::NameTaken => "name_taken",
            Self::Timeout => "timeout",
            Self::Other => "other",
        }
    }
}

impl std::fmt::Display for StuckReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// One cause of a device not coming home: its reason and its text (the error chain).
struct Failure {
    reason: StuckReason,
    error: String,
}

impl Failure {
    fn of(e: &RescueError) -> Self {
        Self {
            reason: StuckReason::of(e),
            error: crate::telemetry::chain(e).to_string(),
        }
    }
}

/// What [`Engine::begin_return`] found.
enum Begun {
    /// Nothing to do: the outcome as it stands.
    Done(DetachOutcome),
    /// Devices to bring home.
    Ready {
        owner: Owner,
        devices: Vec<DeviceRecord>,
        live: Option<Live>,
    },
}

/// What every device of one return shares.
struct ReturnCtx<'a> {
    owner: &'a Owner,
    key: &'a RecordKey,
    live: Option<&'a Live>,
    pod_nl: Option<&'a Netlink>,
    host_nl: &'a Netlink,
    /// Part of an attach: never queued behind other returns.
    foreground: bool,
    /// The socket to send each move home on from a pool thread (see `link::DetachRequest`).
    move_from: Option<&'a std::sync::Arc<link::MoveSocket>>,
    /// The id the pod netns gives the host netns, once asked (see `link::DetachRequest`).
    host_nsid: &'a std::sync::OnceLock<i32>,
}

/// What a device's netdev needs in a return, from its recorded state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NetdevStep {
    /// Home already (under its name, or a temporary one while its name is taken).
    AlreadyHome,
    /// Judged gone by an earlier pass whose return did not finish (dranet killed before the
    /// record ended, or another device failed): it has no place left to look at (`at` was
    /// cleared), so looking again could only fail it, and the record would never end.
    Gone,
    /// Out (moving in, in the pod, on its way home): brought home.
    BringHome,
}

impl NetdevStep {
    fn of(s: DeviceState) -> Self {
        match s {
            DeviceState::Home | DeviceState::HomeNameBusy => Self::AlreadyHome,
            DeviceState::Gone => Self::Gone,
            DeviceState::Moving | DeviceState::InPod | DeviceState::Returning => Self::BringHome,
        }
    }
}

/// The record's change for device `i` (`d`) once the kernel brought it home, how it is saved,
/// and what the return reports.
///
/// Home under its name: staged, not awaited. The writer saves it right after, and the return's
/// last save ([`Engine::finish_return`]) waits for it. A crash before that leaves the device
/// `InPod` or `Returning` on disk with the pin still held, and the restart's reconcile returns
/// the sandbox again: the device is no longer in the pod, so it is found in the host by its
/// identity and restored (`find_and_repair`), which is what this save records.
///
/// Home under a temporary name: awaited before the return goes on.
fn home_transition(i: usize, d: &DeviceRecord, returned: Returned) -> (Transition, Durability, DeviceReturn) {
    match returned {
        Returned::Restored => (
            Transition::DeviceHome { device: i },
            Durability::Staged,
            DeviceReturn::Home(d.snapshot.name.clone()),
        ),
        Returned::NameBusy { temp_name } => (
            Transition::HomeNameBusy {
                device: i,
                temp_name: temp_name.clone(),
            },
            Durability::Awaited,
            DeviceReturn::NameBusy(temp_name),
        ),
    }
}

/// How one device's return ended.
enum DeviceReturn {
    AlreadyHome,
    Home(String),
    NameBusy(String),
    /// It no longer exists anywhere ([`Engine::vanished`]): marked gone and reported.
    Gone,
    /// Why it (or its RDMA link) is not home, each cause once.
    Failed(Vec<Failure>),
}

impl DeviceReturn {
    /// This netdev outcome of a device whose RDMA link failed to come home (`rdma_failed`) is a
    /// failure, the RDMA cause first.
    fn after_rdma(self, rdma_failed: Option<Failure>) -> Self {
        let Some(rdma) = rdma_failed else {
            return self;
        };
        match self {
            Self::Failed(mut why) => {
                why.insert(0, rdma);
                Self::Failed(why)
            }
            _ => Self::Failed(vec![rdma]),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A netlink error of the kernel with `errno`, as `rtnetlink` hands it over.
    fn kernel_said(errno: i32) -> LinkError {
        let mut m = netlink_packet_core::ErrorMessage::default();
        m.code = std::num::NonZeroI32::new(-errno);
        LinkError::Netlink {
            what: "move home",
            source: Box::new(rtnetlink::Error::NetlinkError(m)),
        }
    }

    fn of_device(source: LinkError) -> RescueError {
        RescueError::Link {
            pod: super::Owner::Pod(crate::ids::pod_uid("uid").unwrap()),
            device: "eth1".into(),
            source,
        }
    }

    /// Each cause a return gives up with, as the rescue reports it, and its stuck label.
    fn cases() -> Vec<(RescueError, &'static str)> {
        let after = Duration::from_secs(5);
        vec![
            (of_device(kernel_said(libc::EEXIST)), "name_taken"),
            (
                of_device(LinkError::Transport {
                    what: "move home",
                    step: "send",
                    source: std::io::Error::from_raw_os_error(libc::EEXIST),
                }),
                "name_taken",
            ),
            (
                RescueError::Rdma {
                    pod: super::Owner::Pod(crate::ids::pod_uid("uid").unwrap()),
                    device: "mlx5_0".into(),
                    source: rdma::RdmaError::Kernel {
                        what: "moving the RDMA device home",
                        errno: libc::EEXIST,
                    },
                },
                "name_taken",
            ),
            (
                of_device(LinkError::Timeout {
                    what: "bringing the device home",
                    after,
                }),
                "timeout",
            ),
            (
                RescueError::Timeout {
                    pod: super::Owner::Pod(crate::ids::pod_uid("uid").unwrap()),
                    device: "eth1".into(),
                    what: "RDMA link home",
                    after,
                },
                "timeout",
            ),
            (of_device(kernel_said(libc::EBUSY)), "other"),
            (
                of_device(LinkError::Lost {
                    name: "eth1".into(),
                    mac: None,
                }),
                "other",
            ),
            (of_device(LinkError::NotFound("eth1".into())), "other"),
        ]
    }

    #[test]
    fn a_stuck_return_is_labelled_by_its_cause() {
        for (e, label) in cases() {
            let error = crate::telemetry::chain(&e).to_string();
            assert_eq!(StuckReason::of(&e).label(), label, "{error}");
            let failure = Failure::of(&e);
            assert_eq!(
                (failure.reason.label(), failure.error.as_str()),
                (label, error.as_str())
            );
        }
    }
}
