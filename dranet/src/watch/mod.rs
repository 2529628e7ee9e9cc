// Over 500 lines: the watcher's event merging (probes, rtnetlink, inotify) and identity learning; the kernel side is in sys::probes.
//! The lifecycle watcher: eBPF probes (tiered, chosen by capability detection), an rtnetlink
//! monitor and an inotify fallback, merged into one typed stream of [`LifecycleEvent`]s.
//! (Fenced: touches the kernel.)
//!
//! ```text
//!  ring buffer (umount/unlink of watched paths, cleanup_net, tier B moves/death) ─┐
//!  rtnetlink (links in/out/deleted, nsid added/removed)                           ├─▶ broadcast ─▶ subscribers
//!  inotify on /run/netns (fallback unlinks, identities of new netns files)        ─┘
//! ```
//!
//! Netns identity is the cookie plus the inode ([`NetnsId`]); inodes are reused at once, so
//! state is never keyed by the inode alone.

pub mod event;
mod nsfs;
pub mod reactor;
pub mod rtnl;

use std::collections::{HashMap, VecDeque};
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::sys::inotify;
use crate::sys::netns::{NetnsCookie, NetnsId};
pub use crate::sys::os::mono_now;
use crate::sys::probes::{self, maps};
pub use crate::sys::probes::{ProbeState, ProbeStatus, Tier};
pub use event::{EventKind, LifecycleEvent, MonoTime, Source, Task, UnlinkCall};
pub use nsfs::{identify_fd, identify_path};
pub use reactor::Reactor;

