// Over 500 lines: the multiplexer's reader, writer and stream table with their bounds; one protocol.
//! The NRI multiplexer (containerd/nri `pkg/net/multiplex`): several logical byte streams over
//! one trunk connection.
//!
//! Every write on a logical connection becomes one or more trunk frames:
//! `conn id (u32 BE) | payload length (u32 BE) | payload`. Connection 1 carries the Plugin service
//! (the plugin serves it), connection 2 the Runtime service (the runtime serves it). Opening a
//! connection is local; frames for a connection nobody opened are dropped.
//!
//! Sending: the Go peer reads frames into a 4096-byte buffer and fails on a larger frame, so the
//! plugin sends with [`Split::Max`]`(`[`GO_FRAME_LIMIT`]`)`. The runtime harness imitates the Go
//! writer with [`Split::Go`] and can cut messages anywhere with [`Split::Pattern`] or
//! [`Split::Random`]. Receiving: each connection is a byte stream; frame boundaries mean nothing
//! to the layer above, which reassembles its own messages. A frame over [`MAX_FRAME_IN`] (Go's
//! largest, 4 MiB + 10 bytes) closes the trunk before its payload is read, and a payload is read
//! into a buffer that grows with the bytes that arrive, never allocated whole up front.
//!
//! Limit to keep in mind: the Go reader queues at most 256 frames per connection, so a single
//! plugin → runtime message of more than ~1 MiB (256 × 4096) could overflow it if the runtime's
//! ttrpc reader lags. Everything the plugin sends today (registration, small responses) is far
//! below that.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Mux connection of the Plugin service (the plugin is the ttrpc server).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// Mux connection of the Runtime service (the runtime is the ttrpc server).
pub const RUNTIME_SERVICE_CONN: u32 = 2;
/// Size of a trunk frame header.
pub const HEADER_LEN: usize = 8;
/// Largest frame payload a Go peer can read (its ttrpc reader buffer).
pub const GO_FRAME_LIMIT: usize = 4096;
/// Largest frame payload the Go writer emits (4 MiB + a ttrpc header).
pub const GO_MAX_PAYLOAD: usize = (4 << 20) + 10;
/// Frames larger than this are taken as a corrupt trunk: nothing a Go writer sends is larger.
pub const MAX_FRAME_IN: usize = GO_MAX_PAYLOAD;
/// A frame's payload is read in steps of at most this many bytes, so the buffer grows with the
/// bytes that actually arrive (a header that announces 4 MiB and then stalls costs 64 KiB).
const READ_STEP: usize = 64 << 10;

/// Errors of the multiplexer.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    /// The trunk is closed (peer gone, read/write failure or local close).
    #[error("mux trunk closed")]
    Closed,
    /// A frame larger than the receiver accepts.
    #[error("mux frame of {len} bytes on conn {conn} exceeds the limit of {limit}")]
    FrameTooLarge { conn: u32, len: usize, limit: usize },
    /// Reading or writing the trunk failed.
    #[error("mux trunk {op} failed")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// How outgoing messages are cut into frames.
#[derive(Debug, Clone)]
pub enum Split {
    /// Frames of at most this many payload bytes (the plugin uses [`GO_FRAME_LIMIT`]).
    Max(usize),
    /// The Go writer: a message of up to 4096 bytes is one frame; a longer one goes out as a
    /// 4096-byte frame and then the rest (in frames of at most [`GO_MAX_PAYLOAD`]).
    Go,
    /// Frame sizes taken in turn from the list (cycled; 0 entries are skipped).
    Pattern(Vec<usize>),
    /// Pseudo-random frame sizes in `1..=max`, reproducible from the seed.
    Random { seed: u64, max: usize },
}

