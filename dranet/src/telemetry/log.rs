//! Log set-up: `tracing` to stderr, text or JSON, `RUST_LOG`-style filters; `log` records
//! (aya-log from the probes) are forwarded to `tracing`.

/// [`init_logging`] with `filter` instead of `RUST_LOG`.
pub fn init_logging_with(json: bool, filter: &str) {
    use tracing_subscriber::EnvFilter;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Sets up `tracing` (text or JSON) with `RUST_LOG`-style filtering, defaulting to `default`.
/// `log` records (aya-log from the probes) are forwarded to `tracing`.
pub fn init_logging(json: bool, default: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
