pub mod kernel;
pub mod kubelet;
pub mod nic;
