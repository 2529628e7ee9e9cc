//! The kernel fence: the only code that enters a network namespace, opens a netlink socket,
//! calls `bpf(2)`, mounts, or uses `libc`. Everything above it speaks typed requests.
//!
//! * [`netns`] — netns handles, pins (bind mounts), identity (cookie + inode), running code in a
//!   netns;
//! * [`link`] — device moves into and out of a pod, snapshots and full restores (rtnetlink);
//! * [`rdma`] — RDMA netns mode and RDMA link moves (`NETLINK_RDMA`), behind [`rdma::RdmaOps`];
//! * [`ethtool`] — offloads over generic netlink;
//! * [`bpf`] — `bpf(2)`: pinned programs, tc/tcx detach;
//! * [`rtnl`] — host rtnetlink connections (requests and multicast monitors);
//! * [`packet`] — the `AF_PACKET` socket of the DHCPv4 exchange;
//! * [`os`] — the rest of the process's syscalls: the monotonic clock, `flock`, `RLIMIT_NOFILE`,
//!   errno classification, bpffs mounts, returning freed heap to the kernel;
//! * [`process`] — this process's CPU, memory and fds from procfs (the `process_*` metrics).
//!
//! `dranet/clippy.toml` disallows the kernel entry points (`setns`, netlink sockets, `libc`
//! syscalls, mounts) everywhere in the crate; this module alone allows them.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

pub mod bpf;
pub mod ethtool;
pub mod inotify;
pub mod link;
pub mod netns;
pub mod os;
pub mod packet;
pub mod probes;
pub mod process;
pub mod rdma;
pub mod rtnl;
