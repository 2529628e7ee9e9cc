// Over 500 lines: the ttrpc framing, request and response paths and their bounds; one protocol.
//! The unary subset of ttrpc (containerd/ttrpc) on one mux connection.
//!
//! A message is a 10-byte header — data length (u32 BE, ≤ 4 MiB), stream id (u32 BE), type
//! (1 Request, 2 Response, 3 Data), flags — and a protobuf body: a `ttrpc.Request` (service,
//! method, payload, timeout) or a `ttrpc.Response` (`google.rpc.Status`, payload). Clients use odd
//! stream ids from 1. [`serve`] dispatches requests to a [`Service`]; [`Client`] calls with a
//! timeout.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::debug;

use super::mux::{MuxConn, MuxError, MuxSender};
use super::pb::google::rpc::Status;
use super::pb::ttrpc::{Request, Response};

/// Size of the ttrpc message header.
pub const HEADER_LEN: usize = 10;
/// Largest message body ttrpc accepts.
pub const MAX_MESSAGE: usize = 4 << 20;
/// Message type: request.
pub const TYPE_REQUEST: u8 = 1;
/// Message type: response.
pub const TYPE_RESPONSE: u8 = 2;
/// Message type: stream data (not used by NRI).
pub const TYPE_DATA: u8 = 3;

/// gRPC status codes used here.
pub mod code {
    pub const OK: i32 = 0;
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const UNIMPLEMENTED: i32 = 12;
    pub const INTERNAL: i32 = 13;
    pub const UNAVAILABLE: i32 = 14;
}

/// Errors of the ttrpc layer.
#[derive(Debug, thiserror::Error)]
pub enum TtrpcError {
    /// The peer answered with a non-OK status.
    #[error("ttrpc status {code}: {message}")]
    Status { code: i32, message: String },
    /// No answer within the timeout.
    #[error("ttrpc call {method} timed out after {timeout:?}")]
    Timeout { method: String, timeout: Duration },
    /// The connection closed before the answer.
    #[error("ttrpc connection closed")]
    Closed,
    /// A message that does not decode.
    #[error("ttrpc protocol error: {what}")]
    Protocol { what: &'static str },
    /// A protobuf body that does not decode.
    #[error("ttrpc: cannot decode {what}")]
    Decode {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    /// The mux refused the message.
    #[error("ttrpc send failed")]
    Mux(#[from] MuxError),
}

impl TtrpcError {
    /// The status code when the peer answered with one.
    #[must_use]
    pub fn code(&self) -> Option<i32> {
        match self {
            TtrpcError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// A ttrpc message (header fields + body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub stream_id: u32,
    pub kind: u8,
    pub flags: u8,
    pub data: Bytes,
}

/// What the decoder yields.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A whole message.
    Message(Frame),
    /// A message over [`MAX_MESSAGE`], skipped; the server answers `RESOURCE_EXHAUSTED`.
    Oversized { stream_id: u32, kind: u8, len: usize },
}

/// Encodes header + body.
#[must_use]
pub fn encode(stream_id: u32, kind: u8, flags: u8, data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(HEADER_LEN + data.len());
    b.put_u32(u32::try_from(data.len()).unwrap_or(u32::MAX));
    b.put_u32(stream_id);
    b.put_u8(kind);
    b.put_u8(flags);
    b.put_slice(data);
    b.freeze()
}

/// Reassembles ttrpc messages from a byte stream cut anywhere.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: BytesMut,
    /// Bytes of an oversized message still to skip.
    skip: usize,
}

impl Decoder {
    /// Adds received bytes.
    pub fn push(&mut self, data: &[u8]) {
        let mut data = data;
        if self.skip > 0 {
            let n = self.skip.min(data.len());
            self.skip -= n;
            data = &data[n..];
        }
        self.buf.extend_from_slice(data);
    }

    /// Whether nothing is buffered or left to skip.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty() && self.skip == 0
    }

    /// The next complete message, if one is buffered.
    pub fn next_message(&mut self) -> Option<Decoded> {
        if self.skip > 0 || self.buf.len() < HEADER_LEN {
            return None;
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        let stream_id = u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]);
        let (kind, flags) = (self.buf[8], self.buf[9]);
        if len > MAX_MESSAGE {
            self.buf.advance(HEADER_LEN);
            let have = self.buf.len().min(len);
            self.buf.advance(have);
            self.skip = len - have;
            return Some(Decoded::Oversized { stream_id, kind, len });
        }
        if self.buf.len() < HEADER_LEN + len {
            return None;
        }
        self.buf.advance(HEADER_LEN);
        let data = self.buf.split_to(len).freeze();
        Some(Decoded::Message(Frame {
            stream_id,
            kind,
            flags,
            data,
        }))
    }
}

/// A ttrpc status.
#[must_use]
pub fn status(code: i32, message: impl Into<String>) -> Status {
    Status {
        code,
        message: message.into(),
        details: Vec::new(),
    }
}

/// What a service handler returns: the response payload or a status.
pub type CallResult = Result<Bytes, Status>;

/// A ttrpc service: dispatch on (service, method).
pub trait Service: Send + Sync + 'static {
    /// Handles one request. Unknown service or method → `UNIMPLEMENTED` (see [`unimplemented`]).
    fn call(
        self: Arc<Self>,
        service: String,
        method: String,
        payload: Bytes,
    ) -> impl Future<Output = CallResult> + Send;
}

