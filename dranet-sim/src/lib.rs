pub mod apiserver;
pub mod bpf;
pub mod fixtures;
pub mod kernel;
pub mod kubelet;
pub mod nic;
pub mod node;
pub mod nri_runtime;
