//! The accept loop of every listener (`dranet::listen`) with the process out of fds: accept
//! fails with EMFILE while connections wait in the backlog, so a loop that retries at once
//! spins. It must back off (little CPU), count the errors, and accept again once fds are free,
//! on TCP (the metrics port) and unix sockets (DRA, registration, `events.sock`) alike.
//!
//! Its own test binary, so lowering this process's fd limit disturbs no other test.

use std::io::Write;
use std::time::{Duration, Instant};

use dranet::listen::{Accepted, Incoming, Listen};
use tokio::net::{TcpListener, UnixListener};

fn rlimit() -> libc::rlimit {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a valid, writable rlimit.
    let r = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut l) };
    assert_eq!(r, 0, "getrlimit");
    l
}

fn set_soft(soft: u64) {
    let l = libc::rlimit {
        rlim_cur: soft,
        rlim_max: rlimit().rlim_max,
    };
    // SAFETY: `l` is a valid rlimit.
    let r = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const l) };
    assert_eq!(r, 0, "setrlimit");
}

/// The lowest free fd number: with the soft limit there, the next fd cannot be allocated.
fn lowest_free_fd() -> u64 {
    // SAFETY: dup of stdin has no preconditions; the new fd is closed at once.
    let fd = unsafe { libc::dup(0) };
    assert!(fd >= 0, "dup");
    // SAFETY: `fd` was just returned by dup and is owned here.
    unsafe { libc::close(fd) };
    u64::try_from(fd).unwrap_or(0)
}

/// CPU time of this process (user + system).
fn cpu() -> Duration {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut u) };
    assert_eq!(r, 0, "getrusage");
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn accept_errors(listener: &str) -> u64 {
    let mut reg = prometheus_client::registry::Registry::default();
    dranet::listen::metrics().register(&mut reg);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &reg).unwrap_or_default();
    let key = format!("dranet_listener_accept_errors_total{{listener=\"{listener}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

async fn starved_then_served<L: Listen>(mut inc: Incoming<L>, name: &str) {
    let errors0 = accept_errors(name);
    let limit = rlimit();
    set_soft(lowest_free_fd());
    let (cpu0, t0) = (cpu(), Instant::now());
    let starved = tokio::time::timeout(Duration::from_millis(1500), inc.accept()).await;
    let (used, wall) = (cpu() - cpu0, t0.elapsed());
    set_soft(limit.rlim_cur);
    assert!(starved.is_err(), "{name}: accepted with no fd left");
    let errors = accept_errors(name) - errors0;
    eprintln!("{name}: {errors} accept errors, {used:?} CPU in {wall:?} without fds");
    // 10, 20, 40, ... 640 ms: about 8 attempts in 1.5 s, not millions.
    assert!(
        (2..=20).contains(&errors),
        "{name}: {errors} accept errors in {wall:?}"
    );
    assert!(
        used < wall / 5,
        "{name}: {used:?} of CPU in {wall:?} while out of fds (spinning)"
    );
    // Fds again: the loop accepts the waiting connection within its back-off (≤ 1 s).
    let served = tokio::time::timeout(Duration::from_secs(3), inc.accept())
        .await
        .unwrap_or_else(|_| panic!("{name}: no accept once fds were free"));
    assert!(matches!(served, Accepted::Admitted(_)), "{name}: refused");
}

#[test]
fn accept_errors_back_off_and_the_loop_keeps_accepting() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    rt.block_on(async {
        let dir = std::env::temp_dir().join(format!("dranet-accept-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.join("s.sock");
        let tcp = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = tcp.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let unix = UnixListener::bind(&path).unwrap_or_else(|e| panic!("{e}"));
        // Clients wait in the backlogs (connect completes without accept).
        let mut t = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        let mut u = std::os::unix::net::UnixStream::connect(&path).unwrap_or_else(|e| panic!("{e}"));
        let _ = t.write_all(b"x");
        let _ = u.write_all(b"x");
        starved_then_served(Incoming::new(tcp, "test-tcp", 4), "test-tcp").await;
        starved_then_served(Incoming::new(unix, "test-unix", 4), "test-unix").await;
        let _ = std::fs::remove_dir_all(&dir);
    });
}