/// The `UNIMPLEMENTED` status Go ttrpc gives for an unknown service or method.
#[must_use]
pub fn unimplemented(service: &str, method: &str) -> Status {
    status(
        code::UNIMPLEMENTED,
        format!("{service}/{method} is not implemented"),
    )
}

/// Requests [`serve`] handles at once on one connection. A runtime sends one request at a time
/// (containerd/nri `pkg/adaptation` holds one lock across every plugin call) and gives up on a
/// request after 2 s, so more than a few in flight means a broken or hostile peer.
pub const MAX_IN_FLIGHT: usize = 16;

/// [`serve_with`] with at most [`MAX_IN_FLIGHT`] requests in flight.
pub async fn serve<S: Service>(conn: MuxConn, svc: Arc<S>) {
    serve_with(conn, svc, MAX_IN_FLIGHT).await;
}

/// Serves requests from `conn` until it closes. Each request runs in its own task; the handler
/// runs in a task of its own too, so a request deadline (`timeout_nano`) answers
/// `DEADLINE_EXCEEDED` without cancelling the handler half-way.
///
/// At most `max_in_flight` handlers run at once (a handler past its deadline still counts until
/// it returns). A request past the cap is answered `RESOURCE_EXHAUSTED` at once rather than
/// queued: waiting would only turn it into a `DEADLINE_EXCEEDED` after the runtime's 2 s, which
/// the runtime treats as fatal (it drops the plugin's connection), whereas an error status goes
/// back to the CRI caller, who retries. Not queueing also keeps memory bounded: what is not
/// running is not kept.
pub async fn serve_with<S: Service>(conn: MuxConn, svc: Arc<S>, max_in_flight: usize) {
    let (mut rx, tx) = conn.into_parts();
    let mut dec = Decoder::default();
    let slots = Arc::new(Semaphore::new(max_in_flight.max(1)));
    while let Some(chunk) = rx.recv().await {
        dec.push(&chunk);
        while let Some(d) = dec.next_message() {
            match d {
                Decoded::Oversized { stream_id, kind, len } => {
                    if kind == TYPE_REQUEST {
                        let st = status(
                            code::RESOURCE_EXHAUSTED,
                            format!("message length {len} exceed maximum message size of {MAX_MESSAGE}"),
                        );
                        respond(&tx, stream_id, Err(st));
                    }
                }
                Decoded::Message(f) if f.kind == TYPE_REQUEST => match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        tokio::spawn(handle(tx.clone(), svc.clone(), f, slot));
                    }
                    Err(_) => {
                        let st = status(
                            code::RESOURCE_EXHAUSTED,
                            format!("{max_in_flight} requests already in flight on this connection"),
                        );
                        respond(&tx, f.stream_id, Err(st));
                    }
                },
                Decoded::Message(f) => {
                    debug!(
                        stream = f.stream_id,
                        kind = f.kind,
                        "ttrpc server: ignoring a non-request message"
                    );
                }
            }
        }
    }
}

async fn handle<S: Service>(tx: MuxSender, svc: Arc<S>, f: Frame, slot: OwnedSemaphorePermit) {
    let req = match Request::decode(f.data) {
        Ok(r) => r,
        Err(e) => {
            respond(
                &tx,
                f.stream_id,
                Err(status(code::INVALID_ARGUMENT, format!("bad request: {e}"))),
            );
            return;
        }
    };
    let timeout = u64::try_from(req.timeout_nano)
        .ok()
        .filter(|&n| n > 0)
        .map(Duration::from_nanos);
    let call = svc.call(req.service, req.method, req.payload);
    let work = tokio::spawn(async move {
        let r = call.await;
        drop(slot);
        r
    });
    let res = match timeout {
        Some(t) => match tokio::time::timeout(t, work).await {
            Ok(j) => joined(j),
            Err(_) => Err(status(code::DEADLINE_EXCEEDED, "context deadline exceeded")),
        },
        None => joined(work.await),
    };
    respond(&tx, f.stream_id, res);
}

