use std::time::{Duration, Instant};

use super::*;
use crate::telemetry::version;

/// A registry with every family the daemon registers, each with a sample where labels allow.
fn full_registry() -> Registry {
    let mut r = registry();
    RescueMetrics::default().register(&mut r);
    crate::listen::metrics().register(&mut r);
    let probes = ProbeMetrics::default();
    probes.set("Ebpf", "umount", true);
    probes.register(&mut r);
    let nri = NriMetrics::default();
    nri.observe(
        crate::nri::hooks::PodHook::RunPodSandbox,
        Instant::now(),
        nri::HookStatus::Success,
    );
    nri.register(&mut r);
    let dra = DraMetrics::default();
    dra.observe(dra::PREPARE, true, Duration::from_millis(3));
    dra.register(&mut r);
    let slices = SliceMetrics::default();
    slices.published(2, 1);
    slices.failed("conflict");
    slices.scanned(0.01);
    slices.register(&mut r);
    crate::adoption::AdoptionMetrics::default().register(&mut r);
    r
}

/// Metric names of an exposition: from `# TYPE`/`# HELP` lines and from every sample.
fn names(exposition: &str) -> Vec<&str> {
    exposition
        .lines()
        .filter(|l| !l.is_empty() && *l != "# EOF")
        .filter_map(|l| match l.strip_prefix("# ") {
            Some(meta) => meta.split_whitespace().nth(1),
            None => l.split(['{', ' ']).next(),
        })
        .collect()
}

#[test]
fn every_family_is_dranet_prefixed_or_a_standard_process_one() {
    let r = full_registry();
    for format in [Format::Text004, Format::OpenMetrics] {
        let out = encode(&r, format).unwrap();
        let names = names(&out);
        assert!(names.len() > 40, "{out}");
        for n in names {
            assert!(
                n.starts_with("dranet_") || n.starts_with("process_"),
                "{n} is not dranet_-prefixed ({format:?}):\n{out}"
            );
        }
        for n in [
            "dranet_nri_registrations_total",
            "dranet_nri_connection_losses_total",
            "dranet_driver_nri_plugin_requests_total",
            "dranet_driver_dra_plugin_requests_total",
        ] {
            assert!(
                out.contains(&format!("\n{n} ")) || out.contains(&format!("\n{n}{{")),
                "{n} missing:\n{out}"
            );
        }
    }
}

fn sample(out: &str, name: &str) -> f64 {
    out.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} sample in\n{out}"))
}

#[test]
fn process_families_are_there_and_sane() {
    let out = encode(&registry(), Format::Text004).unwrap();
    assert!(sample(&out, "process_resident_memory_bytes") > 0.0, "{out}");
    assert!(sample(&out, "process_virtual_memory_bytes") > 0.0, "{out}");
    let fds = sample(&out, "process_open_fds");
    assert!(fds > 0.0 && sample(&out, "process_max_fds") >= fds, "{out}");
    assert!(sample(&out, "process_cpu_seconds_total") >= 0.0, "{out}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let start = sample(&out, "process_start_time_seconds");
    assert!(start > now - 86_400.0 && start <= now + 1.0, "{out}");
    for t in [
        "# TYPE process_cpu_seconds_total counter",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_virtual_memory_bytes gauge",
        "# TYPE process_open_fds gauge",
        "# TYPE process_max_fds gauge",
        "# TYPE process_start_time_seconds gauge",
        "# TYPE dranet_build_info gauge",
    ] {
        assert!(out.lines().any(|l| l == t), "{t} missing:\n{out}");
    }
    assert!(
        out.contains(&format!(
            "dranet_build_info{{version=\"{}\",revision=\"{}\"}} 1\n",
            version::VERSION,
            version::REVISION
        )),
        "{out}"
    );
    assert!(!version::REVISION.is_empty());
}

/// The 0.0.4 rules that differ from OpenMetrics, on the daemon's real families: a counter's
/// HELP and TYPE name its `_total` sample, no `_created`, no `# UNIT`, no `# EOF`, info is a gauge.
#[test]
fn text_0_0_4_differs_from_openmetrics_where_it_must() {
    let r = full_registry();
    let text = encode(&r, Format::Text004).unwrap();
    let om = encode(&r, Format::OpenMetrics).unwrap();
    assert!(om.ends_with("# EOF\n") && !text.contains("# EOF"), "{text}");
    assert!(om.contains("# TYPE dranet_nri_registrations counter\n"), "{om}");
    assert!(text.contains("# HELP dranet_nri_registrations_total "), "{text}");
    assert!(
        text.contains("# TYPE dranet_nri_registrations_total counter\n"),
        "{text}"
    );
    assert!(text.contains("\ndranet_nri_registrations_total 0\n"), "{text}");
    for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut it = l.split_whitespace().skip(2);
        let (name, kind) = (it.next().unwrap(), it.next().unwrap());
        assert!(
            matches!(kind, "counter" | "gauge" | "histogram" | "untyped"),
            "{l}"
        );
        assert!(kind != "counter" || name.ends_with("_total"), "{l}");
    }
    assert!(!text.contains("_created") && !text.contains("# UNIT"), "{text}");
    // The same samples in both (0.0.4 orders a histogram's buckets first, labels `le` last and
    // writes `le` as Go does: `1`, `5e-05`; OpenMetrics `1.0`, `0.00005`).
    let samples = |s: &str| -> Vec<String> {
        let mut v: Vec<String> = s
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("process_"))
            .filter_map(|l| l.split(['{', ' ']).next())
            .map(str::to_owned)
            .collect();
        v.sort();
        v
    };
    assert_eq!(samples(&text), samples(&om));
}

#[test]
fn accept_headers_pick_the_format() {
    use Format::{OpenMetrics, Text004};
    for (accept, want) in [
        (None, Text004),
        (Some(""), Text004),
        (Some("text/plain"), Text004),
        (Some("text/plain; version=0.0.4; q=1"), Text004),
        (Some("application/json, */*"), Text004),
        (Some("application/openmetrics-text"), OpenMetrics),
        (Some("Application/OpenMetrics-Text; version=1.0.0"), OpenMetrics),
        (
            Some("text/plain;q=0.5, application/openmetrics-text;version=0.0.1;q=0.75"),
            OpenMetrics,
        ),
        (Some("application/openmetrics-text; q=0, text/plain"), Text004),
    ] {
        assert_eq!(Format::negotiate(accept), want, "{accept:?}");
    }
}
