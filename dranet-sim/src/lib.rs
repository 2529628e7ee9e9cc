pub mod kernel;
pub mod kubelet;
pub mod nic;
pub mod nri_runtime;
