//! The NRI side of `dranet run`: the plugin, with the rescue engine behind its hooks.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tracing::{error, info};

use super::run::RunArgs;
use super::run_sides::Sides;
use crate::adoption::Adopter;
use crate::nri::{NriMetrics, PluginConfig};
use crate::pod::Driver;
use crate::pod::late::LateAttacher;
use crate::rescue::Engine;

pub async fn start(
    args: &RunArgs,
    engine: &Engine,
    registry: &mut Registry,
    sides: &mut Sides,
) -> anyhow::Result<()> {
    // The node's claims arrive once the kubelet side is up; plans are used at once.
    // Sandboxes the runtime ran while dranet was away get their devices late (pod::late).
    let late = LateAttacher::new(engine.clone(), sides.reporter.clone());
    late.metrics().register(registry);
    let adopter = Adopter::new(engine.clone(), sides.allocations.clone()).with_late(late.clone());
    adopter.metrics().register(registry);
    let driver = Arc::new(
        Driver::new(engine.clone())
            .with_reporter(sides.reporter.clone())
            .with_late(late)
            .with_adoption(adopter),
    );
    let metrics = NriMetrics::default();
    metrics.register(registry);
    if args.no_nri {
        return Ok(());
    }
    let cfg = PluginConfig {
        socket: args.nri_socket.clone(),
        name: args.nri_plugin_name.clone(),
        index: args.nri_plugin_index.clone(),
        metrics: metrics.clone(),
        readiness: Some(sides.readiness.clone()),
        ..PluginConfig::default()
    };
    sides.readiness.expect(
        crate::ready::NRI,
        format!(
            "not registered with the runtime's NRI socket {} yet",
            cfg.socket.display()
        ),
    );
    let (tx, rx) = tokio::sync::watch::channel(false);
    info!(socket = %cfg.socket.display(), name = cfg.name, index = cfg.index, "NRI plugin starting");
    sides.nri_task = Some(tokio::spawn(async move {
        if let Err(e) = crate::nri::run(cfg, driver, rx).await {
            error!(error = %crate::telemetry::chain(&e), "NRI plugin stopped");
        }
    }));
    sides.nri_stop = Some(tx);
    Ok(())
}
