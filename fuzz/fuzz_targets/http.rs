//! What a client sends to /healthz, /readyz, /metrics: the daemon's hyper service over an in-memory stream.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = dranet::fuzzing::http_request(data) {
        panic!("{e}");
    }
});
