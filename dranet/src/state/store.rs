// Over 500 lines: the state dir's files (format 3 record files, the format 1/2 single file and its migration, per-record fallback); the crash-safety sequence reads best in one place.
//! The state dir's files: `checkpoint/` (format 3: one file per record, each with its `.prev`,
//! and `<name>.corrupt-<unix time>` for files that did not load, kept for the operator),
//! `state.json` and `state.json.prev` (formats 1 and 2: read, migrated, then renamed to
//! `*.migrated`), `lock` and `pins/`.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use super::{
    Checkpoint, FILE, FORMAT_VERSION, PodRecord, RECORDS_DIR, Record, RecordKey, Shared, StateError, decode,
    decode_record, encode_plan, encode_pod, plan_file_name, pod_file_name,
};
use crate::plan::PodPlan;

/// Temp files of this process get a sequence number: two writes never share one.
static SEQ: AtomicU64 = AtomicU64::new(0);

/// The records as their files on disk hold them: what a save compares against. It shares every
/// record that did not change since with the engine's checkpoint ([`Shared`]), so it costs the
/// handles, not a second copy, and an unchanged record compares by pointer.
#[derive(Debug, Default)]
pub(super) struct OnDisk {
    plans: HashMap<String, Shared<PodPlan>>,
    pods: HashMap<RecordKey, Shared<PodRecord>>,
}

impl OnDisk {
    fn of(cp: &Checkpoint) -> Self {
        Self {
            plans: cp.plans.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            pods: cp.pods.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        }
    }
}

/// The state dir: checkpoint files and the pins directory. Cheap to clone (clones share what the
/// last [`Store::load_or_recover`] found on disk, which the first [`super::Writer`] takes); the
/// process that writes holds the dir's [`super::StateLock`].
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
    on_disk: Arc<Mutex<Option<OnDisk>>>,
}

/// Where [`Store::load_or_recover`] got the checkpoint from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadSource {
    /// No checkpoint yet: empty.
    Absent,
    /// Every record from its own file (or a single-file `state.json`, then migrated).
    Current,
    /// Some records did not load from their file (`problem`; the first file moved to `aside`)
    /// and did from their `.prev`: those are one save behind (any other record that loaded from
    /// neither is left out and `problem` says so). Single-file format: `state.json` did not load
    /// and `state.json.prev` did.
    Previous { problem: String, aside: Option<PathBuf> },
    /// Some records loaded from neither their file (`problem`) nor their `.prev`
    /// (`prev_problem`): left out, to be rebuilt from the pins; no record came from a `.prev`.
    /// Single-file format: neither `state.json` nor `state.json.prev` loaded, empty.
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

/// The changes of one save: file name in `checkpoint/` → its new content, or `None` to remove
/// it. A `full` save makes `checkpoint/` hold exactly its files (every other record file is
/// removed) and retires a single-file checkpoint still there.
#[derive(Debug, Default)]
pub(super) struct Delta {
    pub(super) files: BTreeMap<String, Option<Vec<u8>>>,
    pub(super) full: bool,
}

impl Delta {
    /// Every record of `cp`: a full save.
    pub(super) fn full(cp: &Checkpoint) -> Result<Self, StateError> {
        let mut files = BTreeMap::new();
        for plan in cp.plans.values() {
            files.insert(plan_file_name(&plan.pod_uid), Some(encode_plan(plan)?));
        }
        for r in cp.pods.values() {
            files.insert(pod_file_name(&r.pod_uid, &r.sandbox_id), Some(encode_pod(r)?));
        }
        Ok(Self { files, full: true })
    }

    /// Adds the changes of a later save: they win; a later full save replaces everything.
    pub(super) fn then(&mut self, newer: Delta) {
        if newer.full {
            *self = newer;
        } else {
            self.files.extend(newer.files);
        }
    }

    /// Bytes this save writes (record files only).
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.files.values().flatten().map(Vec::len).sum()
    }
}

/// Turns checkpoints into [`Delta`]s: keeps the last value of every record it handed out and
/// encodes only the records that differ (comparing a record is a fraction of encoding it, and
/// writing it is most of a save). Without a known disk state its first delta is a full save.
#[derive(Debug, Default)]
pub(super) struct Differ {
    last: Option<OnDisk>,
}

impl Differ {
    pub(super) fn new(on_disk: Option<OnDisk>) -> Self {
        Self { last: on_disk }
    }

