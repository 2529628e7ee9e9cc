//! Accept loops that hostile or careless clients cannot starve.
//!
//! Every listener of the daemon (`/healthz` + `/metrics` over TCP, the kubelet's DRA and
//! registration sockets, the `events.sock` of `dranet trace`) accepts through an [`Incoming`]:
//!
//! * **a cap on open connections** per listener: a connection past the cap is handed back as
//!   [`Accepted::OverCap`] (HTTP answers 503 and closes it, the others just close it), so idle
//!   clients cannot hold every fd of the process;
//! * **back-off on accept errors**: `EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM` leave the pending
//!   connection in the backlog and the listener readable, so retrying at once is a busy loop.
//!   The loop sleeps 10 ms, doubling to 1 s, and resets on the next success;
//! * **it never ends**: no error stops the loop; only dropping it does.
//!
//! [`raise_nofile_limit`] lifts the soft `RLIMIT_NOFILE` to the hard limit at start-up, so the
//! default soft limit (often 1024) is not what runs out first.
//!
//! Counters go to the process-wide [`metrics`] (`dranet_listener_*`): the listeners are created
//! in places that never see the registry, and there are few of them.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tracing::{debug, info, warn};

/// First pause after an accept error.
pub const BACKOFF_START: Duration = Duration::from_millis(10);
/// Longest pause between accept attempts while errors last.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);

pub use crate::sys::os::{NofileLimit, OsError, raise_nofile_limit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: &'static str,
}

/// Connection counters of every listener, by listener name.
#[derive(Clone, Default)]
pub struct ListenerMetrics {
    accepted: Family<ListenerLabel, Counter>,
    refused: Family<ListenerLabel, Counter>,
    errors: Family<ListenerLabel, Counter>,
    open: Family<ListenerLabel, Gauge>,
}

impl ListenerMetrics {
    /// Registers the counters (`dranet_listener_*`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "dranet_listener_connections_accepted",
            "Connections accepted within the listener's cap",
            self.accepted.clone(),
        );
        registry.register(
            "dranet_listener_connections_refused",
            "Connections closed at once because the listener had its cap of open connections",
            self.refused.clone(),
        );
        registry.register(
            "dranet_listener_accept_errors",
            "accept() failures (EMFILE, ENFILE, ...); the listener backs off and keeps accepting",
            self.errors.clone(),
        );
        registry.register(
            "dranet_listener_connections_open",
            "Connections open now",
            self.open.clone(),
        );
    }
}

static METRICS: LazyLock<ListenerMetrics> = LazyLock::new(ListenerMetrics::default);

/// The process-wide listener counters.
#[must_use]
pub fn metrics() -> &'static ListenerMetrics {
    &METRICS
}

/// Something that accepts connections.
pub trait Listen: Send + 'static {
    type Conn: Send + 'static;
    /// Polls for the next connection.
    fn poll_accept_conn(&self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Conn>>;
}

impl Listen for TcpListener {
    type Conn = TcpStream;
    fn poll_accept_conn(&self, cx: &mut Context<'_>) -> Poll<io::Result<TcpStream>> {
        self.poll_accept(cx).map_ok(|(s, _)| s)
    }
}

impl Listen for UnixListener {
    type Conn = UnixStream;
    fn poll_accept_conn(&self, cx: &mut Context<'_>) -> Poll<io::Result<UnixStream>> {
        self.poll_accept(cx).map_ok(|(s, _)| s)
    }
}

/// Errors that concern one pending connection only (it is gone from the backlog): try again
/// at once. Everything else (fd or memory exhaustion above all) backs off.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || crate::sys::os::is_eproto(e)
}

/// Doubling delay between accept attempts while they fail.
#[derive(Debug, Clone, Copy, Default)]
pub struct Backoff {
    current: Option<Duration>,
    streak: u64,
}

impl Backoff {
    /// The next pause: [`BACKOFF_START`], doubling, at most [`BACKOFF_MAX`].
    pub fn next_delay(&mut self) -> Duration {
        let d = self.current.map_or(BACKOFF_START, |d| (d * 2).min(BACKOFF_MAX));
        self.current = Some(d);
        self.streak += 1;
        d
    }

    /// A success: start over. Returns how many errors the streak had.
    pub fn reset(&mut self) -> u64 {
        self.current = None;
        std::mem::take(&mut self.streak)
    }
}

/// A connection accepted within the cap; holds its slot until dropped.
pub struct Guarded<C> {
    inner: C,
    _slot: OwnedSemaphorePermit,
    _open: OpenGuard,
}

struct OpenGuard(Gauge);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl<C> Guarded<C> {
    /// The connection.
    pub fn get_ref(&self) -> &C {
        &self.inner
    }

    /// The connection, mutably.
    pub fn get_mut(&mut self) -> &mut C {
        &mut self.inner
    }
}

impl<C: AsyncRead + Unpin> AsyncRead for Guarded<C> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<C: AsyncWrite + Unpin> AsyncWrite for Guarded<C> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<C: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<C> {
    type ConnectInfo = C::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// What [`Incoming::accept`] yields.
pub enum Accepted<C> {
    /// Within the cap.
    Admitted(Guarded<C>),
    /// Past the cap: answer briefly (or not at all) and drop it.
    OverCap(C),
}

/// An accept loop with a connection cap and back-off (see the module docs).
pub struct Incoming<L: Listen> {
    listener: L,
    name: &'static str,
    slots: Arc<Semaphore>,
    backoff: Backoff,
    sleep: Option<Pin<Box<Sleep>>>,
    label: ListenerLabel,
}

impl<L: Listen> Incoming<L> {
    /// Accepts from `listener` (called `name` in logs and metrics) with at most
    /// `max_connections` open at once.
    pub fn new(listener: L, name: &'static str, max_connections: usize) -> Self {
        Self {
            listener,
            name,
            slots: Arc::new(Semaphore::new(max_connections.max(1))),
            backoff: Backoff::default(),
            sleep: None,
            label: ListenerLabel { listener: name },
        }
    }

