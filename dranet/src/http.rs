//! The daemon's HTTP endpoint: `GET /healthz` and `GET /readyz` (200 when ready, 503 with the
//! reason otherwise) and `GET /metrics` (Prometheus text format 0.0.4, or OpenMetrics when the
//! scraper's `Accept` names `application/openmetrics-text`), served by hyper (HTTP/1.1,
//! keep-alive).
//!
//! The port is reachable from every pod on the node network by default (`0.0.0.0:9177`, as
//! upstream), so nobody may be able to starve it or the daemon behind it:
//!
//! * at most [`ServerOptions::max_connections`] connections are open at once; one more gets a
//!   short `503` and is closed at once ([`crate::listen`]);
//! * a client has [`ServerOptions::header_timeout`] to send a request's headers (slowloris) and
//!   a connection with no byte either way for [`ServerOptions::idle_timeout`] is closed;
//! * accept errors (`EMFILE`, ...) back off instead of spinning, and never end the loop.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming as Body;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tracing::debug;

use crate::listen::{Accepted, Incoming};
pub use crate::telemetry::metrics::Format as MetricsFormat;

/// Errors of the HTTP endpoint.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("binding {addr}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// What the endpoint serves.
pub trait Endpoints: Send + Sync + 'static {
    /// `Ok(())` when ready, `Err(reason)` otherwise.
    fn health(&self) -> Result<(), String>;
    /// `/readyz`: `Ok(())` when ready to serve the cluster, `Err(reasons)` otherwise.
    fn ready(&self) -> Result<(), String> {
        self.health()
    }
    /// The metrics exposition in `format`.
    fn metrics(&self, format: MetricsFormat) -> String;
}

/// Limits of the endpoint.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// Time allowed for a request's headers, from the connection's start or the previous
    /// response on.
    pub header_timeout: Duration,
    /// A connection with no byte read or written for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            // kubelet probes and one or two scrapers need a handful.
            max_connections: 64,
            // Probes and scrapers send their request in one packet at once; a client that
            // holds a slot longer without one is squatting it.
            header_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// A bound endpoint.
pub struct Server {
    listener: TcpListener,
    opts: ServerOptions,
}

impl Server {
    pub async fn bind(addr: &str) -> Result<Self, HttpError> {
        let listener = TcpListener::bind(addr).await.map_err(|source| HttpError::Bind {
            addr: addr.to_owned(),
            source,
        })?;
        Ok(Self {
            listener,
            opts: ServerOptions::default(),
        })
    }

    /// Other limits than [`ServerOptions::default`].
    #[must_use]
    pub fn with_options(mut self, opts: ServerOptions) -> Self {
        self.opts = opts;
        self
    }

    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until the task is dropped.
    pub async fn run(self, ep: Arc<dyn Endpoints>) {
        let opts = Arc::new(self.opts);
        let mut incoming = Incoming::new(self.listener, "http", opts.max_connections);
        let refusals = Arc::new(tokio::sync::Semaphore::new(REFUSALS));
        loop {
            match incoming.accept().await {
                Accepted::Admitted(conn) => {
                    let (ep, opts) = (ep.clone(), opts.clone());
                    tokio::spawn(async move { serve_connection(conn, ep, &opts).await });
                }
                Accepted::OverCap(conn) => match refusals.clone().try_acquire_owned() {
                    Ok(slot) => {
                        tokio::spawn(async move {
                            refuse(conn).await;
                            drop(slot);
                        });
                    }
                    // A flood: no time for manners. A fresh socket's send buffer is empty, so
                    // this never blocks; dropping the stream closes it.
                    Err(_) => {
                        let _ = conn.try_write(BUSY);
                    }
                },
            }
        }
    }
}

/// Connections past the cap answered politely at once (503, then wait briefly for the client
/// to hang up so it reads the answer rather than a reset); past this many they are just closed.
const REFUSALS: usize = 8;

async fn refuse(mut conn: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let polite = async {
        conn.write_all(BUSY).await?;
        conn.shutdown().await?;
        let mut sink = [0u8; 1024];
        while conn.read(&mut sink).await? > 0 {}
        Ok::<_, io::Error>(())
    };
    let _ = tokio::time::timeout(Duration::from_millis(250), polite).await;
}

/// The answer past the connection cap.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 21\r\nRetry-After: 1\r\nConnection: close\r\n\r\ntoo many connections\n";

