//! Many veth pairs at once, created and deleted with one `ip -batch` each (hundreds of `ip`
//! processes would take seconds): the devices of the scale sections.
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use dranet_sim::kernel::{sh, unique};

use crate::baseline::Dev;
use crate::latency::HOST_MTU;

/// `n` veth pairs in the host: `a` (MTU 1400, UP) is the device, `b` its peer (stays home, UP).
/// Both ends are deleted on drop, wherever the kernel has them.
pub struct Fleet {
    pub devs: Vec<Dev>,
    peers: Vec<String>,
}

/// Runs `ip [-n ns] -batch` on `lines`.
pub fn ip_batch(netns: Option<&str>, lines: &str) -> Result<()> {
    let file = std::env::temp_dir().join(unique("drbench-batch-"));
    std::fs::write(&file, lines)?;
    let path = file.display().to_string();
    let mut args = vec!["ip"];
    if let Some(ns) = netns {
        args.extend(["-n", ns]);
    }
    args.extend(["-force", "-batch", &path]);
    let r = sh(&args);
    let _ = std::fs::remove_file(&file);
    r.map(drop)
}

impl Fleet {
    pub fn create(n: usize) -> Result<Self> {
        let mut me = Self {
            devs: Vec::with_capacity(n),
            peers: Vec::with_capacity(n),
        };
        let mut add = String::new();
        let mut set = String::new();
        let mut names = Vec::with_capacity(n);
        for _ in 0..n {
            let (a, b) = (unique("drb"), unique("drc"));
            add.push_str(&format!("link add {a} mtu {HOST_MTU} type veth peer name {b}\n"));
            set.push_str(&format!("link set {a} up\nlink set {b} up\n"));
            names.push(a);
            me.peers.push(b);
        }
        // The guard is armed before the kernel has them: a failure half-way still cleans up.
        ip_batch(None, &add).context("creating the veth pairs")?;
        ip_batch(None, &set).context("setting the veth pairs up")?;
        for (i, a) in names.into_iter().enumerate() {
            let index = ifindex(&a)?;
            me.devs.push(Dev {
                host: a,
                pod: format!("net{}", i % 2),
                index,
            });
        }
        Ok(me)
    }

    pub fn names(&self) -> Vec<String> {
        self.devs.iter().map(|d| d.host.clone()).collect()
    }

    /// Every device home under its name and index, UP, MTU 1400 (read from sysfs).
    pub fn check_home(&self) -> Result<()> {
        for d in &self.devs {
            check_home(d)?;
        }
        Ok(())
    }
}

fn ifindex(name: &str) -> Result<u32> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
        .with_context(|| format!("{name} not in the host netns"))?;
    Ok(s.trim().parse()?)
}

/// One device home under its name and index, UP, MTU 1400 (sysfs).
pub fn check_home(d: &Dev) -> Result<()> {
    let dir = PathBuf::from("/sys/class/net").join(&d.host);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).map(|s| s.trim().to_owned());
    let index: u32 = read("ifindex")
        .with_context(|| format!("{} not home", d.host))?
        .parse()?;
    let mtu: u32 = read("mtu")?.parse()?;
    let flags = u32::from_str_radix(read("flags")?.trim_start_matches("0x"), 16)?;
    if index != d.index || mtu != HOST_MTU || flags & 1 == 0 {
        bail!(
            "{} home but index {index} (want {}), mtu {mtu}, flags {flags:#x}",
            d.host,
            d.index
        );
    }
    Ok(())
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // Deleting either end deletes both; a device still in a pod netns goes with its peer.
        let mut del = String::new();
        for p in &self.peers {
            del.push_str(&format!("link del {p}\n"));
        }
        let _ = ip_batch(None, &del);
    }
}
