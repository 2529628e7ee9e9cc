//! Directory sink (`--slices-dir`): one `<slice name>.json` per slice, written atomically
//! (temp file + rename); this node's stale slice files are removed.

use std::path::{Path, PathBuf};

use futures::future::BoxFuture;

use super::{OwnerReference, Publisher, ResourceSlice, SliceError, slice_name};

/// Writes slices as files in a directory.
#[derive(Clone, Debug)]
pub struct DirPublisher {
    dir: PathBuf,
    prefix: String,
}

impl DirPublisher {
    /// Slices of `driver` on `node` go to `dir`.
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>, driver: &str, node: &str) -> Self {
        let first = slice_name(node, driver, 0);
        let prefix = first.trim_end_matches('0').to_owned();
        Self {
            dir: dir.into(),
            prefix,
        }
    }

    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SliceError {
        let path = path.display().to_string();
        move |source| SliceError::Io { what, path, source }
    }

    /// Our slice files currently in the directory.
    fn ours(&self) -> Result<Vec<PathBuf>, SliceError> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Self::io("reading", &self.dir)(e)),
        };
        Ok(rd
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_suffix(".json"))
                    .and_then(|n| n.strip_prefix(&self.prefix))
                    .is_some_and(|idx| !idx.is_empty() && idx.bytes().all(|b| b.is_ascii_digit()))
            })
            .collect())
    }

    fn publish_sync(&self, slices: &[ResourceSlice]) -> Result<(), SliceError> {
        std::fs::create_dir_all(&self.dir).map_err(Self::io("creating", &self.dir))?;
        let mut keep = Vec::new();
        for s in slices {
            let path = self.dir.join(format!("{}.json", s.metadata.name));
            let tmp = self.dir.join(format!(".{}.json.tmp", s.metadata.name));
            let body = serde_json::to_vec_pretty(s).map_err(|source| SliceError::Json {
                name: s.metadata.name.clone(),
                source,
            })?;
            std::fs::write(&tmp, body).map_err(Self::io("writing", &tmp))?;
            std::fs::rename(&tmp, &path).map_err(Self::io("renaming", &tmp))?;
            keep.push(path);
        }
        for p in self.ours()? {
            if !keep.contains(&p) {
                std::fs::remove_file(&p).map_err(Self::io("removing", &p))?;
            }
        }
        Ok(())
    }

    /// Slices now in the directory (ours), sorted by name.
    pub fn read_all(&self) -> Result<Vec<ResourceSlice>, SliceError> {
        let mut out = Vec::new();
        for p in self.ours()? {
            let body = std::fs::read(&p).map_err(Self::io("reading", &p))?;
            let s: ResourceSlice = serde_json::from_slice(&body).map_err(|source| SliceError::Json {
                name: p.display().to_string(),
                source,
            })?;
            out.push(s);
        }
        out.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(out)
    }
}

impl DirPublisher {
    /// This node's slices as JSON (what [`super::PublishedDevices`] reads at start).
    pub fn existing_slices<'a>(&'a self) -> BoxFuture<'a, Result<Vec<serde_json::Value>, SliceError>> {
        Box::pin(async move {
            self.read_all()?
                .iter()
                .map(|s| {
                    serde_json::to_value(s).map_err(|source| SliceError::Json {
                        name: s.metadata.name.clone(),
                        source,
                    })
                })
                .collect()
        })
    }
}

impl Publisher for DirPublisher {
    fn existing_generation<'a>(&'a self) -> BoxFuture<'a, Result<i64, SliceError>> {
        Box::pin(async move {
            Ok(self
                .read_all()?
                .iter()
                .map(|s| s.spec.pool.generation)
                .max()
                .unwrap_or(0))
        })
    }

    fn owner<'a>(&'a self) -> BoxFuture<'a, Result<Option<OwnerReference>, SliceError>> {
        Box::pin(async { Ok(None) })
    }

    fn publish<'a>(&'a self, slices: &'a [ResourceSlice]) -> BoxFuture<'a, Result<(), SliceError>> {
        Box::pin(async move { self.publish_sync(slices) })
    }
}
