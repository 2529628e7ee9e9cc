//! Loading the eBPF object and attaching its programs, tier by tier, by capability detection.
//!
//! Every probe is tried on its own: one that the kernel cannot run is reported `unsupported`
//! (with the reason) or `failed` (with the error) and never stops the others.

use std::fmt;
use std::io;
use std::path::Path;

use aya::programs::{BtfTracePoint, FEntry, Lsm, ProgramError, TracePoint};
use aya::{Btf as AyaBtf, Ebpf, EbpfLoader};
use dranet_common::Config;
use serde::Serialize;

pub mod btf;
pub mod maps;

use btf::Btf;

/// The eBPF object built by `cargo xtask build-ebpf`, embedded at build time (feature `ebpf`,
/// on by default; a build without it runs on rtnetlink + inotify only).
#[cfg(feature = "ebpf")]
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("DRANET_EBPF_OBJECT"));

/// The embedded eBPF object, `None` in a build without the `ebpf` feature.
#[must_use]
pub fn object() -> Option<&'static [u8]> {
    #[cfg(feature = "ebpf")]
    {
        Some(EBPF_OBJECT)
    }
    #[cfg(not(feature = "ebpf"))]
    {
        None
    }
}

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("loading the eBPF object (maps); needs root, or CAP_BPF + CAP_PERFMON")]
    Load {
        #[source]
        source: aya::EbpfError,
    },
}

/// Probe tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Tier {
    /// tracepoint / raw_tp / tp_btf: loads without BPF trampolines.
    A,
    /// fentry / lsm: needs BPF trampolines.
    B,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::A => "A",
            Tier::B => "B",
        })
    }
}

/// Outcome of trying one probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "reason", rename_all = "snake_case")]
pub enum ProbeState {
    Active,
    /// The kernel lacks what the probe needs (trampolines, a symbol, BTF, tracefs, bpf LSM).
    Unsupported(String),
    /// Something unexpected went wrong.
    Failed(String),
}

/// Status of one probe (one or more programs that belong together).
#[derive(Clone, Debug, Serialize)]
pub struct ProbeStatus {
    pub name: &'static str,
    pub tier: Tier,
    /// What it reports.
    pub what: &'static str,
    #[serde(flatten)]
    pub state: ProbeState,
}

impl fmt::Display for ProbeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (state, reason) = match &self.state {
            ProbeState::Active => ("active", None),
            ProbeState::Unsupported(r) => ("unsupported", Some(r)),
            ProbeState::Failed(e) => ("FAILED", Some(e)),
        };
        write!(
            f,
            "tier {}  {:<19} {:<12} {}",
            self.tier, self.name, state, self.what
        )?;
        if let Some(r) = reason {
            write!(f, "\n{:>36}{r}", "")?;
        }
        Ok(())
    }
}

