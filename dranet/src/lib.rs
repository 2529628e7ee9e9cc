//! dranet: a Kubernetes DRA network driver that returns devices whatever the runtime's teardown
//! order.
//!
//! The data path reads off the module tree:
//!
//! * [`watch`] — eBPF probes + rtnetlink (+ inotify fallback) → one stream of [`watch::LifecycleEvent`]s;
//! * [`pod`] — the pod life cycle: the runtime's hooks and Prepare's plans → the engine;
//! * [`rescue`] — events, NRI hooks and reconcile → decisions (one owner per pod);
//! * [`adoption`] — running sandboxes dranet has no record of + the node's allocations → rescue's
//!   adoption (pods started by upstream dranet, a lost checkpoint);
//! * [`sys`] — the kernel fence, the only code that touches the kernel: netns pins, device moves
//!   and restores, RDMA link moves, offloads, eBPF program detach, host rtnetlink, the DHCP
//!   packet socket, the clock and process limits.
//!
//! Around it: [`nri`] (runtime hooks over multiplexed ttrpc), [`dra`] (kubelet gRPC),
//! [`plan`] (per-pod device plans from Prepare), [`config`] (opaque config + validation),
//! [`inventory`] and [`slices`] (ResourceSlice publishing), [`cloud`] (cloud provider attributes
//! and the profile webhook), [`report`] (claim status and events),
//! [`state`] (crash-safe checkpoint), [`telemetry`] (logs, error chains, metrics), [`clock`]
//! (monotonic vs wall time), [`cli`] (one file per subcommand).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod adoption;
pub mod backoff;
pub mod cli;
pub mod clock;
pub mod cloud;
pub mod config;
pub mod dhcp;
pub mod dra;
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc_authority;
pub mod heap;
pub mod http;
pub mod ids;
pub mod inventory;
pub mod listen;
pub mod mac;
pub mod nri;
pub mod pci;
pub mod plan;
pub mod pod;
pub mod proto;
pub mod rbac;
pub mod ready;
pub mod report;
pub mod rescue;
pub mod shared;
pub mod slices;
pub mod state;
pub mod sys;
pub mod telemetry;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
pub mod text;
pub mod watch;
