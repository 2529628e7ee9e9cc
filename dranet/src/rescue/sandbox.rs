//! Sandboxes as the runtime names them: which record a hook is about, Synchronize, and when a
//! record goes.
//!
//! A record is deleted once every device of its sandbox is home, its pin is released and the
//! runtime no longer has the sandbox: its RemovePodSandbox came, Synchronize does not list it, or
//! its netns is gone (a sandbox's netns is fixed for its life, so a sandbox whose netns was torn
//! down can never run again). containerd sends no Stop/Remove to NRI for the sandboxes it
//! recovered after its own restart; the last rule is what keeps their records from piling up.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Serialize;
use tracing::{info, warn};

use super::decide::normalize_path;
use super::{DetachOutcome, Engine, Owner, RescueError};
use crate::ids::{IdError, PodUid, SandboxId};
use crate::state::{Durability, Naming, PodPhase, PodRecord, RecordKey, ReturnReason, Transition, pod_key};

/// A hook's sandbox, its ids checked at the boundary ([`SandboxRef::parse`]: the NRI hook).
#[derive(Clone, Debug)]
pub struct SandboxRef<'a> {
    pub uid: PodUid,
    /// The runtime's sandbox id.
    pub sandbox: SandboxId,
    /// The netns path the hook carries (containerd sends none on RemovePodSandbox).
    pub netns: Option<&'a Path>,
}

impl<'a> SandboxRef<'a> {
    /// The sandbox `sandbox` of pod `uid`, both checked here.
    ///
    /// # Errors
    /// The id that is not one ([`crate::ids`]).
    pub fn parse(uid: &str, sandbox: &str, netns: Option<&'a Path>) -> Result<Self, IdError> {
        Ok(Self {
            uid: crate::ids::pod_uid(uid)?,
            sandbox: crate::ids::sandbox_id(sandbox)?,
            netns,
        })
    }

    fn key(&self) -> RecordKey {
        RecordKey::new(&self.uid, &self.sandbox)
    }
}

/// A sandbox the runtime reports in Synchronize, its ids checked at the boundary
/// ([`SandboxInfo::parse`]: the NRI Synchronize, which leaves out what does not parse).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxInfo {
    pub uid: PodUid,
    pub sandbox: SandboxId,
    pub netns: Option<PathBuf>,
    /// The pod's namespace and name (events, logs).
    pub namespace: String,
    pub name: String,
}

impl SandboxInfo {
    /// The sandbox `sandbox` of pod `uid`, both checked here.
    ///
    /// # Errors
    /// The id that is not one ([`crate::ids`]).
    pub fn parse(
        uid: &str,
        sandbox: &str,
        netns: Option<PathBuf>,
        namespace: String,
        name: String,
    ) -> Result<Self, IdError> {
        Ok(Self {
            uid: crate::ids::pod_uid(uid)?,
            sandbox: crate::ids::sandbox_id(sandbox)?,
            netns,
            namespace,
            name,
        })
    }

    /// This sandbox's record key.
    #[must_use]
    pub fn key(&self) -> RecordKey {
        RecordKey::new(&self.uid, &self.sandbox)
    }
}

/// What [`Engine::synchronize`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SyncReport {
    /// Sandboxes the runtime no longer knows whose devices were brought home.
    pub returned: Vec<String>,
    /// Records deleted.
    pub dropped: Vec<String>,
    /// Sandboxes whose devices could not all come home (kept; retried by the engine).
    pub failed: Vec<String>,
}

fn same_path(a: &Path, b: &Path) -> bool {
    match (a.to_str(), b.to_str()) {
        (Some(a), Some(b)) => normalize_path(a) == normalize_path(b),
        _ => a == b,
    }
}

impl Engine {
    /// The record a hook for `sb` is about: the sandbox's own, or a record migrated from
    /// checkpoint format 1 (no sandbox id) of the same pod that this sandbox is shown to own
    /// (same netns path; or, for a hook without a path, the pod's only record), which then takes
    /// the sandbox id. The pod's lock must be held.
    async fn resolve(&self, sb: &SandboxRef<'_>, key: RecordKey) -> Result<Option<RecordKey>, RescueError> {
        if self.cp().pods.contains_key(&key) {
            return Ok(Some(key));
        }
        let only_record = self.cp().records_of(&sb.uid).count() == 1;
        let named = self
            .name_legacy_record(&sb.uid, &sb.sandbox, |r| match sb.netns {
                Some(p) => same_path(&r.netns_path, p),
                None => only_record,
            })
            .await?
            || self
                .name_recovered_record(&sb.uid, &sb.sandbox, |r| {
                    sb.netns.is_some_and(|p| same_path(&r.netns_path, p))
                })
                .await?;
        Ok(named.then_some(key))
    }

