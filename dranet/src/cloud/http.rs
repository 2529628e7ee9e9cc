//! A small HTTP/1.1 client (hyper's connection API) for the metadata services and the webhook:
//! one connection per request, a deadline on the whole exchange, bodies capped at 1 MiB.
//! `http://host[:port]/base` or `unix:///path/to.sock` (upstream's webhook form; requests go to
//! `http://localhost/...` over the socket). No TLS: metadata services are plain HTTP and an
//! `https://` webhook is refused when configured.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

use super::CloudError;

/// Largest body read from a metadata service or webhook.
const MAX_BODY: usize = 1 << 20;

/// Where requests go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `host:port` and a base path (no trailing `/`).
    Tcp { authority: String, base: String },
    /// A unix socket; the base path is empty.
    Unix { socket: std::path::PathBuf },
}

impl Endpoint {
    /// Parses `http://host[:port][/base]` or `unix:///path`.
    pub fn parse(url: &str) -> Result<Self, CloudError> {
        let bad = |why: &str| CloudError::Url {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        if let Some(path) = url.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(bad("a unix socket needs an absolute path: unix:///path/to.sock"));
            }
            return Ok(Self::Unix { socket: path.into() });
        }
        if url.starts_with("https://") {
            return Err(bad("https is not supported; use http:// or unix://"));
        }
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad("must start with http:// or unix://"))?;
        let (authority, base) = rest.split_once('/').map_or((rest, ""), |(a, b)| (a, b));
        if authority.is_empty() || authority.contains(['@', ' ']) {
            return Err(bad("no host"));
        }
        let authority = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            && !authority.ends_with(']')
        {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        let base = base.trim_end_matches('/');
        Ok(Self::Tcp {
            authority,
            base: if base.is_empty() {
                String::new()
            } else {
                format!("/{base}")
            },
        })
    }

    fn host_header(&self) -> String {
        match self {
            Self::Tcp { authority, .. } => authority.strip_suffix(":80").unwrap_or(authority).to_owned(),
            Self::Unix { .. } => "localhost".to_owned(),
        }
    }

    /// The request target for `path` (which starts with `/`, and may carry a query).
    fn target(&self, path: &str) -> String {
        match self {
            Self::Tcp { base, .. } => format!("{base}{path}"),
            Self::Unix { .. } => path.to_owned(),
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp { authority, base } => write!(f, "http://{authority}{base}"),
            Self::Unix { socket } => write!(f, "unix://{}", socket.display()),
        }
    }
}

/// An answer.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Response {
    /// The body as text (lossy).
    #[must_use]
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request and reads the whole answer within `timeout`.
pub async fn send(
    ep: &Endpoint,
    method: http::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<Response, CloudError> {
    let url = format!("{ep}{path}");
    match tokio::time::timeout(timeout, exchange(ep, method, path, headers, body)).await {
        Ok(r) => r.map_err(|why| CloudError::Http { url, why }),
        Err(_) => Err(CloudError::Timeout { url, after: timeout }),
    }
}

async fn exchange(
    ep: &Endpoint,
    method: http::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
) -> Result<Response, String> {
    let mut req = http::Request::builder()
        .method(method)
        .uri(ep.target(path))
        .header(http::header::HOST, ep.host_header())
        .header(http::header::USER_AGENT, "dranet");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| e.to_string())?;
    match ep {
        Endpoint::Tcp { authority, .. } => {
            let stream = tokio::net::TcpStream::connect(authority.as_str())
                .await
                .map_err(|e| format!("connecting: {e}"))?;
            over(stream, req).await
        }
        Endpoint::Unix { socket } => {
            let stream = tokio::net::UnixStream::connect(socket)
                .await
                .map_err(|e| format!("connecting: {e}"))?;
            over(stream, req).await
        }
    }
}

async fn over<S>(stream: S, req: http::Request<Full<Bytes>>) -> Result<Response, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let result = async {
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, MAX_BODY)
            .collect()
            .await
            .map_err(|e| format!("reading the body: {e}"))?
            .to_bytes();
        Ok(Response {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }
    .await;
    conn.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            Endpoint::parse("http://169.254.169.254").unwrap(),
            Endpoint::Tcp {
                authority: "169.254.169.254:80".into(),
                base: String::new()
            }
        );
        let ep = Endpoint::parse("http://127.0.0.1:8080/hooks/").unwrap();
        assert_eq!(ep.target("/GetDeviceConfig"), "/hooks/GetDeviceConfig");
        assert_eq!(ep.host_header(), "127.0.0.1:8080");
        assert_eq!(ep.to_string(), "http://127.0.0.1:8080/hooks");
        let ep = Endpoint::parse("unix:///run/webhook.sock").unwrap();
        assert_eq!(ep.target("/health"), "/health");
        assert_eq!(ep.host_header(), "localhost");
        for bad in ["https://x", "ftp://x", "unix://rel.sock", "http://", "webhook:80"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }
}
