//! Log set-up: `tracing` to stderr, text or JSON, `RUST_LOG`-style filters; `log` records
//! (aya-log from the probes) are forwarded to `tracing`.
//!
//! **Text** (`--log-format text`, the default): tracing's line format, with ANSI colours only
//! when stderr is a terminal and `NO_COLOR` is unset or empty, so `kubectl logs` and files never
//! carry escape codes.
//!
//! **JSON** (`--log-format json`): one object per line, in the shape of Kubernetes
//! component-base's JSON logs (`--logging-format=json`), so the same log pipeline parses
//! dranet and kubelet:
//!
//! ```json
//! {"ts":1733547600.123456,"v":0,"level":"info","msg":"dranet starting","caller":"src/cli/run.rs:230","version":"0.1.0"}
//! {"ts":1733547601.5,"v":0,"level":"error","msg":"bad flag","caller":"src/cli/run.rs:140","err":"--v: invalid digit"}
//! ```
//!
//! * `ts`: seconds since the Unix epoch, a float with microseconds (component-base's `ts`);
//! * `v`: the verbosity as klog numbers it, so a line with `v` N shows from `--v=N` on: error,
//!   warn and info 0, debug 4, trace 8 (dranet's `--v` mapping: 4 turns on dranet's debug lines,
//!   8 everything's trace);
//! * `level`: `error`, `warn`, `info`, `debug` or `trace`. Not in component-base, where a warning
//!   and an info line look alike; kept because it costs a parser nothing and an operator filters on
//!   it;
//! * `msg`: the message; `caller`: `file:line` of the log call;
//! * the event's fields, typed (numbers stay numbers); a field named `error` is written `err`, as
//!   component-base writes an error; fields recorded with `?` are their `Debug` text;
//! * `logger`: the target, only for lines from other crates (e.g. `aya_log`, `kube_client`);
//! * a field named like one of these keys gets a `_` after its name (`v_`), so no key repeats.
//!
//! * the fields of the spans the event is in (the engine opens one per sandbox operation:
//!   `pod`, `record`/`sandbox`, the return's `reason`), innermost first, after the event's own;
//!   an event's own field of the same name wins. Span names are not written.
//!
//! The `dranet ready` line the daemon prints on stdout
//! once it serves is the same shape in JSON mode ([`ready_line`]).

use std::fmt::Write as _;
use std::io::IsTerminal;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Whether text logs are coloured: stderr is a terminal and `NO_COLOR` is unset or empty.
#[must_use]
pub fn ansi_enabled() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

fn init(json: bool, filter: EnvFilter) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        // Span fields kept as JSON, for [`KlogJson`] to write with each event.
        builder
            .fmt_fields(JsonFields::new())
            .event_format(KlogJson)
            .try_init()
    } else {
        builder.with_ansi(ansi_enabled()).try_init()
    };
}

/// [`init_logging`] with `filter` instead of `RUST_LOG`.
pub fn init_logging_with(json: bool, filter: &str) {
    init(json, EnvFilter::new(filter));
}

/// Sets up `tracing` (text or JSON) with `RUST_LOG`-style filtering, defaulting to `default`.
/// `log` records (aya-log from the probes) are forwarded to `tracing`.
pub fn init_logging(json: bool, default: &str) {
    init(
        json,
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)),
    );
}

