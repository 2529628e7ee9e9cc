//! Entry points of the cargo-fuzz targets (`fuzz/fuzz_targets/`) and of the test that replays
//! the committed seed corpus (`dranet/tests/fuzz_corpus.rs`). Each one hands arbitrary bytes to
//! the real decoder or server, the same code the daemon runs, and checks what must hold for any
//! input; a broken rule comes back as `Err`, which the targets turn into a crash. Not an API.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::http::{Endpoints, ServerOptions};
use crate::nri::SyncLimits;
use crate::sys::netns::{NetnsCookie, NetnsId};

thread_local! {
    /// One current-thread runtime per fuzzing thread: the targets run millions of inputs.
    static RUNTIME: Option<tokio::runtime::Runtime> = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok();
}

fn block_on<F: Future<Output = Result<(), String>>>(f: F) -> Result<(), String> {
    RUNTIME.with(|rt| match rt {
        Some(rt) => rt.block_on(f),
        None => Err("no tokio runtime".into()),
    })
}

/// An input that takes longer than this is a hang.
const HANG: Duration = Duration::from_secs(10);

/// Target `nri`: `data` as the bytes a runtime writes on the NRI trunk, through the plugin's
/// mux reader, ttrpc decoding and dispatch, the Plugin service and its writers
/// ([`crate::nri::replay`]). Everything the plugin writes back must be whole responses on
/// connection 1, in frames a Go reader accepts (≤ 4096 bytes), and the plugin must finish.
///
/// # Errors
/// A broken rule, or a hang.
pub fn nri_stream(data: &[u8]) -> Result<(), String> {
    // Small Synchronize limits, so that short inputs reach the overflow paths too.
    let limits = SyncLimits {
        max_bytes: 4096,
        max_pods: 8,
        max_containers: 8,
    };
    block_on(async {
        let r = tokio::time::timeout(HANG, crate::nri::replay::replay(data, limits))
            .await
            .map_err(|_| "the NRI receive path hung".to_owned())?;
        r.check().map(drop)
    })
}

struct Fixed;

impl Endpoints for Fixed {
    fn health(&self) -> Result<(), String> {
        Err("kubelet has not registered the DRA plugin".into())
    }

    fn metrics(&self, format: crate::http::MetricsFormat) -> String {
        match format {
            crate::http::MetricsFormat::OpenMetrics => "# TYPE dranet_up gauge\ndranet_up 1\n# EOF\n".into(),
            crate::http::MetricsFormat::Text004 => "# TYPE dranet_up gauge\ndranet_up 1\n".into(),
        }
    }
}

/// Target `http`: `data` as what a client sends on one connection to `/healthz` & co, served by
/// the daemon's hyper service over an in-memory stream. Whatever comes back must be HTTP/1.x
/// responses (hyper answers an HTTP/1.0 request in kind), and the connection must end.
///
/// # Errors
/// A broken rule, or a hang.
pub fn http_request(data: &[u8]) -> Result<(), String> {
    let opts = ServerOptions {
        max_connections: 1,
        header_timeout: Duration::from_millis(200),
        idle_timeout: Duration::from_millis(200),
    };
    block_on(async {
        let out = tokio::time::timeout(HANG, crate::http::exchange(data, Arc::new(Fixed), &opts))
            .await
            .map_err(|_| "the HTTP connection hung".to_owned())?;
        if !out.is_empty() && !out.starts_with(b"HTTP/1.1 ") && !out.starts_with(b"HTTP/1.0 ") {
            return Err(format!(
                "not an HTTP/1.x response: {:?}",
                String::from_utf8_lossy(&out[..out.len().min(64)])
            ));
        }
        Ok(())
    })
}

/// Target `ethtool`: `data` as a datagram on the ethtool genetlink socket, through the reply
/// decoder and every attribute decoder the daemon applies to a reply (family id, features,
/// private flags, bitsets); `data` is also tried as bare attributes.
///
/// # Errors
/// A decoded message claims more bytes than the datagram had.
pub fn ethtool_reply(data: &[u8]) -> Result<(), String> {
    use crate::sys::ethtool::{Features, Reply, decode, decode_bitset, decode_privflags, family_of};
    let poke = |attrs: &[u8]| {
        if let Ok(f) = Features::decode(attrs) {
            let _ = f.changeable_wanted();
            for name in ["rx-gro", "tso", "gro", "tx-checksum-*"] {
                let _ = crate::sys::ethtool::resolve_feature(&f, name, true);
            }
        }
        let _ = decode_privflags(attrs);
        let _ = decode_bitset(attrs);
    };
    if let Ok(replies) = decode(data) {
        let _ = family_of(&replies);
        for r in &replies {
            if let Reply::Message { attrs, .. } = r {
                if attrs.len() > data.len() {
                    return Err(format!(
                        "{} attribute bytes from {} bytes",
                        attrs.len(),
                        data.len()
                    ));
                }
                poke(attrs);
            }
        }
    }
    poke(data);
    Ok(())
}