fn joined(j: Result<CallResult, tokio::task::JoinError>) -> CallResult {
    j.unwrap_or_else(|e| Err(status(code::INTERNAL, format!("handler failed: {e}"))))
}

fn respond(tx: &MuxSender, stream_id: u32, res: CallResult) {
    let resp = match res {
        Ok(payload) => Response {
            status: Some(status(code::OK, "")),
            payload,
        },
        Err(st) => Response {
            status: Some(st),
            payload: Bytes::new(),
        },
    };
    let body = resp.encode_to_vec();
    if tx.send(encode(stream_id, TYPE_RESPONSE, 0, &body)).is_err() {
        debug!(
            stream = stream_id,
            "ttrpc server: connection closed before the response"
        );
    }
}

/// Waiters by stream id; `None` once the connection is closed.
type Pending = Arc<Mutex<Option<HashMap<u32, oneshot::Sender<Response>>>>>;

/// A ttrpc client on one mux connection.
pub struct Client {
    tx: MuxSender,
    next: AtomicU32,
    pending: Pending,
    reader: JoinHandle<()>,
}

impl Client {
    /// Starts the response reader on `conn`.
    #[must_use]
    pub fn new(conn: MuxConn) -> Self {
        let (rx, tx) = conn.into_parts();
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let reader = tokio::spawn(read_responses(rx, pending.clone()));
        Self {
            tx,
            next: AtomicU32::new(1),
            pending,
            reader,
        }
    }

    /// Calls `service/method` and waits at most `timeout` (also sent as `timeout_nano`).
    ///
    /// # Errors
    /// [`TtrpcError::Status`] for a non-OK answer, [`TtrpcError::Timeout`], [`TtrpcError::Closed`].
    pub async fn call(
        &self,
        service: &str,
        method: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, TtrpcError> {
        let id = self.next.fetch_add(2, Ordering::Relaxed);
        let req = Request {
            service: service.into(),
            method: method.into(),
            payload,
            timeout_nano: i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX),
            metadata: Vec::new(),
        };
        let (otx, orx) = oneshot::channel();
        let open = match self.pending.lock() {
            Ok(mut p) => p.as_mut().map(|m| m.insert(id, otx)).is_some(),
            Err(_) => false,
        };
        if !open {
            return Err(TtrpcError::Closed);
        }
        if let Err(e) = self.tx.send(encode(id, TYPE_REQUEST, 0, &req.encode_to_vec())) {
            self.forget(id);
            return Err(e.into());
        }
        let resp = match tokio::time::timeout(timeout, orx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => return Err(TtrpcError::Closed),
            Err(_) => {
                self.forget(id);
                return Err(TtrpcError::Timeout {
                    method: method.into(),
                    timeout,
                });
            }
        };
        match resp.status {
            Some(st) if st.code != code::OK => Err(TtrpcError::Status {
                code: st.code,
                message: st.message,
            }),
            _ => Ok(resp.payload),
        }
    }

    /// Typed call: encodes `req`, decodes the response as `R`.
    ///
    /// # Errors
    /// As [`Client::call`], plus [`TtrpcError::Decode`].
    pub async fn call_msg<Q: prost::Message, R: prost::Message + Default>(
        &self,
        service: &str,
        method: &str,
        req: &Q,
        timeout: Duration,
    ) -> Result<R, TtrpcError> {
        let out = self
            .call(service, method, Bytes::from(req.encode_to_vec()), timeout)
            .await?;
        R::decode(out).map_err(|source| TtrpcError::Decode {
            what: "response payload",
            source,
        })
    }

    fn forget(&self, id: u32) {
        if let Ok(mut p) = self.pending.lock()
            && let Some(m) = p.as_mut()
        {
            m.remove(&id);
        }
    }

