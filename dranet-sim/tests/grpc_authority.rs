//! gRPC clients other than grpc-go on dranet's unix sockets (issue 39): gRPC's C core (Python
//! grpcio, C++, Ruby) sends the socket path, percent-encoded and without its leading `/`, as
//! `:authority` (`tmp%2Fdranet%2Fplugins%2Fdra.net%2Fdra.sock`). That is no valid URI authority,
//! and h2 resets such a stream (RST_STREAM, PROTOCOL_ERROR); grpc-go servers answer it. Both of
//! dranet's kubelet sockets (DRA and registration) must answer it too.
//!
//! The raw tests replay the exact frames grpcio 1.84.0 wrote (captured from a socket server that
//! logged its bytes): its SETTINGS and WINDOW_UPDATE, then two calls on one connection, the
//! second of which refers to the first's header fields through the HPACK dynamic table. One more
//! test splits a Huffman-coded block over HEADERS (padded, with priority) and CONTINUATION frames
//! written a few bytes at a time. The last test runs grpcio itself (`python3`, `pip install
//! grpcio`; under CI=true its absence fails the test).

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers panic on setup failure, like the tests"
)]

use std::sync::Arc;
use std::time::Duration;

use dranet::dra::{KubeletPlugin, MemoryClaimSource, PluginConfig, Preparer};
use dranet::inventory::SharedInventory;
use dranet_sim::fixtures::{RecordingSink, StateDir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// grpcio 1.84.0's first frames: SETTINGS (HEADER_TABLE_SIZE 0, ENABLE_PUSH 0,
/// MAX_CONCURRENT_STREAMS 0, INITIAL_WINDOW_SIZE 4 MiB, MAX_FRAME_SIZE 4 MiB,
/// MAX_HEADER_LIST_SIZE 16 KiB, 0xfe03 = 1) and a connection WINDOW_UPDATE.
const GRPCIO_SETTINGS: &str =
    "000024040000000000000200000000000300000000000400400000000500400000000600004000fe0300000001";
const GRPCIO_WINDOW_UPDATE: &str = "000004080000000000003f0001";

/// grpcio's HEADERS frames for `GetInfo` twice over
/// `unix:///tmp/dranet/plugins_registry/dra.net-reg.sock`. The first indexes every field; the
/// second is `c4 c3 83 86 c2 c1 c0`, a new `grpc-timeout`, `bf`: the path, the authority and
/// most of the rest are dynamic table references.
const GRPCIO_GET_INFO_1: &str = "00011b01040000000140053a70617468282f706c7567696e726567697374726174696f6e2e526567697374726174696f6e2f476574496e666f400a3a617574686f7269747932746d702532466472616e6574253246706c7567696e735f72656769737472792532466472612e6e65742d7265672e736f636b8386400c636f6e74656e742d74797065106170706c69636174696f6e2f677270634002746508747261696c6572734014677270632d6163636570742d656e636f64696e67176964656e746974792c206465666c6174652c20677a6970400c677270632d74696d656f7574043239356d400a757365722d6167656e7430677270632d707974686f6e2f312e38342e3020677270632d632f35362e302e3020286c696e75783b2063687474703229";
const GRPCIO_GET_INFO_2: &str = "00001b010400000003c4c38386c2c1c0400c677270632d74696d656f7574043330306dbf";

/// grpcio's HEADERS frames for v1beta1 then v1 `NodePrepareResources`
/// (`/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources`, `...v1...`) over
/// `unix:///tmp/dranet/plugins/dra.net/dra.sock` (the authority of the second is `c4`).
const GRPCIO_PREPARE_V1BETA1: &str = "00012f01040000000140053a70617468432f6b38732e696f2e6b7562656c65742e706b672e617069732e6472612e763162657461312e445241506c7567696e2f4e6f6465507265706172655265736f7572636573400a3a617574686f726974792b746d702532466472616e6574253246706c7567696e732532466472612e6e65742532466472612e736f636b8386400c636f6e74656e742d74797065106170706c69636174696f6e2f677270634002746508747261696c6572734014677270632d6163636570742d656e636f64696e67176964656e746974792c206465666c6174652c20677a6970400c677270632d74696d656f7574043239336d400a757365722d6167656e7430677270632d707974686f6e2f312e38342e3020677270632d632f35362e302e3020286c696e75783b2063687474703229";
const GRPCIO_PREPARE_V1: &str = "00006001040000000340053a706174683e2f6b38732e696f2e6b7562656c65742e706b672e617069732e6472612e76312e445241506c7567696e2f4e6f6465507265706172655265736f7572636573c48386c3c2c1400c677270632d74696d656f7574043330316dc0";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend([ty, flags]);
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

/// An empty gRPC message (a zero-length protobuf) that ends the stream.
fn empty_message(stream: u32) -> Vec<u8> {
    frame(0, 0x1, stream, &[0, 0, 0, 0, 0])
}

struct Plugin {
    _dir: StateDir,
    cfg: PluginConfig,
    plugin: KubeletPlugin,
}

async fn plugin() -> Plugin {
    let dir = StateDir::create("authority").unwrap();
    let cfg = PluginConfig {
        kubelet_root: dir.0.clone(),
        driver: "dra.net".into(),
    };
    let preparer = Arc::new(Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(MemoryClaimSource::new()),
        Arc::new(SharedInventory::default()),
        Arc::new(RecordingSink::default()),
    ));
    let plugin = KubeletPlugin::start(&cfg, preparer).await.unwrap();
    Plugin {
        _dir: dir,
        cfg,
        plugin,
    }
}

