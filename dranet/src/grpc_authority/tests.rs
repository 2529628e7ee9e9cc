use super::*;
use tokio::io::AsyncReadExt;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// grpcio 1.84.0: SETTINGS, WINDOW_UPDATE, `GetInfo` twice on one connection (see
/// dranet-sim/tests/grpc_authority.rs); the second block refers to the first's fields.
const SETTINGS: &str = "000024040000000000000200000000000300000000000400400000000500400000000600004000fe0300000001000004080000000000003f0001";
const GET_INFO_1: &str = "00011b01040000000140053a70617468282f706c7567696e726567697374726174696f6e2e526567697374726174696f6e2f476574496e666f400a3a617574686f7269747932746d702532466472616e6574253246706c7567696e735f72656769737472792532466472612e6e65742d7265672e736f636b8386400c636f6e74656e742d74797065106170706c69636174696f6e2f677270634002746508747261696c6572734014677270632d6163636570742d656e636f64696e67176964656e746974792c206465666c6174652c20677a6970400c677270632d74696d656f7574043239356d400a757365722d6167656e7430677270632d707974686f6e2f312e38342e3020677270632d632f35362e302e3020286c696e75783b2063687474703229";
const GET_INFO_2: &str = "00001b010400000003c4c38386c2c1c0400c677270632d74696d656f7574043330306dbf";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = u32::try_from(payload.len()).unwrap().to_be_bytes()[1..].to_vec();
    f.extend([ty, flags]);
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

fn data(stream: u32, payload: &[u8]) -> Vec<u8> {
    frame(0, END_STREAM, stream, payload)
}

/// A literal field without indexing, new name.
fn lit(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.push(0);
    hpack_write_string(out, name.as_bytes());
    hpack_write_string(out, value);
}

fn hpack_write_string(out: &mut Vec<u8>, s: &[u8]) {
    let mut f = Vec::new();
    hpack::encode(
        &[hpack::Field {
            name: bytes::Bytes::from_static(b"x"),
            value: bytes::Bytes::copy_from_slice(s),
            never_indexed: false,
        }],
        &mut f,
    );
    // `00 01 'x' <string>`: keep the string.
    out.extend(&f[3..]);
}

/// The grpcio connection: preface, settings, two calls with an empty message each.
fn grpcio_connection() -> Vec<u8> {
    let mut b = PREFACE.to_vec();
    b.extend(unhex(SETTINGS));
    b.extend(unhex(GET_INFO_1));
    b.extend(data(1, &[0; 5]));
    b.extend(unhex(GET_INFO_2));
    b.extend(data(3, &[0; 5]));
    b
}

/// Yields its bytes `chunk` at a time.
struct Chunked {
    data: Vec<u8>,
    pos: usize,
    chunk: usize,
}

impl AsyncRead for Chunked {
    fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let k = this.chunk.min(this.data.len() - this.pos).min(buf.remaining());
        buf.put_slice(&this.data[this.pos..this.pos + k]);
        this.pos += k;
        Poll::Ready(Ok(()))
    }
}

async fn run_with(input: &[u8], chunk: usize, read_size: usize) -> (io::Result<Vec<u8>>, bool) {
    let mut r = AuthorityRewrite::new(Chunked {
        data: input.to_vec(),
        pos: 0,
        chunk,
    });
    let mut out = Vec::new();
    let mut b = vec![0u8; read_size];
    loop {
        match r.read(&mut b).await {
            Ok(0) => return (Ok(out), r.rewrote()),
            Ok(n) => out.extend(&b[..n]),
            Err(e) => return (Err(e), r.rewrote()),
        }
    }
}

async fn run(input: &[u8]) -> Vec<u8> {
    run_with(input, 64 * 1024, 64 * 1024).await.0.unwrap()
}

/// Frames after the preface: (type, flags, stream, payload).
fn frames(b: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    assert_eq!(&b[..24], PREFACE);
    let mut pos = 24;
    let mut v = Vec::new();
    while pos < b.len() {
        let h = frame_header(&b[pos..]).unwrap();
        v.push((
            h.frame_type,
            h.flags,
            h.stream,
            b[pos + 9..pos + 9 + h.len].to_vec(),
        ));
        pos += 9 + h.len;
    }
    v
}

