// Over 500 lines: the in-memory kernel and the tests of the engine's rules over it; the fake is only worth reading beside the rules it serves.
//! Unit tests of the engine's rules over an in-memory kernel ([`FakeKernel`] behind the
//! [`super::kernel::Kernel`] seam): attach, its rollback, the return (name busy: temporary
//! name), a sandbox re-created under the same pod UID, reconcile after a restart. No root, no
//! netns: the fake models devices (ifindex, name, identity by permanent MAC) in netns named by
//! id, the runtime's netns paths, pins, and failures injected per device. The root tests
//! (`dranet-sim/tests/rescue.rs`, `identities.rs`, ...) keep checking the same rules against the
//! real kernel.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use super::kernel::{AttachRequest, Kernel};
use super::{
    Action, AttachOutcome, DetachOutcome, Engine, EngineOptions, PodRef, RescueError, RescueTrigger,
    SandboxRef,
};
use crate::ids::PodIfindex;
use crate::plan::{ClaimRef, DevicePlan, PodPlan};
use crate::state::{DeviceState, PodPhase, ReturnReason, pod_key};
use crate::sys::link::{DetachRequest, LinkError, LinkSnapshot, Netlink, PodSocket, Returned, temp_name};
use crate::sys::netns::{Netns, NetnsError, NetnsId, Pin};
use crate::sys::rdma::{NetnsMode, RdmaError, RdmaOps};

/// A device as the fake kernel has it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Link {
    netns: NetnsId,
    ifindex: u32,
    name: String,
    /// Its identity (permanent MAC).
    mac: String,
    mtu: u32,
    up: bool,
}

/// A failure the fake kernel injects for the device whose host name is the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// The move into the pod is refused; the device stays in the host.
    AttachRefused,
    /// The move happens, a later setting of the same request fails (the device is in the pod).
    AttachHalfWay,
    /// Every move home is refused (the device stays in the pod).
    DetachRefused,
}

#[derive(Debug, Default)]
struct World {
    next_netns: u64,
    host: Option<NetnsId>,
    /// The runtime's netns paths (removed when the runtime tears a sandbox down).
    paths: BTreeMap<PathBuf, NetnsId>,
    /// Pin files: `Some` holds a netns, `None` is a mount point with nothing mounted.
    pins: BTreeMap<PathBuf, Option<NetnsId>>,
    links: Vec<Link>,
    faults: BTreeMap<String, Fault>,
    /// Moves into a pod and home, in order (`in eth1`, `home eth1`).
    moves: Vec<String>,
}

/// An in-memory kernel: devices, netns and pins.
#[derive(Debug, Default)]
struct FakeKernel {
    world: Mutex<World>,
    /// The one connection every "netlink" handle is (the fake never sends on it).
    nl: tokio::sync::OnceCell<Netlink>,
}

fn fail(reason: &str) -> LinkError {
    LinkError::Reply {
        what: "fake kernel",
        reason: reason.to_owned(),
    }
}

fn enoent(path: &Path) -> NetnsError {
    NetnsError::Open {
        path: path.to_owned(),
        source: nix::Error::ENOENT,
    }
}

impl World {
    fn new_netns(&mut self) -> NetnsId {
        self.next_netns += 1;
        NetnsId::test(1000 + self.next_netns, 4_026_531_000 + self.next_netns)
    }

    fn host(&self) -> NetnsId {
        self.host.unwrap_or(NetnsId::test(1, 1))
    }

    fn taken(&self, netns: NetnsId, ifindex: u32) -> bool {
        self.links
            .iter()
            .any(|l| l.netns == netns && l.ifindex == ifindex)
    }

    fn named(&self, netns: NetnsId, name: &str) -> Option<usize> {
        self.links.iter().position(|l| l.netns == netns && l.name == name)
    }

    fn by_identity(&self, netns: NetnsId, snap: &LinkSnapshot) -> Option<usize> {
        self.links
            .iter()
            .position(|l| l.netns == netns && Some(&l.mac) == snap.perm_mac.as_ref())
    }

    fn free_index(&self, netns: NetnsId, want: u32) -> u32 {
        if want > 0 && !self.taken(netns, want) {
            return want;
        }
        let top = self
            .links
            .iter()
            .filter(|l| l.netns == netns)
            .map(|l| l.ifindex)
            .max()
            .unwrap_or(1);
        top.max(want) + 1
    }

    /// Restores the host link `i` to `snap`: its name if free (else a temporary one), MTU, state.
    fn restore(&mut self, i: usize, snap: &LinkSnapshot) -> Returned {
        let host = self.host();
        let busy = self.named(host, &snap.name).is_some_and(|j| j != i);
        let l = &mut self.links[i];
        l.mtu = snap.mtu;
        l.up = snap.up;
        if busy {
            l.name = temp_name(snap.ifindex);
            Returned::NameBusy {
                temp_name: l.name.clone(),
            }
        } else {
            l.name.clone_from(&snap.name);
            Returned::Restored
        }
    }

    fn find_and_repair(&mut self, snap: &LinkSnapshot) -> Result<Returned, LinkError> {
        let host = self.host();
        match self.by_identity(host, snap) {
            Some(i) => Ok(self.restore(i, snap)),
            None => Err(LinkError::Lost {
                name: snap.name.clone(),
                mac: snap.mac.clone(),
            }),
        }
    }
}

impl FakeKernel {
    fn new() -> Arc<Self> {
        let k = Self::default();
        {
            let mut w = k.w();
            let host = w.new_netns();
            w.host = Some(host);
            w.links.push(Link {
                netns: host,
                ifindex: 1,
                name: "lo".into(),
                mac: "00:00:00:00:00:00".into(),
                mtu: 65536,
                up: true,
            });
        }
        Arc::new(k)
    }

