//! Host-side rtnetlink connections: one for requests, and multicast monitors. Callers spawn
//! the returned [`Connection`] on their runtime (it drives the socket) and talk through the
//! [`Handle`].

use futures::channel::mpsc::UnboundedReceiver;
use netlink_packet_core::NetlinkMessage;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{AsyncSocket, SocketAddr};
pub use rtnetlink::{Handle, MulticastGroup};

/// The future that drives one rtnetlink socket.
pub type Connection = rtnetlink::proto::Connection<RouteNetlinkMessage>;

/// Unsolicited messages of a monitor (multicast) connection.
pub type Messages = UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>;

/// An rtnetlink socket in the calling thread's netns, for requests.
pub fn connect() -> std::io::Result<(Connection, Handle)> {
    let (conn, handle, _) = rtnetlink::new_connection()?;
    Ok((conn, handle))
}

/// An rtnetlink socket subscribed to `groups`. With `rcvbuf`, its receive buffer is forced to
/// that many bytes (`SO_RCVBUFFORCE`: we are root; `SO_RCVBUF` caps at `rmem_max`).
pub fn monitor(
    groups: &[MulticastGroup],
    rcvbuf: Option<usize>,
) -> std::io::Result<(Connection, Handle, Messages)> {
    let (mut conn, handle, messages) = rtnetlink::new_multicast_connection(groups)?;
    if let Some(bytes) = rcvbuf {
        conn.socket_mut().socket_ref().set_rx_buf_sz(bytes)?;
    }
    Ok((conn, handle, messages))
}
