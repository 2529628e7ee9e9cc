//! dranet: a Kubernetes DRA network driver that returns devices whatever the runtime's teardown
//! order.
//!
//! The data path reads off the module tree:
//!
//! * [`watch`] — eBPF probes + rtnetlink (+ inotify fallback) → one stream of [`watch::LifecycleEvent`]s;
//! * [`rescue`] — events, NRI hooks and reconcile → decisions (one owner per pod);
//! * [`adoption`] — running sandboxes dranet has no record of + the node's allocations → rescue's
//!   adoption (pods started by upstream dranet, a lost checkpoint);
//! * [`netns`], [`link`], [`rdma`], [`ethtool`], [`dhcp`], [`bpf`] — the only places that touch the
//!   kernel: pins, device moves and restores, RDMA link moves, offloads, the Prepare-time DHCPv4
//!   lease, unpinning and detaching a device's eBPF programs (`disableEbpfPrograms`).
//!
//! Around it: [`nri`] (runtime hooks over multiplexed ttrpc), [`dra`] (kubelet gRPC),
//! [`plan`] (per-pod device plans from Prepare), [`config`] (opaque config + validation),
//! [`inventory`] and [`slices`] (ResourceSlice publishing), [`cloud`] (cloud provider attributes
//! and the profile webhook), [`report`] (claim status and events),
//! [`state`] (crash-safe checkpoint), [`cli`] (one file per subcommand).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod adoption;
pub mod backoff;
pub mod bpf;
pub mod cli;
pub mod cloud;
pub mod config;
pub mod dhcp;
pub mod dra;
pub mod driver;
pub mod ethtool;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod ids;
pub mod inventory;
pub mod link;
pub mod listen;
pub mod netns;
pub mod nri;
pub mod pci;
pub mod plan;
pub mod proto;
pub mod rbac;
pub mod rdma;
pub mod ready;
pub mod report;
pub mod rescue;
pub mod slices;
pub mod state;
pub mod watch;
