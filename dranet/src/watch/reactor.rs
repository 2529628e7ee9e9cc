//! The reactor: a thread of its own, at a raised priority, running a single-threaded tokio
//! runtime for the rescue's event path: the ring-buffer reader, the engine's decisions and the
//! rescue up to (and through) its device moves.
//!
//! On a loaded node the two async workers run at nice 0 beside every other process: each wake-up
//! on the way from a probe event to the first `RTM_NEWLINK` (ring reader → event loop → rescue
//! task → netlink replies) waits behind whatever holds the CPU, a few ms each (`cargo xtask
//! bench --only loaded`). The reactor's thread preempts them: `SCHED_FIFO` where allowed, else a
//! negative nice value ([`crate::sys::os::raise_thread_priority`]), and threads it starts run at
//! the normal priority again.

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::sys::os::{self, Priority};

/// Real-time priority of the reactor under `SCHED_FIFO` (low: it only has to beat `SCHED_OTHER`).
pub const FIFO_PRIORITY: i32 = 10;
/// Nice value of the reactor when `SCHED_FIFO` is not allowed.
pub const NICE: i32 = -15;

/// The reactor thread and its runtime; dropping it stops the runtime (its tasks are dropped).
pub struct Reactor {
    handle: Handle,
    priority: Option<Priority>,
    stop: Option<oneshot::Sender<()>>,
}

impl std::fmt::Debug for Reactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reactor")
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

impl Reactor {
    /// Starts the thread. A priority that cannot be raised is a warning, not an error.
    ///
    /// # Errors
    /// The thread or its runtime cannot be created.
    pub fn start() -> std::io::Result<Self> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("dranet-reactor".into())
            .spawn(move || {
                let priority = match os::raise_thread_priority(FIFO_PRIORITY, NICE) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        warn!(error = %crate::telemetry::chain(&e), "the rescue reactor runs at the normal priority");
                        None
                    }
                };
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .thread_name("dranet-reactor-blocking")
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                if ready_tx.send(Ok((rt.handle().clone(), priority))).is_err() {
                    return;
                }
                // Until the Reactor is dropped (or every sender is gone).
                let _ = rt.block_on(stopped);
                // Tasks still pending are dropped here, on this thread.
                rt.shutdown_background();
            })?;
        let (handle, priority) = ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("the reactor thread exited"))??;
        info!(?priority, "rescue reactor started");
        Ok(Self {
            handle,
            priority,
            stop: Some(stop),
        })
    }

    /// The runtime to spawn on.
    #[must_use]
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// The priority the thread got (`None`: the normal one).
    #[must_use]
    pub fn priority(&self) -> Option<Priority> {
        self.priority
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        // Not joined: the last owner may be a task on the reactor itself.
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Aborts a task (on whichever runtime) when dropped.
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