/// Serves HTTP/1.1 requests on one connection until the client closes it, it stays idle for
/// `opts.idle_timeout`, or a request's headers take longer than `opts.header_timeout`.
pub async fn serve_connection<IO>(io: IO, ep: Arc<dyn Endpoints>, opts: &ServerOptions)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: io,
        activity: activity.clone(),
    });
    let svc = hyper::service::service_fn(move |req: Request<Body>| {
        let resp = respond(&req, ep.as_ref());
        async move { Ok::<_, Infallible>(resp) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_timeout)
        .keep_alive(true)
        // A client may send its request and shut its side down at once (and still read).
        .half_close(true)
        .max_headers(64)
        // hyper's smallest allowed read buffer; a request line + headers must fit in it.
        .max_buf_size(8192);
    let conn = builder.serve_connection(io, svc);
    tokio::select! {
        r = conn => {
            if let Err(e) = r {
                debug!(error = %crate::telemetry::chain(&e), "http connection closed");
            }
        }
        () = activity.idle_for(opts.idle_timeout) => debug!("http connection idle; closed"),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The answer to one request.
fn respond(req: &Request<Body>, ep: &dyn Endpoints) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n".into());
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        p @ ("/healthz" | "/readyz") => match if p == "/readyz" { ep.ready() } else { ep.health() } {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
        },
        "/metrics" => {
            let accept = req
                .headers()
                .get_all(header::ACCEPT)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect::<Vec<_>>()
                .join(",");
            let format = MetricsFormat::negotiate((!accept.is_empty()).then_some(accept.as_str()));
            let mut r = text(StatusCode::OK, ep.metrics(format));
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(format.content_type()),
            );
            h.insert(header::VARY, header::HeaderValue::from_static("Accept"));
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

/// When a connection last moved a byte.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once nothing moved for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let deadline = last + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline.into()).await;
        }
    }
}

