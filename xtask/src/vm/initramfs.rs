//! The guest's initramfs: a newc cpio archive (written here; the machine has no cpio binary) with
//! busybox, the init script and the kernel modules the tests need, in dependency order.
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// A newc ("070701") archive built in memory.
#[derive(Default)]
pub struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFCHR: u32 = 0o020_000;

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8], rdev: (u32, u32)) -> Result<()> {
        self.ino += 1;
        let size = u32::try_from(data.len()).context("file over 4 GiB")?;
        let namesize = u32::try_from(name.len() + 1).context("name too long")?;
        let nlink = if mode & S_IFDIR != 0 { 2 } else { 1 };
        let fields = [
            self.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, namesize, 0,
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
        Ok(())
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    /// A directory (parents are not implied: add them first).
    pub fn dir(&mut self, name: &str) -> Result<()> {
        self.entry(name, S_IFDIR | 0o755, &[], (0, 0))
    }

    /// A regular file with permission bits `perm`.
    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> Result<()> {
        self.entry(name, S_IFREG | (perm & 0o7777), data, (0, 0))
    }

    /// A character device node.
    pub fn chardev(&mut self, name: &str, major: u32, minor: u32) -> Result<()> {
        self.entry(name, S_IFCHR | 0o600, &[], (major, minor))
    }

    /// Ends the archive with the trailer and returns its bytes.
    pub fn finish(mut self) -> Result<Vec<u8>> {
        self.entry("TRAILER!!!", 0, &[], (0, 0))?;
        while !self.buf.len().is_multiple_of(512) {
            self.buf.push(0);
        }
        Ok(self.buf)
    }
}

/// A module's name as the kernel knows it: file stem without `.ko[.xz|.zst|.gz]`, `-` as `_`.
pub fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// `modules.dep` parsed: module name → (path, direct dependency paths).
pub fn parse_modules_dep(text: &str) -> BTreeMap<String, (String, Vec<String>)> {
    text.lines()
        .filter_map(|l| {
            let (m, deps) = l.split_once(':')?;
            let deps = deps.split_whitespace().map(str::to_owned).collect();
            Some((module_name(m), (m.trim().to_owned(), deps)))
        })
        .collect()
}

/// The module paths to load, dependencies first, for the wanted module names. Names listed in
/// `builtin` (from `modules.builtin`) are skipped; an unknown name is an error.
pub fn load_order(
    dep: &BTreeMap<String, (String, Vec<String>)>,
    builtin: &HashSet<String>,
    wanted: &[&str],
) -> Result<Vec<String>> {
    fn visit(
        name: &str,
        dep: &BTreeMap<String, (String, Vec<String>)>,
        seen: &mut HashSet<String>,
        out: &mut Vec<String>,
    ) {
        if !seen.insert(name.to_owned()) {
            return;
        }
        if let Some((path, deps)) = dep.get(name) {
            for d in deps {
                visit(&module_name(d), dep, seen, out);
            }
            out.push(path.clone());
        }
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for w in wanted {
        let name = module_name(w);
        if builtin.contains(&name) {
            continue;
        }
        if !dep.contains_key(&name) {
            bail!("module {w} is neither in modules.dep nor built in");
        }
        visit(&name, dep, &mut seen, &mut out);
    }
    Ok(out)
}

/// The names in `modules.builtin`.
pub fn parse_builtin(text: &str) -> HashSet<String> {
    text.lines().map(module_name).collect()
}

/// Reads a module file, decompressing `.xz` / `.zst` with the host's tools (busybox insmod
/// takes plain ELF).
fn read_module(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else {
        None
    };
    match tool {
        None => std::fs::read(path).with_context(|| format!("reading {}", path.display())),
        Some(t) => {
            let out = std::process::Command::new(t)
                .args(["-dc"])
                .arg(path)
                .output()
                .with_context(|| format!("{t} -dc {}", path.display()))?;
            if !out.status.success() {
                bail!("{t} -dc {} failed", path.display());
            }
            Ok(out.stdout)
        }
    }
}

/// What goes into the initramfs.
pub struct Spec<'a> {
    /// `<root>/lib/modules/<abi>` of the extracted kernel packages.
    pub modules_dir: PathBuf,
    pub wanted: &'a [&'a str],
    /// Module name → insmod parameters.
    pub params: &'a [(&'a str, &'a str)],
    pub busybox: PathBuf,
    pub init: &'a str,
}