/// Frames as h2 sees them: (type, stream, decoded fields of a header block, other payload).
type Seen = Vec<(u8, u32, Vec<(String, String)>, Vec<u8>)>;

/// Decodes the header blocks of `b` as h2 would (one decoder for the connection), with the
/// other frames: (type, stream, fields or payload).
fn as_h2_sees_it(b: &[u8]) -> Seen {
    let mut d = hpack::Decoder::new(4096);
    let mut out = Vec::new();
    let mut block: Option<(u32, Vec<u8>)> = None;
    for (ty, flags, sid, p) in frames(b) {
        let frag = match ty {
            HEADERS => {
                assert!(block.is_none());
                let mut s = 0;
                let mut e = p.len();
                if flags & PADDED != 0 {
                    s = 1;
                    e -= usize::from(p[0]);
                }
                if flags & PRIORITY != 0 {
                    s += 5;
                }
                p[s..e].to_vec()
            }
            CONTINUATION => p.clone(),
            _ => {
                assert!(block.is_none());
                out.push((ty, sid, vec![], p));
                continue;
            }
        };
        let b = block.get_or_insert((sid, Vec::new()));
        b.1.extend(frag);
        if flags & END_HEADERS != 0 {
            let (sid, frag) = block.take().unwrap();
            let fields = d.decode(&frag, 1 << 20).unwrap();
            let fields = fields
                .iter()
                .map(|f| {
                    (
                        String::from_utf8_lossy(&f.name).into_owned(),
                        String::from_utf8_lossy(&f.value).into_owned(),
                    )
                })
                .collect();
            out.push((HEADERS, sid, fields, vec![]));
        }
    }
    out
}

fn authority(fields: &[(String, String)]) -> Vec<&str> {
    fields
        .iter()
        .filter(|(n, _)| n == ":authority")
        .map(|(_, v)| v.as_str())
        .collect()
}

#[test]
fn h2_refuses_what_grpc_clients_send_and_takes_localhost() {
    assert!(!h2_accepts(b"tmp%2Fdranet%2Fplugins%2Fdra.net%2Fdra.sock"));
    assert!(!h2_accepts(b"/var/lib/kubelet/plugins/dra.net/dra.sock"));
    assert!(!h2_accepts(b""));
    assert!(h2_accepts(b"localhost"));
    assert!(h2_accepts(b"dra.sock"));
    assert!(h2_accepts(b"[::1]:443"));
}

#[tokio::test]
async fn grpcio_authorities_become_localhost_and_the_rest_is_unchanged() {
    let input = grpcio_connection();
    let out = run(&input).await;
    let before = as_h2_sees_it(&input);
    let after = as_h2_sees_it(&out);
    assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(
            (b.0, b.1, &b.3),
            (a.0, a.1, &a.3),
            "a frame other than headers changed"
        );
        if b.0 == HEADERS {
            assert_eq!(
                authority(&b.2),
                ["tmp%2Fdranet%2Fplugins_registry%2Fdra.net-reg.sock"]
            );
            assert_eq!(authority(&a.2), [REPLACEMENT]);
            let others = |f: &[(String, String)]| -> Vec<(String, String)> {
                f.iter().filter(|(n, _)| n != ":authority").cloned().collect()
            };
            assert_eq!(others(&b.2), others(&a.2));
        }
    }
    // The settings, window update and DATA frames are byte for byte as sent.
    let pass = |b: &[u8]| -> Vec<(u8, u8, u32, Vec<u8>)> {
        frames(b).into_iter().filter(|f| f.0 != HEADERS).collect()
    };
    assert_eq!(pass(&input), pass(&out));
}

#[tokio::test]
async fn frames_split_anywhere_and_read_into_any_buffer_give_the_same_bytes() {
    let input = grpcio_connection();
    let whole = run(&input).await;
    for chunk in [1, 2, 3, 7, 9, 10, 23, 24, 25, 33, 100, 289, 300] {
        for read in [1, 5, 9, 16, 100, 4096] {
            let (out, rewrote) = run_with(&input, chunk, read).await;
            assert_eq!(out.unwrap(), whole, "chunk {chunk}, read {read}");
            assert!(rewrote);
        }
    }
}

