//! The state dir's files: `state.json` (the checkpoint), `state.json.prev` (the generation it
//! replaced), `state.json.corrupt-<unix time>` (checkpoints that did not load, kept for the
//! operator) and `pins/`.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use tracing::warn;

use super::{Checkpoint, FILE, FORMAT_VERSION, PodRecord, StateError, decode};
use crate::plan::PodPlan;

/// Temp files of this process get a sequence number: two saves never share one.
static SEQ: AtomicU64 = AtomicU64::new(0);

/// The state dir: checkpoint files and the pins directory. Paths only (cheap to clone); the
/// process that writes holds the dir's [`super::StateLock`].
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

/// Where [`Store::load_or_recover`] got the checkpoint from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadSource {
    /// No checkpoint yet: empty.
    Absent,
    /// `state.json`.
    Current,
    /// `state.json` did not load (`problem`; moved to `aside` when it existed) and
    /// `state.json.prev` did: one save behind.
    Previous { problem: String, aside: Option<PathBuf> },
    /// Neither loaded: empty, to be rebuilt from the pins.
    Nothing {
        problem: String,
        prev_problem: String,
        aside: Option<PathBuf>,
    },
}

/// A checkpoint and where it came from.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub cp: Checkpoint,
    pub source: LoadSource,
}

fn empty() -> Checkpoint {
    Checkpoint {
        version: FORMAT_VERSION,
        ..Checkpoint::default()
    }
}

