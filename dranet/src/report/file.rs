//! Reports without a cluster (embedded mode): each claim's status apply body is written to
//! `<dir>/<namespace>/<name>.json` (replaced atomically), events are appended to
//! `<dir>/events.jsonl`. `dir` is `<claims-dir>/status`: namespaces and claim names cannot
//! contain `/` or start with `.`, so nothing here can clash with a claim file.

use std::io::Write;
use std::path::{Path, PathBuf};

use futures::future::BoxFuture;

use super::{ClaimStatusApply, Event, Patched, ReportError, Sink};

/// JSON files under `dir`.
#[derive(Clone, Debug)]
pub struct FileSink {
    dir: PathBuf,
}

impl FileSink {
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Where the status of `namespace/name` goes.
    pub fn status_path(&self, namespace: &str, name: &str) -> Result<PathBuf, ReportError> {
        for s in [namespace, name] {
            if s.is_empty() || s.contains('/') || s.starts_with('.') {
                return Err(ReportError::BadName { name: s.to_owned() });
            }
        }
        Ok(self.dir.join(namespace).join(format!("{name}.json")))
    }

    #[must_use]
    pub fn events_path(&self) -> PathBuf {
        self.dir.join("events.jsonl")
    }
}

fn write_err(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `events.jsonl` at `path` holds an event whose name is `quoted` (JSON-quoted).
fn has_event_named(path: &Path, quoted: &str) -> std::io::Result<bool> {
    use std::io::BufRead;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let needle = format!("\"metadata\":{{\"name\":{quoted},");
    for line in std::io::BufReader::new(f).lines() {
        if line?.contains(&needle) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Updates are appended as they stand: a repeat is a line of its own.
impl Sink for FileSink {
    fn apply_claim_status<'a>(
        &'a self,
        apply: &'a ClaimStatusApply,
    ) -> BoxFuture<'a, Result<(), ReportError>> {
        Box::pin(async move {
            let path = self.status_path(&apply.metadata.namespace, &apply.metadata.name)?;
            let body = serde_json::to_vec_pretty(apply).map_err(ReportError::Encode)?;
            if let Some(parent) = path.parent() {
                tokio::fs::create_dir_all(parent)
                    .await
                    .map_err(write_err(parent))?;
            }
            let tmp = path.with_extension("json.tmp");
            tokio::fs::write(&tmp, body).await.map_err(write_err(&tmp))?;
            tokio::fs::rename(&tmp, &path).await.map_err(write_err(&path))
        })
    }

    /// An Event of that name in the file already is success and adds nothing, as the API
    /// server answers a create of an existing name: a report sent again under its fixed name
    /// (a vanished device's, after a restart) is not a second one.
    fn event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), ReportError>> {
        Box::pin(async move { self.append(event, true).await })
    }

    fn patch_event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<Patched, ReportError>> {
        Box::pin(async move { self.append(event, false).await.map(|()| Patched::Updated) })
    }
}

impl FileSink {
    /// Appends `event` as a line of `events.jsonl`; `once`: not if an event of its name is there.
    async fn append(&self, event: &Event, once: bool) -> Result<(), ReportError> {
        let mut line = serde_json::to_vec(event).map_err(ReportError::Encode)?;
        line.push(b'\n');
        let name = serde_json::to_string(&event.metadata.name).map_err(ReportError::Encode)?;
        let path = self.events_path();
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(write_err(&self.dir))?;
        let p = path.clone();
        // One write(2) of a whole line with O_APPEND: concurrent events do not interleave.
        tokio::task::spawn_blocking(move || {
            if once && has_event_named(&p, &name)? {
                return Ok(());
            }
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .and_then(|mut f| f.write_all(&line))
        })
        .await
        .map_err(|e| ReportError::Write {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?
        .map_err(write_err(&path))
    }
}
