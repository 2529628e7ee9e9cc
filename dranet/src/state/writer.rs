//! Saves run on a thread of their own (`dranet-checkpoint`): `fsync` never blocks an async
//! worker. A change is *staged* (the records that differ from the last stage are encoded while
//! the caller still holds the checkpoint, so generations follow the order of the changes) and then
//! awaited if the caller needs it durable. Stages that pile up while a save runs are coalesced
//! (the newer value of a record wins): the thread always writes up to the newest generation, which
//! contains every older one. A save that fails is kept and written again with the next stage, so
//! a record is never left behind on disk because only its first save failed.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use tokio::sync::watch;
use tracing::warn;

use super::store::{Delta, Differ};
use super::{Checkpoint, StateError, Store};

/// The newest save attempt: its generation and how it went.
#[derive(Clone, Debug, Default)]
struct Done {
    generation: u64,
    error: Option<Arc<StateError>>,
}

#[derive(Default)]
struct Queue {
    /// Generation of the newest stage.
    staged: u64,
    /// The changes staged and not written yet, up to the newest generation.
    pending: Option<(u64, Delta)>,
    /// The changes of a save that failed while nothing was pending: written with the next stage.
    failed: Option<Delta>,
    stop: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

fn lock(m: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The checkpoint writer of one state dir (the lock holder's).
pub struct Writer {
    shared: Arc<Shared>,
    /// The last staged value of every record (taken under the caller's checkpoint lock).
    differ: Mutex<Differ>,
    done: watch::Receiver<Done>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

impl Writer {
    /// Starts the writer thread for `store`. After [`Store::load_or_recover`] the first save
    /// writes only what changed since; else it is a full save.
    pub fn start(store: Store) -> Result<Self, StateError> {
        let differ = Differ::new(store.take_on_disk());
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        let (tx, done) = watch::channel(Done::default());
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("dranet-checkpoint".into())
            .spawn(move || run(&s, &store, &tx))
            .map_err(StateError::Thread)?;
        Ok(Self {
            shared,
            differ: Mutex::new(differ),
            done,
            thread: Some(thread),
        })
    }

    /// Queues `cp` for saving and returns its generation. Call it while holding the checkpoint
    /// the change was made to, so generations follow the changes.
    pub fn stage(&self, cp: &Checkpoint) -> Result<u64, StateError> {
        let delta = self
            .differ
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .diff(cp)?;
        let mut q = lock(&self.shared.queue);
        q.staged += 1;
        let generation = q.staged;
        let mut all = q.failed.take().unwrap_or_default();
        if let Some((_, older)) = q.pending.take() {
            all.then(older);
        }
        all.then(delta);
        q.pending = Some((generation, all));
        drop(q);
        self.shared.wake.notify_one();
        Ok(generation)
    }

    /// The newest staged generation.
    #[must_use]
    pub fn staged(&self) -> u64 {
        lock(&self.shared.queue).staged
    }

    /// Waits until a save newer than generation `after` has been written (or tried): how a task
    /// that only matters after a change sleeps without a timer. `false`: the writer stopped.
    pub async fn saved_after(&self, after: u64) -> bool {
        let mut rx = self.done.clone();
        rx.wait_for(|d| d.generation > after).await.is_ok()
    }

    /// Waits until generation `generation` (or a newer one, which contains it) is on disk.
    pub async fn durable(&self, generation: u64) -> Result<(), StateError> {
        let mut rx = self.done.clone();
        let done = rx
            .wait_for(|d| d.generation >= generation)
            .await
            .map_err(|_| StateError::WriterStopped)?
            .clone();
        match done.error {
            None => Ok(()),
            Some(e) => Err(StateError::Save(e)),
        }
    }
}

impl Drop for Writer {
    /// Writes what is still staged, then stops the thread.
    fn drop(&mut self) {
        lock(&self.shared.queue).stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            warn!("the checkpoint writer thread panicked");
        }
    }
}

fn run(shared: &Shared, store: &Store, done: &watch::Sender<Done>) {
    loop {
        let job = {
            let mut q = lock(&shared.queue);
            loop {
                if let Some(job) = q.pending.take() {
                    break Some(job);
                }
                if q.stop {
                    break None;
                }
                q = shared
                    .wake
                    .wait(q)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        };
        let Some((generation, delta)) = job else {
            return;
        };
        let error = store.apply(&delta).err().map(Arc::new);
        if let Some(e) = &error {
            warn!(error = %crate::telemetry::chain(&e), generation, "saving the checkpoint failed");
            // Written again before (and under) whatever is staged next.
            let mut q = lock(&shared.queue);
            let mut again = q.failed.take().unwrap_or_default();
            again.then(delta);
            match q.pending.take() {
                Some((g, newer)) => {
                    again.then(newer);
                    q.pending = Some((g, again));
                }
                None => q.failed = Some(again),
            }
        }
        done.send_replace(Done { generation, error });
    }
}