/// Target `rdma`: `data` as a datagram on the NETLINK_RDMA socket, through the nldev reply
/// decoder, the device list and the netns mode; each decoded message is encoded again and must
/// decode to itself.
///
/// # Errors
/// A message that does not survive its own encoder.
pub fn rdma_reply(data: &[u8]) -> Result<(), String> {
    use crate::sys::rdma::{Reply, decode, devices_of, encode, mode_of};
    let Ok(replies) = decode(data) else {
        return Ok(());
    };
    let _ = devices_of(&replies);
    let _ = mode_of(&replies);
    for r in replies {
        if let Reply::Message(m) = r {
            let again = decode(&encode(m.clone(), 1, false)).map_err(|e| format!("re-encoded {m:?}: {e}"))?;
            if again != [Reply::Message(m.clone())] {
                return Err(format!("{m:?} re-encoded decodes to {again:?}"));
            }
        }
    }
    Ok(())
}

/// Target `probe_event`: `data` as one record of the probes' ring buffer, through the event
/// decoder (with resolvers that know one path and one inode) and everything the watcher and
/// `dranet trace` read from an event.
///
/// # Errors
/// A record shorter than an event decoded to one.
pub fn probe_event(data: &[u8]) -> Result<(), String> {
    let known = NetnsId {
        cookie: NetnsCookie::from_raw(4096),
        inode: 4_026_532_000,
    };
    let ev = crate::watch::event::decode(
        data,
        |p| (p == "/run/netns/cni-fuzz").then_some(known),
        |i| (i == known.inode).then_some(known),
    );
    let Some(ev) = ev else {
        return Ok(());
    };
    if data.len() < size_of::<dranet_common::Event>() {
        return Err(format!("an event from {} bytes", data.len()));
    }
    let _ = (ev.kind_name(), ev.path(), ev.netns(), ev.device());
    let _ = serde_json::to_string(&ev);
    Ok(())
}

/// Target `config`: `data` as a claim's opaque parameters, through strict decoding and
/// upstream's validation rules.
///
/// # Errors
/// A rejected config that reports no error, or more than the 32 it may list.
pub fn config_json(data: &[u8]) -> Result<(), String> {
    use crate::config::{ConfigError, parse_and_validate};
    match parse_and_validate(data) {
        Ok(_) | Err(ConfigError::Json { .. } | ConfigError::Invalid { .. }) => Ok(()),
        // Every decoding failure is reported, bounded, each on its own.
        Err(e) => {
            let n = e.field_errors().len();
            if (1..=32).contains(&n) {
                Ok(())
            } else {
                Err(format!("{n} field errors: {e}"))
            }
        }
    }
}

/// Target `dhcp`: `data` as a DHCP message or as an IPv4/UDP datagram carrying one, through
/// the decoders and everything a lease is made of; a decoded message must decode again from
/// its own encoding.
///
/// # Errors
/// A decoded message whose encoding does not decode.
pub fn dhcp_packet(data: &[u8]) -> Result<(), String> {
    use crate::dhcp::Lease;
    use crate::dhcp::message::{Message, opt};
    use crate::dhcp::packet::decode_udp;
    let poke = |m: &Message| {
        let _ = m.message_type();
        let _ = m.classless_routes();
        let _ = m.prefix_len();
        let _ = m.ip_list_option(opt::ROUTER);
        let _ = m.server_message();
        if let Ok(l) = Lease::from_ack(m) {
            let _ = l.route_configs();
        }
        Message::decode(&m.encode())
            .map(drop)
            .map_err(|e| format!("re-encoded message does not decode: {e}"))
    };
    if let Ok(m) = Message::decode(data) {
        poke(&m)?;
    }
    if let Ok(d) = decode_udp(data)
        && let Ok(m) = Message::decode(d.payload)
    {
        poke(&m)?;
    }
    Ok(())
}

/// Target `store`: `data` as a checkpoint file, through the loader's decoding, the migration
/// from format 1 and the identifier checks; what it accepts must save and load back unchanged
/// ([`crate::state::check_decode`]).
///
/// # Errors
/// The rule a decoded checkpoint breaks.
pub fn checkpoint(data: &[u8]) -> Result<(), String> {
    crate::state::check_decode(data)
}
