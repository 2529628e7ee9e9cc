//! Every metric family dranet exports, one file per side (as controller-rs keeps its metrics in
//! one place): the rescue engine, the NRI plugin, the DRA plugin, ResourceSlice publication and
//! the kernel probes. Each family type is cheap to clone (shared handles), is observed where the
//! work happens and registers itself with `register`. The listeners' own counters are in
//! [`crate::listen`], next to the caps they count; the standard `process_*` families and
//! `dranet_build_info` are in [`process`].
//!
//! Every family is `dranet_`-prefixed except the standard `process_*` ones. `/metrics` answers
//! the Prometheus text format 0.0.4 unless the scraper accepts OpenMetrics ([`Format`]).

pub mod dra;
pub mod nri;
pub mod probes;
pub mod process;
pub mod rescue;
pub mod slices;

pub use dra::DraMetrics;
pub use nri::NriMetrics;
pub use probes::ProbeMetrics;
pub use rescue::RescueMetrics;
pub use slices::SliceMetrics;

use prometheus_client::registry::Registry;

/// A registry holding the families every exposition has: `process_*` and `dranet_build_info`.
#[must_use]
pub fn registry() -> Registry {
    let mut r = Registry::default();
    process::register(&mut r);
    r
}

/// The exposition formats `/metrics` speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4: what a scraper gets unless it asks for OpenMetrics.
    Text004,
    /// OpenMetrics 1.0.0 text (`# EOF`-terminated).
    OpenMetrics,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text` with a non-zero quality (as Prometheus does), the text
    /// format 0.0.4 otherwise, or when there is no header.
    #[must_use]
    pub fn negotiate(accept: Option<&str>) -> Self {
        let wants_openmetrics = accept.is_some_and(|a| {
            a.split(',').any(|range| {
                let mut parts = range.split(';').map(str::trim);
                let media = parts.next().unwrap_or_default();
                media.eq_ignore_ascii_case("application/openmetrics-text")
                    && !parts.any(|p| {
                        p.split_once('=').is_some_and(|(k, v)| {
                            k.trim().eq_ignore_ascii_case("q")
                                && v.trim().parse::<f32>().is_ok_and(|q| q <= 0.0)
                        })
                    })
            })
        });
        if wants_openmetrics {
            Self::OpenMetrics
        } else {
            Self::Text004
        }
    }

    /// The `Content-Type` of an answer in this format.
    #[must_use]
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Text004 => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// `registry` in `format`.
///
/// # Errors
/// A metric that fails to encode (a `fmt::Error` from a collector).
pub fn encode(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    match format {
        Format::Text004 => prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?,
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, registry)?,
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