    /// The listener.
    pub fn listener(&self) -> &L {
        &self.listener
    }

    /// The next connection. Never fails: errors are logged, counted and waited out.
    pub async fn accept(&mut self) -> Accepted<L::Conn> {
        std::future::poll_fn(|cx| self.poll_next_conn(cx)).await
    }

    /// Polls for the next connection (see [`Incoming::accept`]).
    pub fn poll_next_conn(&mut self, cx: &mut Context<'_>) -> Poll<Accepted<L::Conn>> {
        loop {
            if let Some(s) = self.sleep.as_mut() {
                ready!(s.as_mut().poll(cx));
                self.sleep = None;
            }
            match ready!(self.listener.poll_accept_conn(cx)) {
                Ok(conn) => {
                    let errors = self.backoff.reset();
                    if errors > 0 {
                        info!(listener = self.name, errors, "accepting again");
                    }
                    return Poll::Ready(self.admit(conn));
                }
                Err(e) if is_per_connection(&e) => {
                    debug!(listener = self.name, error = %crate::telemetry::chain(&e), "accept: connection gone before it was accepted");
                }
                Err(e) => {
                    metrics().errors.get_or_create(&self.label).inc();
                    let delay = self.backoff.next_delay();
                    if self.backoff.streak == 1 {
                        warn!(listener = self.name, error = %crate::telemetry::chain(&e), retry_in = ?delay,
                              "accept failed; backing off (still listening)");
                    } else {
                        debug!(listener = self.name, error = %crate::telemetry::chain(&e), retry_in = ?delay, "accept failed again");
                    }
                    self.sleep = Some(Box::pin(tokio::time::sleep(delay)));
                }
            }
        }
    }

    fn admit(&self, conn: L::Conn) -> Accepted<L::Conn> {
        let m = metrics();
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => {
                m.accepted.get_or_create(&self.label).inc();
                let open = m.open.get_or_create(&self.label).clone();
                open.inc();
                Accepted::Admitted(Guarded {
                    inner: conn,
                    _slot: slot,
                    _open: OpenGuard(open),
                })
            }
            Err(_) => {
                m.refused.get_or_create(&self.label).inc();
                debug!(
                    listener = self.name,
                    "connection cap reached; refusing a connection"
                );
                Accepted::OverCap(conn)
            }
        }
    }

    /// A stream of admitted connections for servers that take one (tonic): connections past the
    /// cap are closed at once, errors are waited out; it never yields an error and never ends.
    pub fn into_stream(self) -> AdmittedStream<L> {
        AdmittedStream(self)
    }
}

/// See [`Incoming::into_stream`].
pub struct AdmittedStream<L: Listen>(Incoming<L>);

impl<L: Listen> futures::Stream for AdmittedStream<L>
where
    L: Unpin,
{
    type Item = Result<Guarded<L::Conn>, io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            match ready!(this.0.poll_next_conn(cx)) {
                Accepted::Admitted(c) => return Poll::Ready(Some(Ok(c))),
                Accepted::OverCap(c) => drop(c),
            }
        }
    }
}

/// Whether the peer of a connected stream socket closed it entirely (`POLLHUP`), as opposed to
/// only shutting down its sending side (a reader that reached end of file sees both alike).
#[must_use]
pub fn peer_hung_up(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(fd, PollFlags::empty())];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
        && fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLHUP))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn backoff_doubles_to_one_second_and_resets() {
        let mut b = Backoff::default();
        let ms: Vec<u128> = (0..9).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(ms, vec![10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(b.reset(), 9);
        assert_eq!(b.next_delay(), BACKOFF_START);
    }

    #[test]
    fn raising_the_fd_limit_reaches_the_hard_limit() {
        let l = raise_nofile_limit().unwrap();
        assert_eq!(l.new_soft, l.hard);
        assert!(l.old_soft <= l.new_soft);
    }

    #[test]
    fn a_closed_peer_is_told_from_a_half_closed_one() {
        use std::os::fd::AsFd;
        use std::os::unix::net::UnixStream as Std;
        let (a, b) = Std::pair().unwrap();
        assert!(!peer_hung_up(a.as_fd()));
        b.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(!peer_hung_up(a.as_fd()), "a half-close is not a hang-up");
        drop(b);
        assert!(peer_hung_up(a.as_fd()));
    }

    #[tokio::test]
    async fn past_the_cap_connections_are_handed_back_and_slots_come_back() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut inc = Incoming::new(listener, "test-cap", 2);
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        let a = inc.accept().await;
        let b = inc.accept().await;
        let c = inc.accept().await;
        assert!(matches!(a, Accepted::Admitted(_)));
        assert!(matches!(b, Accepted::Admitted(_)));
        let Accepted::OverCap(c) = c else {
            panic!("third connection admitted past a cap of 2");
        };
        drop(c);
        let mut buf = [0u8; 1];
        assert_eq!(
            clients[2].read(&mut buf).await.unwrap_or(0),
            0,
            "refused connection not closed"
        );
        drop(a);
        let mut d = TcpStream::connect(addr).await.unwrap();
        let Accepted::Admitted(mut g) = inc.accept().await else {
            panic!("a freed slot was not reused");
        };
        g.write_all(b"x").await.unwrap();
        d.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"x");
    }
}
