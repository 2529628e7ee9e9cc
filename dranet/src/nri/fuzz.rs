//! The receive path, byte for byte, as one pure function: mux frames → per-connection ttrpc
//! reassembly → envelope → the NRI request of the method. Used by the cargo-fuzz target
//! (`fuzz/fuzz_targets/frames.rs`) and by a bounded random-input test in CI. It must never
//! panic, whatever the bytes.

use prost::Message;

use super::mux::{HEADER_LEN, decode_header};
use super::pb::nri as api;
use super::pb::ttrpc as env;
use super::ttrpc::{Decoded, Decoder};

/// What one input decoded to (for assertions).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub frames: usize,
    pub messages: usize,
    pub requests: usize,
    pub oversized: usize,
}

/// Feeds `data` through the whole receive path.
#[must_use]
pub fn decode_stream(data: &[u8]) -> Summary {
    let mut s = Summary::default();
    let mut decoders: [Decoder; 3] = Default::default();
    let mut rest = data;
    while rest.len() >= HEADER_LEN {
        let mut hdr = [0u8; HEADER_LEN];
        hdr.copy_from_slice(&rest[..HEADER_LEN]);
        let (conn, len) = decode_header(hdr);
        rest = &rest[HEADER_LEN..];
        let take = len.min(rest.len());
        let payload = &rest[..take];
        rest = &rest[take..];
        s.frames += 1;
        // Unknown connection ids are dropped, as the Go mux does.
        let Some(d) = usize::try_from(conn).ok().and_then(|c| decoders.get_mut(c)) else {
            continue;
        };
        d.push(payload);
        while let Some(m) = d.next_message() {
            match m {
                Decoded::Oversized { .. } => s.oversized += 1,
                Decoded::Message(f) => {
                    s.messages += 1;
                    if let Ok(req) = env::Request::decode(f.data.clone()) {
                        s.requests += 1;
                        request(&req.method, &req.payload);
                    } else {
                        let _ = env::Response::decode(f.data);
                    }
                }
            }
        }
    }
    s
}

fn request(method: &str, p: &[u8]) {
    let _ = match method {
        "Configure" => api::ConfigureRequest::decode(p).map(|_| ()),
        "Synchronize" => api::SynchronizeRequest::decode(p).map(|_| ()),
        "RunPodSandbox" => api::RunPodSandboxRequest::decode(p).map(|_| ()),
        "StopPodSandbox" => api::StopPodSandboxRequest::decode(p).map(|_| ()),
        "CreateContainer" => api::CreateContainerRequest::decode(p).map(|_| ()),
        "StateChange" => api::StateChangeEvent::decode(p).map(|_| ()),
        _ => Ok(()),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn frame(conn: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        super::super::mux::encode_frame(&mut b, conn, payload);
        b.to_vec()
    }

    #[test]
    fn a_real_request_decodes_through_every_layer() {
        let req = env::Request {
            service: "nri.pkg.api.v1alpha1.Plugin".into(),
            method: "RunPodSandbox".into(),
            payload: api::RunPodSandboxRequest::default().encode_to_vec().into(),
            ..Default::default()
        };
        let msg = super::super::ttrpc::encode(1, 1, 0, &req.encode_to_vec());
        // Split across two frames, plus a frame for an unknown connection.
        let (a, b) = msg.split_at(7);
        let mut input = frame(1, a);
        input.extend(frame(9, b"junk"));
        input.extend(frame(1, b));
        let s = decode_stream(&input);
        assert_eq!(
            s,
            Summary {
                frames: 3,
                messages: 1,
                requests: 1,
                oversized: 0
            }
        );
    }

    #[test]
    fn oversized_messages_are_skipped_not_buffered() {
        let mut hdr = vec![0x00, 0x50, 0x00, 0x00, 0, 0, 0, 1, 1, 0]; // 5 MiB announced
        hdr.extend([0u8; 32]);
        let s = decode_stream(&frame(1, &hdr));
        assert_eq!(s.oversized, 1);
        assert_eq!(s.messages, 0);
    }

    /// Bounded random inputs and mutations of a valid stream: never a panic (the CI-sized
    /// sibling of the cargo-fuzz target).
    #[test]
    fn garbage_truncation_and_mutation_never_panic() {
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let req = env::Request {
            method: "Synchronize".into(),
            payload: vec![0x0a, 0x02, 0x0a, 0x00].into(),
            ..Default::default()
        };
        let valid = frame(1, &super::super::ttrpc::encode(3, 1, 0, &req.encode_to_vec()));
        for i in 0..20_000 {
            let mut input = if i % 2 == 0 { valid.clone() } else { Vec::new() };
            let extra = (next() % 64) as usize;
            for _ in 0..extra {
                input.push((next() & 0xff) as u8);
            }
            for _ in 0..(next() % 4) {
                if !input.is_empty() {
                    let at = (next() as usize) % input.len();
                    input[at] = (next() & 0xff) as u8;
                }
            }
            let cut = if input.is_empty() {
                0
            } else {
                (next() as usize) % (input.len() + 1)
            };
            let _ = decode_stream(&input[..cut]);
        }
    }
}
