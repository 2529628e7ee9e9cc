//! The checkpoint loader (`Store::load`'s decoding, migration from format 1, the identifier
//! checks) on arbitrary bytes: never panics; whatever it accepts is a format-2 checkpoint that
//! saves and loads back unchanged (`dranet::fuzzing::checkpoint`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = dranet::fuzzing::checkpoint(data) {
        panic!("{e}");
    }
});