#[tokio::test]
async fn a_valid_authority_passes_through_byte_for_byte() {
    // kubelet (grpc-go): "localhost", indexed, then referred to.
    let mut b1 = vec![0x83, 0x86, 0x44, 0x05];
    b1.extend(b"/a/b1");
    b1.extend([0x41, 0x09]);
    b1.extend(b"localhost");
    let b2 = [0x83, 0x86, 0xbf, 0xbe];
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_HEADERS, 1, &b1));
    input.extend(data(1, b"hello"));
    input.extend(frame(HEADERS, END_HEADERS, 3, &b2));
    input.extend(data(3, b"again"));
    for chunk in [1, 4, 1000] {
        let (out, rewrote) = run_with(&input, chunk, 7).await;
        assert_eq!(out.unwrap(), input);
        assert!(!rewrote);
    }
}

#[tokio::test]
async fn padding_priority_and_continuation_are_read_and_the_priority_kept() {
    let mut block = vec![0x83, 0x86, 0x84];
    block.extend([0x41, 0x0d]);
    block.extend(b"/tmp/dra.sock");
    lit(&mut block, "content-type", b"application/grpc");
    let (a, rest) = block.split_at(5);
    let (b, c) = rest.split_at(9);
    let mut p = vec![4u8];
    p.extend([0x80, 0, 0, 0, 200]); // exclusive, depends on 0, weight 201
    p.extend(a);
    p.extend([0; 4]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &p));
    input.extend(frame(CONTINUATION, 0, 5, b));
    input.extend(frame(CONTINUATION, END_HEADERS, 5, c));
    let out = run(&input).await;
    let f = frames(&out);
    assert_eq!(f.len(), 1, "{f:?}");
    let (ty, flags, sid, payload) = &f[0];
    assert_eq!(
        (*ty, *flags, *sid),
        (HEADERS, PRIORITY | END_STREAM | END_HEADERS, 5)
    );
    assert_eq!(&payload[..5], &[0x80, 0, 0, 0, 200]);
    let seen = as_h2_sees_it(&out);
    assert_eq!(
        seen[0].2,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "localhost"),
            ("content-type", "application/grpc")
        ]
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
    );
}

#[tokio::test]
async fn dynamic_table_references_survive_the_switch_to_re_encoding() {
    // Block 1 is valid and indexes "x-a: one" (passes through: h2 indexes it too). Block 2
    // refers to it and brings the path authority: re-encoded from there on. Block 3 refers to
    // both entries the client indexed, and shrinks the table first.
    let mut b1 = vec![0x83, 0x86, 0x84, 0x40, 0x03];
    b1.extend(b"x-a");
    b1.push(0x03);
    b1.extend(b"one");
    let mut b2 = vec![0x83, 0x86, 0x84, 0xbe, 0x41, 0x05];
    b2.extend(b"/sock");
    let b3 = [0x3f, 0x21, 0x83, 0x86, 0x84, 0xbe];
    let mut input = PREFACE.to_vec();
    for (sid, b) in [(1, &b1[..]), (3, &b2[..]), (5, &b3[..])] {
        input.extend(frame(HEADERS, END_HEADERS, sid, b));
        input.extend(data(sid, &[0; 5]));
    }
    let out = run(&input).await;
    assert_eq!(
        &out[..24 + 9 + b1.len()],
        &input[..24 + 9 + b1.len()],
        "block 1 changed"
    );
    let seen = as_h2_sees_it(&out);
    let x_a = ("x-a".to_owned(), "one".to_owned());
    assert!(seen[0].2.contains(&x_a));
    assert!(seen[2].2.contains(&x_a));
    assert_eq!(authority(&seen[2].2), ["localhost"]);
    // 0x3f 0x21 is a size update to 64; (":authority", "/sock") (47 bytes) stays, x-a goes:
    // 0xbe is the authority entry now.
    assert_eq!(authority(&seen[4].2), ["localhost"]);
    assert!(!seen[4].2.contains(&x_a));
}

