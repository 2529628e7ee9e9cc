//! DHCP receive path (IPv4/UDP framing → DHCP message → lease) on arbitrary bytes, framed or
//! as a bare DHCP payload.
#![no_main]

use dranet::dhcp::Lease;
use dranet::dhcp::message::{Message, opt};
use dranet::dhcp::packet::decode_udp;

fn poke(m: &Message) {
    let _ = m.message_type();
    let _ = m.classless_routes();
    let _ = m.prefix_len();
    let _ = m.ip_list_option(opt::ROUTER);
    let _ = m.server_message();
    if let Ok(l) = Lease::from_ack(m) {
        let _ = l.route_configs();
    }
    let _ = Message::decode(&m.encode());
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Message::decode(data) {
        poke(&m);
    }
    if let Ok(d) = decode_udp(data)
        && let Ok(m) = Message::decode(d.payload)
    {
        poke(&m);
    }
});
