//! TC BPF filters of a device on its clsact `ingress` and `egress` parents, over rtnetlink (the
//! socket's netns is the one looked at): listing (also for the inventory's attributes) and
//! deletion.

use futures::{StreamExt, TryStreamExt};
use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::tc::{TcAttribute, TcFilterBpfOption, TcHandle, TcMessage, TcOption};
use rtnetlink::Handle;

use super::BpfError;

/// The clsact parents: ingress (`ffff:fff2`) and egress (`ffff:fff3`).
const PARENTS: [(TcHandle, &str); 2] = [
    (
        TcHandle {
            major: 0xffff,
            minor: TcHandle::MIN_INGRESS,
        },
        "ingress",
    ),
    (
        TcHandle {
            major: 0xffff,
            minor: TcHandle::MIN_EGRESS,
        },
        "egress",
    ),
];

/// Every filter (any kind) on the ingress and egress parents of device `index`.
pub async fn filters(handle: &Handle, index: u32) -> Result<Vec<TcMessage>, BpfError> {
    let Ok(ifindex) = i32::try_from(index) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (parent, _) in PARENTS {
        let mut tf = handle.traffic_filter(ifindex);
        let mut req = tf.get();
        req = if parent.minor == TcHandle::MIN_INGRESS {
            req.ingress()
        } else {
            req.egress()
        };
        let msgs: Vec<TcMessage> = req.execute().try_collect().await.map_err(|e| BpfError::Tc {
            what: "dump filters",
            source: Box::new(e),
        })?;
        out.extend(msgs);
    }
    Ok(out)
}

fn is_bpf(m: &TcMessage) -> bool {
    m.attributes
        .iter()
        .any(|a| matches!(a, TcAttribute::Kind(k) if k == "bpf"))
}

fn chain_of(m: &TcMessage) -> Option<u32> {
    m.attributes.iter().find_map(|a| match a {
        TcAttribute::Chain(c) => Some(*c),
        _ => None,
    })
}

/// Whether any filter is a `bpf` one, and the program names of those that carry one.
#[must_use]
pub fn bpf_filter_names(filters: &[TcMessage]) -> (bool, Vec<String>) {
    let mut any = false;
    let mut names = Vec::new();
    for f in filters.iter().filter(|f| is_bpf(f)) {
        for a in &f.attributes {
            if let TcAttribute::Options(opts) = a {
                for o in opts {
                    if let TcOption::Bpf(TcFilterBpfOption::ProgName(n)) = o {
                        names.push(n.clone());
                    }
                }
            }
        }
        // A dump lists the chain head (kind only) and then each filter with its options.
        any = true;
    }
    names.sort();
    names.dedup();
    (any, names)
}

/// One `bpf` classifier instance: all its filters share parent, chain, priority and protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BpfFilterGroup {
    pub parent: u32,
    pub chain: Option<u32>,
    /// `tcm_info`: priority << 16 | protocol (network order).
    pub info: u32,
}

impl std::fmt::Display for BpfFilterGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = PARENTS
            .iter()
            .find(|(p, _)| u32::from(*p) == self.parent)
            .map_or("?", |(_, n)| n);
        write!(f, "{side} bpf prio {}", self.info >> 16)?;
        if let Some(c) = self.chain.filter(|c| *c != 0) {
            write!(f, " chain {c}")?;
        }
        Ok(())
    }
}

/// The `bpf` classifier instances among `filters`.
#[must_use]
pub fn bpf_groups(filters: &[TcMessage]) -> Vec<BpfFilterGroup> {
    let mut g: Vec<BpfFilterGroup> = filters
        .iter()
        .filter(|m| is_bpf(m))
        .map(|m| BpfFilterGroup {
            parent: u32::from(m.header.parent),
            chain: chain_of(m),
            info: m.header.info,
        })
        .collect();
    g.sort();
    g.dedup();
    g
}

/// The `RTM_DELTFILTER` that removes one whole `bpf` classifier instance (handle 0: every
/// filter of that priority; the kind makes the kernel refuse if it is not `bpf`).
#[must_use]
pub fn delete_message(index: i32, g: &BpfFilterGroup) -> TcMessage {
    let mut m = TcMessage::with_index(index);
    m.header.parent = TcHandle::from(g.parent);
    m.header.info = g.info;
    m.attributes.push(TcAttribute::Kind("bpf".to_owned()));
    if let Some(c) = g.chain {
        m.attributes.push(TcAttribute::Chain(c));
    }
    m
}