    fn w(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().unwrap()
    }

    /// A host device `name` at `ifindex`.
    fn add_host_link(&self, name: &str, ifindex: u32) {
        let mut w = self.w();
        let host = w.host();
        assert!(!w.taken(host, ifindex), "ifindex {ifindex} taken");
        w.links.push(Link {
            netns: host,
            ifindex,
            name: name.to_owned(),
            mac: format!("02:00:00:00:{:02x}:{:02x}", ifindex >> 8, ifindex & 0xff),
            mtu: 1500,
            up: true,
        });
    }

    /// A sandbox netns the runtime made at `path` (with its loopback).
    fn add_sandbox(&self, path: &Path) -> NetnsId {
        let mut w = self.w();
        let id = w.new_netns();
        w.paths.insert(path.to_owned(), id);
        w.links.push(Link {
            netns: id,
            ifindex: 1,
            name: "lo".into(),
            mac: "00:00:00:00:00:00".into(),
            mtu: 65536,
            up: true,
        });
        id
    }

    /// The runtime tore the sandbox at `path` down: its path goes (a pin keeps the netns).
    fn remove_sandbox_path(&self, path: &Path) {
        self.w().paths.remove(path);
    }

    fn fault(&self, host_name: &str, f: Fault) {
        self.w().faults.insert(host_name.to_owned(), f);
    }

    fn clear_faults(&self) {
        self.w().faults.clear();
    }

    /// The link whose identity is the host device first made as `name` at `ifindex`.
    fn link_of(&self, ifindex: u32) -> Link {
        let mac = format!("02:00:00:00:{:02x}:{:02x}", ifindex >> 8, ifindex & 0xff);
        self.w().links.iter().find(|l| l.mac == mac).cloned().unwrap()
    }

    fn host(&self) -> NetnsId {
        self.w().host()
    }

    fn pins(&self) -> Vec<PathBuf> {
        self.w().pins.keys().cloned().collect()
    }

    fn moves(&self) -> Vec<String> {
        self.w().moves.clone()
    }

    async fn token(&self) -> Result<Netlink, LinkError> {
        // One real rtnetlink socket (unprivileged), never sent on: a handle to carry.
        self.nl.get_or_try_init(Netlink::host).await.cloned()
    }
}

impl Kernel for FakeKernel {
    fn host_netns(&self) -> Result<Netns, NetnsError> {
        Ok(Netns::inert(self.host()))
    }

    fn open_netns(&self, path: &Path) -> Result<Netns, NetnsError> {
        let w = self.w();
        if path == Path::new("/proc/self/ns/net") {
            return Ok(Netns::inert(w.host()));
        }
        w.paths
            .get(path)
            .map(|id| Netns::inert(*id))
            .ok_or_else(|| enoent(path))
    }

    fn find_netns(&self, id: NetnsId, _hints: &[&Path]) -> Option<Netns> {
        self.w()
            .paths
            .values()
            .any(|v| *v == id)
            .then(|| Netns::inert(id))
    }

    fn create_pin(&self, netns: &Netns, dir: &Path, name: &str) -> Result<Pin, NetnsError> {
        if name.is_empty() || name.contains('/') {
            return Err(NetnsError::PinName(name.to_owned()));
        }
        let path = dir.join(name);
        self.w().pins.insert(path.clone(), Some(netns.id()));
        Ok(Pin::inert(path, Netns::inert(netns.id())))
    }

    fn reopen_pin(&self, path: &Path) -> Result<Pin, NetnsError> {
        match self.w().pins.get(path) {
            Some(Some(id)) => Ok(Pin::inert(path.to_owned(), Netns::inert(*id))),
            Some(None) => Err(NetnsError::NotANamespace {
                path: path.to_owned(),
                what: "not on nsfs",
            }),
            None => Err(enoent(path)),
        }
    }

    fn reopen_pin_as(&self, path: &Path, id: NetnsId) -> Result<Pin, NetnsError> {
        let pin = self.reopen_pin(path)?;
        let found = pin.netns().id();
        if found != id {
            return Err(NetnsError::PinMismatch {
                path: path.to_owned(),
                expected: id,
                found,
            });
        }
        Ok(pin)
    }

    fn list_pins(&self, dir: &Path) -> Result<Vec<PathBuf>, NetnsError> {
        Ok(self
            .w()
            .pins
            .keys()
            .filter(|p| p.starts_with(dir))
            .cloned()
            .collect())
    }

    fn release_pin(&self, pin: Pin) -> Result<(), NetnsError> {
        self.release_pin_path(pin.path())
    }

    fn release_pin_path(&self, path: &Path) -> Result<(), NetnsError> {
        self.w().pins.remove(path);
        Ok(())
    }

