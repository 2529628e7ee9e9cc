//! The engine's seam to the kernel: every link and netns operation the engine's rules make
//! (open a netns, pin it, snapshot a device, move it in, bring it home, repair it), as one
//! narrow trait. [`SysKernel`] delegates each to `sys::link` / `sys::netns` unchanged; the unit
//! tests of the engine (`rescue::engine_tests`) put an in-memory kernel behind it instead, so
//! attach, rollback, return, re-creation and reconcile are checked without root in
//! milliseconds, beside the root tests that keep checking the real kernel.
//!
//! Handles stay the kernel's own types (`Netns`, `Pin`, `Netlink`, `PodSocket`): the engine
//! only carries them from one operation to the next. Each operation is one dynamic call (and,
//! for the async ones, one boxed future) in front of a netlink round trip or a syscall.
//!
//! Not behind the seam (the unit tests do not reach them): the RDMA moves (their own seam,
//! `sys::rdma::RdmaOps`), the watcher, the PCI rebind and the inventory scan of a pin no record
//! claims.

use std::path::{Path, PathBuf};

use futures::future::BoxFuture;

use crate::ids::PodIfindex;
use crate::sys::link::{
    self, AttachSpec, DetachRequest, LinkError, LinkSnapshot, Netlink, PodSocket, Returned,
};
use crate::sys::netns::{self, Netns, NetnsError, NetnsId, Pin};

/// One move of a device into a pod (see [`link::attach`]).
pub(crate) struct AttachRequest<'a> {
    pub host_nl: &'a Netlink,
    pub pod_nl: &'a Netlink,
    /// The pod netns (the move's target).
    pub netns: &'a Netns,
    pub snap: &'a LinkSnapshot,
    pub spec: &'a AttachSpec,
    /// The ifindex chosen for the device in the pod (written ahead).
    pub pod_ifindex: PodIfindex,
}

/// The link and netns operations of the engine.
pub(crate) trait Kernel: Send + Sync + 'static {
    /// The netns the driver runs in.
    fn host_netns(&self) -> Result<Netns, NetnsError>;
    /// The netns at `path` ([`Netns::open_path`]).
    fn open_netns(&self, path: &Path) -> Result<Netns, NetnsError>;
    /// A live netns by identity, at one of `hints` or any process's (blocking: a `/proc` scan).
    fn find_netns(&self, id: NetnsId, hints: &[&Path]) -> Option<Netns>;
    /// Pins `netns` at `<dir>/<name>` ([`Pin::create`]).
    fn create_pin(&self, netns: &Netns, dir: &Path, name: &str) -> Result<Pin, NetnsError>;
    /// Re-opens the pin at `path` ([`Pin::reopen`]).
    fn reopen_pin(&self, path: &Path) -> Result<Pin, NetnsError>;
    /// Re-opens the pin at `path`, which must hold netns `id` ([`Pin::reopen_as`]).
    fn reopen_pin_as(&self, path: &Path, id: NetnsId) -> Result<Pin, NetnsError>;
    /// Every pin path in `dir` ([`Pin::list`]).
    fn list_pins(&self, dir: &Path) -> Result<Vec<PathBuf>, NetnsError>;
    /// Releases a pin (blocking: the umount waits for an RCU grace period).
    fn release_pin(&self, pin: Pin) -> Result<(), NetnsError>;
    /// Releases a pin path that may hold nothing ([`netns::release_path`]).
    fn release_pin_path(&self, path: &Path) -> Result<(), NetnsError>;

    /// rtnetlink in the host netns ([`Netlink::host`]).
    fn host_netlink(&self) -> BoxFuture<'_, Result<Netlink, LinkError>>;
    /// rtnetlink inside `netns` ([`Netlink::in_netns`]).
    fn pod_netlink<'a>(&'a self, netns: &'a Netns) -> BoxFuture<'a, Result<Netlink, LinkError>>;
    /// rtnetlink inside `netns`, its socket kept for the return ([`Netlink::in_netns_kept`]).
    fn pod_netlink_kept<'a>(
        &'a self,
        netns: &'a Netns,
        rt: Option<&'a tokio::runtime::Handle>,
    ) -> BoxFuture<'a, Result<(Netlink, Option<PodSocket>), LinkError>>;
    /// A connection on a kept socket ([`PodSocket::connect`]).
    fn connect(&self, socket: &PodSocket, rt: Option<&tokio::runtime::Handle>) -> Result<Netlink, LinkError>;
    /// The host link named `name` ([`link::snapshot`]).
    fn snapshot<'a>(
        &'a self,
        host_nl: &'a Netlink,
        name: &'a str,
    ) -> BoxFuture<'a, Result<LinkSnapshot, LinkError>>;
    /// The ifindex of every link in `netns`, through `nl` (a connection in it).
    fn link_indexes<'a>(
        &'a self,
        nl: &'a Netlink,
        netns: &'a Netns,
    ) -> BoxFuture<'a, Result<Vec<PodIfindex>, LinkError>>;
    /// Moves a device into the pod ([`link::attach`]); its ifindex there.
    fn attach<'a>(&'a self, req: AttachRequest<'a>) -> BoxFuture<'a, Result<PodIfindex, LinkError>>;
    /// Brings a device home from `pod`, the netns `req.pod_nl` is in ([`link::detach`]).
    fn detach<'a>(
        &'a self,
        req: &'a DetachRequest<'a>,
        pod: &'a Netns,
        moved_at: &'a mut Option<crate::clock::MonoTime>,
    ) -> BoxFuture<'a, Result<Returned, LinkError>>;
    /// Finds the device of `snap` in the host by identity and restores it ([`link::find_and_repair`]).
    fn find_and_repair<'a>(
        &'a self,
        host_nl: &'a Netlink,
        snap: &'a LinkSnapshot,
    ) -> BoxFuture<'a, Result<Returned, LinkError>>;
    /// Restores the host link `index`, which must be the device of `snap` ([`link::repair`]).
    fn repair<'a>(
        &'a self,
        host_nl: &'a Netlink,
        index: u32,
        snap: &'a LinkSnapshot,
    ) -> BoxFuture<'a, Result<Returned, LinkError>>;
    /// Gives the device under `temp` its host name back if free ([`link::reclaim_name`]).
    fn reclaim_name<'a>(
        &'a self,
        host_nl: &'a Netlink,
        temp: &'a str,
        snap: &'a LinkSnapshot,
    ) -> BoxFuture<'a, Result<Option<Returned>, LinkError>>;
}

