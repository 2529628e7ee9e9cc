//! The plugin's real receive path on a byte stream: what a runtime writes on the trunk goes
//! through the mux reader, ttrpc reassembly and dispatch, the Plugin service (with
//! [`RecordingHooks`] behind it instead of the driver) and back out through the ttrpc and mux
//! writers. Frames for connection 2 reach the real ttrpc client's response reader. Used by the
//! cargo-fuzz target `nri` (`fuzz/fuzz_targets/nri.rs`) and by tests; nothing here is a model of
//! the code, it *is* the code, wired over an in-memory stream.

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use super::hooks::{ContainerInfo, DeviceKind, HookError, LinuxDevice, Outcome, Pod, PodHook, PodHooks};
use super::mux::{
    GO_FRAME_LIMIT, HEADER_LEN, Mux, MuxOptions, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, decode_header,
};
use super::pb::ttrpc::Response;
use super::service::{PluginService, SyncBuf, SyncLimits};
use super::ttrpc::{self, Client, Decoded, Decoder, TYPE_RESPONSE};
use crate::telemetry::metrics::NriMetrics;

/// Pod hooks that do nothing but remember what they were asked.
#[derive(Debug, Default)]
pub struct RecordingHooks {
    calls: Mutex<Vec<String>>,
}

impl RecordingHooks {
    /// Hook calls so far: the hook's name, and for Synchronize the number of pods.
    #[must_use]
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn record(&self, what: String) {
        if let Ok(mut c) = self.calls.lock() {
            c.push(what);
        }
    }
}

impl PodHooks for RecordingHooks {
    async fn run_pod_sandbox(&self, pod: Pod) -> Result<Outcome, HookError> {
        self.record(PodHook::RunPodSandbox.to_string());
        if pod.netns.is_none() && !pod.uid.is_empty() {
            return Err(HookError::Rejected {
                pod: pod.uid,
                reason: "no network namespace".into(),
            });
        }
        Ok(Outcome::Noop)
    }

    async fn stop_pod_sandbox(&self, _pod: Pod) -> Result<Outcome, HookError> {
        self.record(PodHook::StopPodSandbox.to_string());
        Ok(Outcome::Noop)
    }

    async fn remove_pod_sandbox(&self, _pod: Pod) -> Result<Outcome, HookError> {
        self.record(PodHook::RemovePodSandbox.to_string());
        Ok(Outcome::Noop)
    }

    async fn create_container(&self, pod: Pod, _c: ContainerInfo) -> Result<Vec<LinuxDevice>, HookError> {
        self.record(PodHook::CreateContainer.to_string());
        // Two devices with the same path: the service keeps the first.
        let dev = |minor| LinuxDevice {
            path: format!("/dev/infiniband/uverbs-{}", pod.uid.len()),
            kind: DeviceKind::Char,
            major: 231,
            minor,
            file_mode: Some(0o666),
            uid: None,
            gid: None,
        };
        Ok(vec![dev(192), dev(193)])
    }

    async fn synchronize(&self, pods: Vec<Pod>, containers: Vec<ContainerInfo>) {
        self.record(format!(
            "Synchronize pods={} containers={}",
            pods.len(),
            containers.len()
        ));
    }

    async fn shutdown(&self) {
        self.record("Shutdown".into());
    }
}

/// What the plugin did with one input.
#[derive(Debug, Default)]
pub struct Replay {
    /// Every byte the plugin wrote on the trunk.
    pub output: Vec<u8>,
    /// Why the plugin's side of the trunk closed.
    pub closed: String,
    /// Hook calls, in order.
    pub calls: Vec<String>,
}

/// The plugin's Plugin service and client on one end of an in-memory trunk; `input` written on
/// the other end, then end of file. Returns once the plugin has closed its side.
pub async fn replay(input: &[u8], limits: SyncLimits) -> Replay {
    let (plugin_end, runtime_end) = tokio::io::duplex(256 << 10);
    let mut mux = Mux::new(plugin_end, MuxOptions::default());
    let plugin_conn = mux.open(PLUGIN_SERVICE_CONN);
    let runtime_conn = mux.open(RUNTIME_SERVICE_CONN);
    let trunk = mux.start();
    let hooks = Arc::new(RecordingHooks::default());
    let svc = Arc::new(PluginService {
        hooks: hooks.clone(),
        metrics: NriMetrics::default(),
        sync: Mutex::new(SyncBuf::default()),
        sync_limits: limits,
        configured: watch::channel(None).0,
        gone: Arc::default(),
        in_flight: watch::channel(0).0,
    });
    let server = tokio::spawn(ttrpc::serve(plugin_conn, svc));
    let client = Client::new(runtime_conn);
    let (mut rd, mut wr) = tokio::io::split(runtime_end);
    let input = Bytes::copy_from_slice(input);
    let write = async move {
        let _ = wr.write_all(&input).await;
        let _ = wr.shutdown().await;
    };
    let read = async move {
        let mut out = Vec::new();
        let _ = rd.read_to_end(&mut out).await;
        out
    };
    let run = async {
        // The reader may stop early (a frame over the limit): then the rest of the input is
        // never read, and writing it would wait for ever.
        tokio::select! {
            () = write => {}
            _ = trunk.closed() => {}
        }
        let closed = trunk.closed().await;
        let _ = server.await;
        // The client's sender is the last one once the handlers are done: the writer then
        // flushes and shuts the plugin's side down.
        drop(client);
        closed
    };
    let (closed, output) = tokio::join!(run, read);
    Replay {
        output,
        closed,
        calls: hooks.calls(),
    }
}