    pub(super) fn diff(&mut self, cp: &Checkpoint) -> Result<Delta, StateError> {
        let Some(last) = self.last.as_mut() else {
            let d = Delta::full(cp)?;
            self.last = Some(OnDisk::of(cp));
            return Ok(d);
        };
        let res = diff_into(last, cp);
        if res.is_err() {
            // What was handed out is unknown now: the next save writes everything.
            self.last = None;
        }
        res
    }

    /// How many records of `cp` the last value kept is the very same record of (not a copy).
    #[cfg(test)]
    pub(super) fn shared_with(&self, cp: &Checkpoint) -> usize {
        let Some(last) = &self.last else { return 0 };
        let plans = cp
            .plans
            .iter()
            .filter(|(k, p)| last.plans.get(*k).is_some_and(|o| Shared::same(o, p)));
        let pods = cp
            .pods
            .iter()
            .filter(|(k, r)| last.pods.get(*k).is_some_and(|o| Shared::same(o, r)));
        plans.count() + pods.count()
    }
}

fn diff_into(last: &mut OnDisk, cp: &Checkpoint) -> Result<Delta, StateError> {
    let mut files: BTreeMap<String, Option<Vec<u8>>> = BTreeMap::new();
    diff_table(
        &mut last.plans,
        &cp.plans,
        &mut files,
        |p| plan_file_name(&p.pod_uid),
        encode_plan,
    )?;
    diff_table(
        &mut last.pods,
        &cp.pods,
        &mut files,
        |r| pod_file_name(&r.pod_uid, &r.sandbox_id),
        encode_pod,
    )?;
    Ok(Delta { files, full: false })
}

/// One table of the diff: every record of `now` that is not unchanged in `last` is encoded into
/// `files` under its file name (a record whose file name changed also removes its old file), and
/// every record `last` has and `now` does not is removed. `last` ends as `now`. Unchanged records
/// cost a lookup and a pointer compare; the removal pass runs only when something was removed.
fn diff_table<K: Clone + Ord + std::hash::Hash, T: PartialEq>(
    last: &mut HashMap<K, Shared<T>>,
    now: &BTreeMap<K, Shared<T>>,
    files: &mut BTreeMap<String, Option<Vec<u8>>>,
    file_name: impl Fn(&T) -> String,
    encode: impl Fn(&T) -> Result<Vec<u8>, StateError>,
) -> Result<(), StateError> {
    let before = last.len();
    let mut kept = 0;
    for (key, rec) in now {
        let old = match last.get_mut(key) {
            Some(old) => {
                kept += 1;
                if unchanged(old, rec) {
                    continue;
                }
                Some(file_name(old))
            }
            None => None,
        };
        let name = file_name(rec);
        if let Some(old) = old
            && old != name
        {
            files.entry(old).or_insert(None);
        }
        files.insert(name, Some(encode(rec)?));
        last.insert(key.clone(), rec.clone());
    }
    if kept < before {
        last.retain(|key, rec| {
            let keep = now.contains_key(key);
            if !keep {
                files.entry(file_name(rec)).or_insert(None);
            }
            keep
        });
        crate::heap::shrink_sparse(last);
    }
    Ok(())
}

/// Whether the writer's copy `old` still holds what `new` holds: the same record (nothing wrote to
/// it since: one pointer compare), or an equal one, which becomes the same one so that the next
/// save compares it by pointer too.
fn unchanged<T: PartialEq>(old: &mut Shared<T>, new: &Shared<T>) -> bool {
    if Shared::same(old, new) {
        return true;
    }
    if **old == **new {
        *old = new.clone();
        return true;
    }
    false
}

/// What reading `checkpoint/` found.
#[derive(Default)]
struct Scan {
    cp: Checkpoint,
    /// The records that loaded from their own file.
    on_disk: OnDisk,
    first_error: Option<StateError>,
    /// Per file that did not load: what was wrong (and with its `.prev` when that did not load
    /// either).
    problems: Vec<String>,
    prev_problems: Vec<String>,
    from_prev: usize,
    lost: usize,
    aside: Option<PathBuf>,
    files: usize,
}

impl Scan {
    fn insert(&mut self, record: Record, own_file: bool) {
        match record {
            Record::Plan(p) => {
                let p = Shared::new(p);
                if own_file {
                    self.on_disk.plans.insert(p.pod_uid.clone(), p.clone());
                }
                self.cp.plans.insert(p.pod_uid.clone(), p);
            }
            Record::Pod(r) => {
                let r = Shared::new(r);
                if own_file {
                    self.on_disk.pods.insert(r.key(), r.clone());
                }
                self.cp.pods.insert(r.key(), r);
            }
        }
    }
}

