//! `cargo xtask vm-test [--kernel 5.10|6.1|6.12|7.3|all] [--keep]`: boots Debian kernels under qemu (TCG) with
//! three virtio-net NICs and the host's root shared read-only over 9p, runs
//! `xtask/vm/guest-test.sh` in a chroot of it, and reads the per-case verdicts off the serial log.
//!
//! Everything downloaded or built lives under `target/vm/` and is reused on the next run.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

use crate::{root, run};

pub mod apt;
pub mod initramfs;
pub mod serial;

const INIT: &str = include_str!("../../vm/init.sh");
const GUEST_TEST: &str = include_str!("../../vm/guest-test.sh");

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KernelLine {
    /// Debian 11 bullseye 5.10 (oldest BTF kernel class; LTS on deb.debian.org).
    #[value(name = "5.10")]
    V5_10,
    /// Debian 12 bookworm 6.1 (tier-B probes, NIC return).
    #[value(name = "6.1")]
    V6_1,
    /// Debian 13 trixie 6.12.
    #[value(name = "6.12")]
    V6_12,
    /// Debian trixie-backports 7.3 (also RDMA exclusive mode with rxe).
    #[value(name = "7.3")]
    V7_3,
    /// The four kernels above, oldest first, one after the other.
    #[value(name = "all")]
    All,
}

impl KernelLine {
    /// The kernels this choice stands for.
    fn expand(self) -> Vec<KernelLine> {
        match self {
            Self::All => vec![Self::V5_10, Self::V6_1, Self::V6_12, Self::V7_3],
            k => vec![k],
        }
    }
}

#[derive(Args, Debug)]
pub struct Options {
    /// Only this kernel, or `all` four (default: 6.1 then 7.3).
    #[arg(long, value_enum)]
    pub kernel: Option<KernelLine>,
    /// Keep the initramfs too (the serial log and the guest's output always stay in
    /// target/vm/run-<kernel>/ until the next run).
    #[arg(long)]
    pub keep: bool,
    /// Only download and unpack the kernel packages, then stop.
    #[arg(long)]
    pub fetch_only: bool,
    /// Seconds before a guest is killed.
    #[arg(long, default_value_t = 540)]
    pub timeout: u64,
}

struct KernelSpec {
    tag: &'static str,
    /// (archive is main|security, suite)
    suites: &'static [(bool, &'static str)],
    modules: &'static [&'static str],
    params: &'static [(&'static str, &'static str)],
    boots: &'static [Boot],
}

/// One boot of a kernel: extra kernel command line and the guest cases it runs.
struct Boot {
    /// Appended to the kernel tag for the run directory and the summary (`6.1-lsm`).
    suffix: &'static str,
    append: &'static str,
    cases: &'static str,
}

/// Every kernel boots twice: the stock LSM list (tier B falls back to fentry
/// security_sb_umount), then with the BPF LSM enabled, for `lsm/sb_umount`.
const BOOTS: &[Boot] = &[
    Boot {
        suffix: "",
        append: "",
        cases: "tiers trace nic rdma vrf",
    },
    Boot {
        suffix: "-lsm",
        append: "lsm=lockdown,capability,landlock,yama,apparmor,bpf",
        cases: "tiers lsm e2e",
    },
];

/// Modules for every kernel (virtio ones that are built in are skipped via modules.builtin).
const MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_net",
    "9pnet_virtio",
    "9p",
    "veth",
    "dummy",
    "vrf",
    "ib_core",
    "ib_uverbs",
    "rdma_rxe",
];

/// 6.1's rxe looks its crc32 shash up at run time (no modules.dep entry, and no modprobe for
/// the guest kernel): load it up front.
const MODULES_6_1: &[&str] = &[
    "virtio_pci",
    "virtio_net",
    "9pnet_virtio",
    "9p",
    "veth",
    "dummy",
    "vrf",
    "crc32_generic",
    "ib_core",
    "ib_uverbs",
    "rdma_rxe",
];

/// RDMA exclusive mode from the start (it cannot change once a netns exists).
const PARAMS: &[(&str, &str)] = &[("ib_core", "netns_mode=0")];

