//! NRI trunk as a runtime writes it: the real mux reader, ttrpc decoding and dispatch, the Plugin service and its writers (dranet::nri::replay), over an in-memory stream.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = dranet::fuzzing::nri_stream(data) {
        panic!("{e}");
    }
});