/// Whether `name` is a record file of `checkpoint/` (not its `.prev`, a temp or a corrupt one).
fn is_record_file(name: &str) -> bool {
    (name.starts_with("plan_") || name.starts_with("pod_")) && name.ends_with(".json")
}

/// Reads the record file `path`, which must be the file of the record it holds (`name`);
/// `Ok(None)` when it does not exist.
fn read_record(path: &Path, name: &str, pins: &Path) -> Result<Option<Record>, StateError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    let record = decode_record(&bytes, path)?;
    let own = record.file_name();
    if own != name {
        return Err(StateError::Invalid {
            path: path.to_owned(),
            what: format!("it holds the record {:?}, whose file is {own}", record.key()),
        });
    }
    let checked = match &record {
        Record::Pod(r) => pod_record_ok(r, pins),
        Record::Plan(p) => {
            super::validate::plan_fields(p).map_err(|why| format!("plan {:?}: {why}", p.pod_uid))
        }
    };
    if let Err(what) = checked {
        return Err(StateError::Invalid {
            path: path.to_owned(),
            what,
        });
    }
    Ok(Some(record))
}

/// Whether sandbox record `r`, read from disk, may be acted on: its pin ([`pin_path_ok`]) and
/// every other field ([`super::validate`]). The error names the record and the field.
fn pod_record_ok(r: &PodRecord, pins: &Path) -> Result<(), String> {
    if let Some(pin) = &r.pin
        && let Err(why) = pin_path_ok(pin, pins)
    {
        return Err(format!("record {:?}: pin {}: {why}", r.key(), pin.display()));
    }
    super::validate::record_fields(r).map_err(|why| format!("record {:?}: {why}", r.key()))
}

/// Whether `pin`, read from a record, may be a pin of this state dir: a file directly in
/// `pins` (no `..` or `.`, no hidden name), not a symlink, and, if it exists, `pins` and the pin's
/// canonical directory are the same real directory. A record is a file on disk: nothing in it is
/// unmounted or removed unless it passes (the netns it holds is checked before any unmount).
pub(crate) fn pin_path_ok(pin: &Path, pins: &Path) -> Result<(), &'static str> {
    use std::path::Component;
    if pin
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err("has a '..' or '.' component");
    }
    if pin.parent() != Some(pins) {
        return Err("not directly in the pins dir");
    }
    match pin.file_name().and_then(|n| n.to_str()) {
        Some(n) if !n.is_empty() && !n.starts_with('.') => {}
        _ => return Err("not a pin name"),
    }
    match fs::symlink_metadata(pins) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err("the pins dir is not a directory (a symlink?)"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(_) => return Err("the pins dir cannot be read"),
    }
    match fs::symlink_metadata(pin) {
        Ok(m) if m.file_type().is_symlink() => return Err("a symlink"),
        Ok(_) => {}
        // A pin that is gone is harmless: nothing to unmount.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(_) => return Err("cannot be read"),
    }
    let real = pin.canonicalize().map_err(|_| "cannot be resolved")?;
    let dir = pins
        .canonicalize()
        .map_err(|_| "the pins dir cannot be resolved")?;
    if real.parent() != Some(dir.as_path()) {
        return Err("resolves outside the pins dir");
    }
    Ok(())
}

impl Store {
    /// Opens (creating, mode 0700) the state dir, its `pins/` and `checkpoint/`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StateError> {
        let dir = dir.into();
        let derr = |source| StateError::Dir {
            path: dir.clone(),
            source,
        };
        let fresh = !dir.join(RECORDS_DIR).is_dir();
        fs::create_dir_all(dir.join("pins")).map_err(derr)?;
        fs::create_dir_all(dir.join(RECORDS_DIR)).map_err(derr)?;
        set_private(&dir).map_err(derr)?;
        if fresh {
            // The new directory's entry is durable before any record is written into it.
            sync_dir(&dir)?;
        }
        Ok(Self {
            dir,
            on_disk: Arc::default(),
        })
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

    /// The directory of the record files (format 3).
    #[must_use]
    pub fn records_dir(&self) -> PathBuf {
        self.dir.join(RECORDS_DIR)
    }