    fn host_netlink(&self) -> BoxFuture<'_, Result<Netlink, LinkError>> {
        Box::pin(self.token())
    }

    fn pod_netlink<'a>(&'a self, _netns: &'a Netns) -> BoxFuture<'a, Result<Netlink, LinkError>> {
        Box::pin(self.token())
    }

    fn pod_netlink_kept<'a>(
        &'a self,
        _netns: &'a Netns,
        _rt: Option<&'a tokio::runtime::Handle>,
    ) -> BoxFuture<'a, Result<(Netlink, Option<PodSocket>), LinkError>> {
        Box::pin(async move { Ok((self.token().await?, None)) })
    }

    fn connect(
        &self,
        _socket: &PodSocket,
        _rt: Option<&tokio::runtime::Handle>,
    ) -> Result<Netlink, LinkError> {
        Err(fail("the fake keeps no socket"))
    }

    fn snapshot<'a>(
        &'a self,
        _host_nl: &'a Netlink,
        name: &'a str,
    ) -> BoxFuture<'a, Result<LinkSnapshot, LinkError>> {
        Box::pin(async move {
            let w = self.w();
            let l = w
                .named(w.host(), name)
                .map(|i| &w.links[i])
                .ok_or_else(|| LinkError::NotFound(name.to_owned()))?;
            Ok(LinkSnapshot {
                ifindex: l.ifindex,
                name: l.name.clone(),
                mtu: l.mtu,
                mac: Some(l.mac.clone()),
                perm_mac: Some(l.mac.clone()),
                up: l.up,
                identified: true,
                ..LinkSnapshot::default()
            })
        })
    }

    fn link_indexes<'a>(
        &'a self,
        _nl: &'a Netlink,
        netns: &'a Netns,
    ) -> BoxFuture<'a, Result<Vec<PodIfindex>, LinkError>> {
        Box::pin(async move {
            Ok(self
                .w()
                .links
                .iter()
                .filter(|l| l.netns == netns.id())
                .map(|l| PodIfindex::new(l.ifindex))
                .collect())
        })
    }

    fn attach<'a>(&'a self, req: AttachRequest<'a>) -> BoxFuture<'a, Result<PodIfindex, LinkError>> {
        Box::pin(async move {
            let mut w = self.w();
            let host = w.host();
            let Some(i) = w.by_identity(host, req.snap) else {
                return Err(LinkError::NotTheDevice {
                    index: req.snap.ifindex,
                    device: req.snap.name.clone(),
                });
            };
            let fault = w.faults.get(&req.snap.name).copied();
            if fault == Some(Fault::AttachRefused) {
                return Err(fail("move into the pod refused"));
            }
            let pod = req.netns.id();
            if w.taken(pod, req.pod_ifindex.get()) || w.named(pod, &req.spec.pod_ifname).is_some() {
                return Err(LinkError::NameTaken(req.spec.pod_ifname.clone()));
            }
            let l = &mut w.links[i];
            l.netns = pod;
            l.ifindex = req.pod_ifindex.get();
            l.name.clone_from(&req.spec.pod_ifname);
            w.moves.push(format!("in {}", req.snap.name));
            if fault == Some(Fault::AttachHalfWay) {
                return Err(fail("a setting of the move refused"));
            }
            Ok(req.pod_ifindex)
        })
    }

    fn detach<'a>(
        &'a self,
        req: &'a DetachRequest<'a>,
        pod: &'a Netns,
        moved_at: &'a mut Option<crate::clock::MonoTime>,
    ) -> BoxFuture<'a, Result<Returned, LinkError>> {
        Box::pin(async move {
            let mut w = self.w();
            let snap = req.snap;
            // Only the recorded place identifies the device in the pod.
            let found = w.links.iter().position(|l| {
                l.netns == pod.id()
                    && Some(&l.mac) == snap.perm_mac.as_ref()
                    && match req.pod_ifindex {
                        Some(x) => l.ifindex == x.get(),
                        None => l.name == req.pod_ifname,
                    }
            });
            let Some(i) = found else {
                return w.find_and_repair(snap);
            };
            if w.faults.get(&snap.name) == Some(&Fault::DetachRefused) {
                return Err(fail("move home refused"));
            }
            moved_at.get_or_insert(crate::clock::MonoTime::from_ns(1));
            let host = w.host();
            let index = w.free_index(host, snap.ifindex);
            let l = &mut w.links[i];
            l.netns = host;
            l.ifindex = index;
            w.moves.push(format!("home {}", snap.name));
            Ok(w.restore(i, snap))
        })
    }

    fn find_and_repair<'a>(
        &'a self,
        _host_nl: &'a Netlink,
        snap: &'a LinkSnapshot,
    ) -> BoxFuture<'a, Result<Returned, LinkError>> {
        Box::pin(async move { self.w().find_and_repair(snap) })
    }

    fn repair<'a>(
        &'a self,
        _host_nl: &'a Netlink,
        index: u32,
        snap: &'a LinkSnapshot,
    ) -> BoxFuture<'a, Result<Returned, LinkError>> {
        Box::pin(async move {
            let mut w = self.w();
            let host = w.host();
            match w.by_identity(host, snap) {
                Some(i) if w.links[i].ifindex == index => Ok(w.restore(i, snap)),
                _ => Err(LinkError::NotTheDevice {
                    index,
                    device: snap.name.clone(),
                }),
            }
        })
    }

    fn reclaim_name<'a>(
        &'a self,
        _host_nl: &'a Netlink,
        temp: &'a str,
        snap: &'a LinkSnapshot,
    ) -> BoxFuture<'a, Result<Option<Returned>, LinkError>> {
        Box::pin(async move {
            let mut w = self.w();
            let host = w.host();
            let Some(i) = w
                .named(host, temp)
                .filter(|i| Some(&w.links[*i].mac) == snap.perm_mac.as_ref())
            else {
                return Ok(None);
            };
            if w.named(host, &snap.name).is_some() {
                return Ok(Some(Returned::NameBusy {
                    temp_name: temp.to_owned(),
                }));
            }
            Ok(Some(w.restore(i, snap)))
        })
    }
}

/// No RDMA on this host.
#[derive(Debug)]
struct NoRdma;

impl RdmaOps for NoRdma {
    fn host_mode(&self) -> Result<Option<NetnsMode>, RdmaError> {
        Ok(None)
    }

    fn move_device(&self, _from: &Netns, _name: &str, _to: &Netns) -> Result<(), RdmaError> {
        Err(RdmaError::NoRdma)
    }
}

/// A state dir of its own, removed on drop.
struct StateDir(PathBuf);