/// The kernel itself: every operation is the `sys` function of the same name.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SysKernel;

impl Kernel for SysKernel {
    fn host_netns(&self) -> Result<Netns, NetnsError> {
        Netns::host()
    }

    fn open_netns(&self, path: &Path) -> Result<Netns, NetnsError> {
        Netns::open_path(path)
    }

    fn find_netns(&self, id: NetnsId, hints: &[&Path]) -> Option<Netns> {
        netns::find_by_id(id, hints)
    }

    fn create_pin(&self, netns: &Netns, dir: &Path, name: &str) -> Result<Pin, NetnsError> {
        Pin::create(netns, dir, name)
    }

    fn reopen_pin(&self, path: &Path) -> Result<Pin, NetnsError> {
        Pin::reopen(path)
    }

    fn reopen_pin_as(&self, path: &Path, id: NetnsId) -> Result<Pin, NetnsError> {
        Pin::reopen_as(path, id)
    }

    fn list_pins(&self, dir: &Path) -> Result<Vec<PathBuf>, NetnsError> {
        Pin::list(dir)
    }

    fn release_pin(&self, pin: Pin) -> Result<(), NetnsError> {
        pin.release()
    }

    fn release_pin_path(&self, path: &Path) -> Result<(), NetnsError> {
        netns::release_path(path)
    }

    fn host_netlink(&self) -> BoxFuture<'_, Result<Netlink, LinkError>> {
        Box::pin(Netlink::host())
    }

    fn pod_netlink<'a>(&'a self, netns: &'a Netns) -> BoxFuture<'a, Result<Netlink, LinkError>> {
        Box::pin(Netlink::in_netns(netns))
    }

    fn pod_netlink_kept<'a>(
        &'a self,
        netns: &'a Netns,
        rt: Option<&'a tokio::runtime::Handle>,
    ) -> BoxFuture<'a, Result<(Netlink, Option<PodSocket>), LinkError>> {
        Box::pin(async move {
            let (nl, socket) = Netlink::in_netns_kept(netns, rt).await?;
            Ok((nl, Some(socket)))
        })
    }

    fn connect(&self, socket: &PodSocket, rt: Option<&tokio::runtime::Handle>) -> Result<Netlink, LinkError> {
        socket.connect(rt)
    }

    fn snapshot<'a>(
        &'a self,
        host_nl: &'a Netlink,
        name: &'a str,
    ) -> BoxFuture<'a, Result<LinkSnapshot, LinkError>> {
        Box::pin(link::snapshot(host_nl, name))
    }

    fn link_indexes<'a>(
        &'a self,
        nl: &'a Netlink,
        _netns: &'a Netns,
    ) -> BoxFuture<'a, Result<Vec<PodIfindex>, LinkError>> {
        Box::pin(async move {
            Ok(nl
                .links()
                .await?
                .iter()
                .map(|m| PodIfindex::new(m.header.index))
                .collect())
        })
    }

    fn attach<'a>(&'a self, req: AttachRequest<'a>) -> BoxFuture<'a, Result<PodIfindex, LinkError>> {
        Box::pin(link::attach(
            req.host_nl,
            req.pod_nl,
            req.netns,
            req.snap,
            req.spec,
            req.pod_ifindex,
        ))
    }

    fn detach<'a>(
        &'a self,
        req: &'a DetachRequest<'a>,
        _pod: &'a Netns,
        moved_at: &'a mut Option<crate::clock::MonoTime>,
    ) -> BoxFuture<'a, Result<Returned, LinkError>> {
        Box::pin(link::detach(req, moved_at))
    }

    fn find_and_repair<'a>(
        &'a self,
        host_nl: &'a Netlink,
        snap: &'a LinkSnapshot,
    ) -> BoxFuture<'a, Result<Returned, LinkError>> {
        Box::pin(link::find_and_repair(host_nl, snap))
    }

    fn repair<'a>(
        &'a self,
        host_nl: &'a Netlink,
        index: u32,
        snap: &'a LinkSnapshot,
    ) -> BoxFuture<'a, Result<Returned, LinkError>> {
        Box::pin(link::repair(host_nl, index, snap))
    }

    fn reclaim_name<'a>(
        &'a self,
        host_nl: &'a Netlink,
        temp: &'a str,
        snap: &'a LinkSnapshot,
    ) -> BoxFuture<'a, Result<Option<Returned>, LinkError>> {
        Box::pin(link::reclaim_name(host_nl, temp, snap))
    }
}
