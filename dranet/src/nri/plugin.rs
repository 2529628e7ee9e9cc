//! placeholder
#[derive(Debug, thiserror::Error)]
pub enum NriError {}
pub struct NriMetrics;
pub struct PluginConfig;
pub fn run() {}