impl StateDir {
    fn new() -> Self {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // On tmpfs when there is one, as `/run/dranet` is: a save's fsync costs nothing there.
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_owned()
        } else {
            std::env::temp_dir()
        };
        let p = base.join(format!("dranet-engine-tests-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const UID: &str = "0f0e0d0c-0b0a-4909-8807-060504030201";

async fn engine(dir: &StateDir, kernel: &Arc<FakeKernel>) -> Engine {
    let opts = EngineOptions {
        state_dir: dir.0.clone(),
        lock_wait: std::time::Duration::from_secs(5),
        kernel_timeout: std::time::Duration::from_secs(5),
        rdma: Some(Arc::new(NoRdma)),
        ..EngineOptions::default()
    };
    let k: Arc<dyn Kernel> = kernel.clone();
    Engine::with_kernel(opts, None, k).await.unwrap()
}

fn device(host_ifname: &str, pod_ifname: Option<&str>) -> DevicePlan {
    let mut config = crate::config::NetworkConfig::default();
    config.interface.name = pod_ifname.map(str::to_owned);
    DevicePlan {
        device: format!("dev-{host_ifname}"),
        pool: "node-a".into(),
        request: "nic".into(),
        claim: ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "claim-1".into(),
        },
        host_ifname: Some(host_ifname.to_owned()),
        pci_address: None,
        permanent_mac: None,
        rdma_device: None,
        config,
        char_devices: vec![],
    }
}

/// A kernel with host devices eth1.. at ifindexes 11.., a pod planned with all of them (pod
/// names net1..), and an engine.
async fn setup(n: u32) -> (StateDir, Arc<FakeKernel>, Engine) {
    let dir = StateDir::new();
    let k = FakeKernel::new();
    for i in 1..=n {
        k.add_host_link(&format!("eth{i}"), 10 + i);
    }
    let e = engine(&dir, &k).await;
    let devices = (1..=n)
        .map(|i| device(&format!("eth{i}"), Some(&format!("net{i}"))))
        .collect();
    e.set_plan(PodPlan {
        pod_uid: UID.into(),
        pod_namespace: "ns".into(),
        pod_name: "p".into(),
        devices,
    })
    .unwrap();
    (dir, k, e)
}

/// The owner of [`UID`]'s records.
fn owner() -> super::Owner {
    super::Owner::Pod(crate::ids::pod_uid(UID).unwrap())
}

fn pod(sandbox: &str) -> PodRef<'static> {
    PodRef::parse(UID, sandbox, "ns", "p").unwrap()
}

fn sandbox<'a>(id: &str, netns: &'a Path) -> SandboxRef<'a> {
    SandboxRef::parse(UID, id, Some(netns)).unwrap()
}

/// Every device eth1..=n is home: in the host, at its own ifindex, under its own name.
fn assert_all_home(k: &FakeKernel, n: u32) {
    for i in 1..=n {
        let l = k.link_of(10 + i);
        assert_eq!(
            (l.netns, l.ifindex, l.name.as_str()),
            (k.host(), 10 + i, format!("eth{i}").as_str()),
            "device eth{i} not home: {l:?}"
        );
    }
}

#[tokio::test]
async fn attach_moves_every_device_to_the_place_it_wrote_ahead() {
    let (_dir, k, e) = setup(2).await;
    let path = PathBuf::from("/run/netns/sb-a");
    let ns = k.add_sandbox(&path);
    let out = e.attach_pod(pod("sb-a"), &path).await.unwrap();
    assert_eq!(
        out,
        AttachOutcome::Attached {
            devices: vec!["net1".into(), "net2".into()]
        }
    );
    let rec = e.pod_record(&pod_key(UID, "sb-a")).unwrap();
    assert_eq!(rec.phase, PodPhase::Attached);
    for (i, d) in rec.devices.iter().enumerate() {
        let l = k.link_of(11 + u32::try_from(i).unwrap());
        assert_eq!(d.state, DeviceState::InPod);
        assert_eq!((l.netns, l.name.as_str()), (ns, d.pod_ifname.as_str()));
        // The place written ahead is where the device is.
        let at = d.at.unwrap();
        assert_eq!((at.netns, at.ifindex.get()), (ns, l.ifindex));
    }
    assert_eq!(k.pins(), vec![e.state_dir().join("pins/sb-a")]);
    // The runtime retries the hook: nothing moves again.
    let again = e.attach_pod(pod("sb-a"), &path).await.unwrap();
    assert_eq!(again, AttachOutcome::AlreadyAttached);
    assert_eq!(k.moves(), vec!["in eth1", "in eth2"]);
}

/// The rule of rollback: whichever device fails, and however (refused, or moved and then
/// failed), every device is home afterwards, restored, the record says so and the pin is gone.
#[tokio::test]
async fn a_failed_attach_leaves_every_device_home_wherever_it_fails() {
    for n in 1..=3 {
        for failing in 1..=n {
            for fault in [Fault::AttachRefused, Fault::AttachHalfWay] {
                let (_dir, k, e) = setup(n).await;
                let path = PathBuf::from("/run/netns/sb-a");
                k.add_sandbox(&path);
                k.fault(&format!("eth{failing}"), fault);
                let err = e.attach_pod(pod("sb-a"), &path).await.unwrap_err();
                let case = format!("{n} devices, eth{failing} fails: {fault:?}");
                assert!(
                    matches!(&err, RescueError::Link { device, .. } if *device == format!("dev-eth{failing}")),
                    "{case}: {err:?}"
                );
                assert_all_home(&k, n);
                let rec = e.pod_record(&pod_key(UID, "sb-a")).unwrap();
                assert_eq!(rec.phase, PodPhase::Returned(ReturnReason::Rollback), "{case}");
                assert!(!rec.has_devices_out(), "{case}: {rec:?}");
                assert!(k.pins().is_empty(), "{case}: pin left {:?}", k.pins());
                // Moved back exactly the devices that moved in.
                let moves = k.moves();
                let ins = moves.iter().filter(|m| m.starts_with("in ")).count();
                let homes = moves.iter().filter(|m| m.starts_with("home ")).count();
                assert_eq!(ins, homes, "{case}: {moves:?}");
                // The pod can attach once the fault is gone (nothing stays busy).
                k.clear_faults();
                let ok = e.attach_pod(pod("sb-a"), &path).await;
                assert!(matches!(ok, Ok(AttachOutcome::Attached { .. })), "{case}: {ok:?}");
            }
        }
    }
}

