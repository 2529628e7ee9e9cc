//! The daemon's small HTTP endpoint: `GET /healthz` (200 when ready, 503 with the reason
//! otherwise) and `GET /metrics` (Prometheus text format). HTTP/1.1, one request per connection,
//! nothing else: enough for kubelet probes and a Prometheus scrape, no server framework needed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::debug;

/// Errors of the HTTP endpoint.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("binding {addr}: {source}")]
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
    /// The metrics exposition (OpenMetrics text).
    fn metrics(&self) -> String;
}

/// A bound endpoint.
pub struct Server {
    listener: TcpListener,
}

impl Server {
    pub async fn bind(addr: &str) -> Result<Self, HttpError> {
        let listener = TcpListener::bind(addr).await.map_err(|source| HttpError::Bind {
            addr: addr.to_owned(),
            source,
        })?;
        Ok(Self { listener })
    }

    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until the task is dropped.
    pub async fn run(self, ep: Arc<dyn Endpoints>) {
        loop {
            let Ok((conn, peer)) = self.listener.accept().await else {
                continue;
            };
            let ep = ep.clone();
            tokio::spawn(async move {
                if let Err(e) = tokio::time::timeout(Duration::from_secs(5), serve(conn, ep.as_ref())).await {
                    debug!(%peer, error = %e, "http request timed out");
                }
            });
        }
    }
}

async fn serve(mut conn: TcpStream, ep: &dyn Endpoints) {
    let mut buf = vec![0u8; 2048];
    let mut n = 0;
    while n < buf.len() {
        match conn.read(&mut buf[n..]).await {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", p @ ("/healthz" | "/readyz")) => {
            match if p == "/readyz" { ep.ready() } else { ep.health() } {
                Ok(()) => ("200 OK", "text/plain", "ok\n".to_owned()),
                Err(reason) => ("503 Service Unavailable", "text/plain", format!("{reason}\n")),
            }
        }
        ("GET", "/metrics") => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ep.metrics(),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_owned()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".to_owned(),
        ),
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(resp.as_bytes()).await;
    let _ = conn.shutdown().await;
}