fn spec(k: KernelLine) -> KernelSpec {
    match k {
        KernelLine::V5_10 => KernelSpec {
            tag: "5.10",
            // Bullseye is LTS-only since 2024 and still on deb.debian.org (main and
            // debian-security); archive.debian.org is not needed (and not reachable here).
            suites: &[(false, "bullseye"), (true, "bullseye-security")],
            modules: MODULES_6_1,
            params: PARAMS,
            boots: BOOTS,
        },
        KernelLine::V6_12 => KernelSpec {
            tag: "6.12",
            suites: &[(false, "trixie"), (true, "trixie-security")],
            // Like 6.1, rxe asks for its crc32 shash at run time ("rxe_newlink: failed to add
            // eth2", ENOENT, without it in the 6.12 guest).
            modules: MODULES_6_1,
            params: PARAMS,
            boots: BOOTS,
        },
        KernelLine::V6_1 | KernelLine::All => KernelSpec {
            tag: "6.1",
            suites: &[(false, "bookworm"), (true, "bookworm-security")],
            modules: MODULES_6_1,
            params: PARAMS,
            boots: BOOTS,
        },
        KernelLine::V7_3 => KernelSpec {
            tag: "7.3",
            suites: &[(false, "trixie-backports")],
            modules: MODULES,
            params: PARAMS,
            boots: BOOTS,
        },
    }
}

/// The state of every probe `dranet trace` must report on a kernel line, with the stock LSM list
/// or with `lsm=…,bpf` (case `probe-tiers`; the daemon's /metrics must agree, `netns_cleanup`
/// aside, which only `dranet trace` loads). What decides each row, from the kernels' BTF and
/// configs:
/// * `dev_netns_move`: fentry `__dev_change_net_namespace`, absent on 5.10 (the move is
///   `dev_change_net_namespace` there, which is what `dev_netns_move_legacy` attaches to; from
///   5.15 on that is an inline wrapper, so the legacy probe stands down or finds no target).
/// * `netns_put_nsfs`: reads the netns refcount from `ns_common.count` (5.11+) or `net.count`
///   (5.10).
/// * `nsfs_umount` (`lsm/sb_umount`) needs `bpf` among the active LSMs: Debian's CONFIG_LSM
///   lists it from 6.1 on, not on 5.10 (there only the `lsm=` boot has it); where it is active,
///   `nsfs_umount_fentry` stands down.
pub fn expected_probes(tag: &str, bpf_lsm_boot: bool) -> String {
    let legacy_move = tag == "5.10";
    let lsm = bpf_lsm_boot || tag != "5.10";
    let st = |on: bool| if on { "active" } else { "unsupported" };
    [
        ("umount", st(true)),
        ("unlink", st(true)),
        ("netns_cleanup", st(true)),
        ("dev_netns_move", st(!legacy_move)),
        ("dev_netns_move_legacy", st(legacy_move)),
        ("netns_put", st(true)),
        ("netns_put_nsfs", st(true)),
        ("nsfs_umount", st(lsm)),
        ("nsfs_umount_fentry", st(!lsm)),
    ]
    .iter()
    .map(|(n, s)| format!("{n}={s}"))
    .collect::<Vec<_>>()
    .join(" ")
}

/// Built artefacts the guest runs (absolute host paths, seen at the same place in the guest).
struct Binaries {
    dranet: PathBuf,
    vm_nic: PathBuf,
    e2e: PathBuf,
    rescue: PathBuf,
}

