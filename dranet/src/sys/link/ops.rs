//! Single rtnetlink operations on one link: admin state, addresses.

use super::*;

/// Sets the admin state (IFF_UP) of link `index` in `nl`'s netns, nothing else.
pub async fn set_admin_state(nl: &Netlink, index: u32, up: bool) -> Result<(), LinkError> {
    set_up(nl, index, up).await
}

pub(super) async fn set_up(nl: &Netlink, index: u32, up: bool) -> Result<(), LinkError> {
    let mut m = LinkMessage::default();
    m.header.index = index;
    m.header.change_mask = LinkFlags::Up;
    if up {
        m.header.flags = LinkFlags::Up;
    }
    nl.newlink(m, if up { "set link up" } else { "set link down" })
        .await
}

pub(super) async fn add_address(nl: &Netlink, index: u32, ip: IpAddr, len: u8) -> Result<(), LinkError> {
    match nl.handle.address().add(index, ip, len).execute().await {
        Ok(()) => Ok(()),
        Err(e) if errno_of(&e) == Some(libc::EEXIST) => Ok(()),
        Err(e) => Err(nl_err("add address", e)),
    }
}

/// Adds (or replaces, when only its details differ) one snapshotted address exactly as it was.
pub(super) async fn restore_address(nl: &Netlink, index: u32, a: &AddrSnapshot) -> Result<(), LinkError> {
    let (ip, len) = a.ip_prefix()?;
    let mut req = nl.handle.address().add(index, ip, len).replace();
    a.shape(req.message_mut());
    req.execute().await.map_err(|e| nl_err("restore address", e))
}

pub(super) fn nl_err(what: &'static str, source: rtnetlink::Error) -> LinkError {
    LinkError::Netlink {
        what,
        source: Box::new(source),
    }
}