/// What the server answered on one stream.
#[derive(Debug, Default)]
struct Answer {
    /// Payload of the DATA frames (the gRPC messages).
    data: Vec<u8>,
    /// Header blocks received (response headers, trailers).
    header_blocks: usize,
    /// The RST_STREAM error code, if the stream was reset.
    reset: Option<u32>,
    ended: bool,
}

/// A bare HTTP/2 client: writes bytes as given, reads frames.
struct RawClient {
    s: UnixStream,
}

impl RawClient {
    async fn connect(path: &std::path::Path) -> Self {
        let mut s = UnixStream::connect(path).await.unwrap();
        let mut hello = PREFACE.to_vec();
        hello.extend(unhex(GRPCIO_SETTINGS));
        hello.extend(unhex(GRPCIO_WINDOW_UPDATE));
        s.write_all(&hello).await.unwrap();
        Self { s }
    }

    async fn write(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).await.unwrap();
    }

    async fn read_frame(&mut self) -> (u8, u8, u32, Vec<u8>) {
        let mut h = [0u8; 9];
        self.s
            .read_exact(&mut h)
            .await
            .expect("the server closed the connection");
        let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
        let mut p = vec![0u8; len];
        self.s.read_exact(&mut p).await.unwrap();
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        (h[3], h[4], stream, p)
    }

    /// Reads frames until `stream` ends or is reset; acknowledges the server's SETTINGS.
    async fn answer(&mut self, stream: u32) -> Answer {
        let mut a = Answer::default();
        tokio::time::timeout(Duration::from_secs(10), async {
            while !a.ended && a.reset.is_none() {
                let (ty, flags, sid, p) = self.read_frame().await;
                match ty {
                    4 if flags & 0x1 == 0 => self.write(&frame(4, 0x1, 0, &[])).await,
                    0 if sid == stream => {
                        a.data.extend(&p);
                        a.ended |= flags & 0x1 != 0;
                    }
                    1 if sid == stream => {
                        a.header_blocks += 1;
                        a.ended |= flags & 0x1 != 0;
                    }
                    3 if sid == stream => a.reset = Some(u32::from_be_bytes([p[0], p[1], p[2], p[3]])),
                    7 => panic!("GOAWAY: {p:02x?}"),
                    _ => {}
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("stream {stream}: no answer in 10 s: {a:?}"));
        a
    }

    /// Sends a HEADERS frame as written (hex) plus an empty message, and waits for the answer.
    async fn call(&mut self, headers_hex: &str, stream: u32) -> Answer {
        let mut bytes = unhex(headers_hex);
        bytes.extend(empty_message(stream));
        self.write(&bytes).await;
        self.answer(stream).await
    }
}

/// A successful unary answer: response headers, one message, trailers; no reset.
fn assert_answered(a: &Answer, what: &str) {
    assert_eq!(a.reset, None, "{what}: the server reset the stream: {a:?}");
    assert!(a.data.len() >= 5, "{what}: no gRPC message in the answer: {a:?}");
    assert_eq!(a.header_blocks, 2, "{what}: headers and trailers expected: {a:?}");
}

#[tokio::test]
async fn grpcio_calls_on_the_registration_socket_are_answered() {
    let p = plugin().await;
    let mut c = RawClient::connect(&p.cfg.registration_socket()).await;
    let first = c.call(GRPCIO_GET_INFO_1, 1).await;
    assert_answered(&first, "GetInfo (fields indexed)");
    assert!(
        first.data.windows(9).any(|w| w == b"DRAPlugin"),
        "GetInfo answer without the plugin type: {first:?}"
    );
    let second = c.call(GRPCIO_GET_INFO_2, 3).await;
    assert_answered(&second, "GetInfo (dynamic table references)");
    assert_eq!(second.data, first.data);
    // The servers stop gracefully: they wait for open connections.
    drop(c);
    p.plugin.stop().await;
}

#[tokio::test]
async fn grpcio_calls_on_the_dra_socket_are_answered() {
    let p = plugin().await;
    let mut c = RawClient::connect(&p.cfg.dra_socket()).await;
    // An empty request prepares nothing: the answer is an empty message.
    let beta = c.call(GRPCIO_PREPARE_V1BETA1, 1).await;
    assert_answered(&beta, "v1beta1 NodePrepareResources");
    assert_eq!(beta.data, [0, 0, 0, 0, 0]);
    let v1 = c.call(GRPCIO_PREPARE_V1, 3).await;
    assert_answered(&v1, "v1 NodePrepareResources");
    drop(c);
    p.plugin.stop().await;
}

/// HPACK Huffman code of `s` (RFC 7541 Appendix B), for the few characters used below.
fn huffman(s: &str) -> Vec<u8> {
    // (code, bits) of the characters of "/tmp/dra.sock".
    let code = |c: char| -> (u32, u32) {
        match c {
            '/' => (0x18, 6),
            '.' => (0x17, 6),
            'a' => (0x3, 5),
            'c' => (0x4, 5),
            'd' => (0x24, 6),
            'k' => (0x75, 7),
            'm' => (0x29, 6),
            'o' => (0x7, 5),
            'p' => (0x2b, 6),
            'r' => (0x2c, 6),
            's' => (0x8, 5),
            't' => (0x9, 5),
            _ => panic!("no code for {c:?} in this test"),
        }
    };
    let (mut acc, mut n, mut out) = (0u64, 0u32, Vec::new());
    for ch in s.chars() {
        let (c, b) = code(ch);
        acc = (acc << b) | u64::from(c);
        n += b;
        while n >= 8 {
            out.push((acc >> (n - 8)) as u8);
            n -= 8;
        }
    }
    if n > 0 {
        // Pad with the most significant bits of EOS (all ones).
        out.push(((acc << (8 - n)) as u8) | (0xff >> n));
    }
    out
}

/// A block as grpc-java or a C++ client may write it: the raw socket path as authority,
/// Huffman-coded, in a padded HEADERS frame with a priority, continued in a CONTINUATION frame,
/// everything written a few bytes at a time.
#[tokio::test]
async fn a_padded_prioritised_continued_huffman_block_written_in_pieces_is_answered() {
    let p = plugin().await;
    let mut c = RawClient::connect(&p.cfg.registration_socket()).await;
    let path = b"/pluginregistration.Registration/GetInfo";
    let authority = huffman("/tmp/dra.sock");
    // :method POST, :scheme http, :path (literal without indexing, name index 4).
    let mut block = vec![0x83, 0x86, 0x04, u8::try_from(path.len()).unwrap()];
    block.extend(path);
    // :authority, literal with incremental indexing (name index 1), Huffman.
    block.extend([0x41, 0x80 | u8::try_from(authority.len()).unwrap()]);
    block.extend(&authority);
    // content-type: application/grpc; te: trailers (literals without indexing, new names).
    let mut rest = Vec::new();
    for (n, v) in [("content-type", "application/grpc"), ("te", "trailers")] {
        rest.push(0x00);
        rest.push(u8::try_from(n.len()).unwrap());
        rest.extend(n.as_bytes());
        rest.push(u8::try_from(v.len()).unwrap());
        rest.extend(v.as_bytes());
    }
    block.extend(&rest);
    let (head, tail) = block.split_at(block.len() / 2);
    let mut headers = vec![3u8]; // pad length
    headers.extend([0, 0, 0, 0, 15]); // priority: depends on 0, weight 16
    headers.extend(head);
    headers.extend([0, 0, 0]);
    let mut bytes = frame(1, 0x8 | 0x20, 1, &headers); // PADDED | PRIORITY, no END_HEADERS
    bytes.extend(frame(9, 0x4, 1, tail)); // CONTINUATION, END_HEADERS
    bytes.extend(empty_message(1));
    for piece in bytes.chunks(7) {
        c.write(piece).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let a = c.answer(1).await;
    assert_answered(&a, "GetInfo (padded, continued, Huffman)");
    // The same authority again, from the dynamic table (index 62), on a second stream.
    let mut again = vec![0x83, 0x86, 0x04, u8::try_from(path.len()).unwrap()];
    again.extend(path);
    again.push(0xbe);
    again.extend(&rest);
    let mut bytes = frame(1, 0x4, 3, &again);
    bytes.extend(empty_message(3));
    c.write(&bytes).await;
    assert_answered(&c.answer(3).await, "GetInfo (authority from the dynamic table)");
    drop(c);
    p.plugin.stop().await;
}

/// grpcio itself: `GetInfo` on the registration socket and `NodePrepareResources` (v1 and
/// v1beta1, empty requests sent as raw bytes) on the DRA socket, two calls per channel, with the
/// two spellings of a unix target.
#[tokio::test]
async fn python_grpcio_client_calls_both_sockets() {
    const SCRIPT: &str = r"
import sys, grpc
reg, dra = sys.argv[1], sys.argv[2]
def call(target, method):
    with grpc.insecure_channel(target) as ch:
        f = ch.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        return [f(b'', timeout=10) for _ in range(2)]
for target in ('unix:' + reg, 'unix://' + reg):
    info = call(target, '/pluginregistration.Registration/GetInfo')
    assert b'DRAPlugin' in info[0] and info[0] == info[1], info
for target in ('unix:' + dra, 'unix://' + dra):
    for v in ('v1', 'v1beta1'):
        m = '/k8s.io.kubelet.pkg.apis.dra.' + v + '.DRAPlugin/NodePrepareResources'
        assert call(target, m) == [b'', b''], m
print('grpcio', grpc.__version__, 'ok')
";
    let probe = std::process::Command::new("python3")
        .args(["-c", "import grpc"])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        let why = probe.map_or_else(
            |e| e.to_string(),
            |o| String::from_utf8_lossy(&o.stderr).into_owned(),
        );
        assert!(
            std::env::var_os("CI").is_none_or(|v| v != "true"),
            "CI=true but python3 with grpcio is missing (scripts/install-toolchain.sh installs it): {why}"
        );
        eprintln!("skipped: python3 with grpcio is missing (pip install grpcio): {why}");
        return;
    }
    let p = plugin().await;
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("python3")
            .arg("-c")
            .arg(SCRIPT)
            .arg(p.cfg.registration_socket())
            .arg(p.cfg.dra_socket())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("grpcio client ran over 60 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "grpcio client failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(" ok"), "{stdout}\n{stderr}");
    p.plugin.stop().await;
}
