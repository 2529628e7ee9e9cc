//! The NRI side of `dranet run` (wired once the NRI plugin lands).

use prometheus_client::registry::Registry;

use super::run::RunArgs;
use super::run_sides::Sides;
use crate::rescue::Engine;

pub async fn start(
    _args: &RunArgs,
    _engine: &Engine,
    _registry: &mut Registry,
    _sides: &mut Sides,
) -> anyhow::Result<()> {
    Ok(())
}
