//! `interface.disableEbpfPrograms: true` (fenced: touches the kernel — `bpf(2)`, bpffs and
//! rtnetlink TC messages; nothing outside this module issues a `bpf` command for it).
//!
//! As upstream dranet (`pkg/driver/ebpf.go`), in two steps:
//!
//! * **Prepare**, host netns ([`unpin_links`]): walk the bpffs (`/sys/fs/bpf`) and remove the
//!   pins of TCX, netkit and XDP links that target the device. A pinned link keeps its program
//!   attached whatever else happens to it, so the pins go first; a link held only by its pin is
//!   released (and its program detached from the host device) right away. Slow (a directory
//!   walk), hence at Prepare time.
//! * **Attach**, pod netns, right after the move ([`detach_in_pod`]): the device keeps its TCX
//!   programs when it changes netns (its clsact qdisc, with the TC filters on it, is destroyed
//!   by the move on 6.18 — observed in the tests — so the TC half finds nothing there today; it
//!   stays, as upstream has it, for whatever is on the device in the pod). Every `bpf` TC filter
//!   on its clsact ingress and egress is deleted (rtnetlink socket opened in the pod netns) and
//!   every TCX program is detached (links with `BPF_LINK_DETACH`, plain attachments with
//!   `BPF_PROG_DETACH`, on a thread inside the pod netns: the kernel resolves the ifindex in
//!   the calling thread's netns). Then nothing may remain: if something does, the attach fails
//!   and the caller rolls the device back home.
//!
//! Detached and unpinned programs are **not** re-attached when the device comes home: dranet
//! does not own them and cannot know how their owner wants them (upstream does not either).
//! Their owner (a CNI, an agent) is expected to re-attach what it needs.
//!
//! The syscalls go through [`sys`] (raw `bpf(2)`, own `#[repr(C)]` attribute structs; aya
//! 0.14 has neither link ifindexes nor TCX link ids).

pub mod pins;
pub mod sys;
pub mod tc;
pub mod tcx;

use std::path::{Path, PathBuf};

use rtnetlink::Handle;

pub use pins::{LinkKind, Unpinned, find_pinned_links, unpin_links};
pub use tc::BpfFilterGroup;
pub use tcx::TcxProgram;

use crate::sys::netns::{Netns, NetnsError};

/// Where the host's bpffs is mounted.
pub const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// The default bpffs root as a path.
#[must_use]
pub fn bpffs_root() -> &'static Path {
    Path::new(BPFFS_ROOT)
}

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("bpf {what}")]
    Syscall {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("rtnetlink {what}")]
    Tc {
        what: &'static str,
        #[source]
        source: Box<rtnetlink::Error>,
    },
    #[error("reading bpffs at {path}")]
    Walk {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("interface {ifname:?} not found in the host netns")]
    NoDevice {
        ifname: String,
        #[source]
        source: nix::Error,
    },
    #[error("removing the bpf link pin {path} (already unpinned: {})", if done.is_empty() { "none".to_owned() } else { done.join("; ") })]
    Unpin {
        path: PathBuf,
        done: Vec<String>,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("eBPF programs still attached to device {ifindex} in the pod after detaching: {}", left.join(", "))]
    Remaining {
        ifindex: u32,
        left: Vec<String>,
        #[source]
        cause: Option<Box<BpfError>>,
    },
}

/// What [`detach_in_pod`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Detached {
    pub tc_filters: Vec<BpfFilterGroup>,
    pub tcx: Vec<TcxProgram>,
}

impl Detached {
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tc_filters.is_empty() && self.tcx.is_empty()
    }

    /// One line per removed item, for logs and events.
    #[must_use]
    pub fn describe(&self) -> Vec<String> {
        self.tc_filters
            .iter()
            .map(ToString::to_string)
            .chain(self.tcx.iter().map(ToString::to_string))
            .collect()
    }
}

/// Attach time: removes every TC `bpf` filter (ingress, egress) and every TCX program of device
/// `ifindex` in `netns`, then checks that none remain. `pod` must be an rtnetlink handle whose
/// socket lives in `netns`. [`BpfError::Remaining`] when something is still attached (with
/// the first failure that explains it, if any).
pub async fn detach_in_pod(pod: &Handle, netns: &Netns, ifindex: u32) -> Result<Detached, BpfError> {
    let tc_done = tc::delete_bpf_filters(pod, ifindex).await;
    let (tcx_done, tcx_left) = crate::sys::netns::in_netns(netns, move || {
        let done = tcx::detach_all(ifindex);
        (done, tcx::programs(ifindex))
    })?;
    let tc_left = tc::bpf_groups(&tc::filters(pod, ifindex).await?);
    let tcx_left = tcx_left?;
    if tc_left.is_empty() && tcx_left.is_empty() {
        let mut out = Detached::default();
        match tc_done {
            Ok(g) => out.tc_filters = g,
            Err(e) => {
                tracing::debug!(ifindex, error = %crate::telemetry::chain(&e), "tc filter deletion reported an error, none remain")
            }
        }
        match tcx_done {
            Ok(p) => out.tcx = p,
            Err(e) => {
                tracing::debug!(ifindex, error = %crate::telemetry::chain(&e), "tcx detach reported an error, none remain")
            }
        }
        return Ok(out);
    }
    let left = tc_left
        .iter()
        .map(ToString::to_string)
        .chain(tcx_left.iter().map(ToString::to_string))
        .collect();
    Err(BpfError::Remaining {
        ifindex,
        left,
        cause: tc_done.err().or(tcx_done.err()).map(Box::new),
    })
}

/// Read-only: the TC `bpf` filters and TCX programs of device `ifindex` in `netns` (`pod` is an
/// rtnetlink handle whose socket lives there).
pub async fn attached_in(pod: &Handle, netns: &Netns, ifindex: u32) -> Result<Detached, BpfError> {
    let tcx = crate::sys::netns::in_netns(netns, move || tcx::programs(ifindex))??;
    let tc_filters = tc::bpf_groups(&tc::filters(pod, ifindex).await?);
    Ok(Detached { tc_filters, tcx })
}