/// Builds the archive; returns the bytes and the load order (module names).
pub fn build(spec: &Spec<'_>) -> Result<(Vec<u8>, Vec<String>)> {
    let dep_text = std::fs::read_to_string(spec.modules_dir.join("modules.dep"))
        .with_context(|| format!("reading {}/modules.dep", spec.modules_dir.display()))?;
    let builtin =
        parse_builtin(&std::fs::read_to_string(spec.modules_dir.join("modules.builtin")).unwrap_or_default());
    let order = load_order(&parse_modules_dep(&dep_text), &builtin, spec.wanted)?;
    let mut c = Cpio::default();
    for d in [
        "bin",
        "dev",
        "proc",
        "sys",
        "mnt",
        "mnt/root",
        "lib",
        "lib/modules",
    ] {
        c.dir(d)?;
    }
    c.chardev("dev/console", 5, 1)?;
    c.file(
        "bin/busybox",
        0o755,
        &std::fs::read(&spec.busybox).context("reading busybox")?,
    )?;
    c.file("init", 0o755, spec.init.as_bytes())?;
    let mut list = String::new();
    let mut names = Vec::new();
    for (i, rel) in order.iter().enumerate() {
        let name = module_name(rel);
        let file = format!("lib/modules/{i:02}-{name}.ko");
        c.file(&file, 0o644, &read_module(&spec.modules_dir.join(rel))?)?;
        let params = spec
            .params
            .iter()
            .find(|(m, _)| *m == name)
            .map_or("", |(_, p)| *p);
        list.push_str(&format!("/{file} {params}\n"));
        names.push(name);
    }
    c.file("modules.list", 0o644, list.as_bytes())?;
    Ok((c.finish()?, names))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8], at: usize) -> u32 {
        u32::from_str_radix(std::str::from_utf8(&b[at..at + 8]).unwrap(), 16).unwrap()
    }

    #[test]
    fn newc_layout_is_what_the_kernel_reads() {
        let mut c = Cpio::default();
        c.dir("bin").unwrap();
        c.file("init", 0o755, b"#!/bin/sh\n").unwrap();
        c.chardev("dev/console", 5, 1).unwrap();
        let b = c.finish().unwrap();
        assert_eq!(b.len() % 512, 0);
        assert_eq!(&b[0..6], b"070701");
        assert_eq!(hex(&b, 6 + 8), S_IFDIR | 0o755);
        // "bin\0" after the 110-byte header, padded to 4: the next header starts at 116.
        assert_eq!(&b[110..114], b"bin\0");
        let second = 116;
        assert_eq!(&b[second..second + 6], b"070701");
        assert_eq!(hex(&b, second + 6 + 8), S_IFREG | 0o755);
        assert_eq!(hex(&b, second + 6 + 6 * 8), 10, "filesize");
        assert_eq!(hex(&b, second + 6 + 11 * 8), 5, "namesize incl. NUL");
        // name "init\0" at 226 (pad to 232), data at 232..242, pad to 244.
        assert_eq!(&b[second + 110..second + 115], b"init\0");
        assert_eq!(&b[232..242], b"#!/bin/sh\n");
        let third = 244;
        assert_eq!(hex(&b, third + 6 + 8), S_IFCHR | 0o600);
        assert_eq!(hex(&b, third + 6 + 9 * 8), 5, "rdevmajor");
        assert_eq!(hex(&b, third + 6 + 10 * 8), 1, "rdevminor");
        let s = String::from_utf8_lossy(&b);
        assert!(s.contains("TRAILER!!!"));
    }

    #[test]
    fn modules_load_dependencies_first_once_and_skip_builtins() {
        let dep = parse_modules_dep(
            "kernel/drivers/net/virtio_net.ko.xz: kernel/drivers/net/net_failover.ko.xz kernel/net/core/failover.ko.xz\n\
             kernel/drivers/net/net_failover.ko.xz: kernel/net/core/failover.ko.xz\n\
             kernel/net/core/failover.ko.xz:\n\
             kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko.xz: kernel/drivers/infiniband/core/ib_uverbs.ko.xz kernel/net/ipv6/ip6_udp_tunnel.ko.xz kernel/net/ipv4/udp_tunnel.ko.xz kernel/drivers/infiniband/core/ib_core.ko.xz\n\
             kernel/drivers/infiniband/core/ib_uverbs.ko.xz: kernel/drivers/infiniband/core/ib_core.ko.xz\n\
             kernel/drivers/infiniband/core/ib_core.ko.xz:\n\
             kernel/net/ipv6/ip6_udp_tunnel.ko.xz:\n\
             kernel/net/ipv4/udp_tunnel.ko.xz:\n\
             kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz\n\
             kernel/net/9p/9pnet.ko.xz:\n",
        );
        let builtin = parse_builtin("kernel/drivers/virtio/virtio_pci.ko\n");
        let order = load_order(
            &dep,
            &builtin,
            &["virtio_pci", "virtio_net", "9p", "ib_core", "rdma_rxe"],
        )
        .unwrap();
        let names: Vec<String> = order.iter().map(|p| module_name(p)).collect();
        assert_eq!(
            names,
            [
                "failover",
                "net_failover",
                "virtio_net",
                "9pnet",
                "9p",
                "ib_core",
                "ib_uverbs",
                "ip6_udp_tunnel",
                "udp_tunnel",
                "rdma_rxe"
            ]
        );
        assert!(load_order(&dep, &builtin, &["nosuch"]).is_err());
        assert_eq!(module_name("kernel/net/9p/9pnet_virtio.ko.zst"), "9pnet_virtio");
        assert_eq!(module_name("a/b/snd-hda.ko"), "snd_hda");
    }
}