pub fn run_vm_test(opts: &Options) -> Result<()> {
    if !crate::demo::nix_is_root() {
        bail!("vm-test needs root (apt, qemu's 9p export of /)");
    }
    let t0 = Instant::now();
    ensure_host_packages()?;
    let kernels = match opts.kernel {
        Some(k) => k.expand(),
        None => vec![KernelLine::V6_1, KernelLine::V7_3],
    };
    let vm = target_dir().join("vm");
    for k in &kernels {
        fetch_kernel(&spec(*k), &vm)?;
    }
    if opts.fetch_only {
        return Ok(());
    }
    let bins = build_binaries()?;
    let mut all_ok = true;
    let mut summary = Vec::new();
    let mut columns: Vec<Column> = Vec::new();
    for k in kernels {
        let s = spec(k);
        for boot in s.boots {
            let tag = format!("{}{}", s.tag, boot.suffix);
            let started = Instant::now();
            let mut report = run_kernel(&s, boot, &tag, &bins, opts)?;
            if let Some(why) = report.retry_because().map(str::to_owned) {
                // The guest kernel hung (TCG: both vCPUs stuck, seen once on 6.1 while the
                // trampolines were attached). Its log is kept, the hang is printed in the
                // summary, and the boot runs once more; a second hang, or any case failure,
                // fails the run.
                let kept = target_dir().join("vm").join(format!("hung-{tag}-serial.log"));
                let _ = std::fs::copy(
                    target_dir()
                        .join("vm")
                        .join(format!("run-{tag}"))
                        .join("serial.log"),
                    &kept,
                );
                println!(
                    "vm-test: {tag}: the guest kernel hung ({why}); log kept at {}; booting it once more",
                    kept.display()
                );
                summary.push(format!(
                    "WARN kernel [{tag}]: hung on the first boot ({why}); log {}",
                    kept.display()
                ));
                report = run_kernel(&s, boot, &tag, &bins, opts)?;
            }
            let took = started.elapsed();
            for c in &report.cases {
                summary.push(format!(
                    "{} {} [{tag}] {:.1}s {}",
                    c.verdict.word(),
                    c.name,
                    c.seconds,
                    c.detail
                ));
            }
            if !report.finished {
                summary.push(format!("FAIL guest [{tag}]: no VMTEST END (timeout or crash)"));
            }
            if let Some(t) = &report.kernel_trouble {
                summary.push(format!("WARN kernel [{tag}]: {t}"));
            }
            summary.push(format!("kernel {tag} took {:.0}s", took.as_secs_f64()));
            all_ok &= report.ok();
            columns.push(Column {
                tag,
                cases: report.cases.clone(),
                finished: report.finished,
                seconds: took.as_secs_f64(),
            });
        }
    }
    println!("vm-test summary ({:.0}s total):", t0.elapsed().as_secs_f64());
    for l in &summary {
        println!("  {l}");
    }
    print!("{}", matrix_table(&columns));
    if !all_ok {
        bail!("vm-test failed");
    }
    Ok(())
}

/// One boot's results, a column of the matrix table.
struct Column {
    tag: String,
    cases: Vec<serial::Case>,
    finished: bool,
    seconds: f64,
}

/// The matrix: one row per case (in the order first seen), one column per boot, each cell the
/// verdict (`-` where the boot does not run the case); then every KNOWN case with its reason,
/// so no case that cannot run on a kernel goes unexplained; then the boot times.
fn matrix_table(cols: &[Column]) -> String {
    let mut rows: Vec<&str> = Vec::new();
    for c in cols {
        for case in &c.cases {
            if case.verdict != serial::Verdict::NotDone && !rows.contains(&case.name.as_str()) {
                rows.push(&case.name);
            }
        }
    }
    let w = rows.iter().map(|r| r.len()).max().unwrap_or(4).max(4);
    let cw: Vec<usize> = cols.iter().map(|c| c.tag.len().max(7)).collect();
    let mut out = format!("vm-test matrix:\n  {:<w$}", "case");
    for (c, cw) in cols.iter().zip(&cw) {
        out.push_str(&format!(" {:<cw$}", c.tag));
    }
    out.push('\n');
    for r in &rows {
        out.push_str(&format!("  {r:<w$}"));
        for (c, cw) in cols.iter().zip(&cw) {
            let cell = c
                .cases
                .iter()
                .filter(|x| x.name == *r)
                .map(|x| x.verdict.word())
                .collect::<Vec<_>>()
                .join("/");
            let cell = if cell.is_empty() { "-".to_owned() } else { cell };
            out.push_str(&format!(" {cell:<cw$}"));
        }
        out.push('\n');
    }
    out.push_str(&format!("  {:<w$}", "(finished)"));
    for (c, cw) in cols.iter().zip(&cw) {
        out.push_str(&format!(" {:<cw$}", if c.finished { "yes" } else { "NO" }));
    }
    out.push('\n');
    out.push_str(&format!("  {:<w$}", "(seconds)"));
    for (c, cw) in cols.iter().zip(&cw) {
        out.push_str(&format!(" {:<cw$.0}", c.seconds));
    }
    out.push('\n');
    for c in cols {
        for case in c.cases.iter().filter(|x| x.verdict == serial::Verdict::Known) {
            out.push_str(&format!("  KNOWN {} [{}]: {}\n", case.name, c.tag, case.detail));
        }
    }
    out
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from)
}

