//! Saves run on a thread of their own (`dranet-checkpoint`): `fsync` never blocks an async
//! worker. A change is *staged* (encoded while the caller still holds the checkpoint, so
//! generations follow the order of the changes) and then awaited if the caller needs it durable.
//! Stages that pile up while a save runs are coalesced: the thread always writes the newest
//! generation, which contains every older one.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use tokio::sync::watch;
use tracing::warn;

use super::store::Encoder;
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
    /// The newest stage not written yet.
    pending: Option<(u64, Vec<u8>)>,
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
    /// Reuses the JSON of unchanged records (taken under the caller's checkpoint lock).
    encoder: Mutex<Encoder>,
    done: watch::Receiver<Done>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

impl Writer {
    /// Starts the writer thread for `store`.
    pub fn start(store: Store) -> Result<Self, StateError> {
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
            encoder: Mutex::new(Encoder::default()),
            done,
            thread: Some(thread),
        })
    }

    /// Queues `cp` for saving and returns its generation. Call it while holding the checkpoint
    /// the change was made to, so generations follow the changes.
    pub fn stage(&self, cp: &Checkpoint) -> Result<u64, StateError> {
        let bytes = self
            .encoder
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .encode(cp)?;
        let mut q = lock(&self.shared.queue);
        q.staged += 1;
        let generation = q.staged;
        q.pending = Some((generation, bytes));
        drop(q);
        self.shared.wake.notify_one();
        Ok(generation)
    }

    /// The newest staged generation.
    #[must_use]
    pub fn staged(&self) -> u64 {
        lock(&self.shared.queue).staged
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
        let Some((generation, bytes)) = job else {
            return;
        };
        let error = store.write(&bytes).err().map(Arc::new);
        if let Some(e) = &error {
            warn!(error = %crate::telemetry::chain(&e), generation, "saving the checkpoint failed");
        }
        done.send_replace(Done { generation, error });
    }
}
