//! NRI receive path (mux frames → ttrpc reassembly → envelope → NRI request) on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = dranet::nri::fuzz::decode_stream(data);
});