/// Kind of program, with its attach target.
enum Prog {
    Tracepoint(&'static str, &'static str),
    TpBtf(&'static str),
    FEntry(&'static str),
    Lsm(&'static str),
}

/// A probe: programs loaded and attached together, or not at all.
struct ProbeDef {
    name: &'static str,
    tier: Tier,
    what: &'static str,
    programs: &'static [(&'static str, Prog)],
}

const PROBES: &[ProbeDef] = &[
    ProbeDef {
        name: "umount",
        tier: Tier::A,
        what: "umount2 of watched netns paths (tracepoint syscalls)",
        programs: &[
            (
                "dranet_enter_umount",
                Prog::Tracepoint("syscalls", "sys_enter_umount"),
            ),
            (
                "dranet_exit_umount",
                Prog::Tracepoint("syscalls", "sys_exit_umount"),
            ),
        ],
    },
    ProbeDef {
        name: "unlink",
        tier: Tier::A,
        what: "unlink/unlinkat of watched netns paths (tracepoint syscalls)",
        programs: &[
            (
                "dranet_enter_unlink",
                Prog::Tracepoint("syscalls", "sys_enter_unlink"),
            ),
            (
                "dranet_exit_unlink",
                Prog::Tracepoint("syscalls", "sys_exit_unlink"),
            ),
            (
                "dranet_enter_unlinkat",
                Prog::Tracepoint("syscalls", "sys_enter_unlinkat"),
            ),
            (
                "dranet_exit_unlinkat",
                Prog::Tracepoint("syscalls", "sys_exit_unlinkat"),
            ),
        ],
    },
    ProbeDef {
        name: "netns_cleanup",
        tier: Tier::A,
        what: "cleanup_net queued/start/end (tp_btf workqueue)",
        programs: &[
            ("dranet_wq_queue", Prog::TpBtf("workqueue_queue_work")),
            ("dranet_wq_start", Prog::TpBtf("workqueue_execute_start")),
            ("dranet_wq_end", Prog::TpBtf("workqueue_execute_end")),
        ],
    },
    ProbeDef {
        name: "dev_netns_move",
        tier: Tier::B,
        what: "device netns moves (fentry __dev_change_net_namespace)",
        programs: &[("dranet_dev_netns", Prog::FEntry("__dev_change_net_namespace"))],
    },
    // Kernels without __dev_change_net_namespace (≤ 5.10, e.g. Debian 11): the move is
    // dev_change_net_namespace itself (out of line there; an inline wrapper from 5.15 on).
    ProbeDef {
        name: "dev_netns_move_legacy",
        tier: Tier::B,
        what: "device netns moves (fentry dev_change_net_namespace; kernels without __dev_change_net_namespace)",
        programs: &[(
            "dranet_dev_netns_legacy",
            Prog::FEntry("dev_change_net_namespace"),
        )],
    },
    ProbeDef {
        name: "netns_put",
        tier: Tier::B,
        what: "netns last reference dropped, with identity (fentry __put_net)",
        programs: &[("dranet_put_net", Prog::FEntry("__put_net"))],
    },
    // The nsfs path (`ip netns del`, a runtime unmounting its bind mount): nsfs_evict ->
    // netns_put -> put_net, where the compiler may inline __put_net into netns_put (both live in
    // net_namespace.c; seen on Debian 6.1, where fentry __put_net never fires on this path).
    // netns_put is only reached through proc_ns_operations, so it is never inlined; the program
    // reports the put that drops the last reference (refcount 1 at entry). When __put_net also
    // fires for the same netns, user space drops the duplicate by cookie.
    ProbeDef {
        name: "netns_put_nsfs",
        tier: Tier::B,
        what: "netns last reference dropped by nsfs (fentry netns_put)",
        programs: &[("dranet_nsfs_put", Prog::FEntry("netns_put"))],
    },
    ProbeDef {
        name: "nsfs_umount",
        tier: Tier::B,
        what: "nsfs bind mount unmounted, with inode (lsm/sb_umount)",
        programs: &[("dranet_lsm_sb_umount", Prog::Lsm("sb_umount"))],
    },
    ProbeDef {
        name: "nsfs_umount_fentry",
        tier: Tier::B,
        what: "nsfs bind mount unmounted, with inode (fentry security_sb_umount; when bpf LSM is off)",
        programs: &[("dranet_fentry_sb_umount", Prog::FEntry("security_sb_umount"))],
    },
];

/// Resolves the kernel facts the programs need, from BTF and kallsyms.
#[must_use]
pub fn kernel_config(btf: Option<&Btf>, trace_all: bool) -> Config {
    let mut cfg = Config::empty();
    cfg.trace_all = u32::from(trace_all);
    cfg.cleanup_net_addr = kallsyms_addr("cleanup_net").unwrap_or(0);
    let Some(btf) = btf else {
        return cfg;
    };
    let off = |s: &str, m: &str| btf.offset(s, m).unwrap_or(Config::MISSING);
    cfg.work_func = off("work_struct", "func");
    cfg.net_inum = off("net", "ns.inum");
    cfg.net_cookie = off("net", "net_cookie");
    cfg.net_ns = off("net", "ns");
    cfg.ns_common_inum = off("ns_common", "inum");
    cfg.ns_common_count = btf
        .offset("ns_common", "count")
        .or_else(|| btf.offset("ns_common", "__ns_ref"))
        .unwrap_or(Config::MISSING);
    cfg.net_count = off("net", "count");
    cfg.dev_ifindex = off("net_device", "ifindex");
    cfg.dev_name = off("net_device", "name");
    cfg.dev_nd_net = off("net_device", "nd_net.net");
    cfg.mnt_root = off("vfsmount", "mnt_root");
    cfg.mnt_sb = off("vfsmount", "mnt_sb");
    cfg.sb_magic = off("super_block", "s_magic");
    cfg.dentry_inode = off("dentry", "d_inode");
    cfg.inode_ino = off("inode", "i_ino");
    cfg.inode_private = off("inode", "i_private");
    cfg
}

/// Address of a text symbol in /proc/kallsyms (0 means hidden by kptr_restrict). Read a line at
/// a time: the file is several MiB, and the daemon's peak heap should not hold it.
fn kallsyms_addr(symbol: &str) -> Option<u64> {
    use std::io::BufRead;
    let file = std::fs::File::open("/proc/kallsyms").ok()?;
    let mut reader = std::io::BufReader::with_capacity(64 * 1024, file);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let mut it = line.split_ascii_whitespace();
        let (Some(addr), Some(ty), Some(name)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if name != symbol || !matches!(ty, "t" | "T") || it.next().is_some() {
            continue;
        }
        if let Some(a) = u64::from_str_radix(addr, 16).ok().filter(|a| *a != 0) {
            return Some(a);
        }
    }
}

/// Mounts tracefs if the syscall tracepoints need it and it is not there.
fn ensure_tracefs() -> Result<(), String> {
    if Path::new("/sys/kernel/tracing/events").is_dir()
        || Path::new("/sys/kernel/debug/tracing/events").is_dir()
    {
        return Ok(());
    }
    nix::mount::mount(
        Some("tracefs"),
        "/sys/kernel/tracing",
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| format!("tracefs is not mounted and mounting it failed: {e}"))
}

/// Is the BPF LSM active (`bpf` in /sys/kernel/security/lsm)?
fn bpf_lsm_active() -> Result<bool, String> {
    let path = Path::new("/sys/kernel/security/lsm");
    if !path.exists() {
        let _ = nix::mount::mount(
            Some("securityfs"),
            "/sys/kernel/security",
            Some("securityfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        );
    }
    std::fs::read_to_string(path)
        .map(|s| s.trim().split(',').any(|l| l == "bpf"))
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// The loaded object and the status of every probe.
pub struct Loaded {
    pub ebpf: Ebpf,
    pub status: Vec<ProbeStatus>,
}

/// Loads the object (maps + globals) and tries every probe (`netns_cleanup` only with
/// `cleanup`). Fails only if the object itself cannot be loaded (no privileges, no BPF at all).
pub fn load(object: &[u8], trace_all: bool, cleanup: bool) -> Result<Loaded, ProbeError> {
    let own_btf = Btf::from_sys_fs().ok();
    let aya_btf = AyaBtf::from_sys_fs().ok();
    let cfg = kernel_config(own_btf.as_ref(), trace_all);
    let ebpf = EbpfLoader::new()
        .btf(aya_btf.as_ref())
        .override_global("CONFIG", &cfg, true)
        .load(object)
        .map_err(|source| ProbeError::Load { source })?;
    let mut loaded = Loaded {
        ebpf,
        status: Vec::new(),
    };
    let tracefs = ensure_tracefs();
    let lsm = bpf_lsm_active();
    let mut nsfs_lsm_active = false;
    let mut dev_move_active = false;
    for def in PROBES {
        let state = if def.name == "netns_cleanup" && !cleanup {
            ProbeState::Unsupported(
                "off: only `dranet trace` uses it (it runs on every workqueue item)".into(),
            )
        } else if def.name == "nsfs_umount_fentry" && nsfs_lsm_active {
            ProbeState::Unsupported("not needed: lsm/sb_umount is active".into())
        } else if def.name == "dev_netns_move_legacy" && dev_move_active {
            ProbeState::Unsupported("not needed: fentry __dev_change_net_namespace is active".into())
        } else {
            let pre = precheck(def, &cfg, own_btf.as_ref(), aya_btf.as_ref(), &tracefs, &lsm);
            match pre {
                Some(state) => state,
                None => attach_all(&mut loaded.ebpf, def, aya_btf.as_ref()),
            }
        };
        if def.name == "nsfs_umount" && state == ProbeState::Active {
            nsfs_lsm_active = true;
        }
        if def.name == "dev_netns_move" && state == ProbeState::Active {
            dev_move_active = true;
        }
        loaded.status.push(ProbeStatus {
            name: def.name,
            tier: def.tier,
            what: def.what,
            state,
        });
    }
    Ok(loaded)
}

/// Reasons a probe cannot run here, found before trying the kernel.
fn precheck(
    def: &ProbeDef,
    cfg: &Config,
    btf: Option<&Btf>,
    aya_btf: Option<&AyaBtf>,
    tracefs: &Result<(), String>,
    lsm: &Result<bool, String>,
) -> Option<ProbeState> {
    let needs_btf = def
        .programs
        .iter()
        .any(|(_, p)| matches!(p, Prog::TpBtf(_) | Prog::FEntry(_) | Prog::Lsm(_)));
    if needs_btf && (aya_btf.is_none() || btf.is_none()) {
        return Some(ProbeState::Unsupported(
            "no kernel BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF)".into(),
        ));
    }
    for (_, prog) in def.programs {
        match prog {
            Prog::Tracepoint(..) => {
                if let Err(e) = tracefs {
                    return Some(ProbeState::Unsupported(e.clone()));
                }
            }
            Prog::FEntry(func) => {
                if !btf.is_some_and(|b| b.has_function(func)) {
                    return Some(ProbeState::Unsupported(format!(
                        "{func} is not in kernel BTF (inlined or renamed)"
                    )));
                }
            }
            Prog::Lsm(hook) => match lsm {
                Ok(true) => {
                    if !btf.is_some_and(|b| b.has_function(&format!("bpf_lsm_{hook}"))) {
                        return Some(ProbeState::Unsupported(format!(
                            "bpf_lsm_{hook} is not in kernel BTF"
                        )));
                    }
                }
                Ok(false) => {
                    return Some(ProbeState::Unsupported(
                        "bpf LSM not active (add bpf to lsm=)".into(),
                    ));
                }
                Err(e) => return Some(ProbeState::Unsupported(e.clone())),
            },
            Prog::TpBtf(_) => {}
        }
    }
    let missing = |o: u32| o == Config::MISSING;
    let missing_offsets = match def.name {
        "netns_cleanup" if cfg.cleanup_net_addr == 0 => {
            return Some(ProbeState::Unsupported(
                "cleanup_net address not in /proc/kallsyms (kptr_restrict?)".into(),
            ));
        }
        "netns_cleanup" => missing(cfg.work_func),
        "dev_netns_move" | "dev_netns_move_legacy" => {
            missing(cfg.dev_ifindex) || missing(cfg.dev_nd_net) || missing(cfg.net_inum)
        }
        "netns_put" => missing(cfg.net_inum),
        "netns_put_nsfs" => {
            missing(cfg.net_inum)
                || missing(cfg.net_ns)
                || (missing(cfg.ns_common_count) && missing(cfg.net_count))
        }
        "nsfs_umount" | "nsfs_umount_fentry" => {
            missing(cfg.mnt_sb) || missing(cfg.sb_magic) || missing(cfg.mnt_root) || missing(cfg.inode_ino)
        }
        _ => false,
    };
    missing_offsets.then(|| ProbeState::Unsupported("needed struct offsets not found in kernel BTF".into()))
}

fn attach_all(ebpf: &mut Ebpf, def: &ProbeDef, btf: Option<&AyaBtf>) -> ProbeState {
    for (prog_name, prog) in def.programs {
        if let Err(state) = attach_one(ebpf, prog_name, prog, btf) {
            return state;
        }
    }
    ProbeState::Active
}

fn attach_one(ebpf: &mut Ebpf, prog_name: &str, prog: &Prog, btf: Option<&AyaBtf>) -> Result<(), ProbeState> {
    let Some(program) = ebpf.program_mut(prog_name) else {
        return Err(ProbeState::Failed(format!(
            "program {prog_name} missing from the object"
        )));
    };
    let classify = |e: ProgramError| classify(prog, &e);
    match prog {
        Prog::Tracepoint(category, name) => {
            let p: &mut TracePoint = program.try_into().map_err(classify)?;
            p.load().map_err(classify)?;
            p.attach(category, name).map_err(classify)?;
        }
        Prog::TpBtf(tp) => {
            let btf = btf.ok_or_else(|| ProbeState::Unsupported("no kernel BTF".into()))?;
            let p: &mut BtfTracePoint = program.try_into().map_err(classify)?;
            p.load(tp, btf).map_err(classify)?;
            p.attach().map_err(classify)?;
        }
        Prog::FEntry(func) => {
            let btf = btf.ok_or_else(|| ProbeState::Unsupported("no kernel BTF".into()))?;
            let p: &mut FEntry = program.try_into().map_err(classify)?;
            p.load(func, btf).map_err(classify)?;
            p.attach().map_err(classify)?;
        }
        Prog::Lsm(hook) => {
            let btf = btf.ok_or_else(|| ProbeState::Unsupported("no kernel BTF".into()))?;
            let p: &mut Lsm = program.try_into().map_err(classify)?;
            p.load(hook, btf).map_err(classify)?;
            p.attach().map_err(classify)?;
        }
    }
    Ok(())
}

/// Maps a program error to unsupported (the kernel lacks a capability) or failed.
fn classify(prog: &Prog, err: &ProgramError) -> ProbeState {
    let trampoline = matches!(prog, Prog::FEntry(_) | Prog::Lsm(_));
    match err {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } if trampoline && crate::sys::os::is_eperm(io_error) => {
            let log = verifier_log.to_string();
            let detail = if log.trim().is_empty() {
                "empty verifier log".to_owned()
            } else {
                log.lines().last().unwrap_or_default().to_owned()
            };
            ProbeState::Unsupported(format!(
                "kernel refuses BPF trampoline programs (EPERM at BPF_PROG_LOAD, {detail})"
            ))
        }
        ProgramError::SyscallError(e) if e.io_error.kind() == io::ErrorKind::NotFound => {
            ProbeState::Unsupported(format!("attach target not found: {e}"))
        }
        ProgramError::Btf(e) => ProbeState::Unsupported(format!("BTF: {e}")),
        other => ProbeState::Failed(other.to_string()),
    }
}

/// Status lines for when nothing could be loaded at all.
#[must_use]
pub fn all_unsupported(reason: &str) -> Vec<ProbeStatus> {
    PROBES
        .iter()
        .map(|d| ProbeStatus {
            name: d.name,
            tier: d.tier,
            what: d.what,
            state: ProbeState::Unsupported(reason.to_owned()),
        })
        .collect()
}