    /// Gives a format-1 record (no sandbox id) of pod `uid` the id `sandbox` when `owns` says the
    /// sandbox is its. Returns whether a record was named. The pod's lock must be held.
    pub(super) async fn name_legacy_record(
        &self,
        uid: &PodUid,
        sandbox: &SandboxId,
        owns: impl Fn(&PodRecord) -> bool,
    ) -> Result<bool, RescueError> {
        // The key of the pod's record from format 1: no sandbox id.
        let legacy = pod_key(uid, "");
        let hit = self.cp().record(&legacy).is_some_and(owns);
        if !hit {
            return Ok(false);
        }
        let key = RecordKey::new(uid, sandbox);
        // An error that surfaces (the hook or the attach fails, Synchronize logs it), and the
        // format-1 record stays as it was: gone meanwhile (the pod's lock is held: a bug), or
        // the sandbox has a record of its own with devices out, which it must not lose to this
        // one.
        let rekey = Transition::Rekey {
            to: key.clone(),
            naming: Naming::default(),
        };
        self.transition(&legacy, rekey, Durability::Awaited).await?;
        if let Some(l) = self.inner.live_take(&legacy) {
            self.inner.live_put(&key, l);
        }
        info!(
            pod = %uid,
            sandbox = %sandbox,
            "record from checkpoint format 1 now names its sandbox"
        );
        Ok(true)
    }

    /// StopPodSandbox / RemovePodSandbox: brings home the devices of this sandbox only.
    pub async fn detach_sandbox(
        &self,
        sb: SandboxRef<'_>,
        reason: ReturnReason,
    ) -> Result<DetachOutcome, RescueError> {
        let _owner = self.own(&sb.uid).await;
        let Some(key) = self.resolve(&sb, sb.key()).await? else {
            return Ok(DetachOutcome::NotOurs);
        };
        self.detach_locked(&key, reason).await
    }

    /// RemovePodSandbox: the runtime is done with the sandbox. Its devices come home if they are
    /// not yet (a Remove without a Stop), then its record goes.
    pub async fn forget_sandbox(&self, sb: SandboxRef<'_>) -> Result<DetachOutcome, RescueError> {
        let out = {
            let _owner = self.own(&sb.uid).await;
            let Some(key) = self.resolve(&sb, sb.key()).await? else {
                return Ok(DetachOutcome::NotOurs);
            };
            let out = self.detach_locked(&key, ReturnReason::Hook).await?;
            self.drop_record(&key, "removed by the runtime").await?;
            out
        };
        self.prune_lock(&sb.uid);
        Ok(out)
    }

    /// Synchronize (after every (re)connection): `running` is every sandbox the runtime has.
    /// Format-1 records are matched to their sandbox by pod UID and netns path; a sandbox the
    /// runtime does not list gets its devices home and its record deleted.
    pub async fn synchronize(&self, running: &[SandboxInfo]) -> SyncReport {
        let mut report = SyncReport::default();
        for s in running {
            let _owner = self.own(&s.uid).await;
            let owns = |r: &PodRecord| s.netns.as_deref().is_some_and(|p| same_path(&r.netns_path, p));
            let named = match self.name_legacy_record(&s.uid, &s.sandbox, owns).await {
                Ok(false) => self.name_recovered_record(&s.uid, &s.sandbox, owns).await,
                other => other,
            };
            if let Err(e) = named {
                warn!(pod = %s.uid, sandbox = %s.sandbox, error = %crate::telemetry::chain(&e), "cannot name a format-1 or rebuilt record");
            }
        }
        let known: HashSet<RecordKey> = running.iter().map(SandboxInfo::key).collect();
        let gone: Vec<(Owner, RecordKey)> = self
            .cp()
            .pods
            .values()
            .filter(|r| !known.contains(&r.key()))
            .map(|r| (Owner::of(r), r.key()))
            .collect();
        for (owner, key) in gone {
            {
                let _owner = self.own(&owner).await;
                let out = self.cp().record(&key).is_some_and(PodRecord::has_devices_out);
                if out {
                    info!(
                        pod = %owner,
                        record = %key,
                        "the runtime no longer knows this sandbox: bringing its devices home"
                    );
                    match self.detach_locked(&key, ReturnReason::Vanished).await {
                        Ok(_) => report.returned.push(key.to_string()),
                        Err(e) => {
                            warn!(pod = %owner, record = %key, error = %crate::telemetry::chain(&e), "devices of a vanished sandbox not all home");
                            report.failed.push(key.to_string());
                            continue;
                        }
                    }
                }
                match self.drop_record(&key, "unknown to the runtime").await {
                    Ok(true) => report.dropped.push(key.to_string()),
                    Ok(false) => {}
                    Err(e) => {
                        warn!(record = %key, error = %crate::telemetry::chain(&e), "cannot drop the record")
                    }
                }
            }
            self.prune_lock(&owner);
        }
        report
    }

