//! Opaque claim config: JSON parsing + upstream's validation on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = dranet::config::parse_and_validate(data);
});
