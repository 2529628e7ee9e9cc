//! eBPF programs attached to a link: TC BPF filters (rtnetlink dump through
//! [`crate::sys::bpf::tc`], works in any netns) and TCX programs (`BPF_PROG_QUERY` by ifindex,
//! resolved in the calling thread's netns).

use std::collections::BTreeSet;

use futures::TryStreamExt;
use netlink_packet_route::tc::{TcHandle, TcMessage};
use rtnetlink::Handle;

use super::netlink::LinkRecord;
use crate::sys::bpf::tc::{bpf_filter_names, filters};
use crate::sys::bpf::tcx::program_names;

/// What one scan learns once for all its links, so that it asks per link only where there can
/// be something. Asking every link cost 2 filter dumps and 2 TCX queries (each an ioctl socket
/// for the name and a `BPF_PROG_QUERY`) per link, serially: most of a 1,024-device scan
/// (docs/bench.md, "Figures behind the code's comments").
pub(super) struct Presence {
    /// Links with a qdisc at the ingress/clsact parent: TC filters on the ingress and egress
    /// parents hang off one (`None`: the qdisc dump failed; every link is asked).
    filter_links: Option<BTreeSet<i32>>,
    /// A `sched_cls` program is loaded somewhere (a TCX program is one); `true` when the
    /// programs cannot be listed.
    tcx_possible: bool,
}

impl Presence {
    pub(super) async fn probe(handle: &Handle) -> Self {
        let qdiscs: Result<Vec<TcMessage>, _> = handle.qdisc().get().execute().try_collect().await;
        let filter_links = qdiscs.ok().map(|q| {
            q.iter()
                .filter(|m| m.header.parent == TcHandle::INGRESS)
                .map(|m| m.header.index)
                .collect()
        });
        let tcx_possible = crate::sys::bpf::tcx::sched_cls_loaded();
        Self {
            filter_links,
            tcx_possible,
        }
    }

    fn filters_possible(&self, index: u32) -> bool {
        match (&self.filter_links, i32::try_from(index)) {
            (Some(set), Ok(i)) => set.contains(&i),
            _ => true,
        }
    }
}

/// TC BPF filters (ingress, egress) and TCX programs of a link, best effort: a link without a
/// clsact qdisc or a kernel without TCX simply has none.
pub(super) async fn ebpf_programs(handle: &Handle, r: &mut LinkRecord, presence: &Presence) {
    let filters = if presence.filters_possible(r.index) {
        filters(handle, r.index).await.unwrap_or_default()
    } else {
        Vec::new()
    };
    let (any_filter, names) = bpf_filter_names(&filters);
    let tcx = if presence.tcx_possible {
        program_names(&r.name)
    } else {
        Vec::new()
    };
    r.ebpf = any_filter || !tcx.is_empty();
    r.tc_filter_names = names;
    r.tcx_program_names = tcx;
}
