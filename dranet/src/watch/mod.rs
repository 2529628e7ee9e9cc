//! The lifecycle watcher: eBPF probes (tiered, chosen by capability detection), an rtnetlink
//! monitor and an inotify fallback, merged into one typed stream of [`LifecycleEvent`]s.
//! (Fenced: touches the kernel.)

/// The eBPF object built by `cargo xtask build-ebpf`, embedded at build time.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("DRANET_EBPF_OBJECT"));