#[tokio::test]
async fn a_return_restores_every_device_and_releases_the_pin() {
    let (_dir, k, e) = setup(2).await;
    let path = PathBuf::from("/run/netns/sb-a");
    k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    let out = e
        .detach_sandbox(sandbox("sb-a", &path), ReturnReason::Hook)
        .await
        .unwrap();
    assert_eq!(
        out,
        DetachOutcome::Returned {
            devices: vec!["eth1".into(), "eth2".into()],
            name_busy: vec![]
        }
    );
    assert_all_home(&k, 2);
    assert!(k.pins().is_empty());
    let rec = e.pod_record(&pod_key(UID, "sb-a")).unwrap();
    assert_eq!(rec.phase, PodPhase::Returned(ReturnReason::Hook));
    // StopPodSandbox again: already home, nothing moves.
    let again = e
        .detach_sandbox(sandbox("sb-a", &path), ReturnReason::Hook)
        .await
        .unwrap();
    assert_eq!(
        again,
        DetachOutcome::AlreadyReturned {
            reason: ReturnReason::Hook
        }
    );
    assert_eq!(k.moves(), vec!["in eth1", "in eth2", "home eth1", "home eth2"]);
    // RemovePodSandbox: the record goes.
    e.forget_sandbox(sandbox("sb-a", &path)).await.unwrap();
    assert!(e.pod_record(&pod_key(UID, "sb-a")).is_none());
}

#[tokio::test]
async fn a_failed_return_keeps_the_pin_and_a_later_one_finishes() {
    let (_dir, k, e) = setup(2).await;
    let path = PathBuf::from("/run/netns/sb-a");
    k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    k.fault("eth2", Fault::DetachRefused);
    let err = e
        .detach_sandbox(sandbox("sb-a", &path), ReturnReason::Hook)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RescueError::Incomplete {
                failed: 1,
                total: 2,
                ..
            }
        ),
        "{err:?}"
    );
    let rec = e.pod_record(&pod_key(UID, "sb-a")).unwrap();
    assert_eq!(rec.devices[0].state, DeviceState::Home);
    assert_ne!(rec.devices[1].state, DeviceState::Home);
    assert_eq!(k.pins().len(), 1, "the pin stays while a device is out");
    k.clear_faults();
    e.detach_sandbox(sandbox("sb-a", &path), ReturnReason::Hook)
        .await
        .unwrap();
    assert_all_home(&k, 2);
    assert!(k.pins().is_empty());
    // eth1 was home already: moved home once.
    assert_eq!(
        k.moves().iter().filter(|m| *m == "home eth1").count(),
        1,
        "{:?}",
        k.moves()
    );
}

#[tokio::test]
async fn a_taken_host_name_brings_the_device_home_under_a_temporary_name_until_it_frees() {
    let (_dir, k, e) = setup(1).await;
    let path = PathBuf::from("/run/netns/sb-a");
    k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    // Something on the host took the name meanwhile.
    k.add_host_link("eth1", 50);
    let out = e
        .detach_sandbox(sandbox("sb-a", &path), ReturnReason::Hook)
        .await
        .unwrap();
    assert_eq!(
        out,
        DetachOutcome::Returned {
            devices: vec![],
            name_busy: vec!["dn11".into()]
        }
    );
    let l = k.link_of(11);
    assert_eq!((l.netns, l.name.as_str()), (k.host(), "dn11"));
    let key = pod_key(UID, "sb-a");
    let rec = e.pod_record(&key).unwrap();
    assert_eq!(rec.devices[0].state, DeviceState::HomeNameBusy);
    assert_eq!(rec.devices[0].temp_name.as_deref(), Some("dn11"));
    // The record stays while the device waits for its name, even past RemovePodSandbox.
    e.forget_sandbox(sandbox("sb-a", &path)).await.unwrap();
    assert!(e.pod_record(&key).is_some());
    // Still taken: nothing changes.
    e.rename_home(&owner(), &key, "dev-eth1").await.unwrap();
    assert_eq!(k.link_of(11).name, "dn11");
    // The squatter goes: the device gets its name back, and the record ends (its netns is gone).
    k.w().links.retain(|l| l.ifindex != 50);
    k.remove_sandbox_path(&path);
    e.rename_home(&owner(), &key, "dev-eth1").await.unwrap();
    assert_all_home(&k, 1);
    assert!(e.pod_record(&key).is_none());
}

