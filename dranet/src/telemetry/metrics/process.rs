//! The families every Prometheus exporter is expected to have: the standard process collector's
//! `process_*` (as Go's `collectors.NewProcessCollector` and client_golang's default registry
//! export them; read from procfs at scrape time through [`crate::sys::process`], no thread or
//! timer) and `dranet_build_info{version,revision} 1`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::telemetry::version;

/// The standard `process_*` families, sampled at every scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

fn gauge(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: f64) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // No procfs (never on Linux with /proc mounted): the families are left out, as Go's
        // collector does, rather than failing the whole scrape.
        let Ok(s) = crate::sys::process::stats() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(enc.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        gauge(
            &mut enc,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            s.resident_bytes as f64,
        )?;
        gauge(
            &mut enc,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            s.virtual_bytes as f64,
        )?;
        gauge(
            &mut enc,
            "process_open_fds",
            "Number of open file descriptors.",
            s.open_fds as f64,
        )?;
        gauge(
            &mut enc,
            "process_max_fds",
            "Maximum number of open file descriptors.",
            s.max_fds as f64,
        )?;
        gauge(
            &mut enc,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            s.start_time_seconds,
        )
    }
}

/// Registers the `process_*` families and `dranet_build_info`.
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(ProcessCollector));
    registry.register(
        "dranet_build",
        "dranet's version and the git revision it was built from",
        Info::new(vec![
            ("version".to_owned(), version::VERSION.to_owned()),
            ("revision".to_owned(), version::REVISION.to_owned()),
        ]),
    );
}
