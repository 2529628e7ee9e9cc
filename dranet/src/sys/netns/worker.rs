//! The worker thread of one [`Netns`](super::Netns): entered (`setns`) once, it runs every
//! closure given to [`in_netns`](super::in_netns) for that netns, one after the other, and
//! exits after [`IDLE`] without work. One attach or detach thus enters the pod netns once,
//! however many of its rooms (rtnetlink, ethtool, sysctl, bpf) need to be inside, and no idle
//! thread stays behind a pin.

use std::cell::Cell;
use std::os::fd::OwnedFd;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sched::{CloneFlags, setns};

use super::{NetnsError, NetnsId};

/// How long the worker waits for its next closure before it exits.
pub const IDLE: Duration = Duration::from_secs(1);

type Job = Box<dyn FnOnce() + Send>;

thread_local! {
    /// The netns a worker thread is in (a closure that asks for the same netns runs inline).
    static INSIDE: Cell<Option<NetnsId>> = const { Cell::new(None) };
}

/// The sending side of the current worker thread, if one runs.
/// The slot is shared with the thread: a send happens under its lock, and the thread leaves
/// only under it, after a last look for work, so no closure is ever dropped unrun.
#[derive(Default)]
pub(super) struct Worker {
    tx: Arc<Mutex<Option<Sender<Job>>>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Worker")
    }
}

impl Worker {
    /// Runs `f` on the worker thread inside the netns of `fd` (starting it if needed) and
    /// waits for its result.
    pub(super) fn run<R, F>(&self, fd: &OwnedFd, id: NetnsId, f: F) -> Result<R, NetnsError>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        if INSIDE.with(Cell::get) == Some(id) {
            return Ok(f());
        }
        let (done_tx, done_rx) = mpsc::sync_channel::<R>(1);
        let job: Job = Box::new(move || {
            let _ = done_tx.send(f());
        });
        {
            let mut slot = self.tx.lock().map_err(|_| NetnsError::ThreadPanicked(id))?;
            let sent = match slot.as_ref() {
                Some(tx) => tx.send(job).map_err(|mpsc::SendError(back)| back),
                None => Err(job),
            };
            if let Err(back) = sent {
                // No thread, or it died (a closure panicked): start one.
                let tx = start(fd, id, Arc::clone(&self.tx))?;
                tx.send(back).map_err(|_| NetnsError::ThreadPanicked(id))?;
                *slot = Some(tx);
            }
        }
        done_rx.recv().map_err(|_| NetnsError::ThreadPanicked(id))
    }
}

/// Starts a worker thread in the netns of `fd`; returns once it is inside.
fn start(
    fd: &OwnedFd,
    id: NetnsId,
    slot: Arc<Mutex<Option<Sender<Job>>>>,
) -> Result<Sender<Job>, NetnsError> {
    let fd = fd.try_clone().map_err(|e| NetnsError::Thread(id, e))?;
    let (tx, rx) = mpsc::channel::<Job>();
    let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<(), nix::Error>>(1);
    std::thread::Builder::new()
        .name("dranet-netns".into())
        .spawn(move || {
            // Network namespace only: a thread may switch it on its own (no CLONE_FS rule).
            let entered = setns(&fd, CloneFlags::CLONE_NEWNET);
            let ok = entered.is_ok();
            let _ = ready_tx.send(entered);
            if !ok {
                return;
            }
            INSIDE.with(|c| c.set(Some(id)));
            loop {
                match rx.recv_timeout(IDLE) {
                    Ok(job) => run_job(job),
                    Err(RecvTimeoutError::Disconnected) => return,
                    Err(RecvTimeoutError::Timeout) => {
                        // Leave under the slot's lock, after a last look: a closure sent before
                        // runs here, one sent after finds the slot empty and starts a thread.
                        let Ok(mut guard) = slot.lock() else { return };
                        match rx.try_recv() {
                            Ok(job) => {
                                drop(guard);
                                run_job(job);
                            }
                            Err(_) => {
                                *guard = None;
                                return;
                            }
                        }
                    }
                }
            }
        })
        .map_err(|e| NetnsError::Thread(id, e))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(tx),
        Ok(Err(source)) => Err(NetnsError::Setns { id, source }),
        Err(_) => Err(NetnsError::ThreadPanicked(id)),
    }
}

/// Runs one closure; a panic in it is its caller's error (the result never arrives), not the
/// end of the worker, so closures queued behind it still run.
fn run_job(job: Job) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
}
