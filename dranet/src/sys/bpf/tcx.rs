//! TCX programs of a device: query and detach. `BPF_PROG_QUERY` and `BPF_PROG_DETACH` name the
//! device by ifindex, which the kernel resolves in the **calling thread's** netns, so these
//! functions are meant to run on a thread inside the device's netns
//! ([`crate::sys::netns::in_netns`]), never on a tokio worker.

use std::os::fd::AsFd;

use super::BpfError;
use super::sys::{self, BPF_TCX_EGRESS, BPF_TCX_INGRESS};

/// One TCX attachment: hook, program, and the link holding it (0: a plain `BPF_PROG_ATTACH`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcxProgram {
    pub egress: bool,
    pub prog_id: u32,
    pub link_id: u32,
}

impl std::fmt::Display for TcxProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = if self.egress { "egress" } else { "ingress" };
        if self.link_id == 0 {
            write!(f, "tcx {side} program {}", self.prog_id)
        } else {
            write!(f, "tcx {side} program {} (link {})", self.prog_id, self.link_id)
        }
    }
}

fn hooks() -> [(bool, u32); 2] {
    [(false, BPF_TCX_INGRESS), (true, BPF_TCX_EGRESS)]
}

/// Every TCX program on device `ifindex` of the calling thread's netns.
pub fn programs(ifindex: u32) -> Result<Vec<TcxProgram>, BpfError> {
    let mut out = Vec::new();
    for (egress, at) in hooks() {
        let a = sys::prog_query(ifindex, at).map_err(|source| BpfError::Syscall {
            what: "BPF_PROG_QUERY (tcx)",
            source,
        })?;
        out.extend(a.prog_ids.iter().zip(&a.link_ids).map(|(p, l)| TcxProgram {
            egress,
            prog_id: *p,
            link_id: *l,
        }));
    }
    Ok(out)
}

/// Detaches one TCX attachment: a link through `BPF_LINK_DETACH` (works whoever holds or pins
/// it), a plain attachment through `BPF_PROG_DETACH` with the program's fd. An object that
/// vanished meanwhile (`ENOENT`) counts as detached.
fn detach_one(ifindex: u32, p: &TcxProgram) -> Result<(), BpfError> {
    let gone = |e: &std::io::Error| e.raw_os_error() == Some(libc::ENOENT);
    let err = |what| move |source| BpfError::Syscall { what, source };
    if p.link_id != 0 {
        let fd = match sys::link_fd_by_id(p.link_id) {
            Ok(fd) => fd,
            Err(e) if gone(&e) => return Ok(()),
            Err(e) => return Err(err("BPF_LINK_GET_FD_BY_ID")(e)),
        };
        return sys::link_detach(fd.as_fd()).map_err(err("BPF_LINK_DETACH"));
    }
    let fd = match sys::prog_fd_by_id(p.prog_id) {
        Ok(fd) => fd,
        Err(e) if gone(&e) => return Ok(()),
        Err(e) => return Err(err("BPF_PROG_GET_FD_BY_ID")(e)),
    };
    let at = if p.egress { BPF_TCX_EGRESS } else { BPF_TCX_INGRESS };
    match sys::prog_detach(ifindex, fd.as_fd(), at) {
        Err(e) if gone(&e) => Ok(()),
        r => r.map_err(err("BPF_PROG_DETACH")),
    }
}

/// Detaches every TCX program of device `ifindex` (calling thread's netns); returns what was
/// attached. Every attachment is tried; the first failure is returned after the others.
pub fn detach_all(ifindex: u32) -> Result<Vec<TcxProgram>, BpfError> {
    let found = programs(ifindex)?;
    let mut first_err = None;
    for p in &found {
        if let Err(e) = detach_one(ifindex, p) {
            tracing::warn!(ifindex, program = %p, error = %crate::telemetry::chain(&e), "tcx detach failed");
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(found),
    }
}

/// Names of the TCX programs (ingress and egress, sorted, unique) on device `ifname` of the
/// calling thread's netns; best effort: a kernel without TCX or a device without programs has
/// none.
#[must_use]
pub fn program_names(ifname: &str) -> Vec<String> {
    use aya::programs::SchedClassifier;
    use aya::programs::tc::TcAttachType;
    let mut names: Vec<String> = Vec::new();
    for at in [TcAttachType::Ingress, TcAttachType::Egress] {
        if let Ok((_, progs)) = SchedClassifier::query_tcx(ifname, at) {
            names.extend(progs.iter().filter_map(|p| p.name_as_str().map(str::to_owned)));
        }
    }
    names.sort();
    names.dedup();
    names
}

/// Whether any `sched_cls` program is loaded on the machine (a TCX program is one); `true` when
/// the programs cannot be listed. A scan asks for TCX programs per link only when one may exist.
#[must_use]
pub fn sched_cls_loaded() -> bool {
    use aya::programs::{ProgramType, loaded_programs};
    loaded_programs().any(|p| match p {
        Ok(p) => p.program_type() == ProgramType::SchedClassifier.into(),
        Err(_) => true,
    })
}
