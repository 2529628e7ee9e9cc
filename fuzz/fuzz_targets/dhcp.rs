//! DHCP receive path (IPv4/UDP framing → DHCP message → lease) on arbitrary bytes, framed or
//! as a bare DHCP payload.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = dranet::fuzzing::dhcp_packet(data) {
        panic!("{e}");
    }
});
