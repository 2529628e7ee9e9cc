//! RDMA nldev replies: the netlink decoder, device list and netns mode; decoded messages re-encode to themselves.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = dranet::fuzzing::rdma_reply(data) {
        panic!("{e}");
    }
});
