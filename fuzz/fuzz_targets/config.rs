//! Opaque claim config: JSON parsing + upstream's validation on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = dranet::fuzzing::config_json(data) {
        panic!("{e}");
    }
});
