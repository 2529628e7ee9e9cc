//! `:authority` as grpc-go servers take it, on the unix sockets kubelet and its tooling dial.
//!
//! gRPC's C core (Python grpcio, C++, Ruby) names a `unix:` target's authority after the socket
//! path: grpcio 1.84 sends `tmp%2Fdranet%2Fplugins%2Fdra.net%2Fdra.sock` for
//! `unix:///tmp/dranet/plugins/dra.net/dra.sock` (the leading `/` dropped, the others
//! percent-encoded); grpc-java and hand-written clients send the raw path. Neither is a URI
//! authority (`/` is not allowed, `%` only before an `@`), and h2's server resets such a stream
//! (RST_STREAM, PROTOCOL_ERROR; grpcio reports INTERNAL). h2 0.4 has no setting to relax that.
//! grpc-go servers take any `:authority`, and kubelet's own client sends `localhost`.
//!
//! [`AuthorityRewrite`] wraps an accepted connection and rewrites, in the client's HEADERS
//! (and CONTINUATION) frames, every `:authority` that h2 would refuse to `localhost`, before h2
//! reads them. A valid authority (kubelet's `localhost`) is left as sent. dranet's handlers never
//! read the authority; on a unix socket it names nothing anyway.
//!
//! How:
//! * Frames other than header blocks pass through unparsed: the wrapper reads straight into
//!   h2's buffer and only walks the 9-byte frame headers; bytes are copied only from the start
//!   of a header block to the end of that read.
//! * Every header block is decoded (HPACK, with the client's dynamic table) to keep the
//!   client's table. A block passes through as sent while no rewrite has been needed on the
//!   connection. From the first block that needs one on, every block is re-encoded without the
//!   dynamic table (static indices and literals without indexing; table size updates dropped),
//!   so h2's table no longer mirrors the client's and never needs to.
//! * Re-encoded blocks go out as HEADERS (END_STREAM and the priority kept, padding dropped) and
//!   CONTINUATION frames of at most 16 KiB, the size every HTTP/2 peer accepts.
//! * Bounds, for a hostile peer: a header block (its frames) over [`MAX_BLOCK`] bytes, a decoded
//!   list over [`MAX_LIST`] bytes (h2 answers 431 from 16 KiB on), a table size update over
//!   [`MAX_TABLE`] and any malformed block end the connection with an I/O error, as h2 would
//!   with a GOAWAY. What is held per connection: one header block, one read, one table.

mod hpack;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use hpack::HpackError;

/// Largest header block (HEADERS and CONTINUATION frames, their 9-byte headers included) taken.
pub const MAX_BLOCK: usize = 64 * 1024;
/// Largest decoded header list taken (RFC 7541 sizes: name + value + 32 per field).
pub const MAX_LIST: usize = 64 * 1024;
/// Largest dynamic table a client may ask for. h2 advertises the default 4096; this is looser
/// so as not to depend on the server's setting, and bounds the memory all the same.
pub const MAX_TABLE: usize = 64 * 1024;
/// Largest frame payload written (SETTINGS_MAX_FRAME_SIZE's initial value, which every HTTP/2
/// endpoint must accept).
const MAX_FRAME: usize = 16 * 1024;
/// Bytes of the client connection preface, passed through (h2 checks it).
const PREFACE_LEN: usize = 24;
const FRAME_HEADER: usize = 9;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The authority a refused one becomes.
pub const REPLACEMENT: &str = "localhost";

/// Why a connection was ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    #[error("header block of stream {stream} over {limit} bytes")]
    BlockTooLarge { stream: u32, limit: usize },
    #[error("frame of type {frame_type} on stream {got} inside the header block of stream {stream}")]
    ExpectedContinuation { stream: u32, got: u32, frame_type: u8 },
    #[error("CONTINUATION frame on stream {stream} outside a header block")]
    StrayContinuation { stream: u32 },
    #[error("HEADERS frame on stream {stream} shorter than its padding and priority")]
    BadPadding { stream: u32 },
    #[error("header block of stream {stream}")]
    Hpack {
        stream: u32,
        #[source]
        source: HpackError,
    },
}

impl From<RewriteError> for io::Error {
    fn from(e: RewriteError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// Whether h2 takes `authority` as the `:authority` of a request.
#[must_use]
pub fn h2_accepts(authority: &[u8]) -> bool {
    http::uri::Authority::try_from(authority).is_ok()
}

struct FrameHeader {
    len: usize,
    frame_type: u8,
    flags: u8,
    stream: u32,
}

/// Parses the frame header at the start of `b`, if all of it is there.
fn frame_header(b: &[u8]) -> Option<FrameHeader> {
    let h: &[u8; FRAME_HEADER] = b.get(..FRAME_HEADER)?.try_into().ok()?;
    Some(FrameHeader {
        len: usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]),
        frame_type: h[3],
        flags: h[4],
        stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
    })
}

