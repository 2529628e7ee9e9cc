//! Every metric family dranet exports, one file per side (as controller-rs keeps its metrics in
//! one place): the rescue engine, the NRI plugin, the DRA plugin, ResourceSlice publication and
//! the kernel probes. Each family type is cheap to clone (shared handles), is observed where the
//! work happens and registers itself with `register`. The listeners' own counters are in
//! [`crate::listen`], next to the caps they count.

pub mod dra;
pub mod nri;
pub mod probes;
pub mod rescue;
pub mod slices;

pub use dra::DraMetrics;
pub use nri::NriMetrics;
pub use probes::ProbeMetrics;
pub use rescue::RescueMetrics;
pub use slices::SliceMetrics;