impl Replay {
    /// What must hold whatever the input: every frame the plugin sent fits a Go reader's 4096
    /// bytes and belongs to connection 1, and those bytes are whole ttrpc responses that decode.
    ///
    /// # Errors
    /// The first broken rule.
    pub fn check(&self) -> Result<usize, String> {
        let mut rest = &self.output[..];
        let mut dec = Decoder::default();
        let mut responses = 0;
        while !rest.is_empty() {
            let hdr: [u8; HEADER_LEN] = rest
                .get(..HEADER_LEN)
                .and_then(|h| h.try_into().ok())
                .ok_or("a partial frame header")?;
            let (conn, len) = decode_header(hdr);
            if conn != PLUGIN_SERVICE_CONN {
                return Err(format!("a frame on connection {conn}"));
            }
            if len > GO_FRAME_LIMIT {
                return Err(format!("a frame of {len} bytes"));
            }
            let payload = rest.get(HEADER_LEN..HEADER_LEN + len).ok_or("a partial frame")?;
            dec.push(payload);
            rest = &rest[HEADER_LEN + len..];
            while let Some(m) = dec.next_message() {
                let Decoded::Message(f) = m else {
                    return Err("an oversized message".into());
                };
                if f.kind != TYPE_RESPONSE {
                    return Err(format!("a message of type {}", f.kind));
                }
                Response::decode(f.data).map_err(|e| format!("a response that does not decode: {e}"))?;
                responses += 1;
            }
        }
        if dec.next_message().is_some() || !dec.is_empty() {
            return Err("a partial message at the end".into());
        }
        Ok(responses)
    }
}

/// One request on the trunk: a ttrpc Request for `method` of the Plugin service on stream
/// `stream`, in one mux frame for connection 1 (seed inputs and tests).
#[must_use]
pub fn request_frame(stream: u32, method: &str, payload: &[u8], timeout_nano: i64) -> Vec<u8> {
    let req = super::pb::ttrpc::Request {
        service: super::plugin::PLUGIN_SERVICE.into(),
        method: method.into(),
        payload: Bytes::copy_from_slice(payload),
        timeout_nano,
        metadata: Vec::new(),
    };
    let msg = ttrpc::encode(stream, ttrpc::TYPE_REQUEST, 0, &req.encode_to_vec());
    let mut b = BytesMut::new();
    super::mux::encode_frame(&mut b, PLUGIN_SERVICE_CONN, &msg);
    b.to_vec()
}

#[cfg(test)]
mod tests {
    use super::super::pb::nri as api;
    use super::*;

