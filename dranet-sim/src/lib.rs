pub mod kernel;
pub mod kubelet;
