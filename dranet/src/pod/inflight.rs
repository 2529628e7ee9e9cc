//! Attaches that outlive their RunPodSandbox hook.
//!
//! The runtime gives a plugin 2 s per request and closes a plugin that takes longer (it then runs
//! the sandbox, and every later request, without it). A RunPodSandbox attach can take longer on
//! a loaded node (many devices moved under a busy RTNL, a slow kernel), so the hook answers after
//! [`super::hooks::RUN_POD_SANDBOX_BUDGET`] while the attach goes on. The sandbox has no
//! container yet, and none may start before its devices are in: the sandbox's CreateContainer
//! waits here for the attach (within its own budget), and fails the container if the attach
//! failed or still runs (kubelet retries it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use crate::state::RecordKey;

/// How an attach ended: `Err` carries why, for the container it holds back.
pub type Ended = Result<(), String>;

/// What a wait for a sandbox's attach found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Waited {
    /// No attach of the sandbox is running (none began, or it ended and was forgotten).
    NoneRunning,
    /// The attach ended while or before this waited.
    Ended(Ended),
    /// Still running when the wait's budget ran out.
    StillRunning,
}

#[derive(Default)]
struct Table {
    next: u64,
    running: HashMap<RecordKey, (u64, watch::Receiver<Option<Ended>>)>,
}

/// The attaches running per sandbox (pod UID + sandbox id).
#[derive(Clone, Default)]
pub struct InFlight {
    table: Arc<Mutex<Table>>,
}

/// One running attach, from [`InFlight::begin`]; [`Ticket::end`] (or dropping it: a task that
/// stopped) ends it.
pub struct Ticket {
    table: Arc<Mutex<Table>>,
    key: RecordKey,
    id: u64,
    tx: watch::Sender<Option<Ended>>,
}

fn lock(table: &Mutex<Table>) -> std::sync::MutexGuard<'_, Table> {
    // A panic while holding the lock leaves a table of plain values: still consistent.
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

impl InFlight {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        lock(&self.table)
    }

    /// Notes that an attach of sandbox `key` starts (a later one of the same key replaces it).
    #[must_use]
    pub fn begin(&self, key: RecordKey) -> Ticket {
        let (tx, rx) = watch::channel(None);
        let mut t = self.table();
        t.next += 1;
        let id = t.next;
        t.running.insert(key.clone(), (id, rx));
        Ticket {
            table: self.table.clone(),
            key,
            id,
            tx,
        }
    }

    /// Waits at most `budget` for the running attach of sandbox `key`, if any.
    pub async fn wait(&self, key: &RecordKey, budget: Duration) -> Waited {
        let Some(mut rx) = self.table().running.get(key).map(|(_, rx)| rx.clone()) else {
            return Waited::NoneRunning;
        };
        match tokio::time::timeout(budget, rx.wait_for(Option::is_some)).await {
            Ok(Ok(v)) => Waited::Ended(v.clone().unwrap_or(Ok(()))),
            // The sender went without a value: the attach task stopped (a panic).
            Ok(Err(_)) => Waited::Ended(Err("the attach stopped before it ended".into())),
            Err(_) => Waited::StillRunning,
        }
    }

    /// Attaches running now.
    #[must_use]
    pub fn running(&self) -> usize {
        self.table().running.len()
    }
}

impl Ticket {
    /// The attach ended with `how`: waiters wake, and the sandbox has none running.
    pub fn end(self, how: Ended) {
        self.tx.send_replace(Some(how));
    }
}

impl Drop for Ticket {
    /// The sandbox has no attach running any more (ended, or a task that stopped: then waiters
    /// see the channel close).
    fn drop(&mut self) {
        let mut t = lock(&self.table);
        if t.running.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            t.running.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::pod_key;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn a_wait_sees_the_end_of_a_running_attach() {
        let f = InFlight::default();
        let key = pod_key("uid-1", "sb-1");
        assert_eq!(f.wait(&key, MS).await, Waited::NoneRunning);
        let t = f.begin(key.clone());
        assert_eq!(f.wait(&key, 20 * MS).await, Waited::StillRunning);
        let (f2, k2) = (f.clone(), key.clone());
        let waiter = tokio::spawn(async move { f2.wait(&k2, Duration::from_secs(5)).await });
        tokio::time::sleep(20 * MS).await;
        t.end(Ok(()));
        assert_eq!(waiter.await.ok(), Some(Waited::Ended(Ok(()))));
        // Ended and forgotten: nothing runs for the sandbox any more.
        assert_eq!(f.wait(&key, MS).await, Waited::NoneRunning);
        assert_eq!(f.running(), 0);
    }

    #[tokio::test]
    async fn a_failed_attach_tells_the_waiter_why() {
        let f = InFlight::default();
        let key = pod_key("uid-2", "sb-1");
        let t = f.begin(key.clone());
        let (f2, k2) = (f.clone(), key.clone());
        let waiter = tokio::spawn(async move { f2.wait(&k2, Duration::from_secs(5)).await });
        tokio::time::sleep(10 * MS).await;
        t.end(Err("link eth9 not found".into()));
        assert_eq!(
            waiter.await.ok(),
            Some(Waited::Ended(Err("link eth9 not found".into())))
        );
    }

    #[tokio::test]
    async fn a_dropped_ticket_ends_its_waiters_with_an_error() {
        let f = InFlight::default();
        let key = pod_key("uid-3", "sb-1");
        let t = f.begin(key.clone());
        let (f2, k2) = (f.clone(), key.clone());
        let waiter = tokio::spawn(async move { f2.wait(&k2, Duration::from_secs(5)).await });
        tokio::time::sleep(10 * MS).await;
        drop(t);
        assert!(matches!(waiter.await.ok(), Some(Waited::Ended(Err(_)))));
    }

    #[tokio::test]
    async fn the_end_of_an_older_attach_does_not_forget_a_newer_one() {
        let f = InFlight::default();
        let key = pod_key("uid-4", "sb-1");
        let old = f.begin(key.clone());
        let new = f.begin(key.clone());
        old.end(Ok(()));
        assert_eq!(f.running(), 1);
        assert_eq!(f.wait(&key, 10 * MS).await, Waited::StillRunning);
        new.end(Ok(()));
        assert_eq!(f.running(), 0);
    }
}