/// kubelet re-creates the sandbox (same pod UID, new sandbox id and netns, no new Prepare): the
/// devices come home from the old sandbox first, then go into the new one.
#[tokio::test]
async fn a_new_sandbox_of_the_same_pod_takes_the_devices_from_the_old_one() {
    let (_dir, k, e) = setup(2).await;
    let (old, new) = (PathBuf::from("/run/netns/sb-a"), PathBuf::from("/run/netns/sb-b"));
    k.add_sandbox(&old);
    let ns_b = k.add_sandbox(&new);
    e.attach_pod(pod("sb-a"), &old).await.unwrap();
    let out = e.attach_pod(pod("sb-b"), &new).await.unwrap();
    assert!(matches!(out, AttachOutcome::Attached { .. }), "{out:?}");
    for i in 1..=2 {
        let l = k.link_of(10 + i);
        assert_eq!((l.netns, l.name), (ns_b, format!("net{i}")));
    }
    let a = e.pod_record(&pod_key(UID, "sb-a")).unwrap();
    assert_eq!(a.phase, PodPhase::Returned(ReturnReason::Replaced));
    assert!(!a.has_devices_out());
    let b = e.pod_record(&pod_key(UID, "sb-b")).unwrap();
    assert_eq!(b.phase, PodPhase::Attached);
    assert_eq!(k.pins(), vec![e.state_dir().join("pins/sb-b")]);
    assert_eq!(
        k.moves(),
        vec![
            "in eth1",
            "in eth2",
            "home eth1",
            "home eth2",
            "in eth1",
            "in eth2"
        ]
    );
    // The old sandbox's late StopPodSandbox touches nothing of the new one.
    let late = e
        .detach_sandbox(sandbox("sb-a", &old), ReturnReason::Hook)
        .await
        .unwrap();
    assert!(matches!(late, DetachOutcome::AlreadyReturned { .. }), "{late:?}");
    assert_eq!(k.link_of(11).netns, ns_b);
}

/// Another pod's plan naming a device this pod holds is refused, and nothing moves.
#[tokio::test]
async fn a_device_held_by_another_pod_is_refused() {
    let (_dir, k, e) = setup(1).await;
    let path = PathBuf::from("/run/netns/sb-a");
    k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    let other = "1f0e0d0c-0b0a-4909-8807-060504030201";
    e.set_plan(PodPlan {
        pod_uid: other.into(),
        pod_namespace: "ns".into(),
        pod_name: "q".into(),
        devices: vec![device("eth1", Some("net1"))],
    })
    .unwrap();
    let path_q = PathBuf::from("/run/netns/sb-q");
    k.add_sandbox(&path_q);
    let q = PodRef::parse(other, "sb-q", "ns", "q").unwrap();
    let err = e.attach_pod(q, &path_q).await.unwrap_err();
    assert!(matches!(err, RescueError::DeviceBusy { .. }), "{err:?}");
    assert_eq!(k.moves(), vec!["in eth1"]);
}

/// A restart finds a record whose sandbox the runtime tore down while dranet was away (the pin
/// kept the netns and the devices in it), a pin file with nothing mounted, and a second pin of
/// the same netns: the devices come home, the record and every pin go.
#[tokio::test]
async fn reconcile_after_a_restart_returns_a_torn_down_sandbox_and_releases_stray_pins() {
    let (dir, k, e) = setup(2).await;
    let path = PathBuf::from("/run/netns/sb-a");
    let ns = k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    let pins = e.state_dir().join("pins");
    e.durable().await.unwrap();
    drop(e);
    // While dranet is down: the runtime tears the sandbox down; stray pins appear.
    k.remove_sandbox_path(&path);
    k.w().pins.insert(pins.join("empty"), None);
    k.w().pins.insert(pins.join("second"), Some(ns));
    let e = engine(&dir, &k).await;
    let report = e.reconcile().await.unwrap();
    let key = pod_key(UID, "sb-a");
    assert_eq!(report.returned, vec![key.to_string()], "{report:?}");
    assert_eq!(report.stray_pins, 2, "{report:?}");
    assert!(
        report.failed.is_empty() && report.adopted.is_empty(),
        "{report:?}"
    );
    assert_all_home(&k, 2);
    assert!(k.pins().is_empty(), "pins left: {:?}", k.pins());
    // The sandbox's netns is gone: its record ends with the return.
    assert!(e.pod_record(&key).is_none());
}

/// A restart that finds the sandbox still running re-adopts it: nothing moves, the pin stays,
/// and the next StopPodSandbox brings the devices home through it.
#[tokio::test]
async fn reconcile_after_a_restart_readopts_a_running_sandbox() {
    let (dir, k, e) = setup(1).await;
    // The re-adoption checks that the runtime's path is still there on the filesystem.
    let path = dir.0.join("netns-sb-a");
    std::fs::write(&path, "").unwrap();
    k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    e.durable().await.unwrap();
    drop(e);
    let e = engine(&dir, &k).await;
    let report = e.reconcile().await.unwrap();
    let key = pod_key(UID, "sb-a");
    assert_eq!(report.adopted, vec![key.to_string()], "{report:?}");
    assert_eq!(k.moves(), vec!["in eth1"]);
    assert_eq!(k.pins().len(), 1);
    e.detach_sandbox(sandbox("sb-a", &path), ReturnReason::Hook)
        .await
        .unwrap();
    assert_all_home(&k, 1);
    assert!(k.pins().is_empty());
}

/// The netns teardown signal (a probe event) brings every device home without a hook, from the
/// rescue path (moves sent over the pod's netlink, `Returning` only staged); the sandbox can
/// never run again, so its record ends with it.
#[tokio::test]
async fn a_rescue_at_netns_teardown_brings_every_device_home_and_ends_the_record() {
    let (_dir, k, e) = setup(2).await;
    let path = PathBuf::from("/run/netns/sb-a");
    k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    k.remove_sandbox_path(&path);
    let key = pod_key(UID, "sb-a");
    e.act(Action::Rescue {
        owner: owner(),
        key: key.clone(),
        trigger: RescueTrigger::NetnsUnmounted,
        at: crate::watch::mono_now(),
    })
    .await;
    assert_all_home(&k, 2);
    assert!(k.pins().is_empty());
    assert!(e.pod_record(&key).is_none());
    let t = e.last_rescue().unwrap();
    assert!(t.ok && t.first_move_ns.is_some(), "{t:?}");
    // The same teardown signalled again (unlink after umount) finds nothing to do.
    e.act(Action::Rescue {
        owner: owner(),
        key,
        trigger: RescueTrigger::NetnsUnlinked,
        at: crate::watch::mono_now(),
    })
    .await;
    assert_eq!(k.moves().len(), 4, "{:?}", k.moves());
}