#[tokio::test]
async fn a_large_rewritten_block_is_cut_into_16k_frames() {
    let mut block = vec![0x83, 0x86, 0x84, 0x41, 0x05];
    block.extend(b"/sock");
    for i in 0..5 {
        lit(&mut block, &format!("x-big-{i}"), &[b'v'; 9000]);
    }
    let mut input = PREFACE.to_vec();
    let (a, rest) = block.split_at(16_000);
    let (b, c) = rest.split_at(16_000);
    input.extend(frame(HEADERS, 0, 1, a));
    input.extend(frame(CONTINUATION, 0, 1, b));
    input.extend(frame(CONTINUATION, END_HEADERS, 1, c));
    input.extend(data(1, &[0; 5]));
    let out = run(&input).await;
    let f = frames(&out);
    let kinds: Vec<(u8, u8, usize)> = f.iter().map(|(t, fl, _, p)| (*t, *fl, p.len())).collect();
    assert_eq!(kinds.len(), 4, "{kinds:?}");
    assert_eq!(kinds[0], (HEADERS, 0, MAX_FRAME));
    assert_eq!(kinds[1], (CONTINUATION, 0, MAX_FRAME));
    assert_eq!((kinds[2].0, kinds[2].1), (CONTINUATION, END_HEADERS));
    assert_eq!(kinds[3], (0, END_STREAM, 5));
    let seen = as_h2_sees_it(&out);
    assert_eq!(authority(&seen[0].2), ["localhost"]);
    assert_eq!(seen[0].2.len(), 9);
}

async fn refused(input: &[u8]) -> RewriteError {
    let (out, _) = run_with(input, 1000, 4096).await;
    let e = out.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    e.into_inner()
        .unwrap()
        .downcast::<RewriteError>()
        .map(|b| *b)
        .unwrap()
}

#[tokio::test]
async fn a_huge_header_block_is_refused_before_it_is_read() {
    // Only the frame header is sent: its length alone is refused.
    let mut input = PREFACE.to_vec();
    input.extend(&frame(HEADERS, 0, 1, &[])[..3]);
    input[24..27].copy_from_slice(&[0x01, 0x00, 0x00]); // 65536
    input.extend([HEADERS, END_HEADERS, 0, 0, 0, 1]);
    assert_eq!(
        refused(&input).await,
        RewriteError::BlockTooLarge {
            stream: 1,
            limit: MAX_BLOCK
        }
    );
    // Many CONTINUATION frames add up past the bound too.
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, 0, 1, &[0x82; 16_000]));
    for _ in 0..4 {
        input.extend(frame(CONTINUATION, 0, 1, &[0x82; 16_000]));
    }
    assert!(matches!(
        refused(&input).await,
        RewriteError::BlockTooLarge { .. }
    ));
}

#[tokio::test]
async fn an_oversized_decoded_list_is_refused() {
    // One 4000-byte entry in the table, then referred to 40 times (160 KB decoded).
    let mut block = vec![0x40, 0x01, b'x', 0x7f];
    let mut len = Vec::new();
    hpack_write_string(&mut len, &[b'v'; 3900]);
    block.extend(&len[1..]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_HEADERS, 1, &block));
    input.extend(frame(HEADERS, END_HEADERS, 3, &[0xbe; 40]));
    assert_eq!(
        refused(&input).await,
        RewriteError::Hpack {
            stream: 3,
            source: HpackError::ListTooLarge { limit: MAX_LIST }
        }
    );
}

#[tokio::test]
async fn broken_sequences_end_the_connection() {
    let mut input = PREFACE.to_vec();
    input.extend(frame(CONTINUATION, END_HEADERS, 1, &[0x82]));
    assert_eq!(
        refused(&input).await,
        RewriteError::StrayContinuation { stream: 1 }
    );

    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, 0, 1, &[0x82]));
    input.extend(data(1, &[0; 5]));
    assert_eq!(
        refused(&input).await,
        RewriteError::ExpectedContinuation {
            stream: 1,
            got: 1,
            frame_type: 0
        }
    );

    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_HEADERS | PADDED, 1, &[9, 0x82]));
    assert_eq!(refused(&input).await, RewriteError::BadPadding { stream: 1 });

    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0x00]));
    assert!(matches!(
        refused(&input).await,
        RewriteError::Hpack { stream: 1, .. }
    ));
}

#[tokio::test]
async fn a_connection_cut_inside_a_frame_hands_the_rest_on() {
    let input = grpcio_connection();
    let cut = &input[..input.len() - 20];
    let (out, _) = run_with(cut, 50, 100).await;
    let out = out.unwrap();
    // Everything up to the second HEADERS frame, whose block was incomplete, then its raw start.
    let full = run(&input).await;
    assert!(out.len() < full.len());
    assert_eq!(&out[..200], &full[..200]);
}
