pub mod kernel;
pub mod nri_runtime;