impl Split {
    fn cut(&self, msg: &Bytes, rng: &mut u64, pos: &mut usize) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut off = 0;
        let total = msg.len();
        let mut first = true;
        while off < total || (first && total == 0) {
            let left = total - off;
            let n = match self {
                Split::Max(m) => left.min((*m).max(1)),
                Split::Go => {
                    if first && left > GO_FRAME_LIMIT {
                        GO_FRAME_LIMIT
                    } else {
                        left.min(GO_MAX_PAYLOAD)
                    }
                }
                Split::Pattern(p) => {
                    let nz: Vec<usize> = p.iter().copied().filter(|&x| x > 0).collect();
                    if nz.is_empty() {
                        left
                    } else {
                        let v = nz[*pos % nz.len()];
                        *pos += 1;
                        left.min(v)
                    }
                }
                Split::Random { max, .. } => {
                    // xorshift64*: deterministic, good enough to scatter cut points.
                    *rng ^= *rng << 13;
                    *rng ^= *rng >> 7;
                    *rng ^= *rng << 17;
                    let m = (*max).max(1) as u64;
                    left.min((*rng % m) as usize + 1)
                }
            };
            out.push(msg.slice(off..off + n));
            off += n;
            first = false;
            if total == 0 {
                break;
            }
        }
        out
    }
}

/// Options of one trunk.
#[derive(Debug, Clone)]
pub struct MuxOptions {
    /// How messages are cut into frames.
    pub split: Split,
    /// Reject (and close the trunk on) a received frame larger than this, as a Go reader would.
    pub max_frame_in: Option<usize>,
    /// Copy of every byte read from the trunk (tests compare it byte for byte).
    pub tap: Option<Arc<Mutex<Vec<u8>>>>,
}

impl Default for MuxOptions {
    fn default() -> Self {
        Self {
            split: Split::Max(GO_FRAME_LIMIT),
            max_frame_in: None,
            tap: None,
        }
    }
}

/// Frame counters of one trunk.
#[derive(Debug, Default)]
pub struct MuxStats {
    /// Frames received.
    pub frames_in: AtomicU64,
    /// Largest frame payload received.
    pub max_frame_in: AtomicU64,
    /// Frames sent.
    pub frames_out: AtomicU64,
    /// Largest frame payload sent.
    pub max_frame_out: AtomicU64,
    /// Frames dropped because their connection was not open.
    pub dropped: AtomicU64,
}

type Outgoing = (u32, Bytes);

/// A trunk being set up: open connections, then [`Mux::start`].
pub struct Mux<S> {
    stream: S,
    opts: MuxOptions,
    conns: HashMap<u32, mpsc::UnboundedSender<Bytes>>,
    out_tx: mpsc::UnboundedSender<Outgoing>,
    out_rx: mpsc::UnboundedReceiver<Outgoing>,
    stats: Arc<MuxStats>,
}

/// One logical connection: a byte stream in, messages out.
pub struct MuxConn {
    id: u32,
    rx: mpsc::UnboundedReceiver<Bytes>,
    tx: MuxSender,
}

/// The sending half of a logical connection.
#[derive(Clone)]
pub struct MuxSender {
    id: u32,
    tx: mpsc::UnboundedSender<Outgoing>,
}

/// A running trunk.
pub struct MuxHandle {
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
    closed: watch::Receiver<Option<String>>,
    stats: Arc<MuxStats>,
}

impl<S> Mux<S>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    /// Wraps a trunk; nothing is read until [`Mux::start`].
    pub fn new(stream: S, opts: MuxOptions) -> Self {
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        Self {
            stream,
            opts,
            conns: HashMap::new(),
            out_tx,
            out_rx,
            stats: Arc::default(),
        }
    }

    /// Opens logical connection `id` (before start, so no early frame is dropped).
    pub fn open(&mut self, id: u32) -> MuxConn {
        let (tx, rx) = mpsc::unbounded_channel();
        self.conns.insert(id, tx);
        MuxConn {
            id,
            rx,
            tx: MuxSender {
                id,
                tx: self.out_tx.clone(),
            },
        }
    }

    /// Starts the reader and writer tasks.
    #[must_use]
    pub fn start(self) -> MuxHandle {
        let Mux {
            stream,
            opts,
            conns,
            out_tx,
            out_rx,
            stats,
        } = self;
        drop(out_tx);
        let (rd, wr) = tokio::io::split(stream);
        let (closed_tx, closed) = watch::channel(None);
        let closed_tx = Arc::new(closed_tx);
        let reader = {
            let closed_tx = closed_tx.clone();
            let stats = stats.clone();
            let opts = opts.clone();
            tokio::spawn(async move {
                let why = read_loop(rd, conns, &opts, &stats).await;
                closed_tx.send_if_modified(|v| set_once(v, why));
            })
        };
        let writer = {
            let stats = stats.clone();
            tokio::spawn(async move {
                if let Err(e) = write_loop(wr, out_rx, &opts.split, &stats).await {
                    closed_tx.send_if_modified(|v| set_once(v, e.to_string()));
                }
            })
        };
        MuxHandle {
            reader,
            writer,
            closed,
            stats,
        }
    }
}