    /// Whether the connection is gone.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.reader.is_finished()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

async fn read_responses(mut rx: mpsc::UnboundedReceiver<Bytes>, pending: Pending) {
    let mut dec = Decoder::default();
    while let Some(chunk) = rx.recv().await {
        dec.push(&chunk);
        while let Some(d) = dec.next_message() {
            let (id, resp) = match d {
                Decoded::Message(f) if f.kind == TYPE_RESPONSE => match Response::decode(f.data) {
                    Ok(r) => (f.stream_id, r),
                    Err(e) => (
                        f.stream_id,
                        Response {
                            status: Some(status(code::INTERNAL, format!("bad response: {e}"))),
                            payload: Bytes::new(),
                        },
                    ),
                },
                Decoded::Oversized { stream_id, .. } => (
                    stream_id,
                    Response {
                        status: Some(status(code::RESOURCE_EXHAUSTED, "response too large")),
                        payload: Bytes::new(),
                    },
                ),
                Decoded::Message(_) => continue,
            };
            let waiter = pending
                .lock()
                .ok()
                .and_then(|mut p| p.as_mut().and_then(|m| m.remove(&id)));
            if let Some(w) = waiter {
                let _ = w.send(resp);
            }
        }
    }
    // Connection closed: dropping the waiters wakes every caller with `Closed`.
    if let Ok(mut p) = pending.lock() {
        *p = None;
    }
}

#[cfg(test)]
mod tests {
    use super::super::mux::{Mux, MuxOptions, Split};
    use super::super::pb::nri::RegisterPluginRequest;
    use super::*;

    #[test]
    fn header_bytes() {
        let m = encode(1, TYPE_REQUEST, 0, b"xy");
        assert_eq!(&m[..], &[0, 0, 0, 2, 0, 0, 0, 1, 1, 0, b'x', b'y']);
        let mut d = Decoder::default();
        d.push(&m);
        assert_eq!(
            d.next_message(),
            Some(Decoded::Message(Frame {
                stream_id: 1,
                kind: 1,
                flags: 0,
                data: Bytes::from_static(b"xy")
            }))
        );
        assert_eq!(d.next_message(), None);
    }

    /// protocols.md §1.2: RegisterPlugin on conn 2, stream 1, timeout 5 s, name dranet, idx 10.
    #[test]
    fn register_plugin_example_bytes() {
        let payload = RegisterPluginRequest {
            plugin_name: "dranet".into(),
            plugin_idx: "10".into(),
            nri_version: String::new(),
        };
        let req = Request {
            service: "nri.pkg.api.v1alpha1.Runtime".into(),
            method: "RegisterPlugin".into(),
            payload: Bytes::from(payload.encode_to_vec()),
            timeout_nano: 5_000_000_000,
            metadata: Vec::new(),
        };
        let msg = encode(1, TYPE_REQUEST, 0, &req.encode_to_vec());
        let mut frame = BytesMut::new();
        super::super::mux::encode_frame(&mut frame, 2, &msg);
        let mut want = vec![
            0, 0, 0, 2, 0, 0, 0, 0x4c, 0, 0, 0, 0x42, 0, 0, 0, 1, 1, 0, 0x0a, 0x1c,
        ];
        want.extend_from_slice(b"nri.pkg.api.v1alpha1.Runtime");
        want.extend_from_slice(&[0x12, 0x0e]);
        want.extend_from_slice(b"RegisterPlugin");
        want.extend_from_slice(&[0x1a, 0x0c, 0x0a, 0x06]);
        want.extend_from_slice(b"dranet");
        want.extend_from_slice(&[0x12, 0x02]);
        want.extend_from_slice(b"10");
        want.extend_from_slice(&[0x20, 0x80, 0xe4, 0x97, 0xd0, 0x12]);
        assert_eq!(&frame[..], &want[..]);
    }

    #[test]
    fn decoder_reassembles_any_split() {
        let a = encode(1, TYPE_REQUEST, 0, &[5u8; 300]);
        let b = encode(3, TYPE_RESPONSE, 0, b"");
        let c = encode(5, TYPE_REQUEST, 0, &[6u8; 9000]);
        let all: Vec<u8> = [a.clone(), b.clone(), c.clone()].concat();
        for step in [1usize, 2, 3, 7, 10, 11, 4096, 5000] {
            let mut d = Decoder::default();
            let mut got = Vec::new();
            for part in all.chunks(step) {
                d.push(part);
                while let Some(Decoded::Message(f)) = d.next_message() {
                    got.push(encode(f.stream_id, f.kind, f.flags, &f.data));
                }
            }
            assert_eq!(got, vec![a.clone(), b.clone(), c.clone()], "step {step}");
        }
    }