fn put_frame_header(out: &mut BytesMut, len: usize, frame_type: u8, flags: u8, stream: u32) {
    // `len` is at most MAX_FRAME here.
    out.put_uint(len as u64, 3);
    out.put_u8(frame_type);
    out.put_u8(flags);
    out.put_u32(stream);
}

/// The length of the complete header block (HEADERS + CONTINUATION*) at the start of `b`, or
/// `None` if more bytes are needed.
fn block_len(b: &[u8]) -> Result<Option<usize>, RewriteError> {
    let Some(first) = frame_header(b) else {
        return Ok(None);
    };
    let mut pos = 0;
    loop {
        let Some(h) = frame_header(&b[pos..]) else {
            return Ok(None);
        };
        if pos > 0 && (h.frame_type != CONTINUATION || h.stream != first.stream) {
            return Err(RewriteError::ExpectedContinuation {
                stream: first.stream,
                got: h.stream,
                frame_type: h.frame_type,
            });
        }
        let end = pos + FRAME_HEADER + h.len;
        if end > MAX_BLOCK {
            return Err(RewriteError::BlockTooLarge {
                stream: first.stream,
                limit: MAX_BLOCK,
            });
        }
        if b.len() < end {
            return Ok(None);
        }
        if h.flags & END_HEADERS != 0 {
            return Ok(Some(end));
        }
        pos = end;
    }
}

/// An accepted connection whose client header blocks are rewritten (see the module docs).
pub struct AuthorityRewrite<S> {
    inner: S,
    /// Read but not yet handed on; starts `passing` bytes before a frame boundary.
    pending: BytesMut,
    /// Rewritten frames ready to hand on (before anything in `pending`).
    out: BytesMut,
    /// Bytes of the current frame (header included) still to pass through as they are.
    passing: usize,
    decoder: hpack::Decoder,
    /// A block needed a rewrite: every later block is re-encoded.
    translating: bool,
    eof: bool,
    broken: Option<RewriteError>,
}

