//! VRF enslavement inside the pod: route tables follow the VRF's table.

use super::*;

pub(super) fn set_route_table(msg: &mut netlink_packet_route::route::RouteMessage, table: u32) {
    use netlink_packet_route::route::RouteAttribute;
    msg.attributes.retain(|a| !matches!(a, RouteAttribute::Table(_)));
    msg.header.table = u8::try_from(table).unwrap_or(0);
    msg.attributes.push(RouteAttribute::Table(table));
}

/// The table of a VRF link, `None` if `m` is not a VRF.
pub(super) fn vrf_table_of(m: &LinkMessage) -> Option<u32> {
    use netlink_packet_route::link::{InfoData, InfoKind, InfoVrf, LinkInfo};
    let infos = m.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(v) => Some(v),
        _ => None,
    })?;
    if !infos.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Vrf))) {
        return None;
    }
    infos.iter().find_map(|i| match i {
        LinkInfo::Data(InfoData::Vrf(v)) => v.iter().find_map(|x| match x {
            InfoVrf::TableId(t) => Some(*t),
            _ => None,
        }),
        _ => None,
    })
}

/// Creates the VRF `name` with `table` in the pod (or takes the one a previous device of the
/// pod created: devices may share it), sets it up, enslaves device `index` to it and turns on
/// `tcp_l3mdev_accept`/`udp_l3mdev_accept` so unbound sockets of the pod work across it.
/// Returns the table. A kernel without VRF support (`CONFIG_NET_VRF`) is a clear error.
pub(super) async fn enslave_to_vrf(
    nl: &Netlink,
    netns: &Netns,
    index: u32,
    name: &str,
    table: u32,
) -> Result<u32, LinkError> {
    let bad = |reason: String| LinkError::Vrf {
        name: name.to_owned(),
        reason,
    };
    let m = match nl.link_by_name(name).await? {
        Some(m) => m,
        None => {
            match nl
                .handle
                .link()
                .add(rtnetlink::LinkVrf::new(name, table).build())
                .execute()
                .await
            {
                Ok(()) => {}
                Err(e) if errno_of(&e) == Some(libc::EEXIST) => {}
                Err(e) if errno_of(&e) == Some(libc::EOPNOTSUPP) => {
                    return Err(bad("this kernel has no VRF support (CONFIG_NET_VRF)".into()));
                }
                Err(e) => return Err(bad(format!("creating it: {e}"))),
            }
            nl.link_by_name(name)
                .await?
                .ok_or_else(|| bad("vanished right after it was created".into()))?
        }
    };
    match vrf_table_of(&m) {
        Some(t) if t == table => {}
        Some(t) => return Err(bad(format!("exists in the pod with table {t}, not {table}"))),
        None => return Err(bad("a device of that name in the pod is not a VRF".into())),
    }
    let vrf_index = m.header.index;
    set_up(nl, vrf_index, true).await?;
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg.attributes.push(LinkAttribute::Controller(vrf_index));
    nl.newlink(msg, "enslave to the VRF").await?;
    // `/proc/sys` writes from the pod netns's thread: on the blocking pool (`off_async`).
    let (ns, vrf) = (netns.try_clone()?, name.to_owned());
    off_async("VRF sysctls in the pod", move || {
        sysctl::set_in_pod(
            &ns,
            &vrf,
            &[
                PodSysctl::Ipv4Global {
                    name: "tcp_l3mdev_accept",
                    value: 1,
                },
                PodSysctl::Ipv4Global {
                    name: "udp_l3mdev_accept",
                    value: 1,
                },
            ],
        )
    })
    .await??;
    Ok(table)
}