    /// The single-file checkpoint of formats 1 and 2 (`state.json`), read and migrated.
    #[must_use]
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// The single-file checkpoint's previous generation (`state.json.prev`).
    #[must_use]
    pub fn prev_path(&self) -> PathBuf {
        self.dir.join(format!("{FILE}.prev"))
    }

    /// Whether the state dir still holds a single-file checkpoint (not migrated yet): then it is
    /// the checkpoint.
    fn single_file(&self) -> bool {
        self.path().exists() || self.prev_path().exists()
    }

    /// Loads the checkpoint; an absent one is empty. Read only: `dranet status` uses it beside a
    /// running daemon. Fails on the first record file that does not load (a single-file
    /// checkpoint: when `state.json` does not load).
    pub fn load(&self) -> Result<Checkpoint, StateError> {
        if self.single_file() {
            return Ok(load_file(&self.path())?.unwrap_or_else(empty));
        }
        let scan = self.scan(false)?;
        match scan.first_error {
            Some(e) => Err(e),
            None => Ok(scan.cp),
        }
    }

    /// What loads when [`Store::load`] fails: every record from its file, or from its `.prev`
    /// when the file does not load (a record neither loads from is left out); a single-file
    /// checkpoint: `state.json.prev` (`None` when there is none). Read only.
    pub fn load_prev(&self) -> Result<Option<Checkpoint>, StateError> {
        if self.single_file() {
            return load_file(&self.prev_path());
        }
        Ok(Some(self.scan(false)?.cp))
    }

    /// Loads the checkpoint, never failing on its content: a record file that does not load is
    /// logged and moved aside (`<name>.corrupt-<unix time>`) and its `.prev` used; a record that
    /// loads from neither is left out (the caller rebuilds it from its pin). A single-file
    /// checkpoint (formats 1 and 2) loads as it always did and is migrated to one file per
    /// record. Only the state-dir lock holder may call this (it moves files); the first
    /// [`super::Writer`] of this store then writes only what changes.
    pub fn load_or_recover(&self) -> Loaded {
        if self.single_file() {
            let mut loaded = self.load_or_recover_legacy();
            // One file for every record: a record with a bad pin or field cannot be moved aside
            // alone, so it is left out (the pin, if it is one of ours, is rebuilt or released as
            // unclaimed).
            let pins = self.pins_dir();
            loaded.cp.pods.retain(|key, r| match pod_record_ok(r, &pins) {
                Err(why) => {
                    warn!(record = %key, why, "a checkpoint record does not validate (a pin dranet never made, a field out of bounds): left out");
                    false
                }
                Ok(()) => true,
            });
            loaded
                .cp
                .plans
                .retain(|uid, p| match super::validate::plan_fields(p) {
                    Err(why) => {
                        warn!(plan = %uid, why, "a checkpoint plan does not validate: left out");
                        false
                    }
                    Ok(()) => true,
                });
            self.migrate(&loaded.cp);
            return loaded;
        }
        let s = match self.scan(true) {
            Ok(s) => s,
            Err(e) => {
                let problem = crate::telemetry::chain(&e).to_string();
                warn!(
                    problem,
                    "the checkpoint directory does not read: starting empty, records are rebuilt from the pins"
                );
                return Loaded {
                    cp: empty(),
                    source: LoadSource::Nothing {
                        problem,
                        prev_problem: "no record was read".into(),
                        aside: None,
                    },
                };
            }
        };
        let source = if s.from_prev > 0 {
            let problem = s.problems.join("; ");
            warn!(
                problem,
                aside = ?s.aside,
                "checkpoint records do not load: using their .prev, one save behind"
            );
            LoadSource::Previous {
                problem,
                aside: s.aside.clone(),
            }
        } else if s.lost > 0 {
            let problem = s.problems.join("; ");
            let prev_problem = s.prev_problems.join("; ");
            warn!(
                problem,
                prev_problem,
                aside = ?s.aside,
                "checkpoint records load from neither their file nor their .prev: left out, records are rebuilt from the pins"
            );
            LoadSource::Nothing {
                problem,
                prev_problem,
                aside: s.aside.clone(),
            }
        } else if s.files == 0 {
            LoadSource::Absent
        } else {
            LoadSource::Current
        };
        *lock_on_disk(&self.on_disk) = Some(s.on_disk);
        Loaded { cp: s.cp, source }
    }