/// klog's verbosity of a level (see the module doc).
#[must_use]
pub fn verbosity(level: Level) -> u8 {
    match level {
        Level::ERROR | Level::WARN | Level::INFO => 0,
        Level::DEBUG => 4,
        Level::TRACE => 8,
    }
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

fn now_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One JSON log line (no newline): `ts`, `v`, `level`, `msg`, then `rest` in order.
fn json_line(level: Level, msg: &str, rest: &[(String, Value)]) -> String {
    let mut out = format!(
        "{{\"ts\":{:.6},\"v\":{},\"level\":\"{}\",\"msg\":{}",
        now_seconds(),
        verbosity(level),
        level_name(level),
        Value::from(msg)
    );
    for (k, v) in rest {
        let _ = write!(out, ",{}:{v}", Value::from(k.as_str()));
    }
    out.push('}');
    out
}

/// The line `dranet run` prints on stdout once it serves: `dranet ready`, or in JSON mode the
/// same as a JSON log line (`"msg":"dranet ready"`), so every line of the pod's log is JSON.
#[must_use]
pub fn ready_line(json: bool) -> String {
    const READY: &str = "dranet ready";
    if json {
        json_line(Level::INFO, READY, &[])
    } else {
        READY.to_owned()
    }
}

/// The component-base JSON event format (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct KlogJson;

/// An event's fields: the message apart, the rest in order.
#[derive(Default)]
struct Fields {
    msg: String,
    rest: Vec<(String, Value)>,
    log_file: Option<String>,
    log_line: Option<u64>,
    log_target: Option<String>,
}

impl Fields {
    fn put(&mut self, field: &Field, v: Value) {
        match field.name() {
            "message" => {
                self.msg = match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
            }
            // A `log` record forwarded by tracing-log: where it came from, not fields.
            "log.file" => self.log_file = v.as_str().map(str::to_owned),
            "log.line" => self.log_line = v.as_u64(),
            "log.target" => self.log_target = v.as_str().map(str::to_owned),
            "log.module_path" => {}
            "error" => self.rest.push(("err".to_owned(), v)),
            // A field named like one of the line's own keys is written with a `_` after it, so
            // no key appears twice.
            name @ ("ts" | "v" | "level" | "msg" | "caller" | "logger") => {
                self.rest.push((format!("{name}_"), v));
            }
            name => self.rest.push((name.to_owned(), v)),
        }
    }
}

impl Visit for Fields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let v =
            serde_json::Number::from_f64(value).map_or_else(|| Value::from(value.to_string()), Value::Number);
        self.put(field, v);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        self.put(field, Value::from(value.to_string()));
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        self.put(field, Value::from(value.to_string()));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::from(crate::telemetry::chain(value).to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::from(format!("{value:?}")));
    }
}

impl<S, N> FormatEvent<S, N> for KlogJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let mut f = Fields::default();
        event.record(&mut f);
        let mut rest = Vec::with_capacity(f.rest.len() + 2);
        let caller = match (
            f.log_file.as_deref().or(meta.file()),
            f.log_line.or(meta.line().map(u64::from)),
        ) {
            (Some(file), Some(line)) => Some(format!("{file}:{line}")),
            (Some(file), None) => Some(file.to_owned()),
            _ => None,
        };
        if let Some(c) = caller {
            rest.push(("caller".to_owned(), Value::from(c)));
        }
        let target = f.log_target.as_deref().unwrap_or(meta.target());
        if !(target == "dranet" || target.starts_with("dranet::")) {
            rest.push(("logger".to_owned(), Value::from(target)));
        }
        rest.append(&mut f.rest);
        span_fields(ctx, &mut rest);
        writeln!(writer, "{}", json_line(*meta.level(), &f.msg, &rest))
    }
}