    fn pod(uid: &str, annotation: usize) -> api::PodSandbox {
        api::PodSandbox {
            uid: uid.into(),
            id: format!("sb-{uid}"),
            annotations: [("a".to_string(), "x".repeat(annotation))].into_iter().collect(),
            linux: Some(api::LinuxPodSandbox {
                namespaces: vec![api::LinuxNamespace {
                    r#type: "network".into(),
                    path: format!("/run/netns/{uid}"),
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn sync(stream: u32, pods: Vec<api::PodSandbox>, more: bool) -> Vec<u8> {
        let req = api::SynchronizeRequest {
            pods,
            containers: Vec::new(),
            more,
        };
        request_frame(stream, "Synchronize", &req.encode_to_vec(), 0)
    }

    fn statuses(r: &Replay) -> Vec<i32> {
        let mut dec = Decoder::default();
        let mut rest = &r.output[..];
        let mut out = Vec::new();
        while rest.len() >= HEADER_LEN {
            let (_, len) = decode_header(rest[..HEADER_LEN].try_into().unwrap());
            dec.push(&rest[HEADER_LEN..HEADER_LEN + len]);
            rest = &rest[HEADER_LEN + len..];
            while let Some(Decoded::Message(f)) = dec.next_message() {
                out.push((
                    f.stream_id,
                    Response::decode(f.data).unwrap().status.unwrap().code,
                ));
            }
        }
        out.sort_unstable();
        out.into_iter().map(|(_, c)| c).collect()
    }

    #[tokio::test]
    async fn every_method_answers_through_the_real_stack() {
        let p = pod("u1", 3);
        let mut input = Vec::new();
        let calls: [(&str, Vec<u8>); 6] = [
            ("Configure", api::ConfigureRequest::default().encode_to_vec()),
            (
                "RunPodSandbox",
                api::RunPodSandboxRequest { pod: Some(p.clone()) }.encode_to_vec(),
            ),
            (
                "CreateContainer",
                api::CreateContainerRequest {
                    pod: Some(p.clone()),
                    container: None,
                }
                .encode_to_vec(),
            ),
            (
                "StopPodSandbox",
                api::StopPodSandboxRequest { pod: Some(p.clone()) }.encode_to_vec(),
            ),
            ("Nope", Vec::new()),
            ("RunPodSandbox", vec![0xff, 0xff]),
        ];
        for (i, (m, body)) in calls.iter().enumerate() {
            input.extend(request_frame(
                2 * u32::try_from(i).unwrap() + 1,
                m,
                body,
                2_000_000_000,
            ));
        }
        input.extend(frame_for(2, b"stray response bytes"));
        let r = replay(&input, SyncLimits::default()).await;
        assert_eq!(r.check(), Ok(6), "{r:?}");
        assert_eq!(
            statuses(&r),
            vec![
                0,
                0,
                0,
                0,
                ttrpc::code::UNIMPLEMENTED,
                ttrpc::code::INVALID_ARGUMENT
            ]
        );
        assert!(r.closed.contains("peer closed"), "{}", r.closed);
    }

    fn frame_for(conn: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        super::super::mux::encode_frame(&mut b, conn, payload);
        b.to_vec()
    }

    /// Bounded random inputs, truncations and mutations of a valid stream through the real
    /// path: the plugin always finishes and its output keeps the rules (the CI-sized sibling of
    /// the cargo-fuzz target `nri`).
    #[tokio::test]
    async fn garbage_truncation_and_mutation_keep_the_rules() {
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let p = pod("u1", 8);
        let mut valid = request_frame(
            1,
            "RunPodSandbox",
            &api::RunPodSandboxRequest { pod: Some(p.clone()) }.encode_to_vec(),
            0,
        );
        valid.extend(sync(3, vec![p.clone(), p], true));
        valid.extend(request_frame(5, "Shutdown", &[], 0));
        let limits = SyncLimits {
            max_bytes: 1024,
            max_pods: 4,
            max_containers: 4,
        };
        for i in 0..20_000 {
            let mut input = if i % 3 == 0 { Vec::new() } else { valid.clone() };
            for _ in 0..(next() % 48) {
                input.push((next() & 0xff) as u8);
            }
            for _ in 0..(next() % 4) {
                if !input.is_empty() {
                    let at = usize::try_from(next()).unwrap() % input.len();
                    input[at] = (next() & 0xff) as u8;
                }
            }
            let cut = usize::try_from(next()).unwrap() % (input.len() + 1);
            let r = replay(&input[..cut], limits).await;
            assert!(
                r.check().is_ok(),
                "input {i}: {:?} for {:02x?}",
                r.check(),
                &input[..cut]
            );
        }
    }

    /// Parts past the limits are refused, and so is every later part up to the last: the hooks
    /// never see a partial pod list. The next synchronization starts clean.
    #[tokio::test]
    async fn synchronize_parts_over_the_limits_are_refused_to_the_end() {
        let limits = SyncLimits {
            max_bytes: 64 << 10,
            max_pods: 10,
            max_containers: 10,
        };
        let mut input = Vec::new();
        let mut stream = 1;
        let mut next = || {
            stream += 2;
            stream
        };
        // Bytes: 3 parts of 30 KiB; the third goes over 64 KiB.
        for _ in 0..4 {
            input.extend(sync(next(), vec![pod("big", 30 << 10)], true));
        }
        input.extend(sync(next(), vec![pod("last", 1)], false));
        // A clean synchronization afterwards.
        input.extend(sync(next(), vec![pod("a", 1)], true));
        input.extend(sync(next(), vec![pod("b", 1)], false));
        // Pods: 11 in one message.
        input.extend(sync(
            next(),
            (0..11).map(|i| pod(&i.to_string(), 1)).collect(),
            false,
        ));
        let r = replay(&input, limits).await;
        assert_eq!(r.check(), Ok(8));
        let exhausted = ttrpc::code::RESOURCE_EXHAUSTED;
        assert_eq!(
            statuses(&r),
            vec![0, 0, exhausted, exhausted, exhausted, 0, 0, exhausted]
        );
        assert_eq!(r.calls, vec!["Synchronize pods=2 containers=0"]);
    }
}
