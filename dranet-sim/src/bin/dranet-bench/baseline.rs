//! The baseline: the same device moves and restores as dranet, as a minimal direct rtnetlink
//! sequence (rtnetlink crate, no snapshot, no checkpoint, no pin, no lookups beyond what the
//! kernel needs). Per device, attach = one RTM_NEWLINK from the host (move + rename + MTU) and
//! one inside the pod (UP); detach = one RTM_NEWLINK inside the pod (move home + original name)
//! and one in the host (MTU + UP).
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};

use anyhow::{Context, Result};
use nix::sched::CloneFlags;
use rtnetlink::{Handle, LinkUnspec};

/// One device: host name, pod-side name, ifindex (the kernel keeps it across the moves: a fresh
/// netns has no other device with that index; the bench checks it after every round).
#[derive(Clone, Debug)]
pub struct Dev {
    pub host: String,
    pub pod: String,
    pub index: u32,
}

pub fn host_handle() -> Result<Handle> {
    let (conn, handle, _) = rtnetlink::new_connection().context("rtnetlink")?;
    tokio::spawn(conn);
    Ok(handle)
}

/// rtnetlink inside the netns of `ns`: the socket is created on a thread that joined it.
pub fn handle_in(ns: &File) -> Result<Handle> {
    let fd = ns.try_clone()?;
    let raw = std::thread::spawn(move || -> Result<i32> {
        nix::sched::setns(&fd, CloneFlags::CLONE_NEWNET).context("setns")?;
        let s = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE)?;
        s.set_non_blocking(true)?;
        Ok(s.into_raw_fd())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("netns thread panicked"))??;
    // SAFETY: `raw` is a non-blocking netlink socket just released by its owner; TokioSocket
    // takes it over and closes it on drop.
    let sock = unsafe { netlink_sys::TokioSocket::from_raw_fd(raw) };
    let (conn, handle, _) = rtnetlink::from_socket(sock);
    tokio::spawn(conn);
    Ok(handle)
}

/// Moves every device into `ns` (renamed, `mtu`), then sets it UP inside.
pub async fn attach(host: &Handle, ns: &File, devs: &[Dev], mtu: u32) -> Result<()> {
    let pod = handle_in(ns)?;
    for d in devs {
        let m = LinkUnspec::new_with_index(d.index)
            .setns_by_fd(ns.as_raw_fd())
            .name(d.pod.clone())
            .mtu(mtu)
            .build();
        host.link().set(m).execute().await.context("move into the pod")?;
        pod.link()
            .set(LinkUnspec::new_with_index(d.index).up().build())
            .execute()
            .await
            .context("up in the pod")?;
    }
    Ok(())
}

/// Brings every device home from the pod (`pod`: rtnetlink inside it) under its host name,
/// then sets `mtu` and UP in the host.
pub async fn detach(pod: &Handle, host: &Handle, host_ns: &File, devs: &[Dev], mtu: u32) -> Result<()> {
    for d in devs {
        let m = LinkUnspec::new_with_index(d.index)
            .setns_by_fd(host_ns.as_raw_fd())
            .name(d.host.clone())
            .build();
        pod.link().set(m).execute().await.context("move home")?;
        host.link()
            .set(LinkUnspec::new_with_index(d.index).mtu(mtu).up().build())
            .execute()
            .await
            .context("restore in the host")?;
    }
    Ok(())
}