impl Store {
    /// Opens (creating, mode 0700) the state dir.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StateError> {
        let dir = dir.into();
        let derr = |source| StateError::Dir {
            path: dir.clone(),
            source,
        };
        fs::create_dir_all(dir.join("pins")).map_err(derr)?;
        set_private(&dir).map_err(derr)?;
        Ok(Self { dir })
    }

    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where pins (netns bind mounts) live.
    #[must_use]
    pub fn pins_dir(&self) -> PathBuf {
        self.dir.join("pins")
    }

    #[must_use]
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// The previous generation, kept by every save.
    #[must_use]
    pub fn prev_path(&self) -> PathBuf {
        self.dir.join(format!("{FILE}.prev"))
    }

    /// Loads `state.json`; an absent file is an empty checkpoint. Read only: `dranet status`
    /// uses it beside a running daemon.
    pub fn load(&self) -> Result<Checkpoint, StateError> {
        Ok(load_file(&self.path())?.unwrap_or_else(empty))
    }

    /// Loads `state.json.prev` (`None` when there is none).
    pub fn load_prev(&self) -> Result<Option<Checkpoint>, StateError> {
        load_file(&self.prev_path())
    }

    /// Loads the checkpoint, never failing on its content: a `state.json` that does not load is
    /// logged and moved aside (`state.json.corrupt-<unix time>`), then `state.json.prev` is
    /// tried; if that fails too the result is empty and [`LoadSource::Nothing`] (the caller
    /// rebuilds from the pins). `state.json` absent with a `.prev` present (removed by hand)
    /// loads the `.prev`. Only the state-dir lock holder may call this (it moves files).
    pub fn load_or_recover(&self) -> Loaded {
        let path = self.path();
        let problem = match load_file(&path) {
            Ok(Some(cp)) => {
                return Loaded {
                    cp,
                    source: LoadSource::Current,
                };
            }
            Ok(None) if !self.prev_path().exists() => {
                return Loaded {
                    cp: empty(),
                    source: LoadSource::Absent,
                };
            }
            Ok(None) => format!("{} is missing", path.display()),
            Err(e) => crate::telemetry::chain(&e).to_string(),
        };
        let aside = path.exists().then(|| self.move_aside(&path)).flatten();
        match self.load_prev() {
            Ok(Some(cp)) => {
                warn!(
                    problem,
                    aside = ?aside,
                    "the checkpoint does not load: using state.json.prev, one save behind"
                );
                Loaded {
                    cp,
                    source: LoadSource::Previous { problem, aside },
                }
            }
            other => {
                let prev_problem = match other {
                    Err(e) => crate::telemetry::chain(&e).to_string(),
                    Ok(_) => format!("{} is missing", self.prev_path().display()),
                };
                warn!(
                    problem,
                    prev_problem,
                    aside = ?aside,
                    "neither the checkpoint nor state.json.prev loads: starting empty, records are rebuilt from the pins"
                );
                Loaded {
                    cp: empty(),
                    source: LoadSource::Nothing {
                        problem,
                        prev_problem,
                        aside,
                    },
                }
            }
        }
    }

    /// Renames a checkpoint that does not load to `<name>.corrupt-<unix time>[.<n>]`, so the
    /// next save does not destroy the evidence. `None` (logged) if it cannot.
    fn move_aside(&self, path: &Path) -> Option<PathBuf> {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let name = path.file_name()?.to_string_lossy().into_owned();
        for n in 0..100u32 {
            let to = if n == 0 {
                self.dir.join(format!("{name}.corrupt-{secs}"))
            } else {
                self.dir.join(format!("{name}.corrupt-{secs}.{n}"))
            };
            if to.exists() {
                continue;
            }
            return match fs::rename(path, &to) {
                Ok(()) => Some(to),
                Err(e) => {
                    warn!(path = %path.display(), error = %crate::telemetry::chain(&e), "cannot move the bad checkpoint aside");
                    None
                }
            };
        }
        None
    }

    /// Replaces the checkpoint atomically and durably (see the module docs). Only the state-dir
    /// lock holder may call this.
    pub fn save(&self, cp: &Checkpoint) -> Result<(), StateError> {
        self.write(&encode(cp)?)
    }

    /// [`Store::save`] of an encoded checkpoint.
    pub fn write(&self, bytes: &[u8]) -> Result<(), StateError> {
        let path = self.path();
        let tmp = self.temp_path(FILE);
        let werr = |source| StateError::Write {
            path: tmp.clone(),
            source,
        };
        let res = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(werr)?;
            f.write_all(bytes).map_err(werr)?;
            f.sync_all().map_err(werr)?;
            drop(f);
            self.keep_previous(&path);
            fs::rename(&tmp, &path).map_err(|source| StateError::Write {
                path: path.clone(),
                source,
            })
        })();
        if res.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        res?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| StateError::Write {
                path: self.dir.clone(),
                source,
            })
    }

    /// The checkpoint about to be replaced becomes `state.json.prev`: a hard link under a temp
    /// name renamed over the old `.prev`, so `state.json` itself never goes missing. Best
    /// effort: without it only the fallback is lost.
    fn keep_previous(&self, path: &Path) {
        let link = self.temp_path(&format!("{FILE}.prev"));
        match fs::hard_link(path, &link) {
            Ok(()) => {
                if let Err(e) = fs::rename(&link, self.prev_path()) {
                    warn!(error = %crate::telemetry::chain(&e), "cannot keep the previous checkpoint");
                    let _ = fs::remove_file(&link);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => warn!(error = %crate::telemetry::chain(&e), "cannot keep the previous checkpoint"),
        }
    }

    fn temp_path(&self, base: &str) -> PathBuf {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!("{base}.tmp.{}.{n}", std::process::id()))
    }

    /// Removes temp files a killed process left behind. Only the lock holder calls this (another
    /// process's temp file may be in use otherwise).
    pub fn remove_stale_temp_files(&self) {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(&format!("{FILE}.tmp.")) || name.starts_with(&format!("{FILE}.prev.tmp.")) {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// The checkpoint as saved: compact JSON and a newline.
pub(super) fn encode(cp: &Checkpoint) -> Result<Vec<u8>, StateError> {
    let mut b = serde_json::to_vec(cp).map_err(StateError::Encode)?;
    b.push(b'\n');
    Ok(b)
}

/// Encodes checkpoints as [`encode`] does, byte for byte, but reuses the JSON of every plan and
/// record equal to the one it encoded last time under the same key. An update changes one or two
/// records; with hundreds of pods the full re-encode (≈ 8 KiB of JSON per record with its
/// snapshots) was most of what a save cost, and it ran under the checkpoint lock on an async
/// worker. Comparing a record is a fraction of serializing it.
#[derive(Debug, Default)]
pub(super) struct Encoder {
    plans: HashMap<String, (PodPlan, Vec<u8>)>,
    pods: HashMap<String, (PodRecord, Vec<u8>)>,
}

impl Encoder {
    pub(super) fn encode(&mut self, cp: &Checkpoint) -> Result<Vec<u8>, StateError> {
        fn section<T: Clone + PartialEq + Serialize>(
            out: &mut Vec<u8>,
            name: &str,
            map: &std::collections::BTreeMap<String, T>,
            cache: &mut HashMap<String, (T, Vec<u8>)>,
        ) -> Result<(), StateError> {
            cache.retain(|k, _| map.contains_key(k));
            out.extend_from_slice(b",\"");
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\":{");
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, k).map_err(StateError::Encode)?;
                out.push(b':');
                match cache.get(k) {
                    Some((old, bytes)) if old == v => out.extend_from_slice(bytes),
                    _ => {
                        let bytes = serde_json::to_vec(v).map_err(StateError::Encode)?;
                        out.extend_from_slice(&bytes);
                        cache.insert(k.clone(), (v.clone(), bytes));
                    }
                }
            }
            out.push(b'}');
            Ok(())
        }
        let mut out = Vec::with_capacity(self.size_hint());
        out.extend_from_slice(b"{\"version\":");
        out.extend_from_slice(cp.version.to_string().as_bytes());
        section(&mut out, "plans", &cp.plans, &mut self.plans)?;
        section(&mut out, "pods", &cp.pods, &mut self.pods)?;
        out.extend_from_slice(b"}\n");
        Ok(out)
    }

    fn size_hint(&self) -> usize {
        let plans: usize = self.plans.values().map(|(_, b)| b.len() + 64).sum();
        let pods: usize = self.pods.values().map(|(_, b)| b.len() + 96).sum();
        plans + pods + 64
    }
}

/// Loads one checkpoint file; `Ok(None)` when it does not exist.
fn load_file(path: &Path) -> Result<Option<Checkpoint>, StateError> {
    match fs::read(path) {
        Ok(b) => decode(&b, path).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StateError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

fn set_private(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}