/// A device deleted while in the pod (a VF destroyed, a veth deleted) is found neither in the
/// pod nor in the host: it is judged gone, and the return of the others finishes.
#[tokio::test]
async fn a_device_deleted_in_the_pod_is_judged_gone_and_the_return_finishes() {
    let (_dir, k, e) = setup(2).await;
    let path = PathBuf::from("/run/netns/sb-a");
    k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    let gone = k.link_of(12).mac;
    k.w().links.retain(|l| l.mac != gone);
    let out = e
        .detach_sandbox(sandbox("sb-a", &path), ReturnReason::Hook)
        .await
        .unwrap();
    assert_eq!(
        out,
        DetachOutcome::Returned {
            devices: vec!["eth1".into()],
            name_busy: vec![]
        }
    );
    let rec = e.pod_record(&pod_key(UID, "sb-a")).unwrap();
    assert_eq!(rec.phase, PodPhase::Returned(ReturnReason::Hook));
    assert_eq!(rec.devices[1].state, DeviceState::Gone);
    assert!(k.pins().is_empty());
}

/// Issue 38, a device that vanished while dranet was down (the soak's squatter bug 2): the pod
/// held the device, a host link took its host name, the tenant deleted the device in the pod,
/// and the runtime tore the sandbox down while dranet was killed. The restart's reconcile ends
/// the record, releases the pin and reports the device once on the activity feed (subscribed
/// before the reconcile, as `dranet run` does); the host link that has the device's name is
/// neither moved, renamed nor reconfigured.
#[tokio::test]
async fn a_device_deleted_while_dranet_was_down_ends_at_the_restart_and_its_name_squatter_stays() {
    let (dir, k, e) = setup(1).await;
    let path = PathBuf::from("/run/netns/sb-a");
    k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    k.add_host_link("eth1", 40);
    let squatter = k.link_of(40);
    let gone = k.link_of(11).mac;
    k.w().links.retain(|l| l.mac != gone);
    e.durable().await.unwrap();
    drop(e);
    k.remove_sandbox_path(&path);
    let e = engine(&dir, &k).await;
    let mut feed = e.activity();
    let report = e.reconcile().await.unwrap();
    let key = pod_key(UID, "sb-a");
    assert_eq!(report.returned, vec![key.to_string()], "{report:?}");
    assert!(e.pod_record(&key).is_none(), "the record stayed");
    assert!(k.pins().is_empty(), "pins left: {:?}", k.pins());
    assert_eq!(
        k.link_of(40),
        squatter,
        "the host link with the device's name was touched"
    );
    assert_eq!(k.moves(), vec!["in eth1"]);
    let mut vanished = 0;
    while let Ok(a) = feed.try_recv() {
        if let super::activity::ActivityKind::Vanished {
            device, host_name, ..
        } = a.kind
        {
            assert_eq!((device.as_str(), host_name.as_str()), ("dev-eth1", "eth1"));
            vanished += 1;
        }
    }
    assert_eq!(vanished, 1, "reported once");
}

/// The vanished devices reported in `feed` since it was last read: (device, record).
fn vanished_in(
    feed: &mut tokio::sync::broadcast::Receiver<super::activity::Activity>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while let Ok(a) = feed.try_recv() {
        if let super::activity::ActivityKind::Vanished { device, record, .. } = a.kind {
            out.push((device, record));
        }
    }
    out
}

/// With a reporter that confirms (`dranet run`): a device found gone is on disk `gone` and
/// unreported before its report goes out, and its record stays until the confirmation. Killed
/// before it came, the restart sends the report again (once); confirmed, the record ends, and the
/// next restart sends nothing.
#[tokio::test]
async fn a_vanished_devices_report_is_sent_again_until_confirmed_then_never() {
    let (dir, k, e) = setup(1).await;
    let path = PathBuf::from("/run/netns/sb-a");
    k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    let gone = k.link_of(11).mac;
    k.w().links.retain(|l| l.mac != gone);
    e.durable().await.unwrap();
    drop(e);
    k.remove_sandbox_path(&path);
    let key = pod_key(UID, "sb-a");
    let want = vec![("dev-eth1".to_owned(), key.to_string())];
    // First start: judged gone, reported, not confirmed (killed before the reporter's answer).
    let e = engine(&dir, &k).await;
    e.report_vanished_with_acks();
    let mut feed = e.activity();
    e.reconcile().await.unwrap();
    assert_eq!(vanished_in(&mut feed), want);
    let rec = e
        .pod_record(&key)
        .expect("the record ended before the report was confirmed");
    assert!(rec.devices[0].vanish_unreported && rec.devices[0].state == DeviceState::Gone);
    e.durable().await.unwrap();
    drop(e);
    // Second start: the same report again, once; confirmed, the record ends.
    let e = engine(&dir, &k).await;
    e.report_vanished_with_acks();
    let mut feed = e.activity();
    e.reconcile().await.unwrap();
    assert_eq!(vanished_in(&mut feed), want, "not sent again exactly once");
    assert!(e.pod_record(&key).is_some());
    e.vanish_reported(UID, &key, "dev-eth1").await;
    assert!(
        e.pod_record(&key).is_none(),
        "the record stayed after the confirmation"
    );
    e.durable().await.unwrap();
    drop(e);
    // Third start: nothing left to report.
    let e = engine(&dir, &k).await;
    e.report_vanished_with_acks();
    let mut feed = e.activity();
    e.reconcile().await.unwrap();
    assert_eq!(vanished_in(&mut feed), Vec::new());
    assert!(k.pins().is_empty(), "pins left: {:?}", k.pins());
}

