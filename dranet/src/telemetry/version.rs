//! What this binary is: its version (`CARGO_PKG_VERSION`), the git revision it was built from
//! and the compiler, set by `build.rs` (`DRANET_REVISION` when the build passes it, as a Docker
//! build without `.git` does; else `git rev-parse --short=12 HEAD`; else `unknown`). Shown by
//! `dranet --version`, logged at start and exported as `dranet_build_info`.

/// The crate version, e.g. `0.1.0`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binary was built from (12 hex digits), or `unknown`.
pub const REVISION: &str = env!("DRANET_REVISION");

/// The rustc version that built the binary, e.g. `1.95.0`.
pub const RUSTC: &str = env!("DRANET_RUSTC");

/// `dranet --version`: `0.1.0 (revision 0123456789ab, rustc 1.95.0)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("DRANET_REVISION"),
    ", rustc ",
    env!("DRANET_RUSTC"),
    ")"
);
