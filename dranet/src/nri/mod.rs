//! NRI plugin: dranet's runtime hooks, spoken over the NRI trunk without any NRI crate.
//!
//! * [`mux`] — the NRI multiplexer (8-byte header: conn id + length) over one unix connection;
//! * [`ttrpc`] — the unary subset of ttrpc (10-byte header, Request/Response envelope) on a mux
//!   connection: a server with dispatch on (service, method) and a client with timeouts;
//! * [`hooks`] — the API the driver implements ([`hooks::PodHooks`]);
//! * [`plugin`] — dial (or the inherited `NRI_PLUGIN_SOCKET`), RegisterPlugin, wait for
//!   Configure, reconnect with backoff (100 ms doubling to 5 s);
//! * `service` — the Plugin service: Configure (event mask 0xF), chunked Synchronize, the pod
//!   hooks in both dialects (dedicated RPCs and `StateChange`), CreateContainer devices;
//! * hook calls, errors and latency by hook: [`NriMetrics`], in [`crate::telemetry::metrics`];
//! * `replay` — the whole receive path over an in-memory trunk (fuzz target `nri`, tests).
//!
//! Bounds: frames over 4 MiB + 10 bytes (Go's largest) close the trunk, and a frame's buffer
//! grows with the bytes that arrive; at most [`ttrpc::MAX_IN_FLIGHT`] requests run at once per
//! connection (more are answered `RESOURCE_EXHAUSTED`); a Synchronize sent in parts is buffered
//! up to [`SyncLimits`] (more is refused, up to its last part, and dropped); StopPodSandbox and
//! RemovePodSandbox answer after at most `service::TEARDOWN_HOOK_WAIT` (1.5 s) while their device
//! returns go on (a drain queues a pod's returns behind every other pod's).

pub mod hooks;
pub mod mux;
pub mod plugin;
#[doc(hidden)]
pub mod replay;
mod service;
pub mod ttrpc;

pub use plugin::{NriError, NriMetrics, PluginConfig, run};
pub use service::SyncLimits;

/// Generated protobuf messages (`proto/msg/`, prost only: dranet implements ttrpc itself).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    /// `google.rpc.Status` (re-declared, wire-compatible).
    pub mod google {
        pub mod rpc {
            include!(concat!(env!("OUT_DIR"), "/google.rpc.rs"));
        }
    }
    /// The ttrpc envelope.
    pub mod ttrpc {
        include!(concat!(env!("OUT_DIR"), "/ttrpc.rs"));
    }
    /// The NRI API subset.
    pub mod nri {
        include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));
    }
}
