//! The simulated node, never shipped. It holds what dranet meets on a node, built to the real
//! wire protocols and behaviour (the NRI runtime harness, the kubelet simulator, the API server
//! with RBAC and object limits, kernel test objects), the fixtures the tests share, and the
//! programs that run dranet against all of it: `dranet-demo` (the README's demo), `dranet-bench`
//! (`cargo xtask bench`), `dranet-soak` and `engine-child` (a daemon-side process the crash
//! tests kill). The programs live here because they drive the same simulators as the tests.

pub mod apiserver;
pub mod authz;
pub mod bpf;
pub mod containerd;
pub mod cri;
pub mod fixtures;
pub mod kernel;
pub mod kubelet;
pub mod limits;
pub mod nic;
pub mod node;
pub mod nri_runtime;
pub mod nri_validator;
pub mod oci;
pub mod real_node;
pub mod soak;

/// The first line of a root test returning `anyhow::Result<()>`: [`kernel::require_root`] under
/// the test's name, returning `Ok(())` (skipped, and said so) when not root outside CI; under
/// `CI=true` the test fails instead.
#[macro_export]
macro_rules! root_or_skip {
    ($test:expr) => {
        if !$crate::kernel::require_root($test)? {
            return Ok(());
        }
    };
}

/// Root tests that each run one case on a multi-threaded runtime (two workers), named
/// `name => case;` (the case a future of `anyhow::Result<()>`), each after [`root_or_skip!`]
/// under its own name.
#[macro_export]
macro_rules! root_tests {
    ($($(#[$meta:meta])* $name:ident => $case:expr;)*) => {$(
        $(#[$meta])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() -> ::anyhow::Result<()> {
            $crate::root_or_skip!(stringify!($name));
            ::anyhow::Context::context($case.await, stringify!($name))
        }
    )*};
}
