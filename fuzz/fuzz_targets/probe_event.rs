//! Probe ring-buffer records: the event decoder and what the watcher and trace read from an event.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = dranet::fuzzing::probe_event(data) {
        panic!("{e}");
    }
});