/// The kernel returned a device to the host by itself (its netns died under a pin released by
/// hand): the engine restores it there, and with every device home the return finishes.
#[tokio::test]
async fn a_device_the_kernel_returned_is_restored_in_the_host() {
    let (_dir, k, e) = setup(1).await;
    let path = PathBuf::from("/run/netns/sb-a");
    k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    {
        let mut w = k.w();
        let host = w.host();
        let l = w
            .links
            .iter_mut()
            .find(|l| l.ifindex == 11 && l.netns != host)
            .unwrap();
        (l.netns, l.ifindex, l.name, l.up) = (host, 99, "dev99".into(), false);
    }
    let key = pod_key(UID, "sb-a");
    e.repair(&owner(), &key, "dev-eth1", 99).await.unwrap();
    let l = k.link_of(11);
    assert_eq!((l.netns, l.name.as_str(), l.up), (k.host(), "eth1", true));
    let rec = e.pod_record(&key).unwrap();
    assert_eq!(rec.devices[0].state, DeviceState::Home);
    assert_eq!(rec.phase, PodPhase::Returned(ReturnReason::NetnsTeardown));
    assert!(k.pins().is_empty());
    assert_eq!(e.counters().repaired_devices, 1);
}

/// Synchronize (NRI's list of the sandboxes the runtime has) without the sandbox: its devices
/// come home and its record goes.
#[tokio::test]
async fn synchronize_returns_and_drops_a_sandbox_the_runtime_no_longer_has() {
    let (_dir, k, e) = setup(1).await;
    let path = PathBuf::from("/run/netns/sb-a");
    k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    let report = e.synchronize(&[]).await;
    let key = pod_key(UID, "sb-a").to_string();
    assert_eq!(report.returned, vec![key.clone()], "{report:?}");
    assert_eq!(report.dropped, vec![key], "{report:?}");
    assert_all_home(&k, 1);
    assert!(k.pins().is_empty());
}

/// A sandbox "netns" that is the host's own is refused before anything is written or moved.
#[tokio::test]
async fn the_host_netns_is_refused_as_a_sandbox_netns() {
    let (_dir, k, e) = setup(1).await;
    let path = PathBuf::from("/run/netns/sb-a");
    let host = k.host();
    k.w().paths.insert(path.clone(), host);
    let err = e.attach_pod(pod("sb-a"), &path).await.unwrap_err();
    assert!(matches!(err, RescueError::HostNetns { .. }), "{err:?}");
    assert!(k.moves().is_empty());
    assert!(e.pod_record(&pod_key(UID, "sb-a")).is_none());
}

/// Uninstall: release-all brings every device home, removes every pin and record, and every
/// attach after it is refused.
#[tokio::test]
async fn release_all_brings_everything_home_and_refuses_later_attaches() {
    let (_dir, k, e) = setup(2).await;
    let path = PathBuf::from("/run/netns/sb-a");
    k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    e.stop_attaching();
    let report = e.release_all().await.unwrap();
    assert_eq!(
        report.returned,
        vec![pod_key(UID, "sb-a").to_string()],
        "{report:?}"
    );
    assert_eq!(report.dropped, 1, "{report:?}");
    assert_all_home(&k, 2);
    assert!(k.pins().is_empty());
    assert!(e.pod_record(&pod_key(UID, "sb-a")).is_none());
    let path_b = PathBuf::from("/run/netns/sb-b");
    k.add_sandbox(&path_b);
    let err = e.attach_pod(pod("sb-b"), &path_b).await.unwrap_err();
    assert!(matches!(err, RescueError::Uninstalling { .. }), "{err:?}");
}

/// A format-1 record (no sandbox id) that a running sandbox owns is named by it, re-keyed under
/// the sandbox's key; but never over a record that key already has: the re-key is refused
/// (Synchronize logs it) and the sandbox's own record stays as it was (the format-1 one, its
/// devices all home and its key unknown to the runtime, is then dropped). Before, the re-key put
/// the format-1 record in the place of the sandbox's own: a record of devices all home replaced
/// one of devices in the pod, whose teardown then left them there.
#[tokio::test]
async fn naming_a_format1_record_never_replaces_the_record_its_sandbox_has() {
    let (_dir, k, e) = setup(1).await;
    let path = PathBuf::from("/run/netns/sb-a");
    let ns = k.add_sandbox(&path);
    e.attach_pod(pod("sb-a"), &path).await.unwrap();
    let key = pod_key(UID, "sb-a");
    let own = e.pod_record(&key).unwrap();
    let mut legacy = own.clone();
    legacy.sandbox_id = String::new();
    legacy.phase = PodPhase::Returned(ReturnReason::Hook);
    legacy.pin = None;
    legacy.devices.iter_mut().for_each(|d| {
        d.state = DeviceState::Home;
        d.at = None;
    });
    e.cp().pods.insert(legacy.key(), legacy.clone().into());
    let sb = super::SandboxInfo::parse(UID, "sb-a", Some(path.clone()), "ns".into(), "p".into()).unwrap();
    let report = e.synchronize(std::slice::from_ref(&sb)).await;
    assert_eq!(
        e.pod_record(&key).as_ref(),
        Some(&own),
        "the sandbox's own record was replaced"
    );
    assert_eq!(report.dropped, vec![legacy.key().to_string()], "{report:?}");
    assert!(
        report.returned.is_empty() && report.failed.is_empty(),
        "{report:?}"
    );
    // Its teardown still brings the device home.
    assert_eq!(k.link_of(11).netns, ns);
    e.detach_sandbox(sandbox("sb-a", &path), ReturnReason::Hook)
        .await
        .unwrap();
    assert_all_home(&k, 1);
}
