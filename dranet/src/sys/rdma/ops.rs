//! The seam at the kernel fence for what the rescue engine asks of the RDMA subsystem. The real
//! implementation ([`KernelRdma`]) speaks NETLINK_RDMA; a test passes its own (a kernel that
//! hangs, fails or has no RDMA at all: the project VM's has none) through
//! `rescue::EngineOptions::rdma`. Both calls block; the engine runs them on the blocking pool
//! under its kernel timeout.

use super::{NetnsMode, RdmaError};
use crate::sys::netns::Netns;

/// RDMA operations of the rescue engine (blocking).
pub trait RdmaOps: Send + Sync + std::fmt::Debug + 'static {
    /// The host's RDMA netns mode; `None` when the kernel has no RDMA.
    fn host_mode(&self) -> Result<Option<NetnsMode>, RdmaError>;
    /// Moves RDMA device `name` from netns `from` to netns `to` (exclusive mode).
    fn move_device(&self, from: &Netns, name: &str, to: &Netns) -> Result<(), RdmaError>;
}

/// The kernel's RDMA subsystem over NETLINK_RDMA.
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelRdma;

impl RdmaOps for KernelRdma {
    fn host_mode(&self) -> Result<Option<NetnsMode>, RdmaError> {
        super::host_mode()
    }

    fn move_device(&self, from: &Netns, name: &str, to: &Netns) -> Result<(), RdmaError> {
        super::move_device(from, name, to)
    }
}