impl<S> AuthorityRewrite<S> {
    #[must_use]
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            pending: BytesMut::new(),
            out: BytesMut::new(),
            passing: PREFACE_LEN,
            decoder: hpack::Decoder::new(MAX_TABLE),
            translating: false,
            eof: false,
            broken: None,
        }
    }

    /// The connection.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Whether a header block needed a rewrite on this connection.
    #[must_use]
    pub fn rewrote(&self) -> bool {
        self.translating
    }

    /// Walks freshly read bytes (nothing pending): returns how many can go to the reader as they
    /// are; the rest starts a header block or a frame header cut short.
    fn scan_direct(&mut self, b: &[u8]) -> usize {
        let mut pos = 0;
        loop {
            let k = self.passing.min(b.len() - pos);
            pos += k;
            self.passing -= k;
            if pos == b.len() {
                return pos;
            }
            match frame_header(&b[pos..]) {
                Some(h) if h.frame_type != HEADERS && h.frame_type != CONTINUATION => {
                    self.passing = FRAME_HEADER + h.len;
                }
                _ => return pos,
            }
        }
    }

    /// Moves what can go to the reader from `out` and `pending` into `buf`; returns how much.
    fn deliver(&mut self, buf: &mut ReadBuf<'_>) -> Result<usize, RewriteError> {
        let mut put = 0;
        while buf.remaining() > 0 {
            if !self.out.is_empty() {
                let k = self.out.len().min(buf.remaining());
                buf.put_slice(&self.out[..k]);
                self.out.advance(k);
                put += k;
                continue;
            }
            if self.pending.is_empty() {
                break;
            }
            if self.passing > 0 {
                let k = self.passing.min(self.pending.len()).min(buf.remaining());
                buf.put_slice(&self.pending[..k]);
                self.pending.advance(k);
                self.passing -= k;
                put += k;
                continue;
            }
            let Some(h) = frame_header(&self.pending) else {
                break;
            };
            match h.frame_type {
                HEADERS => {
                    let Some(n) = block_len(&self.pending)? else {
                        break;
                    };
                    let block = self.pending.split_to(n);
                    self.rewrite(&block)?;
                }
                CONTINUATION => return Err(RewriteError::StrayContinuation { stream: h.stream }),
                _ => self.passing = FRAME_HEADER + h.len,
            }
        }
        Ok(put)
    }

    /// Decodes one complete header block (`frames`: HEADERS + CONTINUATION*) and appends it to
    /// `out`, as sent or re-encoded.
    fn rewrite(&mut self, frames: &[u8]) -> Result<(), RewriteError> {
        let Some(first) = frame_header(frames) else {
            return Ok(());
        };
        let stream = first.stream;
        let bad_padding = RewriteError::BadPadding { stream };
        let payload = frames
            .get(FRAME_HEADER..FRAME_HEADER + first.len)
            .ok_or_else(|| bad_padding.clone())?;
        let (mut start, mut end) = (0, payload.len());
        if first.flags & PADDED != 0 {
            let pad = usize::from(*payload.first().ok_or_else(|| bad_padding.clone())?);
            start = 1;
            end = end.checked_sub(pad).ok_or_else(|| bad_padding.clone())?;
        }
        let priority = if first.flags & PRIORITY != 0 {
            let p = payload.get(start..start + 5).ok_or_else(|| bad_padding.clone())?;
            start += 5;
            Some(p)
        } else {
            None
        };
        let fragment = payload.get(start..end).ok_or(bad_padding)?;
        let mut pos = FRAME_HEADER + first.len;
        let fields = if pos == frames.len() {
            self.decoder.decode(fragment, MAX_LIST)
        } else {
            let mut joined = fragment.to_vec();
            while let Some(h) = frame_header(&frames[pos..]) {
                joined.extend_from_slice(&frames[pos + FRAME_HEADER..pos + FRAME_HEADER + h.len]);
                pos += FRAME_HEADER + h.len;
            }
            self.decoder.decode(&joined, MAX_LIST)
        }
        .map_err(|source| RewriteError::Hpack { stream, source })?;

        let refused = |f: &hpack::Field| f.name == ":authority" && !h2_accepts(&f.value);
        if !self.translating {
            let Some(f) = fields.iter().find(|f| refused(f)) else {
                self.out.extend_from_slice(frames);
                return Ok(());
            };
            tracing::debug!(
                authority = %String::from_utf8_lossy(&f.value),
                stream,
                "gRPC client sent an :authority h2 refuses; rewriting it to {REPLACEMENT} on this connection"
            );
            self.translating = true;
        }
        let fields: Vec<hpack::Field> = fields
            .into_iter()
            .map(|mut f| {
                if refused(&f) {
                    f.value = bytes::Bytes::from_static(REPLACEMENT.as_bytes());
                }
                f
            })
            .collect();
        let mut block = Vec::with_capacity(fragment.len() + 64);
        hpack::encode(&fields, &mut block);

        let room = MAX_FRAME - priority.map_or(0, <[u8]>::len);
        let (head, mut rest) = block.split_at(room.min(block.len()));
        let mut flags = first.flags & (END_STREAM | PRIORITY);
        if rest.is_empty() {
            flags |= END_HEADERS;
        }
        self.out
            .reserve(block.len() + FRAME_HEADER * (2 + block.len() / MAX_FRAME));
        put_frame_header(
            &mut self.out,
            head.len() + priority.map_or(0, <[u8]>::len),
            HEADERS,
            flags,
            stream,
        );
        if let Some(p) = priority {
            self.out.extend_from_slice(p);
        }
        self.out.extend_from_slice(head);
        while !rest.is_empty() {
            let (chunk, more) = rest.split_at(MAX_FRAME.min(rest.len()));
            let flags = if more.is_empty() { END_HEADERS } else { 0 };
            put_frame_header(&mut self.out, chunk.len(), CONTINUATION, flags, stream);
            self.out.extend_from_slice(chunk);
            rest = more;
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityRewrite<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = &this.broken {
            return Poll::Ready(Err(e.clone().into()));
        }
        loop {
            let put = match this.deliver(buf) {
                Ok(n) => n,
                Err(e) => {
                    tracing::debug!(error = %crate::telemetry::chain(&e), "gRPC connection: ending it");
                    this.broken = Some(e.clone());
                    return Poll::Ready(Err(e.into()));
                }
            };
            if put > 0 || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                if this.pending.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                // The peer ended inside a frame: hand the rest on as it is; h2 sees it cut short.
                this.passing = usize::MAX;
                continue;
            }
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let n = buf.filled().len() - before;
            if n == 0 {
                this.eof = true;
                continue;
            }
            if this.pending.is_empty() {
                let keep = this.scan_direct(&buf.filled()[before..]);
                if keep == n {
                    return Poll::Ready(Ok(()));
                }
                this.pending.extend_from_slice(&buf.filled()[before + keep..]);
                buf.set_filled(before + keep);
                if keep > 0 {
                    return Poll::Ready(Ok(()));
                }
            } else {
                this.pending.extend_from_slice(&buf.filled()[before..]);
                buf.set_filled(before);
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityRewrite<S> {
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

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for AuthorityRewrite<S> {
    type ConnectInfo = S::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests;