    /// What the last [`Store::load_or_recover`] (or migration) found in good record files, once.
    pub(super) fn take_on_disk(&self) -> Option<OnDisk> {
        lock_on_disk(&self.on_disk).take()
    }

    /// [`Store::load_or_recover`] of a single-file checkpoint (formats 1 and 2): a `state.json`
    /// that does not load is logged and moved aside (`state.json.corrupt-<unix time>`), then
    /// `state.json.prev` is tried; if that fails too the result is empty and
    /// [`LoadSource::Nothing`]. `state.json` absent with a `.prev` present (removed by hand)
    /// loads the `.prev`.
    fn load_or_recover_legacy(&self) -> Loaded {
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
        let aside = path.exists().then(|| move_aside(&path)).flatten();
        match load_file(&self.prev_path()) {
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

    /// Writes every record of a single-file checkpoint as its own file, then retires the single
    /// file. On failure it stays the checkpoint (and the writer's first save, a full one, tries
    /// again).
    fn migrate(&self, cp: &Checkpoint) {
        match Delta::full(cp).and_then(|d| self.apply(&d)) {
            Ok(()) => {
                *lock_on_disk(&self.on_disk) = Some(OnDisk::of(cp));
                info!(
                    plans = cp.plans.len(),
                    pods = cp.pods.len(),
                    "checkpoint migrated from state.json to one file per record (format 3)"
                );
            }
            Err(e) => warn!(
                error = %crate::telemetry::chain(&e),
                "cannot migrate the checkpoint to one file per record: state.json stays the checkpoint until a save does"
            ),
        }
    }

    /// Reads every record file of `checkpoint/`, each on its own: one that does not load is
    /// replaced by its `.prev` when that loads, else left out. `fix` (the lock holder): files that
    /// do not load are moved aside.
    fn scan(&self, fix: bool) -> Result<Scan, StateError> {
        let rdir = self.records_dir();
        let pins = self.pins_dir();
        let mut names: Vec<String> = match fs::read_dir(&rdir) {
            Ok(rd) => rd
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| is_record_file(n))
                .collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(source) => return Err(StateError::Read { path: rdir, source }),
        };
        names.sort();
        let mut s = Scan {
            cp: empty(),
            ..Scan::default()
        };
        for name in names {
            let path = rdir.join(&name);
            let err = match read_record(&path, &name, &pins) {
                Ok(Some(record)) => {
                    s.files += 1;
                    s.insert(record, true);
                    continue;
                }
                // Removed since the listing (a save beside `dranet status`).
                Ok(None) => continue,
                Err(e) => e,
            };
            s.files += 1;
            let problem = crate::telemetry::chain(&err).to_string();
            s.first_error.get_or_insert(err);
            if fix {
                let aside = move_aside(&path);
                s.aside = s.aside.take().or(aside);
            }
            let prev = rdir.join(format!("{name}.prev"));
            match read_record(&prev, &name, &pins) {
                Ok(Some(record)) => {
                    warn!(
                        problem,
                        file = name,
                        "a checkpoint record does not load: using its .prev, one save behind"
                    );
                    s.from_prev += 1;
                    s.problems.push(problem);
                    s.insert(record, false);
                }
                other => {
                    let prev_problem = match other {
                        Err(e) => {
                            if fix {
                                move_aside(&prev);
                            }
                            crate::telemetry::chain(&e).to_string()
                        }
                        Ok(_) => format!("{} is missing", prev.display()),
                    };
                    warn!(
                        problem,
                        prev_problem,
                        file = name,
                        "a checkpoint record loads from neither its file nor its .prev: left out"
                    );
                    s.lost += 1;
                    s.problems.push(problem);
                    s.prev_problems.push(prev_problem);
                }
            }
        }
        Ok(s)
    }

    /// Makes every record of `cp` durable, each in its own file, and removes the record files
    /// `cp` does not hold (a full save; see the module docs for a save of the changes only,
    /// [`super::Writer`]). Retires a single-file checkpoint. Only the state-dir lock holder may
    /// call this.
    pub fn save(&self, cp: &Checkpoint) -> Result<(), StateError> {
        self.apply(&Delta::full(cp)?)
    }

    /// Writes a save's files (temp file, `fsync`, the old file kept as `.prev`, rename), removes
    /// its removed records (`.prev` first), then `fsync`s `checkpoint/` once.
    pub(super) fn apply(&self, d: &Delta) -> Result<(), StateError> {
        let rdir = self.records_dir();
        for (name, content) in &d.files {
            match content {
                Some(bytes) => self.write_record(&rdir, name, bytes)?,
                None => remove_record(&rdir, name)?,
            }
        }
        if d.full {
            let rd = fs::read_dir(&rdir).map_err(|source| StateError::Write {
                path: rdir.clone(),
                source,
            })?;
            for e in rd.filter_map(Result::ok) {
                let name = e.file_name().to_string_lossy().into_owned();
                if is_record_file(&name) && !matches!(d.files.get(&name), Some(Some(_))) {
                    remove_record(&rdir, &name)?;
                }
            }
        }
        sync_dir(&rdir)?;
        if d.full && self.single_file() {
            self.retire_single_file()?;
        }
        Ok(())
    }

    /// One record file, atomically and durably (but for the directory's `fsync`).
    fn write_record(&self, rdir: &Path, name: &str, bytes: &[u8]) -> Result<(), StateError> {
        let path = rdir.join(name);
        let tmp = temp_path(rdir);
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
            f.sync_data().map_err(werr)?;
            drop(f);
            keep_previous(rdir, &path, &rdir.join(format!("{name}.prev")));
            fs::rename(&tmp, &path).map_err(|source| StateError::Write {
                path: path.clone(),
                source,
            })
        })();
        if res.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        res
    }

    /// After a migration: `state.json.prev`, then `state.json` (a crash in between migrates
    /// again from `state.json`), renamed to `*.migrated` for the operator.
    fn retire_single_file(&self) -> Result<(), StateError> {
        for path in [self.prev_path(), self.path()] {
            let mut to = path.clone().into_os_string();
            to.push(".migrated");
            match fs::rename(&path, &to) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(StateError::Write { path, source }),
            }
        }
        sync_dir(&self.dir)
    }

    /// Removes temp files a killed process left behind. Only the lock holder calls this (another
    /// process's temp file may be in use otherwise).
    pub fn remove_stale_temp_files(&self) {
        let stale = |dir: &Path, prefixes: &[String]| {
            let Ok(rd) = fs::read_dir(dir) else {
                return;
            };
            for e in rd.flatten() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if prefixes.iter().any(|p| name.starts_with(p.as_str())) {
                    let _ = fs::remove_file(e.path());
                }
            }
        };
        stale(&self.dir, &[format!("{FILE}.tmp."), format!("{FILE}.prev.tmp.")]);
        stale(&self.records_dir(), &["tmp.".to_owned()]);
    }
}