/// Deletes every `bpf` filter on the ingress and egress parents of device `index`; returns
/// what it deleted. A group that vanished meanwhile (`ENOENT`) counts as deleted.
pub async fn delete_bpf_filters(handle: &Handle, index: u32) -> Result<Vec<BpfFilterGroup>, BpfError> {
    let groups = bpf_groups(&filters(handle, index).await?);
    let Ok(ifindex) = i32::try_from(index) else {
        return Ok(Vec::new());
    };
    for g in &groups {
        let mut req = NetlinkMessage::from(RouteNetlinkMessage::DelTrafficFilter(delete_message(ifindex, g)));
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        let mut h = handle.clone();
        let mut resp = h.request(req).map_err(|e| BpfError::Tc {
            what: "delete filter",
            source: Box::new(e),
        })?;
        while let Some(m) = resp.next().await {
            if let NetlinkPayload::Error(e) = m.payload
                && let Some(code) = e.code
            {
                if -code.get() == libc::ENOENT {
                    continue;
                }
                return Err(BpfError::Tc {
                    what: "delete filter",
                    source: Box::new(rtnetlink::Error::NetlinkError(e)),
                });
            }
        }
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::Emitable;

    fn msg(kind: &str, name: Option<&str>) -> TcMessage {
        let mut m = TcMessage::default();
        m.attributes.push(TcAttribute::Kind(kind.to_owned()));
        if let Some(n) = name {
            m.attributes.push(TcAttribute::Options(vec![TcOption::Bpf(
                TcFilterBpfOption::ProgName(n.to_owned()),
            )]));
        }
        m
    }

    #[test]
    fn bpf_filter_names_from_tc_dumps() {
        assert_eq!(bpf_filter_names(&[]), (false, vec![]));
        assert_eq!(bpf_filter_names(&[msg("u32", None)]), (false, vec![]));
        assert_eq!(bpf_filter_names(&[msg("bpf", None)]), (true, vec![]));
        assert_eq!(
            bpf_filter_names(&[
                msg("bpf", Some("tc_b")),
                msg("bpf", Some("tc_a")),
                msg("bpf", Some("tc_b"))
            ]),
            (true, vec!["tc_a".to_owned(), "tc_b".to_owned()])
        );
    }

    #[test]
    fn groups_keep_only_bpf_and_dedup_per_parent_chain_and_priority() {
        let at = |kind: &str, parent: u32, info: u32, chain: Option<u32>| {
            let mut m = msg(kind, None);
            m.header.parent = TcHandle::from(parent);
            m.header.info = info;
            if let Some(c) = chain {
                m.attributes.push(TcAttribute::Chain(c));
            }
            m
        };
        let ingress = 0xffff_fff2;
        let egress = 0xffff_fff3;
        let all = 0x0300; // ETH_P_ALL in network order
        let groups = bpf_groups(&[
            at("bpf", ingress, (1 << 16) | all, Some(0)),
            at("bpf", ingress, (1 << 16) | all, Some(0)),
            at("u32", ingress, (2 << 16) | all, Some(0)),
            at("bpf", egress, (5 << 16) | all, Some(3)),
        ]);
        assert_eq!(groups.len(), 2, "{groups:?}");
        assert_eq!(groups[0].to_string(), "ingress bpf prio 1");
        assert_eq!(groups[1].to_string(), "egress bpf prio 5 chain 3");
    }

    #[test]
    fn delete_message_bytes() {
        let g = BpfFilterGroup {
            parent: 0xffff_fff3,
            chain: Some(0),
            info: (7 << 16) | 0x0300,
        };
        let m = delete_message(42, &g);
        let mut buf = vec![0u8; m.buffer_len()];
        m.emit(&mut buf);
        // struct tcmsg: family, pad, pad16, ifindex, handle, parent, info.
        assert_eq!(buf[0], 0);
        assert_eq!(&buf[4..8], &42i32.to_ne_bytes());
        assert_eq!(&buf[8..12], &0u32.to_ne_bytes());
        assert_eq!(&buf[12..16], &0xffff_fff3u32.to_ne_bytes());
        assert_eq!(&buf[16..20], &((7u32 << 16) | 0x0300).to_ne_bytes());
        // TCA_KIND "bpf\0" (len 8, type 1), then TCA_CHAIN 0 (len 8, type 11).
        assert_eq!(&buf[20..28], &[8, 0, 1, 0, b'b', b'p', b'f', 0]);
        assert_eq!(&buf[28..36], &[8, 0, 11, 0, 0, 0, 0, 0]);
        assert_eq!(buf.len(), 36);
    }
}
