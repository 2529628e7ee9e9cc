//! Ethtool genetlink replies: the hand-written netlink decoders (messages, attributes, bitsets, features, private flags).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = dranet::fuzzing::ethtool_reply(data) {
        panic!("{e}");
    }
});