fn lock_on_disk(m: &Mutex<Option<OnDisk>>) -> std::sync::MutexGuard<'_, Option<OnDisk>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn temp_path(dir: &Path) -> PathBuf {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("tmp.{}.{n}", std::process::id()))
}

/// The file about to be replaced becomes `prev`: a hard link under a temp name renamed over the
/// old `prev`, so the file itself never goes missing. Best effort: without it only the fallback
/// is lost.
fn keep_previous(dir: &Path, path: &Path, prev: &Path) {
    let link = temp_path(dir);
    match fs::hard_link(path, &link) {
        Ok(()) => {
            if let Err(e) = fs::rename(&link, prev) {
                warn!(error = %crate::telemetry::chain(&e), "cannot keep the previous checkpoint");
                let _ = fs::remove_file(&link);
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => warn!(error = %crate::telemetry::chain(&e), "cannot keep the previous checkpoint"),
    }
}

/// A removed record: its `.prev` first (an orphan `.prev` is never read), then its file.
fn remove_record(rdir: &Path, name: &str) -> Result<(), StateError> {
    for path in [rdir.join(format!("{name}.prev")), rdir.join(name)] {
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(StateError::Write { path, source }),
        }
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), StateError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| StateError::Write {
            path: dir.to_owned(),
            source,
        })
}

/// Renames a file that does not load to `<name>.corrupt-<unix time>[.<n>]`, so no save destroys
/// the evidence. `None` (logged) if it cannot.
fn move_aside(path: &Path) -> Option<PathBuf> {
    let secs = crate::clock::UnixSecs::now();
    let name = path.file_name()?.to_string_lossy().into_owned();
    for n in 0..100u32 {
        let to = if n == 0 {
            path.with_file_name(format!("{name}.corrupt-{secs}"))
        } else {
            path.with_file_name(format!("{name}.corrupt-{secs}.{n}"))
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

/// Loads one single-file checkpoint; `Ok(None)` when it does not exist.
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
