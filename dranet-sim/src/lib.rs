pub mod kernel;
pub mod nic;