/// Adds to `rest` the fields of every span the event is in, innermost first, each unless `rest`
/// has one of that name already. Span fields are kept as JSON when the subscriber formats them
/// with [`JsonFields`] (as [`init_logging`] does in JSON mode); otherwise there are none to add.
fn span_fields<S, N>(ctx: &FmtContext<'_, S, N>, rest: &mut Vec<(String, Value)>)
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    let Some(scope) = ctx.event_scope() else {
        return;
    };
    for span in scope {
        let ext = span.extensions();
        let Some(fields) = ext.get::<FormattedFields<N>>() else {
            continue;
        };
        let Ok(Value::Object(map)) = serde_json::from_str::<Value>(fields) else {
            continue;
        };
        for (k, v) in map {
            if !rest.iter().any(|(have, _)| *have == k) {
                rest.push((k, v));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer {
        #[source]
        source: std::io::Error,
    }

    /// The engine sets `pod` and `record` once, on the span of a sandbox operation: every line
    /// inside it carries them (the innermost span's first), a line's own field wins.
    #[test]
    fn json_lines_carry_the_fields_of_their_spans() {
        let buf = Buf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .fmt_fields(JsonFields::new())
            .event_format(KlogJson)
            .finish();
        tracing::subscriber::with_default(sub, || {
            let outer = tracing::info_span!("attach", pod = "uid-1", sandbox = "sb-1");
            let _o = outer.enter();
            tracing::info!("in the attach");
            let inner = tracing::info_span!("return", record = "uid-1/sb-0", pod = tracing::field::Empty);
            inner.record("pod", "uid-0");
            let _i = inner.enter();
            tracing::info!(devices = 2, "devices home");
            tracing::info!(record = "mine", "own field");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert_eq!(
            (&lines[0]["pod"], &lines[0]["sandbox"]),
            (&Value::from("uid-1"), &Value::from("sb-1"))
        );
        assert_eq!(
            (
                &lines[1]["pod"],
                &lines[1]["record"],
                &lines[1]["sandbox"],
                &lines[1]["devices"]
            ),
            (
                &Value::from("uid-0"),
                &Value::from("uid-1/sb-0"),
                &Value::from("sb-1"),
                &Value::from(2)
            )
        );
        assert_eq!(lines[2]["record"], "mine", "{out}");
        assert_eq!(
            out.lines().nth(2).unwrap().matches("\"record\"").count(),
            1,
            "{out}"
        );
    }

    #[test]
    fn json_lines_have_the_component_base_shape() {
        let buf = Buf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_max_level(Level::TRACE)
            .with_writer(move || w.clone())
            .event_format(KlogJson)
            .finish();
        tracing::subscriber::with_default(sub, || {
            let e = Outer {
                source: std::io::Error::other("inner"),
            };
            tracing::info!(
                devices = 3,
                ratio = 0.5,
                ok = true,
                name = "eth0",
                "inventory \"done\""
            );
            tracing::warn!(error = &e as &dyn std::error::Error, "lost");
            tracing::debug!(probe = ?("Ebpf", 1), v = 7, "probe");
            tracing::trace!(target: "kube_client", "deep");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        assert_eq!(lines.len(), 4, "{out}");
        for l in &lines {
            assert!(l["ts"].as_f64().unwrap() > 1.6e9, "{l}");
            assert!(l["v"].is_u64() && l["msg"].is_string(), "{l}");
            assert!(l["caller"].as_str().unwrap().contains("log.rs:"), "{l}");
        }
        assert!(out.starts_with("{\"ts\":"), "{out}");
        assert_eq!(lines[0]["msg"], "inventory \"done\"");
        assert_eq!(
            (
                &lines[0]["devices"],
                &lines[0]["ratio"],
                &lines[0]["ok"],
                &lines[0]["name"]
            ),
            (
                &Value::from(3),
                &Value::from(0.5),
                &Value::from(true),
                &Value::from("eth0")
            )
        );
        assert_eq!(
            (&lines[0]["v"], &lines[0]["level"]),
            (&Value::from(0), &Value::from("info"))
        );
        assert!(lines[0].get("logger").is_none(), "{}", lines[0]);
        assert_eq!(lines[1]["err"], "outer: inner");
        assert_eq!(
            (&lines[1]["v"], &lines[1]["level"]),
            (&Value::from(0), &Value::from("warn"))
        );
        assert_eq!(
            (&lines[2]["v"], &lines[2]["probe"]),
            (&Value::from(4), &Value::from("(\"Ebpf\", 1)"))
        );
        assert_eq!(lines[2]["v_"], 7);
        assert!(!out.lines().nth(2).unwrap().contains("\"v\":7"), "{out}");
        assert_eq!(
            (&lines[3]["v"], &lines[3]["logger"]),
            (&Value::from(8), &Value::from("kube_client"))
        );
    }

    #[test]
    fn the_ready_line_is_json_in_json_mode() {
        assert_eq!(ready_line(false), "dranet ready");
        let v: Value = serde_json::from_str(&ready_line(true)).unwrap();
        assert_eq!(
            (&v["msg"], &v["v"]),
            (&Value::from("dranet ready"), &Value::from(0))
        );
    }
}