    #[test]
    fn decoder_skips_oversized() {
        let mut d = Decoder::default();
        let mut hdr = BytesMut::new();
        hdr.put_u32(u32::try_from(MAX_MESSAGE + 1).unwrap());
        hdr.put_u32(7);
        hdr.put_u8(TYPE_REQUEST);
        hdr.put_u8(0);
        d.push(&hdr);
        d.push(&vec![0u8; 1000]);
        assert_eq!(
            d.next_message(),
            Some(Decoded::Oversized {
                stream_id: 7,
                kind: 1,
                len: MAX_MESSAGE + 1
            })
        );
        d.push(&vec![0u8; MAX_MESSAGE + 1 - 1000]);
        d.push(&encode(9, TYPE_REQUEST, 0, b"ok"));
        match d.next_message() {
            Some(Decoded::Message(f)) => assert_eq!((f.stream_id, &f.data[..]), (9, &b"ok"[..])),
            other => panic!("unexpected {other:?}"),
        }
    }

    struct Echo;
    impl Service for Echo {
        async fn call(self: Arc<Self>, service: String, method: String, payload: Bytes) -> CallResult {
            match (service.as_str(), method.as_str()) {
                ("test.Echo", "Echo") => Ok(payload),
                ("test.Echo", "Sleep") => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Ok(payload)
                }
                _ => Err(unimplemented(&service, &method)),
            }
        }
    }

    /// Past the in-flight cap a request is answered RESOURCE_EXHAUSTED at once; a slot frees
    /// when its handler returns, even if the caller gave up on it before.
    #[tokio::test]
    async fn in_flight_requests_are_capped() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut ma = Mux::new(a, MuxOptions::default());
        let c = ma.open(1);
        let _ha = ma.start();
        let mut mb = Mux::new(b, MuxOptions::default());
        let s = mb.open(1);
        let _hb = mb.start();
        tokio::spawn(serve_with(s, Arc::new(Echo), 2));
        let client = Arc::new(Client::new(c));
        let t = Duration::from_secs(10);
        let sleepers: Vec<_> = (0..2)
            .map(|_| {
                let c = client.clone();
                tokio::spawn(async move { c.call("test.Echo", "Sleep", Bytes::new(), t).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let e = client
            .call("test.Echo", "Echo", Bytes::new(), t)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(code::RESOURCE_EXHAUSTED), "{e:?}");
        for s in sleepers {
            s.await.unwrap().unwrap();
        }
        assert!(client.call("test.Echo", "Echo", Bytes::new(), t).await.is_ok());
    }

    fn pair() -> (Client, super::super::mux::MuxHandle, super::super::mux::MuxHandle) {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut ma = Mux::new(
            a,
            MuxOptions {
                split: Split::Random { seed: 42, max: 50 },
                ..Default::default()
            },
        );
        let c = ma.open(1);
        let ha = ma.start();
        let mut mb = Mux::new(
            b,
            MuxOptions {
                split: Split::Pattern(vec![3, 4096]),
                ..Default::default()
            },
        );
        let s = mb.open(1);
        let hb = mb.start();
        tokio::spawn(serve(s, Arc::new(Echo)));
        (Client::new(c), ha, hb)
    }

    #[tokio::test]
    async fn client_server_roundtrip_unimplemented_and_timeout() {
        let (client, _ha, hb) = pair();
        let t = Duration::from_secs(2);
        let big = Bytes::from(vec![9u8; 20_000]);
        assert_eq!(
            client.call("test.Echo", "Echo", big.clone(), t).await.unwrap(),
            big
        );
        let e = client
            .call("test.Echo", "Nope", Bytes::new(), t)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(code::UNIMPLEMENTED));
        let e = client
            .call("other.Svc", "Echo", Bytes::new(), t)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(code::UNIMPLEMENTED));
        // The server applies timeout_nano and answers DEADLINE_EXCEEDED before the client gives up.
        let e = client
            .call("test.Echo", "Sleep", Bytes::new(), Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(
            matches!(e, TtrpcError::Timeout { .. }) || e.code() == Some(code::DEADLINE_EXCEEDED),
            "{e:?}"
        );
        // Stream ids are odd: 1, 3, 5, 7 used; the next is 9.
        assert_eq!(client.next.load(Ordering::Relaxed), 9);
        hb.close();
        let e = client
            .call("test.Echo", "Echo", Bytes::new(), t)
            .await
            .unwrap_err();
        assert!(matches!(e, TtrpcError::Closed | TtrpcError::Mux(_)), "{e:?}");
    }
}