/// qemu and busybox-static from Debian, if missing.
fn ensure_host_packages() -> Result<()> {
    let have = |p: &str| {
        Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", p])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
    };
    let missing: Vec<&str> = ["qemu-system-x86", "busybox-static"]
        .into_iter()
        .filter(|p| !have(p))
        .collect();
    if !missing.is_empty() {
        let install = || {
            run(Command::new("apt-get")
                .args(["install", "-y", "-q"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"))
        };
        // A fresh machine may have no package lists yet.
        if install().is_err() {
            run(Command::new("apt-get").args(["update", "-q"]))?;
            install()?;
        }
    }
    Ok(())
}

/// Builds `dranet` and the vm_nic test binary; returns their paths from cargo's JSON messages.
fn build_binaries() -> Result<Binaries> {
    let exe = |args: &[&str], want: &str| -> Result<PathBuf> {
        let out = Command::new(env!("CARGO"))
            .current_dir(root())
            .args(args)
            .arg("--message-format=json")
            .stderr(Stdio::inherit())
            .output()
            .context("running cargo")?;
        if !out.status.success() {
            bail!("cargo {args:?} failed");
        }
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"]["name"] == want)
            .find_map(|v| v["executable"].as_str().map(PathBuf::from))
            .with_context(|| format!("cargo did not report the {want} executable"))
    };
    Ok(Binaries {
        dranet: exe(&["build", "-p", "dranet", "--bin", "dranet"], "dranet")?,
        vm_nic: exe(
            &["test", "-p", "dranet-sim", "--test", "vm_nic", "--no-run"],
            "vm_nic",
        )?,
        e2e: exe(&["test", "-p", "dranet-sim", "--test", "e2e", "--no-run"], "e2e")?,
        rescue: exe(
            &["test", "-p", "dranet-sim", "--test", "rescue", "--no-run"],
            "rescue",
        )?,
    })
}

/// Fetches and unpacks the kernel packages (cached); returns (vmlinuz, modules dir).
fn fetch_kernel(s: &KernelSpec, vm: &Path) -> Result<(PathBuf, PathBuf)> {
    let unpacked = vm.join(format!("kernel-{}", s.tag));
    let stamp = unpacked.join(".unpacked");
    if !stamp.exists() {
        let m = apt::system_mirrors()?;
        let entries: Vec<(&str, &str)> = s
            .suites
            .iter()
            .map(|(sec, suite)| {
                (
                    if *sec {
                        m.security.as_str()
                    } else {
                        m.archive.as_str()
                    },
                    *suite,
                )
            })
            .filter(|(uri, _)| !uri.is_empty())
            .collect();
        let a = apt::PrivateApt::new(vm.join(format!("apt-{}", s.tag)), &apt::sources_list(&entries))?;
        a.update()?;
        let meta = apt::depends_field(&a.show("linux-image-amd64")?);
        let (abi, pkgs) = apt::kernel_packages(&meta, |img| {
            a.show(img).map(|t| apt::depends_field(&t)).unwrap_or_default()
        })
        .context("no versioned linux-image in linux-image-amd64's Depends")?;
        println!("vm-test: kernel {} = {abi}: {pkgs:?}", s.tag);
        let debs = a.download(&pkgs, &vm.join(format!("debs-{}", s.tag)))?;
        let _ = std::fs::remove_dir_all(&unpacked);
        std::fs::create_dir_all(&unpacked)?;
        for d in debs {
            run(Command::new("dpkg-deb").arg("-x").arg(&d).arg(&unpacked))?;
        }
        std::fs::write(&stamp, abi)?;
    }
    let abi = std::fs::read_to_string(&stamp)?;
    let vmlinuz = [
        unpacked.join(format!("boot/vmlinuz-{abi}")),
        unpacked.join(format!("usr/lib/modules/{abi}/vmlinuz")),
    ]
    .into_iter()
    .find(|p| p.exists())
    .with_context(|| format!("no vmlinuz for {abi} in {}", unpacked.display()))?;
    let modules = unpacked.join("lib/modules").join(&abi);
    if !modules.exists() {
        // Merged-/usr packages (7.x) ship /usr/lib/modules; depmod -b looks in <base>/lib/modules.
        std::fs::create_dir_all(unpacked.join("lib"))?;
        std::os::unix::fs::symlink("../usr/lib/modules", unpacked.join("lib/modules"))?;
    }
    if !modules.join("modules.dep").exists() {
        // The packages leave modules.dep to depmod at install time.
        run(Command::new("depmod").arg("-b").arg(&unpacked).arg(&abi))?;
    }
    Ok((vmlinuz, modules))
}

fn run_kernel(
    s: &KernelSpec,
    boot: &Boot,
    tag: &str,
    bins: &Binaries,
    opts: &Options,
) -> Result<serial::Report> {
    let vm = target_dir().join("vm");
    let (vmlinuz, modules) = fetch_kernel(s, &vm)?;
    let dir = vm.join(format!("run-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.join("out");
    std::fs::create_dir_all(&out)?;
    let (cpio, order) = initramfs::build(&initramfs::Spec {
        modules_dir: modules,
        wanted: s.modules,
        params: s.params,
        busybox: PathBuf::from("/bin/busybox"),
        init: INIT,
    })?;
    println!("vm-test: {tag} modules {}", order.join(" "));
    let initrd = dir.join("initrd.cpio");
    std::fs::write(&initrd, cpio)?;
    std::fs::write(out.join("guest-test.sh"), GUEST_TEST)?;
    // The guest sees the host root read-only but its own tmpfs on /tmp (where a CI clone may
    // live), so the binaries travel in the output share, next to each other (the test finds
    // `dranet` beside itself).
    let bin = out.join("bin");
    std::fs::create_dir_all(&bin)?;
    std::fs::copy(&bins.dranet, bin.join("dranet"))
        .with_context(|| format!("copying {}", bins.dranet.display()))?;
    std::fs::copy(&bins.vm_nic, bin.join("vm_nic"))
        .with_context(|| format!("copying {}", bins.vm_nic.display()))?;
    std::fs::copy(&bins.e2e, bin.join("e2e")).with_context(|| format!("copying {}", bins.e2e.display()))?;
    std::fs::copy(&bins.rescue, bin.join("rescue"))
        .with_context(|| format!("copying {}", bins.rescue.display()))?;
    std::fs::write(
        out.join("env"),
        format!(
            "KERNEL_LINE={}\nDRANET=/tmp/out/bin/dranet\nVM_NIC_TEST=/tmp/out/bin/vm_nic\nE2E_TEST=/tmp/out/bin/e2e\nRESCUE_TEST=/tmp/out/bin/rescue\nCASES=\"{}\"\nEXPECT_PROBES=\"{}\"\n",
            s.tag,
            boot.cases,
            expected_probes(s.tag, !boot.append.is_empty())
        ),
    )?;
    let log = dir.join("serial.log");
    let mut cmd = qemu_command(&vmlinuz, &initrd, &out, &log, boot.append);
    println!("vm-test: booting {tag} (log {})", log.display());
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let deadline = Instant::now() + Duration::from_secs(opts.timeout);
    let mut timed_out = false;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let report = serial::parse(&text);
    if timed_out {
        println!("vm-test: {tag} killed after {} s", opts.timeout);
    }
    if !opts.keep {
        let _ = std::fs::remove_file(&initrd);
    }
    Ok(report)
}

/// The qemu command line: TCG, q35, three virtio NICs on isolated user-mode backends, the host
/// root read-only and the output dir writable over 9p, serial console to `log`.
fn qemu_command(vmlinuz: &Path, initrd: &Path, out: &Path, log: &Path, append: &str) -> Command {
    let mut c = Command::new("qemu-system-x86_64");
    c.args([
        "-accel", "tcg", "-machine", "q35", "-cpu", "max", "-smp", "2", "-m", "2G",
    ])
    .args(["-display", "none", "-monitor", "none", "-no-reboot"])
    .arg("-serial")
    .arg(format!("file:{}", log.display()))
    .arg("-kernel")
    .arg(vmlinuz)
    .arg("-initrd")
    .arg(initrd)
    .args(["-append"])
    // softlockup_panic: a guest kernel hang ends the boot at once (with its stack, which panic
    // prints at any loglevel) instead of at the timeout.
    .arg(
        format!("console=ttyS0 panic=-1 softlockup_panic=1 rdinit=/init loglevel=4 dranet-vm {append}")
            .trim_end(),
    )
    .args([
        "-fsdev",
        "local,id=root,path=/,security_model=none,readonly=on,multidevs=remap",
        "-device",
        "virtio-9p-pci,fsdev=root,mount_tag=hostroot",
        "-fsdev",
    ])
    .arg(format!("local,id=out,path={},security_model=none", out.display()))
    .args(["-device", "virtio-9p-pci,fsdev=out,mount_tag=out"]);
    for n in 0..3 {
        c.arg("-netdev")
            .arg(format!("user,id=n{n},restrict=on,ipv6=off"))
            .arg("-device")
            .arg(format!("virtio-net-pci,netdev=n{n}"));
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(v: serial::Verdict, name: &str, detail: &str) -> serial::Case {
        serial::Case {
            verdict: v,
            name: name.into(),
            seconds: 1.0,
            detail: detail.into(),
        }
    }

    #[test]
    fn all_is_the_four_kernels_oldest_first() {
        let tags: Vec<&str> = KernelLine::All
            .expand()
            .into_iter()
            .map(|k| spec(k).tag)
            .collect();
        assert_eq!(tags, ["5.10", "6.1", "6.12", "7.3"]);
        assert_eq!(KernelLine::V6_12.expand(), [KernelLine::V6_12]);
    }

    #[test]
    fn the_matrix_lists_every_case_per_boot_and_every_known_reason() {
        use serial::Verdict::{Known, NotDone, Pass};
        let cols = [
            Column {
                tag: "5.10".into(),
                cases: vec![
                    case(Pass, "trace-dev-netns-move", ""),
                    case(
                        Known,
                        "trace-netns-put-nsfs",
                        "netns_put has no refcount in ns_common",
                    ),
                    case(NotDone, "lsm", "not in this boot"),
                ],
                finished: true,
                seconds: 100.4,
            },
            Column {
                tag: "5.10-lsm".into(),
                cases: vec![case(Pass, "lsm-sb-umount", "")],
                finished: false,
                seconds: 50.0,
            },
        ];
        let t = matrix_table(&cols);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[1].contains("case") && lines[1].contains("5.10-lsm"), "{t}");
        assert!(
            lines[2].starts_with("  trace-dev-netns-move") && lines[2].contains("PASS"),
            "{t}"
        );
        assert!(
            lines[2].trim_end().ends_with('-'),
            "not run in the second boot: {t}"
        );
        assert!(lines[3].contains("KNOWN"), "{t}");
        assert!(lines[4].contains("lsm-sb-umount") && !t.contains("  lsm "), "{t}");
        assert!(t.contains("(finished)") && t.contains("NO"), "{t}");
        assert!(t.contains("100") && t.contains("50"), "{t}");
        assert!(
            t.contains("KNOWN trace-netns-put-nsfs [5.10]: netns_put has no refcount in ns_common"),
            "{t}"
        );
    }
}
