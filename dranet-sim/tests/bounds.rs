//! Kernel operations are bounded: an RDMA netns move the kernel never answers (through the
//! engine's RDMA seam, `EngineOptions::rdma`: this kernel has no RDMA subsystem) times out, the
//! attach is rolled back, and the pod's later hooks are served instead of waiting on its lock for
//! ever. Real netns and a veth pair standing in for the NIC.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dranet::rescue::{AttachOutcome, DetachOutcome, EngineOptions, RescueError};
use dranet::state::ReturnReason;
use dranet::sys::netns::Netns;
use dranet::sys::rdma::{NetnsMode, RdmaError, RdmaOps};
use dranet_sim::fixtures::{
    device_plan, engine_case, pod_plan, pod_ref, sandbox_ref, stop_sandbox, wait_for,
};
use dranet_sim::nic::{assert_same, view};
use dranet_sim::root_or_skip;

/// An RDMA subsystem in exclusive mode whose first move hangs (until the test lets it go, at
/// most a minute); later moves succeed at once.
#[derive(Debug, Default)]
struct HangingRdma {
    moves: AtomicUsize,
    released: Mutex<bool>,
    release: Condvar,
}

impl HangingRdma {
    fn let_go(&self) {
        *self
            .released
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        self.release.notify_all();
    }
}

impl RdmaOps for HangingRdma {
    fn host_mode(&self) -> Result<Option<NetnsMode>, RdmaError> {
        Ok(Some(NetnsMode::Exclusive))
    }

    fn move_device(&self, _from: &Netns, _name: &str, _to: &Netns) -> Result<(), RdmaError> {
        if self.moves.fetch_add(1, Ordering::SeqCst) == 0 {
            let g = self
                .released
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            drop(
                self.release
                    .wait_timeout_while(g, Duration::from_secs(60), |r| !*r)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_rdma_move_times_out_and_the_pods_later_hooks_are_served() -> Result<()> {
    root_or_skip!("a_hung_rdma_move_times_out_and_the_pods_later_hooks_are_served");
    let (state, ns, nic, before, uid) = engine_case("rdma-hang")?;
    let rdma = Arc::new(HangingRdma::default());
    let bound = Duration::from_secs(1);
    let opts = EngineOptions {
        state_dir: state.0.clone(),
        kernel_timeout: bound,
        rdma: Some(rdma.clone()),
        ..EngineOptions::default()
    };
    let e = dranet::rescue::Engine::new(opts, None).await?;
    let mut d = device_plan(&nic, "net1", &uid, Default::default());
    d.rdma_device = Some("mlx5_7".into());
    e.set_plan(pod_plan(&uid, vec![d]))?;

    // RunPodSandbox: the netdev moves, then its RDMA link's move hangs in the kernel.
    let (e1, u1, p1) = (e.clone(), uid.clone(), ns.path.clone());
    let started = Instant::now();
    let attach = tokio::spawn(async move { e1.attach_pod(pod_ref(&u1), &p1).await });
    wait_for("the RDMA move under way", Duration::from_secs(5), || {
        rdma.moves.load(Ordering::SeqCst) == 1
    })
    .await?;
    // StopPodSandbox meanwhile: it waits for the pod's lock, which the attach must give up.
    let (e2, u2, p2) = (e.clone(), uid.clone(), ns.path.clone());
    let stop = tokio::spawn(async move {
        let sb = sandbox_ref(&u2, p2.as_path());
        e2.detach_sandbox(sb, ReturnReason::Hook).await
    });
    let res = tokio::time::timeout(Duration::from_secs(10), attach)
        .await
        .context("RunPodSandbox still waiting on the hung RDMA move after 10 s")??;
    let took = started.elapsed();
    let Err(err) = res else {
        bail!("the attach succeeded although the RDMA move never finished");
    };
    assert!(matches!(err, RescueError::Timeout { .. }), "not a timeout: {err}");
    assert!(err.to_string().contains("did not finish within"), "{err}");
    assert!(took < bound + Duration::from_secs(5), "took {took:?}");
    let stopped = tokio::time::timeout(Duration::from_secs(5), stop)
        .await
        .context("StopPodSandbox was not served after the hung attach timed out")??;
    assert!(
        matches!(
            stopped,
            Ok(DetachOutcome::AlreadyReturned { .. } | DetachOutcome::Returned { .. })
        ),
        "{stopped:?}"
    );
    // Rolled back: the netdev and its RDMA link came home.
    assert!(!ns.has("net1"));
    assert_same(&before, &view(&nic.name, None)?)?;
    assert_eq!(
        rdma.moves.load(Ordering::SeqCst),
        2,
        "the RDMA link was not moved back"
    );

    // The runtime retries RunPodSandbox: served, and this time the kernel answers.
    let out = tokio::time::timeout(Duration::from_secs(10), e.attach_pod(pod_ref(&uid), &ns.path))
        .await
        .context("a later RunPodSandbox of the pod was not served")??;
    assert!(matches!(out, AttachOutcome::Attached { .. }), "{out:?}");
    assert!(ns.has("net1"));
    stop_sandbox(&e, &uid, &ns.path).await?;
    assert_same(&before, &view(&nic.name, None)?)?;
    assert_eq!(rdma.moves.load(Ordering::SeqCst), 4);
    rdma.let_go();
    Ok(())
}
