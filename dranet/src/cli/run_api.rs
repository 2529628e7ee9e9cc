//! The API side of `dranet run`: where the kubelet side talks to (files in embedded mode, or the
//! API server), the API client (retried while its configuration cannot be read), and the report
//! sink that drops reports until that client exists.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use futures::future::BoxFuture;
use tracing::warn;

use super::run::RunArgs;
use crate::ready::Readiness;

/// Reports go here before the API client exists (the kubelet side not up yet, or kube mode whose
/// client could not be built yet): kept (at most [`LATE_SINK_KEPT`]) until [`LateSink::set`], then
/// forwarded. A late attach at the runtime's first Synchronize comes before the kubelet side, and
/// its event and claim status must not be lost.
#[derive(Default)]
pub(super) struct LateSink {
    inner: OnceLock<Arc<dyn crate::report::Sink>>,
    kept: std::sync::Mutex<Vec<Kept>>,
}

/// Reports kept until the sink exists, at most.
pub(super) const LATE_SINK_KEPT: usize = 256;

enum Kept {
    Status(crate::report::ClaimStatusApply),
    Event(Box<crate::report::Event>),
}

impl LateSink {
    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets the sink and forwards what was kept (in the background, in order).
    pub(super) fn set(&self, sink: Arc<dyn crate::report::Sink>) {
        // Under the lock that `keep` takes: nothing is kept after the flush took the list.
        let kept = {
            let mut k = self.kept();
            let _ = self.inner.set(sink.clone());
            std::mem::take(&mut *k)
        };
        if kept.is_empty() {
            return;
        }
        tokio::spawn(async move {
            for r in kept {
                let res = match &r {
                    Kept::Status(a) => sink.apply_claim_status(a).await,
                    Kept::Event(e) => sink.event(e).await,
                };
                if let Err(e) = res {
                    warn!(error = %crate::telemetry::chain(&e), "a report kept until the API side was up failed");
                }
            }
        });
    }

    /// The sink, or `None` after keeping `r` (or dropping it past the bound).
    fn sink_or_keep(&self, r: impl FnOnce() -> Kept) -> Option<Arc<dyn crate::report::Sink>> {
        let mut k = self.kept();
        if let Some(s) = self.inner.get() {
            return Some(s.clone());
        }
        if k.len() < LATE_SINK_KEPT {
            k.push(r());
        } else {
            tracing::debug!("no API side yet and {LATE_SINK_KEPT} reports kept: one dropped");
        }
        None
    }
}

impl crate::report::Sink for LateSink {
    fn apply_claim_status<'a>(
        &'a self,
        apply: &'a crate::report::ClaimStatusApply,
    ) -> BoxFuture<'a, Result<(), crate::report::ReportError>> {
        match self.sink_or_keep(|| Kept::Status(apply.clone())) {
            Some(s) => Box::pin(async move { s.apply_claim_status(apply).await }),
            None => Box::pin(async { Ok(()) }),
        }
    }

    fn event<'a>(
        &'a self,
        event: &'a crate::report::Event,
    ) -> BoxFuture<'a, Result<(), crate::report::ReportError>> {
        match self.sink_or_keep(|| Kept::Event(Box::new(event.clone()))) {
            Some(s) => Box::pin(async move { s.event(event).await }),
            None => Box::pin(async { Ok(()) }),
        }
    }

    fn patch_event<'a>(
        &'a self,
        event: &'a crate::report::Event,
    ) -> BoxFuture<'a, Result<crate::report::Patched, crate::report::ReportError>> {
        match self.inner.get() {
            Some(s) => s.patch_event(event),
            None => Box::pin(async { Ok(crate::report::Patched::Updated) }),
        }
    }
}

/// Where the kubelet side talks to: files (embedded mode) or the API server.
pub(super) enum ApiMode {
    Embedded { slices: PathBuf, claims: PathBuf },
    Kube,
}

/// Embedded mode when asked for (`--slices-dir` and `--claims-dir`), or when there is no
/// kubeconfig and no in-cluster environment; kube mode otherwise.
pub(super) fn api_mode(args: &RunArgs) -> ApiMode {
    if let (Some(slices), Some(claims)) = (&args.slices_dir, &args.claims_dir) {
        return ApiMode::Embedded {
            slices: slices.clone(),
            claims: claims.clone(),
        };
    }
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let kubeconfig_env = std::env::var_os("KUBECONFIG").is_some()
        || std::env::var_os("HOME").is_some_and(|h| PathBuf::from(h).join(".kube/config").exists());
    if args.kubeconfig.is_none() && !in_cluster && !kubeconfig_env {
        let slices = args
            .slices_dir
            .clone()
            .unwrap_or_else(|| args.state_dir.join("slices"));
        let claims = args
            .claims_dir
            .clone()
            .unwrap_or_else(|| args.state_dir.join("claims"));
        warn!(slices = %slices.display(), claims = %claims.display(),
            "no kubeconfig and not in a cluster: embedded mode (ResourceSlices to files, ResourceClaims from files)");
        return ApiMode::Embedded { slices, claims };
    }
    ApiMode::Kube
}

/// Builds the API client, retrying (jittered backoff, 1 s to 60 s) while its configuration
/// cannot be read; `/readyz` says why meanwhile.
pub(super) async fn kube_client_retrying(args: &RunArgs, readiness: &Readiness) -> kube::Client {
    let mut backoff = crate::backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        match kube_client(args).await {
            Ok(c) => {
                readiness.set_met(crate::ready::CLAIMS);
                return c;
            }
            Err(e) => {
                let wait = backoff.next_delay();
                let why = format!("{e:#}");
                warn!(error = %why, retry_in = ?wait, "no API client; devices stay protected, the kubelet side waits");
                readiness.set_unmet(crate::ready::SLICES, format!("no API client: {why}"));
                readiness.set_unmet(crate::ready::CLAIMS, format!("no API client: {why}"));
                tokio::time::sleep(wait).await;
            }
        }
    }
}

async fn kube_client(args: &RunArgs) -> anyhow::Result<kube::Client> {
    let cfg = match &args.kubeconfig {
        Some(p) => {
            let kc =
                kube::config::Kubeconfig::read_from(p).with_context(|| format!("reading {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster")?,
    };
    Ok(kube::Client::try_from(cfg)?)
}