fn set_once(v: &mut Option<String>, why: String) -> bool {
    if v.is_none() {
        *v = Some(why);
        true
    } else {
        false
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut rd: R,
    mut conns: HashMap<u32, mpsc::UnboundedSender<Bytes>>,
    opts: &MuxOptions,
    stats: &MuxStats,
) -> String {
    let limit = opts.max_frame_in.unwrap_or(MAX_FRAME_IN).min(MAX_FRAME_IN);
    loop {
        let mut hdr = [0u8; HEADER_LEN];
        if let Err(e) = rd.read_exact(&mut hdr).await {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "peer closed the trunk".into()
            } else {
                MuxError::Io {
                    op: "read",
                    source: e,
                }
                .to_string()
            };
        }
        let (conn, len) = decode_header(hdr);
        if len > limit {
            return MuxError::FrameTooLarge { conn, len, limit }.to_string();
        }
        let payload = match read_payload(&mut rd, len).await {
            Ok(p) => p,
            Err(e) => {
                return MuxError::Io {
                    op: "read",
                    source: e,
                }
                .to_string();
            }
        };
        if let Some(tap) = &opts.tap
            && let Ok(mut t) = tap.lock()
        {
            t.extend_from_slice(&hdr);
            t.extend_from_slice(&payload);
        }
        stats.frames_in.fetch_add(1, Ordering::Relaxed);
        stats.max_frame_in.fetch_max(len as u64, Ordering::Relaxed);
        match conns.get(&conn) {
            Some(tx) => {
                if tx.send(payload.freeze()).is_err() {
                    // The connection's owner is gone: later frames for it are dropped too.
                    conns.remove(&conn);
                }
            }
            None => {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Reads exactly `len` payload bytes into a buffer that grows as they arrive.
async fn read_payload<R: AsyncRead + Unpin>(rd: &mut R, len: usize) -> std::io::Result<BytesMut> {
    let mut payload = BytesMut::with_capacity(len.min(READ_STEP));
    while payload.len() < len {
        let want = (len - payload.len()).min(READ_STEP);
        payload.reserve(want);
        let n = (&mut *rd).take(want as u64).read_buf(&mut payload).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(payload)
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut out_rx: mpsc::UnboundedReceiver<Outgoing>,
    split: &Split,
    stats: &MuxStats,
) -> Result<(), MuxError> {
    let mut rng = match split {
        Split::Random { seed, .. } => seed | 1,
        _ => 1,
    };
    let mut pos = 0;
    while let Some((conn, msg)) = out_rx.recv().await {
        let mut buf = BytesMut::new();
        for part in split.cut(&msg, &mut rng, &mut pos) {
            encode_frame(&mut buf, conn, &part);
            stats.frames_out.fetch_add(1, Ordering::Relaxed);
            stats
                .max_frame_out
                .fetch_max(part.len() as u64, Ordering::Relaxed);
            // One write per frame, as the Go writer does (the peer may see any interleaving
            // of reads, which is what the receiving side must cope with).
            wr.write_all(&buf)
                .await
                .map_err(|source| MuxError::Io { op: "write", source })?;
            buf.clear();
        }
        wr.flush()
            .await
            .map_err(|source| MuxError::Io { op: "flush", source })?;
    }
    let _ = wr.shutdown().await;
    Ok(())
}

/// Appends one frame (header + payload) to `buf`.
pub fn encode_frame(buf: &mut BytesMut, conn: u32, payload: &[u8]) {
    buf.reserve(HEADER_LEN + payload.len());
    buf.put_u32(conn);
    // Payloads are bounded by the splitter (≤ GO_MAX_PAYLOAD), far below u32::MAX.
    buf.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    buf.put_slice(payload);
}

/// Splits a frame header into (conn id, payload length).
#[must_use]
pub fn decode_header(hdr: [u8; HEADER_LEN]) -> (u32, usize) {
    let conn = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
    let len = u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]) as usize;
    (conn, len)
}

impl MuxConn {
    /// This connection's id.
    #[must_use]
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The next received bytes (any amount); `None` once the trunk is closed.
    pub async fn recv(&mut self) -> Option<Bytes> {
        self.rx.recv().await
    }

    /// A sender for this connection.
    #[must_use]
    pub fn sender(&self) -> MuxSender {
        self.tx.clone()
    }

    /// Splits into receiving and sending halves.
    #[must_use]
    pub fn into_parts(self) -> (mpsc::UnboundedReceiver<Bytes>, MuxSender) {
        (self.rx, self.tx)
    }
}

impl MuxSender {
    /// Queues one message; the writer cuts it into frames.
    ///
    /// # Errors
    /// [`MuxError::Closed`] once the writer is gone.
    pub fn send(&self, msg: Bytes) -> Result<(), MuxError> {
        self.tx.send((self.id, msg)).map_err(|_| MuxError::Closed)
    }
}

impl MuxHandle {
    /// Frame counters.
    #[must_use]
    pub fn stats(&self) -> Arc<MuxStats> {
        self.stats.clone()
    }

    /// Resolves once the trunk is closed, with the reason.
    pub async fn closed(&self) -> String {
        let mut rx = self.closed.clone();
        loop {
            if let Some(why) = rx.borrow_and_update().clone() {
                return why;
            }
            if rx.changed().await.is_err() {
                return "mux tasks ended".into();
            }
        }
    }

    /// Whether the trunk is closed.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.closed.borrow().is_some() || self.reader.is_finished()
    }

    /// Closes the trunk now (the peer sees end of file).
    pub fn close(&self) {
        self.reader.abort();
        self.writer.abort();
    }

    /// Closes the trunk after what is queued is written: stops reading, then lets the writer
    /// send every message queued or still to come from a live [`MuxSender`] (it ends once every
    /// sender is dropped and shuts the write side down, the peer sees end of file), for at most
    /// `within`; then closes it now. The caller drops its own senders first.
    pub async fn close_flushed(&mut self, within: std::time::Duration) {
        self.reader.abort();
        let _ = tokio::time::timeout(within, &mut self.writer).await;
        self.close();
    }
}

impl Drop for MuxHandle {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    #[test]
    fn frame_bytes() {
        let mut b = BytesMut::new();
        encode_frame(&mut b, 2, b"abc");
        assert_eq!(&b[..], &[0, 0, 0, 2, 0, 0, 0, 3, b'a', b'b', b'c']);
        let hdr: [u8; 8] = b[..8].try_into().unwrap();
        assert_eq!(decode_header(hdr), (2, 3));
    }

    fn sizes(split: &Split, len: usize) -> Vec<usize> {
        let msg = Bytes::from(vec![7u8; len]);
        let (mut rng, mut pos) = (3, 0);
        let parts = split.cut(&msg, &mut rng, &mut pos);
        assert_eq!(parts.iter().map(Bytes::len).sum::<usize>(), len);
        parts.iter().map(Bytes::len).collect()
    }

    #[test]
    fn split_rules() {
        assert_eq!(sizes(&Split::Max(4096), 10_000), vec![4096, 4096, 1808]);
        assert_eq!(sizes(&Split::Max(4096), 4096), vec![4096]);
        assert_eq!(sizes(&Split::Go, 4096), vec![4096]);
        assert_eq!(sizes(&Split::Go, 10_000), vec![4096, 5904]);
        assert_eq!(sizes(&Split::Go, 100), vec![100]);
        assert_eq!(sizes(&Split::Pattern(vec![1, 0, 3]), 9), vec![1, 3, 1, 3, 1]);
        let r = sizes(&Split::Random { seed: 9, max: 7 }, 1000);
        assert!(r.iter().all(|&n| (1..=7).contains(&n)));
        assert!(r.len() > 1000 / 7);
    }

    #[tokio::test]
    async fn routes_by_conn_and_drops_unopened() {
        let (a, b) = duplex(1 << 16);
        let mut ma = Mux::new(
            a,
            MuxOptions {
                split: Split::Max(5),
                ..Default::default()
            },
        );
        let c1 = ma.open(1);
        let c3 = ma.open(3);
        let ha = ma.start();
        let mut mb = Mux::new(b, MuxOptions::default());
        let mut d1 = mb.open(1);
        let hb = mb.start();
        c3.sender().send(Bytes::from_static(b"nobody listens")).unwrap();
        c1.sender().send(Bytes::from_static(b"hello world")).unwrap();
        let mut got = Vec::new();
        while got.len() < 11 {
            got.extend_from_slice(&d1.recv().await.unwrap());
        }
        assert_eq!(&got, b"hello world");
        assert_eq!(ha.stats().max_frame_out.load(Ordering::Relaxed), 5);
        assert_eq!(hb.stats().frames_in.load(Ordering::Relaxed), 3 + 3);
        assert_eq!(hb.stats().dropped.load(Ordering::Relaxed), 3);
        ha.close();
        let why = hb.closed().await;
        assert!(why.contains("closed"), "{why}");
        assert!(d1.recv().await.is_none());
    }

    /// A frame over Go's limit (4 MiB + a ttrpc header) closes the trunk before any payload is
    /// read; one at the limit is received whole; a stalled one costs what arrived, not its size.
    #[tokio::test]
    async fn frames_are_capped_at_the_go_limit_and_read_as_they_arrive() {
        use tokio::io::AsyncWriteExt;
        let (mut a, b) = duplex(1 << 20);
        let mut mb = Mux::new(b, MuxOptions::default());
        let mut d = mb.open(1);
        let hb = mb.start();
        let mut f = BytesMut::new();
        encode_frame(&mut f, 1, &vec![7u8; GO_MAX_PAYLOAD]);
        a.write_all(&f).await.unwrap();
        let mut got = 0;
        while got < GO_MAX_PAYLOAD {
            got += d.recv().await.unwrap().len();
        }
        assert_eq!(got, GO_MAX_PAYLOAD);
        // A frame that announces 4 MiB and ends after 10 bytes: end of file, and the buffer
        // never grew past one read step.
        let (mut c, mut r) = duplex(1 << 16);
        c.write_all(&[1u8; 10]).await.unwrap();
        drop(c);
        let e = read_payload(&mut r, GO_MAX_PAYLOAD).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        let (mut c, mut r) = duplex(1 << 16);
        c.write_all(&[1u8; 18]).await.unwrap();
        let p = read_payload(&mut r, 18).await.unwrap();
        assert_eq!((p.len(), p.capacity() < READ_STEP), (18, true));
        let mut hdr = [0u8; HEADER_LEN];
        hdr[..4].copy_from_slice(&1u32.to_be_bytes());
        hdr[4..].copy_from_slice(&u32::try_from(GO_MAX_PAYLOAD + 1).unwrap().to_be_bytes());
        a.write_all(&hdr).await.unwrap();
        let why = hb.closed().await;
        assert!(
            why.contains(&format!("exceeds the limit of {GO_MAX_PAYLOAD}")),
            "{why}"
        );
    }

    #[tokio::test]
    async fn strict_reader_rejects_big_frames() {
        let (a, b) = duplex(1 << 16);
        let mut ma = Mux::new(
            a,
            MuxOptions {
                split: Split::Max(5000),
                ..Default::default()
            },
        );
        let c = ma.open(1);
        let _ha = ma.start();
        let mut mb = Mux::new(
            b,
            MuxOptions {
                max_frame_in: Some(GO_FRAME_LIMIT),
                ..Default::default()
            },
        );
        let _d = mb.open(1);
        let hb = mb.start();
        c.sender().send(Bytes::from(vec![0u8; 4097])).unwrap();
        let why = hb.closed().await;
        assert!(why.contains("exceeds the limit of 4096"), "{why}");
    }
}
