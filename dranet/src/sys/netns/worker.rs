//! The worker thread of one [`Netns`](super::Netns): entered (`setns`) once, it runs every
//! closure given to [`in_netns`](super::in_netns) for that netns, one after the other, and
//! exits after [`IDLE`] without work. One attach or detach thus enters the pod netns once,
//! however many of its rooms (rtnetlink, ethtool, sysctl, bpf) need to be inside, and no idle
//! thread stays behind a pin.

use std::cell::Cell;
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
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
#[derive(Default)]
pub(super) struct Worker {
    tx: Mutex<Option<Sender<Job>>>,
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
        let mut job: Job = Box::new(move || {
            let _ = done_tx.send(f());
        });
        // Twice at most: the thread may have just exited on idle (its receiver is gone and the
        // job comes back); the second try starts a new one.
        for _ in 0..2 {
            let tx = self.sender(fd, id)?;
            match tx.send(job) {
                Ok(()) => return done_rx.recv().map_err(|_| NetnsError::ThreadPanicked(id)),
                Err(mpsc::SendError(back)) => {
                    job = back;
                    if let Ok(mut slot) = self.tx.lock() {
                        *slot = None;
                    }
                }
            }
        }
        Err(NetnsError::ThreadPanicked(id))
    }

    fn sender(&self, fd: &OwnedFd, id: NetnsId) -> Result<Sender<Job>, NetnsError> {
        let mut slot = self.tx.lock().map_err(|_| NetnsError::ThreadPanicked(id))?;
        if let Some(tx) = slot.as_ref() {
            return Ok(tx.clone());
        }
        let tx = start(fd, id)?;
        *slot = Some(tx.clone());
        Ok(tx)
    }
}

/// Starts a worker thread in the netns of `fd`; returns once it is inside.
fn start(fd: &OwnedFd, id: NetnsId) -> Result<Sender<Job>, NetnsError> {
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
                    Ok(job) => job(),
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
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
