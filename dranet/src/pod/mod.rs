//! The pod life cycle, from the runtime's hooks to the rescue engine.
//!
//! * [`hooks`] — the NRI hooks on top of the engine: RunPodSandbox attaches, Stop/Remove
//!   detach, CreateContainer injects RDMA character devices, Synchronize returns and adopts;
//! * [`late`] — late attach: a sandbox the runtime ran while dranet was away gets its devices at
//!   Synchronize or at its next CreateContainer;
//! * [`plans`] — the engine as the plan store of Prepare ([`crate::dra::PlanSink`]).
//!
//! A pod is a *sandbox* in a *netns*: every hook names its sandbox (pod UID + sandbox id), and the
//! engine ([`crate::rescue`]) owns every device move of it.

pub mod hooks;
pub mod inflight;
pub mod late;
mod plans;

pub use hooks::Driver;