/// A stream that records its activity.
struct Tracked<IO> {
    inner: IO,
    activity: Arc<Activity>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Tracked<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.touch();
        }
        r
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Tracked<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A fixed [`Endpoints`] and a request fed as raw bytes, for the fuzz target and tests: the
/// bytes go through [`serve_connection`] over an in-memory stream; returns everything the
/// server wrote back.
#[doc(hidden)]
pub async fn exchange(raw: &[u8], ep: Arc<dyn Endpoints>, opts: &ServerOptions) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (client, server) = tokio::io::duplex(64 * 1024);
    let serve = serve_connection(server, ep, opts);
    let talk = async move {
        let (mut rd, mut wr) = tokio::io::split(client);
        let write = async {
            let _ = wr.write_all(raw).await;
            let _ = wr.shutdown().await;
        };
        let mut out = Vec::new();
        let read = rd.read_to_end(&mut out);
        let _ = tokio::join!(write, read);
        out
    };
    let ((), out) = tokio::join!(serve, talk);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    struct Fixed(Result<(), String>);
    impl Endpoints for Fixed {
        fn health(&self) -> Result<(), String> {
            self.0.clone()
        }
        fn metrics(&self, format: MetricsFormat) -> String {
            let reg = crate::telemetry::metrics::registry();
            crate::telemetry::metrics::encode(&reg, format).unwrap()
        }
    }

    fn ep(ready: bool) -> Arc<dyn Endpoints> {
        Arc::new(Fixed(if ready { Ok(()) } else { Err("starting".into()) }))
    }

    async fn get(raw: &str, ready: bool) -> String {
        let out = exchange(raw.as_bytes(), ep(ready), &ServerOptions::default()).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn routes() {
        let r = get("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", true).await;
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\nok\n"),
            "{r}"
        );
        let r = get("GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n", false).await;
        assert!(r.starts_with("HTTP/1.1 503 ") && r.ends_with("starting\n"), "{r}");
        let r = get(
            "GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\n\r\n",
            true,
        )
        .await;
        assert!(
            r.contains("application/openmetrics-text") && r.ends_with("# EOF\n"),
            "{r}"
        );
        let r = get("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", true).await;
        assert!(r.starts_with("HTTP/1.1 404 "), "{r}");
        let r = get(
            "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            true,
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 405 "), "{r}");
        let r = get("GARBAGE\r\n\r\n", true).await;
        assert!(r.is_empty() || r.starts_with("HTTP/1.1 400 "), "{r}");
        // Two requests on one keep-alive connection.
        let r = get(
            "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            true,
        )
        .await;
        assert_eq!(r.matches("HTTP/1.1 200 OK").count(), 2, "{r}");
    }

    async fn server(opts: ServerOptions) -> SocketAddr {
        let s = Server::bind("127.0.0.1:0").await.unwrap().with_options(opts);
        let addr = s.local_addr().unwrap();
        tokio::spawn(s.run(ep(true)));
        addr
    }

    async fn healthz(addr: SocketAddr) -> String {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out).await;
        out
    }

    #[tokio::test]
    async fn slowloris_is_dropped_after_the_header_timeout() {
        let addr = server(ServerOptions {
            header_timeout: Duration::from_millis(300),
            ..ServerOptions::default()
        })
        .await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        let start = Instant::now();
        let mut closed = false;
        for b in b"GET /healthz HTTP/1.1\r\nHost: slow\r\n".iter().cycle().take(40) {
            if c.write_all(&[*b]).await.is_err() {
                closed = true;
                break;
            }
            let mut buf = [0u8; 256];
            if let Ok(r) = tokio::time::timeout(Duration::from_millis(50), c.read(&mut buf)).await {
                // 408 (hyper answers a header timeout) or end of file.
                assert!(matches!(r, Ok(0) | Err(_)) || buf.starts_with(b"HTTP/1.1 408"));
                closed = true;
                break;
            }
        }
        assert!(closed, "slow client still connected after {:?}", start.elapsed());
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn idle_connections_are_closed_and_the_cap_answers_503() {
        let addr = server(ServerOptions {
            max_connections: 4,
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_millis(300),
        })
        .await;
        let mut idle = Vec::new();
        for _ in 0..4 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let r = healthz(addr).await;
        assert!(
            r.starts_with("HTTP/1.1 503 ") && r.contains("too many connections"),
            "{r}"
        );
        // The idle ones are closed after 300 ms; then the endpoint answers again.
        let mut buf = [0u8; 1];
        for c in &mut idle {
            let n = tokio::time::timeout(Duration::from_secs(2), c.read(&mut buf))
                .await
                .expect("idle connection not closed");
            assert!(matches!(n, Ok(0) | Err(_)));
        }
        let r = healthz(addr).await;
        assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
    }

    fn header<'a>(r: &'a str, name: &str) -> Option<&'a str> {
        r.split("\r\n\r\n").next()?.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn body(r: &str) -> &str {
        r.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }

    /// `/metrics` speaks the text format 0.0.4 unless the scraper names OpenMetrics in
    /// `Accept` (Prometheus' own header), byte for byte over the wire.
    #[tokio::test]
    async fn metrics_negotiate_text_0_0_4_or_openmetrics() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        for (accept, openmetrics) in [
            (None, false),
            (Some("text/plain"), false),
            (Some("text/plain;version=0.0.4"), false),
            (Some("*/*"), false),
            (Some("application/openmetrics-text;q=0"), false),
            (Some("application/openmetrics-text"), true),
            (Some(prometheus), true),
        ] {
            let raw = match accept {
                Some(a) => format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {a}\r\n\r\n"),
                None => "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".to_owned(),
            };
            let r = get(&raw, true).await;
            assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
            let b = body(&r);
            assert_eq!(header(&r, "vary"), Some("Accept"), "{r}");
            if openmetrics {
                assert_eq!(
                    header(&r, "content-type"),
                    Some("application/openmetrics-text; version=1.0.0; charset=utf-8"),
                    "{accept:?}"
                );
                assert!(b.ends_with("# EOF\n"), "{b}");
                assert!(b.contains("# TYPE process_cpu_seconds counter\n"), "{b}");
                assert!(b.contains("# TYPE dranet_build info\n"), "{b}");
            } else {
                assert_eq!(
                    header(&r, "content-type"),
                    Some("text/plain; version=0.0.4; charset=utf-8"),
                    "{accept:?}"
                );
                assert!(!b.contains("# EOF"), "{b}");
                assert!(!b.contains("# UNIT"), "{b}");
                // 0.0.4 names a counter's family by its sample (`_total`), and has no info type.
                assert!(b.contains("# TYPE process_cpu_seconds_total counter\n"), "{b}");
                assert!(b.contains("# HELP process_cpu_seconds_total "), "{b}");
                assert!(b.contains("# TYPE dranet_build_info gauge\n"), "{b}");
                assert!(!b.contains(" info\n"), "{b}");
            }
            assert!(b.contains("\nprocess_cpu_seconds_total "), "{b}");
            assert!(
                b.contains(&format!(
                    "dranet_build_info{{version=\"{}\",revision=\"{}\"}} 1\n",
                    crate::telemetry::version::VERSION,
                    crate::telemetry::version::REVISION
                )),
                "{b}"
            );
        }
    }
}