    /// Deletes the record `key` if every device is home and its pin is released. Returns whether
    /// it did. The pod's lock must be held.
    pub(super) async fn drop_record(&self, key: &RecordKey, why: &str) -> Result<bool, RescueError> {
        let droppable = self
            .cp()
            .pods
            .get(key)
            .is_some_and(|r| !r.has_devices_out() && r.pin.is_none());
        if !droppable {
            return Ok(false);
        }
        // A device home under a temporary name waits for its own: the record that knows both
        // names stays until the name is free and given back ([`Engine::rename_home`] drops it).
        if self.cp().pods.get(key).is_some_and(|r| {
            r.devices
                .iter()
                .any(|d| d.state == crate::state::DeviceState::HomeNameBusy)
        }) {
            info!(
                record = %key,
                why, "sandbox record kept: a device waits for its host name"
            );
            return Ok(false);
        }
        // A vanished device's report not confirmed yet: the record that says so stays until it
        // is ([`Engine::vanish_reported`] drops it then).
        if self
            .cp()
            .pods
            .get(key)
            .is_some_and(|r| self.waits_for_a_report(r))
        {
            info!(record = %key, why, "sandbox record kept: a vanished device's report is not confirmed yet");
            return Ok(false);
        }
        let id = self.cp().pods.get(key).map(|r| r.netns);
        // Staged, not awaited (the next save carries it): a crash that loses it leaves a
        // record with every device home and no pin, of a sandbox the runtime no longer has,
        // which the restart's Synchronize or sweep drops again. Gone meanwhile is an error:
        // the pod's lock is held, so only a bug ends the record under it.
        self.transition(key, Transition::Drop, Durability::Staged).await?;
        if let (Some(w), Some(id)) = (&self.inner.watcher, id) {
            w.unwatch_netns(id);
        }
        self.inner.metrics.records_dropped.inc();
        // What the sandbox held is free now; after a burst of removals, hand it back.
        crate::heap::after_burst();
        info!(record = %key, why, "sandbox record dropped");
        Ok(true)
    }

    /// Drops the record `key` (devices home, pin released) if its netns is gone: the runtime's
    /// path no longer names the netns the sandbox attached to.
    pub(super) async fn drop_if_torn_down(&self, key: &RecordKey) -> Result<bool, RescueError> {
        let Some((path, id)) = self.cp().pods.get(key).map(|r| (r.netns_path.clone(), r.netns)) else {
            return Ok(false);
        };
        let alive = self.inner.kernel.open_netns(&path).is_ok_and(|ns| ns.id() == id);
        if alive {
            return Ok(false);
        }
        self.drop_record(key, "its netns is gone").await
    }

    /// Whether [`Engine::sweep`] has anything to look at: a returned record (its sandbox's
    /// netns may go away later) or a pod lock to prune.
    #[must_use]
    pub fn sweep_pending(&self) -> bool {
        self.cp()
            .pods
            .values()
            .any(|r| matches!(r.phase, PodPhase::Returned(_)) && r.pin.is_none())
            || !super::lock(&self.inner.locks).is_empty()
    }

    /// Runs [`Engine::sweep`] for as long as the engine lives: every [`SWEEP_EVERY`] while it has
    /// something to look at ([`Engine::sweep_pending`]), and otherwise not until the checkpoint
    /// changes (no timer on an idle node).
    pub async fn sweep_forever(&self) {
        loop {
            let seen = self.inner.writer.staged();
            if self.sweep_pending() {
                tokio::time::sleep(SWEEP_EVERY).await;
                self.sweep().await;
            } else if !self.inner.writer.saved_after(seen).await {
                return;
            }
        }
    }

    /// Drops every returned record whose sandbox's netns is gone; then prunes the locks of pods
    /// with nothing left. Runs after a reconcile and every [`SWEEP_EVERY`] while there is
    /// something to sweep ([`Engine::sweep_forever`]).
    pub async fn sweep(&self) -> usize {
        let candidates: Vec<(Owner, RecordKey)> = self
            .cp()
            .pods
            .values()
            .filter(|r| matches!(r.phase, PodPhase::Returned(_)) && r.pin.is_none())
            .map(|r| (Owner::of(r), r.key()))
            .collect();
        let mut n = 0;
        for (owner, key) in candidates {
            {
                let _owner = self.own(&owner).await;
                match self.drop_if_torn_down(&key).await {
                    Ok(true) => n += 1,
                    Ok(false) => {}
                    Err(e) => {
                        warn!(record = %key, error = %crate::telemetry::chain(&e), "sweep: cannot drop the record")
                    }
                }
            }
            self.prune_lock(&owner);
        }
        let owners: Vec<Owner> = super::lock(&self.inner.locks).keys().cloned().collect();
        for owner in owners {
            self.prune_lock(&owner);
        }
        n
    }
}

/// How often the daemon sweeps records of sandboxes whose netns is gone.
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
