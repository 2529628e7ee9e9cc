//! Test support, one copy of each (built for dranet's unit tests and with the feature
//! `test-support`, which dranet-sim turns on; never in a shipped build): a temp dir removed at
//! drop and file-tree builders, netlink byte builders, a poll with a deadline, and plan sinks standing in for the rescue engine behind
//! `Preparer` (dranet-sim's root tests use these through `dranet_sim::fixtures`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::dra::PlanSink;
use crate::plan::{ClaimPlan, DevicePlan};
use crate::state::{DeviceRecord, DeviceState};
use crate::sys::link::LinkSnapshot;

/// A unique directory `dranet-<tag>-<pid>-<n>` under the system temp dir, created, removed at
/// drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "dranet-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()));
        Self(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How often the waits poll.
const POLL: Duration = Duration::from_millis(2);

/// Writes `s` to `p`, creating its directories.
pub fn write_file(p: &Path, s: &str) {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
    }
    std::fs::write(p, s).unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
}

/// A symlink at `at` to `target`, creating the directories of `at`.
pub fn symlink_at(target: &str, at: &Path) {
    if let Some(d) = at.parent() {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
    }
    std::os::unix::fs::symlink(target, at).unwrap_or_else(|e| panic!("linking {}: {e}", at.display()));
}

/// A netlink message header (`struct nlmsghdr`, host order, pid 0) for byte-level checks.
pub fn nlmsg_hdr(len: u32, ty: u16, flags: u16, seq: u32) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&len.to_ne_bytes());
    v.extend_from_slice(&ty.to_ne_bytes());
    v.extend_from_slice(&flags.to_ne_bytes());
    v.extend_from_slice(&seq.to_ne_bytes());
    v.extend_from_slice(&0u32.to_ne_bytes());
    v
}

/// A netlink attribute (`struct nlattr` + value), padded to 4 bytes.
pub fn nla(ty: u16, value: &[u8]) -> Vec<u8> {
    let len = u16::try_from(4 + value.len()).unwrap_or_else(|_| panic!("an NLA of {} bytes", value.len()));
    let mut v = Vec::new();
    v.extend_from_slice(&len.to_ne_bytes());
    v.extend_from_slice(&ty.to_ne_bytes());
    v.extend_from_slice(value);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v
}

/// Polls `check` every 2 ms until it returns `Some` (its value) or `timeout` passes (an error
/// naming `what`).
pub async fn wait_for_some<T>(what: &str, timeout: Duration, check: impl FnMut() -> Option<T>) -> Result<T> {
    wait_for_some_every(what, timeout, POLL, check).await
}

/// [`wait_for_some`], polling every `every`.
pub async fn wait_for_some_every<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return Ok(v);
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls `ok` every 2 ms until it holds (how long that took) or `timeout` passes (an error
/// naming `what`).
pub async fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> Result<Duration> {
    let start = Instant::now();
    wait_for_some(what, timeout, || ok().then_some(())).await?;
    Ok(start.elapsed())
}

/// [`wait_for`] for a test without a runtime: sleeps the thread between polls.
pub fn wait_for_blocking(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> Result<Duration> {
    let start = Instant::now();
    while !ok() {
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(POLL);
    }
    Ok(start.elapsed())
}

/// The record of `device` in a pod as `net1`, in `state`, with an empty snapshot.
pub fn device_record(device: &str, state: DeviceState) -> DeviceRecord {
    DeviceRecord {
        device: device.into(),
        pod_ifname: "net1".into(),
        pci_address: None,
        permanent_mac: None,
        rdma_device: None,
        rdma_in_pod: false,
        pod_mac: None,
        snapshot: LinkSnapshot::default(),
        state,
        temp_name: None,
        at: None,
        rebuilt: false,
        return_error: None,
        vanish_unreported: false,
    }
}

/// Holds the plans Prepare hands over by pod UID, and drops a claim's devices when it is
/// removed, as the engine does; records every removal in order.
#[derive(Default)]
pub struct RecordingSink {
    plans: Mutex<crate::plan::Plans>,
    removed: Mutex<Vec<String>>,
}

impl RecordingSink {
    /// The plans held now.
    pub fn plans(&self) -> MutexGuard<'_, crate::plan::Plans> {
        self.plans.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The claim UIDs removed so far, in order.
    pub fn removed(&self) -> Vec<String> {
        self.removed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl PlanSink for RecordingSink {
    fn claim_devices(&self, claim_uid: &str) -> Vec<DevicePlan> {
        crate::plan::claim_devices(&self.plans(), claim_uid)
    }
    fn set_claim(&self, claim: ClaimPlan) -> Result<(), String> {
        crate::plan::set_claim(&mut self.plans(), claim);
        Ok(())
    }
    fn remove_claim(&self, claim_uid: &str) -> Result<Vec<DevicePlan>, String> {
        self.removed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(claim_uid.to_owned());
        Ok(crate::plan::remove_claim(&mut self.plans(), claim_uid).0)
    }
}

/// Accepts every plan and keeps none.
pub struct NoSink;

impl PlanSink for NoSink {
    fn claim_devices(&self, _: &str) -> Vec<DevicePlan> {
        Vec::new()
    }
    fn set_claim(&self, _: ClaimPlan) -> Result<(), String> {
        Ok(())
    }
    fn remove_claim(&self, _: &str) -> Result<Vec<DevicePlan>, String> {
        Ok(Vec::new())
    }
}

/// splitmix64: small and seedable; the only source of random choices of the property tests and
/// the soak, so a seed replays a run.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below32(&mut self, n: u32) -> u32 {
        u32::try_from(self.below(u64::from(n))).unwrap_or(0)
    }

    /// Heads or tails.
    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }

    /// True with probability `p` percent.
    pub fn pct(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    /// One element of `v` (`None` when empty).
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        v.get(usize::try_from(self.below(v.len() as u64)).unwrap_or(0))
    }
}