/// Where runtimes bind-mount pod netns: the prefixes `dranet trace` watches.
pub const DEFAULT_PREFIXES: &[&str] = &["/run/netns/", "/var/run/netns/"];

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("rtnetlink monitor")]
    Rtnl(#[from] rtnl::RtnlError),
    #[error("eBPF maps")]
    Maps(#[from] maps::MapError),
}

/// How to start the watcher.
#[derive(Clone, Debug)]
pub struct WatcherOptions {
    /// Load the eBPF probes (off: rtnetlink + inotify only).
    pub ebpf: bool,
    /// Report every umount/unlink, watched or not (debugging).
    pub trace_all: bool,
    /// Path prefixes matched in the kernel besides the exact paths of watched netns
    /// ([`Watcher::watch_netns`] registers every spelling of a pod's path). Every umount/unlink
    /// under a prefix becomes an event, for every pod of the node (probe CPU per netns teardown:
    /// docs/bench.md, "Figures behind the code's comments"), so the daemon leaves this empty
    /// and only `dranet trace` sets [`DEFAULT_PREFIXES`].
    pub prefixes: Vec<String>,
    /// Netns directories for inotify and identity learning.
    pub netns_dirs: Vec<PathBuf>,
    /// Learn the identity of every netns file in `netns_dirs` (for `dranet trace`).
    pub learn_dirs: bool,
    /// Broadcast capacity (events buffered per slow subscriber before it sees `Lost`).
    pub capacity: usize,
    /// Attach the `netns_cleanup` probes (tp_btf on the workqueue tracepoints). They run for
    /// every work item of the machine (their cost: docs/bench.md, "Figures behind the code's
    /// comments") and only `dranet trace` shows what they report: the rescue engine does not act
    /// on them, so the daemon leaves them off.
    pub cleanup_probes: bool,
    /// Read the ring buffer on the [`Reactor`] (a thread of its own at a raised priority), and
    /// let the engine decide and rescue there too ([`Watcher::reactor`]). Off: everything runs
    /// on the caller's runtime.
    pub reactor: bool,
    /// Receive buffer of the rtnetlink monitor socket, bytes. Large by default, so a burst of
    /// link events (a node drain) is not lost; an overflow still becomes a `Lost` event.
    pub rtnl_rcvbuf: usize,
    /// Tests only: start reading the ring buffer this late (to fill it and see `Lost`).
    #[doc(hidden)]
    pub ring_reader_delay: Option<Duration>,
    /// Tests only: once the link table is seeded, stop reading the rtnetlink monitor for this
    /// long (to overflow its receive buffer and see `Lost`).
    #[doc(hidden)]
    pub rtnl_reader_delay: Option<Duration>,
}

impl Default for WatcherOptions {
    fn default() -> Self {
        Self {
            ebpf: true,
            trace_all: false,
            prefixes: Vec::new(),
            netns_dirs: vec![PathBuf::from("/run/netns"), PathBuf::from("/var/run/netns")],
            learn_dirs: false,
            capacity: 8192,
            cleanup_probes: false,
            reactor: true,
            rtnl_rcvbuf: 4 << 20,
            ring_reader_delay: None,
            rtnl_reader_delay: None,
        }
    }
}

/// How long the paths of a dead netns still label events. Ring-buffer records are labelled
/// when they are read, and on a loaded node that can be after rtnetlink reported the death
/// (`nsid_removed`): the umount that started the teardown must still name its netns.
pub const DEAD_PATHS_KEPT: Duration = Duration::from_secs(10);
/// At most this many dead netns keep their paths (a drain of many pods within the grace).
const DEAD_KEPT_MAX: usize = 1024;

/// Identities the watcher knows, to label events.
#[derive(Default)]
struct Known {
    paths: HashMap<String, NetnsId>,
    inodes: HashMap<u64, NetnsId>,
    nsids: HashMap<i32, NetnsId>,
    /// Dead netns whose paths are kept for [`DEAD_PATHS_KEPT`], oldest first.
    dead: VecDeque<(Instant, NetnsId)>,
}

impl Known {
    /// `id` died at `now`. Its nsid and inode go at once (the kernel reuses both at once; a
    /// cookie never comes back); its paths stay for [`DEAD_PATHS_KEPT`] unless a new netns is
    /// learned on them first.
    fn forget(&mut self, id: NetnsId, now: Instant) {
        self.inodes.retain(|_, v| *v != id);
        self.nsids.retain(|_, v| *v != id);
        crate::heap::shrink_sparse(&mut self.inodes);
        crate::heap::shrink_sparse(&mut self.nsids);
        if self.paths.values().any(|v| *v == id) {
            self.dead.push_back((now, id));
        }
        self.expire(now);
    }

    /// When the oldest dead netns's paths are due to go.
    fn next_expiry(&self) -> Option<Instant> {
        self.dead.front().map(|(at, _)| *at + DEAD_PATHS_KEPT)
    }

    /// Drops the paths of netns dead for longer than the grace, or beyond the bound.
    fn expire(&mut self, now: Instant) {
        while let Some(&(at, id)) = self.dead.front() {
            if now.saturating_duration_since(at) < DEAD_PATHS_KEPT && self.dead.len() <= DEAD_KEPT_MAX {
                break;
            }
            self.dead.pop_front();
            self.paths.retain(|_, v| *v != id);
        }
        crate::heap::shrink_sparse(&mut self.paths);
        crate::heap::shrink_sparse_queue(&mut self.dead);
    }
}

struct Shared {
    tx: broadcast::Sender<LifecycleEvent>,
    known: RwLock<Known>,
    bpf: Mutex<Option<maps::Watched>>,
    prefixes: Vec<String>,
    rtnl: tokio::sync::Mutex<Option<crate::sys::rtnl::Handle>>,
    /// A netns died and its paths are kept for the grace: wakes [`expire_dead`].
    died: tokio::sync::Notify,
}

impl Shared {
    fn emit(&self, ev: LifecycleEvent) {
        // No subscribers is fine: nobody is listening yet.
        let _ = self.tx.send(ev);
    }

    fn resolve_path(&self, path: &str) -> Option<NetnsId> {
        self.known.read().ok()?.paths.get(path).copied()
    }

    fn resolve_inode(&self, inode: u64) -> Option<NetnsId> {
        self.known.read().ok()?.inodes.get(&inode).copied()
    }

    fn learn(&self, path: &str, id: NetnsId) {
        if let Ok(mut k) = self.known.write() {
            k.expire(Instant::now());
            for p in spellings(path) {
                k.paths.insert(p, id);
            }
            k.inodes.insert(id.inode, id);
        }
    }

    /// Fills in identities on rtnetlink events and forgets netns that died.
    fn enrich(&self, mut ev: LifecycleEvent) -> LifecycleEvent {
        let lookup = |nsid: i32| self.known.read().ok().and_then(|k| k.nsids.get(&nsid).copied());
        match &mut ev.kind {
            EventKind::NsidAdded { nsid, netns } => *netns = lookup(*nsid),
            EventKind::LinkLeftHost { nsid, to, .. } => *to = lookup(*nsid),
            EventKind::NsidRemoved { nsid, netns } => {
                *netns = lookup(*nsid);
                if let (Some(id), Ok(mut k)) = (*netns, self.known.write()) {
                    k.forget(id, Instant::now());
                    self.died.notify_one();
                }
            }
            _ => {}
        }
        ev
    }
}

/// Both spellings of a netns path (`/var/run` is usually a symlink to `/run`).
fn spellings(path: &str) -> Vec<String> {
    let mut v = vec![path.to_owned()];
    if let Some(rest) = path.strip_prefix("/var/run/") {
        v.push(format!("/run/{rest}"));
    } else if let Some(rest) = path.strip_prefix("/run/") {
        v.push(format!("/var/run/{rest}"));
    }
    v
}

/// A subscription to the lifecycle stream.
pub struct Subscription {
    rx: broadcast::Receiver<LifecycleEvent>,
}

impl Subscription {
    /// The next event; `None` once the watcher is gone. Lag turns into a [`EventKind::Lost`].
    pub async fn recv(&mut self) -> Option<LifecycleEvent> {
        match self.rx.recv().await {
            Ok(ev) => Some(ev),
            Err(broadcast::error::RecvError::Lagged(n)) => Some(LifecycleEvent {
                time: mono_now(),
                source: Source::Daemon,
                kind: EventKind::Lost { count: n },
            }),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// As a `Stream`.
    pub fn into_stream(self) -> impl futures::Stream<Item = LifecycleEvent> {
        futures::stream::unfold(self, |mut s| async move { s.recv().await.map(|ev| (ev, s)) })
    }
}

/// The running watcher. Dropping it stops every source and detaches the probes.
pub struct Watcher {
    shared: Arc<Shared>,
    status: Vec<ProbeStatus>,
    notes: Vec<String>,
    tasks: Vec<JoinHandle<()>>,
    /// Declared last: stopped once the tasks are aborted.
    reactor: Option<Reactor>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Watcher {
    /// Starts every source the kernel allows. Fails only if not even rtnetlink works.
    pub async fn start(opts: WatcherOptions) -> Result<Self, WatchError> {
        let (tx, _) = broadcast::channel(opts.capacity.max(16));
        let shared = Arc::new(Shared {
            tx,
            known: RwLock::new(Known::default()),
            bpf: Mutex::new(None),
            prefixes: opts.prefixes.clone(),
            rtnl: tokio::sync::Mutex::new(None),
            died: tokio::sync::Notify::new(),
        });
        let mut w = Watcher {
            shared,
            status: Vec::new(),
            notes: Vec::new(),
            tasks: Vec::new(),
            reactor: None,
        };
        if opts.reactor && opts.ebpf {
            match Reactor::start() {
                Ok(r) => w.reactor = Some(r),
                Err(e) => {
                    warn!(error = %crate::telemetry::chain(&e), "no rescue reactor thread; events are read on the async workers");
                }
            }
        }
        let unlink_probe = w.start_ebpf(&opts);
        crate::sys::os::release_freed_heap();
        w.start_rtnl(opts.rtnl_rcvbuf, opts.rtnl_reader_delay).await?;
        w.start_inotify(&opts, !unlink_probe);
        w.tasks.push(tokio::spawn(expire_dead(Arc::clone(&w.shared))));
        Ok(w)
    }

    /// Loads and attaches the probes; returns whether the unlink probe is active.
    fn start_ebpf(&mut self, opts: &WatcherOptions) -> bool {
        if !opts.ebpf {
            self.status = probes::all_unsupported("eBPF disabled by configuration");
            return false;
        }
        let Some(object) = probes::object() else {
            let reason = "this build has no eBPF object (built without the `ebpf` feature)";
            warn!(reason, "eBPF unavailable; falling back to rtnetlink + inotify");
            self.status = probes::all_unsupported(reason);
            self.notes.push("fallback: rtnetlink + inotify (no eBPF)".into());
            return false;
        };
        let loaded = match probes::load(object, opts.trace_all, opts.cleanup_probes) {
            Ok(l) => l,
            Err(e) => {
                let reason = crate::telemetry::chain(&e).to_string();
                warn!(error = %reason, "eBPF unavailable; falling back to rtnetlink + inotify");
                self.status = probes::all_unsupported(&reason);
                self.notes.push("fallback: rtnetlink + inotify (no eBPF)".into());
                return false;
            }
        };
        self.status = loaded.status;
        let unlink_active = self
            .status
            .iter()
            .any(|s| s.name == "unlink" && s.state == ProbeState::Active);
        // The ring buffer's fd is registered with the runtime that reads it: the reactor's.
        let taken = {
            let _in_reactor = self.reactor.as_ref().map(|r| r.handle().enter());
            maps::take(loaded.ebpf, &opts.prefixes)
        };
        match taken.map(|m| self.use_maps(m, opts.ring_reader_delay)) {
            Ok(()) => {}
            Err(e) => {
                warn!(error = %crate::telemetry::chain(&e), "eBPF maps unusable; probes disabled");
                self.status = probes::all_unsupported(&crate::telemetry::chain(&e).to_string());
                return false;
            }
        }
        unlink_active
    }

    fn use_maps(&mut self, maps: maps::Maps, delay: Option<Duration>) {
        let maps::Maps {
            watched,
            ring,
            lost,
            log,
        } = maps;
        let here = tokio::runtime::Handle::current();
        let rt = self.reactor.as_ref().map_or(&here, Reactor::handle);
        if let Some(log) = log {
            self.tasks.push(rt.spawn(log.run()));
        }
        if let Ok(mut bpf) = self.shared.bpf.lock() {
            *bpf = Some(watched);
        }
        let shared = Arc::clone(&self.shared);
        self.tasks.push(rt.spawn(async move {
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
            read_ring(ring, lost, shared).await;
        }));
    }

    /// The runtime of the [`Reactor`] thread, where the ring buffer is read; `None` without
    /// one (disabled, no probes, or the thread could not start).
    #[must_use]
    pub fn reactor(&self) -> Option<&tokio::runtime::Handle> {
        self.reactor.as_ref().map(Reactor::handle)
    }

    async fn start_rtnl(&mut self, rcvbuf: usize, pause: Option<Duration>) -> Result<(), WatchError> {
        let mon = rtnl::open(rcvbuf, pause).await?;
        *self.shared.rtnl.lock().await = Some(mon.handle.clone());
        let shared = Arc::clone(&self.shared);
        let mut table = mon.table;
        let mut messages = mon.messages;
        let mut handle = mon.handle;
        self.tasks.push(tokio::spawn(async move {
            while let Some((msg, _)) = messages.next().await {
                if let Some(ev) = rtnl::to_event(&mut table, msg) {
                    match ev.kind {
                        EventKind::NsidAdded { nsid, .. } => resolve_nsid(&shared, &mut handle, nsid).await,
                        // The kernel dropped messages (ENOBUFS): the link table is stale; take
                        // it afresh, and let subscribers reconcile.
                        EventKind::Lost { .. } => {
                            warn!("rtnetlink monitor overflowed (ENOBUFS): events lost, reconciling");
                            if let Err(e) = rtnl::reseed(&mut table, &handle).await {
                                warn!(error = %crate::telemetry::chain(&e), "re-reading host links after an overflow");
                            }
                        }
                        _ => {}
                    }
                    shared.emit(shared.enrich(ev));
                }
            }
            warn!("rtnetlink monitor stream ended");
        }));
        Ok(())
    }

    fn start_inotify(&mut self, opts: &WatcherOptions, emit_unlinks: bool) {
        if !emit_unlinks && !opts.learn_dirs {
            // Nothing to do with its events (the unlink probe reports removals, nobody wants
            // identities learned): skip it, or every netns created or removed on the node
            // wakes the daemon (≈ 10 % slower netns churn on 2 cores, `cargo xtask bench`).
            return;
        }
        if let Some(first) = opts.netns_dirs.first() {
            // Runtimes create it on first use; create it so the watch has something to watch.
            let _ = std::fs::create_dir_all(first);
        }
        if opts.learn_dirs {
            for dir in &opts.netns_dirs {
                learn_dir(&self.shared, dir);
            }
        }
        let mut dw = match inotify::DirWatch::new(&opts.netns_dirs) {
            Ok(dw) => dw,
            Err(e) => {
                warn!(error = %crate::telemetry::chain(&e), "inotify on netns directories unavailable");
                return;
            }
        };
        let dirs: Vec<String> = dw.dirs().map(|d| d.display().to_string()).collect();
        if emit_unlinks {
            self.notes
                .push(format!("fallback: inotify unlink events on {}", dirs.join(", ")));
        }
        let shared = Arc::clone(&self.shared);
        let learn = opts.learn_dirs;
        self.tasks.push(tokio::spawn(async move {
            while let Ok(batch) = dw.next_batch().await {
                for ev in batch {
                    match ev {
                        inotify::DirEvent::Created(path) if learn => {
                            tokio::spawn(learn_later(Arc::clone(&shared), path));
                        }
                        inotify::DirEvent::Removed(path) if emit_unlinks => {
                            let p = path.display().to_string();
                            shared.emit(LifecycleEvent {
                                time: mono_now(),
                                source: Source::Inotify,
                                kind: EventKind::NetnsUnlinked {
                                    netns: shared.resolve_path(&p),
                                    path: p,
                                    ret: 0,
                                    call: UnlinkCall::Unknown,
                                    task: Task::default(),
                                },
                            });
                        }
                        _ => {}
                    }
                }
            }
        }));
    }

    /// Status of every probe (tier A and B).
    #[must_use]
    pub fn status(&self) -> &[ProbeStatus] {
        &self.status
    }

    /// Extra lines about fallbacks in use.
    #[must_use]
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Subscribes to the lifecycle stream (events from now on).
    #[must_use]
    pub fn subscribe(&self) -> Subscription {
        Subscription {
            rx: self.shared.tx.subscribe(),
        }
    }

    /// Publishes an event of the daemon itself on the stream (hooks, rescue actions).
    pub fn publish(&self, ev: LifecycleEvent) {
        self.shared.emit(ev);
    }

    /// Starts watching a pod netns: its path (both spellings) is matched in the kernel, events on
    /// it carry `id`, and the host gets an nsid for it so device moves and its death map to it.
    pub async fn watch_netns(&self, path: &Path, id: NetnsId, fd: BorrowedFd<'_>) -> Result<(), WatchError> {
        let p = path.display().to_string();
        self.shared.learn(&p, id);
        let outside: Vec<String> = spellings(&p)
            .into_iter()
            .filter(|s| !self.shared.prefixes.iter().any(|pre| s.starts_with(pre.as_str())))
            .collect();
        if !outside.is_empty() {
            self.add_exact(&outside)?;
        }
        let mut guard = self.shared.rtnl.lock().await;
        if let Some(handle) = guard.as_mut() {
            match rtnl::ensure_nsid(handle, fd).await {
                Ok(nsid) => {
                    if let Ok(mut k) = self.shared.known.write() {
                        k.nsids.insert(nsid, id);
                    }
                }
                Err(e) => {
                    warn!(error = %crate::telemetry::chain(&e), netns = %id, "no nsid for watched netns")
                }
            }
        }
        Ok(())
    }

    /// Stops matching a netns's exact paths in the kernel (its identity is kept until it dies, so
    /// late events on it are still labelled).
    pub fn unwatch_netns(&self, id: NetnsId) {
        let paths: Vec<String> = self
            .shared
            .known
            .read()
            .map(|k| {
                k.paths
                    .iter()
                    .filter(|(_, v)| **v == id)
                    .map(|(p, _)| p.clone())
                    .collect()
            })
            .unwrap_or_default();
        let Ok(mut guard) = self.shared.bpf.lock() else {
            return;
        };
        let Some(bpf) = guard.as_mut() else { return };
        for p in paths {
            if let Err(e) = bpf.remove(&p) {
                debug!(path = %p, error = %crate::telemetry::chain(&e), "unwatching a netns path");
            }
        }
    }

    fn add_exact(&self, paths: &[String]) -> Result<(), WatchError> {
        let Ok(mut guard) = self.shared.bpf.lock() else {
            return Ok(());
        };
        let Some(bpf) = guard.as_mut() else { return Ok(()) };
        for p in paths {
            bpf.add(p)?;
        }
        Ok(())
    }
}

/// Maps a new nsid to a known netns by asking the kernel for the nsid of each known netns file.
async fn resolve_nsid(shared: &Shared, handle: &mut crate::sys::rtnl::Handle, nsid: i32) {
    let candidates: Vec<(String, NetnsId)> = match shared.known.read() {
        Ok(k) if !k.nsids.contains_key(&nsid) => {
            let mut seen = std::collections::HashSet::new();
            k.paths
                .iter()
                .filter(|(_, id)| !k.nsids.values().any(|v| v == *id) && seen.insert(**id))
                .map(|(p, id)| (p.clone(), *id))
                .collect()
        }
        _ => return,
    };
    for (path, id) in candidates {
        let Ok(file) = std::fs::File::open(&path) else {
            continue;
        };
        if identify_fd(std::os::fd::AsFd::as_fd(&file)).ok() != Some(id) {
            continue;
        }
        if let Ok(Some(found)) = rtnl::get_nsid(handle, std::os::fd::AsFd::as_fd(&file)).await {
            if let Ok(mut k) = shared.known.write() {
                k.nsids.insert(found, id);
            }
            if found == nsid {
                return;
            }
        }
    }
}

/// Learns identities of the netns files already in `dir`.
fn learn_dir(shared: &Shared, dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if let Ok(id) = identify_path(&path) {
            shared.learn(&path.display().to_string(), id);
        }
    }
}

/// A netns file is created before the runtime bind-mounts the netns on it: retry a few times.
async fn learn_later(shared: Arc<Shared>, path: PathBuf) {
    for delay in [2u64, 10, 50, 200, 1000] {
        tokio::time::sleep(Duration::from_millis(delay)).await;
        if let Ok(id) = identify_path(&path) {
            shared.learn(&path.display().to_string(), id);
            return;
        }
    }
}

/// Netns cookies already reported as released. Two tier-B programs can report the same release
/// (`netns_put` on the nsfs path and `__put_net` where it is not inlined); net cookies are never
/// reused, so a cookie seen once is a duplicate the second time.
#[derive(Default)]
struct ReleasedCookies(std::collections::VecDeque<NetnsCookie>);

impl ReleasedCookies {
    const KEEP: usize = 256;

    /// True when `ev` is a release already reported.
    fn is_duplicate(&mut self, ev: &LifecycleEvent) -> bool {
        let EventKind::NetnsReleased { netns, .. } = &ev.kind else {
            return false;
        };
        if !netns.cookie.is_known() {
            return false;
        }
        if self.0.contains(&netns.cookie) {
            return true;
        }
        if self.0.len() == Self::KEEP {
            self.0.pop_front();
        }
        self.0.push_back(netns.cookie);
        false
    }
}

/// Drops the paths of dead netns once their grace is over, also when no later death or new netns
/// comes to do it: after a drain, the drained pods' path strings would otherwise stay until the
/// next pod, scattered through the heap the drain's pods used. When the last of them went, the
/// heap is trimmed (their pages are in the middle of the heap, which only a trim gives back).
async fn expire_dead(shared: Arc<Shared>) {
    loop {
        let next = shared.known.read().ok().and_then(|k| k.next_expiry());
        match next {
            Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
            None => shared.died.notified().await,
        }
        let all_gone = shared.known.write().is_ok_and(|mut k| {
            let had = k.dead.len();
            // The timer's clock (the same as `Instant::now()` outside paused-time tests).
            k.expire(tokio::time::Instant::now().into_std());
            had > 0 && k.dead.is_empty()
        });
        if all_gone {
            crate::heap::after_burst();
        }
    }
}

/// The probes' dropped-event count (ring buffer full), turned into `Lost` events as it grows.
struct Losses {
    lost: maps::LostCounter,
    seen: u64,
}

impl Losses {
    fn check(&mut self, shared: &Shared) {
        let Some(total) = self.lost.total() else {
            return;
        };
        if total > self.seen {
            warn!(
                lost = total - self.seen,
                "eBPF ring buffer was full: events lost, reconciling"
            );
            shared.emit(LifecycleEvent {
                time: mono_now(),
                source: Source::Probe,
                kind: EventKind::Lost {
                    count: total - self.seen,
                },
            });
            self.seen = total;
        }
    }
}

/// Reads the ring buffer as it fills, and the dropped-event count after each batch: a probe
/// drops an event only while the ring buffer is full, and a full ring buffer wakes this reader,
/// so a loss is seen at the batch that follows it, with no timer on an idle node. One check
/// more, [`maps::LOST_RECHECK`] after a batch, covers a probe that counts its loss just after
/// the reader looked (the last event of a burst); then nothing is armed until the next event.
async fn read_ring(mut ring: maps::EventRing, lost: maps::LostCounter, shared: Arc<Shared>) {
    info!("eBPF ring buffer reader started");
    let mut released = ReleasedCookies::default();
    let mut losses = Losses { lost, seen: 0 };
    // Losses before the reader started (a late reader on a loaded node).
    losses.check(&shared);
    let mut recheck: Option<tokio::time::Instant> = None;
    loop {
        let drained = ring.drain(|item| {
            if let Some(ev) = event::decode(item, |p| shared.resolve_path(p), |i| shared.resolve_inode(i))
                && !released.is_duplicate(&ev)
            {
                shared.emit(ev);
            }
        });
        // Cancelling `drained` at its await (the recheck's turn) consumes no record.
        let batch = match recheck {
            Some(at) => tokio::select! {
                r = drained => Some(r),
                () = tokio::time::sleep_until(at) => None,
            },
            None => Some(drained.await),
        };
        match batch {
            Some(Err(_)) => {
                warn!("ring buffer fd failed");
                return;
            }
            Some(Ok(())) => {
                losses.check(&shared);
                recheck = Some(tokio::time::Instant::now() + maps::LOST_RECHECK);
            }
            None => {
                losses.check(&shared);
                recheck = None;
            }
        }
    }
}

#[cfg(test)]
mod released_tests {
    use super::*;
    use crate::sys::netns::NetnsId;

    fn released(cookie: u64) -> LifecycleEvent {
        LifecycleEvent {
            time: crate::clock::MonoTime::from_ns(1),
            source: Source::Probe,
            kind: EventKind::NetnsReleased {
                netns: NetnsId::test(cookie, 7),
                task: Task::default(),
            },
        }
    }

    #[test]
    fn a_release_reported_by_both_programs_is_emitted_once() {
        let mut seen = ReleasedCookies::default();
        assert!(!seen.is_duplicate(&released(42)));
        assert!(seen.is_duplicate(&released(42)));
        assert!(!seen.is_duplicate(&released(43)));
        // Unknown identity (cookie 0) is never folded.
        assert!(!seen.is_duplicate(&released(0)));
        assert!(!seen.is_duplicate(&released(0)));
        // Bounded: the oldest cookies are forgotten.
        for c in 100..100 + ReleasedCookies::KEEP as u64 {
            assert!(!seen.is_duplicate(&released(c)));
        }
        assert_eq!(seen.0.len(), ReleasedCookies::KEEP);
        assert!(!seen.is_duplicate(&released(42)));
    }
}

#[cfg(test)]
mod known_tests {
    use super::*;

    const OLD: NetnsId = NetnsId::test(1, 7);
    const NEW: NetnsId = NetnsId::test(2, 7);

    fn known_with(path: &str, id: NetnsId) -> Known {
        let mut k = Known::default();
        k.paths.insert(path.to_owned(), id);
        k.inodes.insert(id.inode, id);
        k.nsids.insert(3, id);
        k
    }

    #[test]
    fn a_dead_netns_keeps_its_paths_for_the_grace_only() {
        let t0 = Instant::now();
        let mut k = known_with("/run/netns/a", OLD);
        k.forget(OLD, t0);
        // Inode and nsid are reused by the kernel at once: gone now.
        assert!(k.inodes.is_empty() && k.nsids.is_empty());
        // The path still names the dead netns for a late ring-buffer record...
        k.expire(t0 + DEAD_PATHS_KEPT - Duration::from_millis(1));
        assert_eq!(k.paths.get("/run/netns/a"), Some(&OLD));
        // ... and not after the grace.
        k.expire(t0 + DEAD_PATHS_KEPT);
        assert!(k.paths.is_empty() && k.dead.is_empty());
    }

    #[test]
    fn a_new_netns_on_the_path_is_not_forgotten_with_the_old() {
        let t0 = Instant::now();
        let mut k = known_with("/run/netns/a", OLD);
        k.forget(OLD, t0);
        k.paths.insert("/run/netns/a".into(), NEW);
        k.expire(t0 + DEAD_PATHS_KEPT);
        assert_eq!(k.paths.get("/run/netns/a"), Some(&NEW));
    }

    /// The paths of the last pods of a drain go after the grace even though no later event
    /// comes, and the grown tables are given back.
    #[tokio::test(start_paused = true)]
    async fn a_drains_dead_paths_go_after_the_grace_with_no_further_event() {
        let (tx, _) = broadcast::channel(16);
        let shared = Arc::new(Shared {
            tx,
            known: RwLock::new(Known::default()),
            bpf: Mutex::new(None),
            prefixes: Vec::new(),
            rtnl: tokio::sync::Mutex::new(None),
            died: tokio::sync::Notify::new(),
        });
        let trims = crate::heap::trims();
        let task = tokio::spawn(expire_dead(Arc::clone(&shared)));
        let t0 = tokio::time::Instant::now().into_std();
        {
            let mut k = shared
                .known
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for i in 0..256u64 {
                let id = NetnsId::test(i + 1, i);
                k.paths.insert(format!("/run/netns/p{i}"), id);
                k.inodes.insert(i, id);
                k.forget(id, t0);
            }
            assert_eq!(k.paths.len(), 256, "kept for the grace");
        }
        shared.died.notify_one();
        tokio::time::sleep(DEAD_PATHS_KEPT - Duration::from_millis(10)).await;
        let left = |s: &Shared| {
            s.known
                .read()
                .map(|k| (k.paths.len(), k.paths.capacity(), k.inodes.capacity()))
                .unwrap_or_default()
        };
        assert_eq!(left(&shared).0, 256, "not before the grace");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (paths, paths_cap, inodes_cap) = left(&shared);
        assert_eq!(
            paths, 0,
            "gone after the grace, with no event after the last death"
        );
        assert!(
            paths_cap <= 32 && inodes_cap <= 32,
            "tables kept: {paths_cap}, {inodes_cap}"
        );
        task.abort();
        // The trim runs on a thread of its own, on the real clock.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while crate::heap::trims() == trims {
            assert!(
                std::time::Instant::now() < until,
                "no heap trim after the last dead path went"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn dead_netns_kept_are_bounded() {
        let t0 = Instant::now();
        let mut k = Known::default();
        for i in 0..(DEAD_KEPT_MAX as u64 + 10) {
            let id = NetnsId::test(i + 1, i);
            k.paths.insert(format!("/run/netns/p{i}"), id);
            k.forget(id, t0);
        }
        assert_eq!(k.dead.len(), DEAD_KEPT_MAX);
        assert_eq!(k.paths.len(), DEAD_KEPT_MAX);
    }
}
