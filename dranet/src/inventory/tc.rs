//! eBPF programs attached to a link: TC BPF filters (rtnetlink dump through
//! [`crate::sys::bpf::tc`], works in any netns) and TCX programs (`BPF_PROG_QUERY` by ifindex,
//! resolved in the calling thread's netns).

use rtnetlink::Handle;

use super::netlink::LinkRecord;
use crate::sys::bpf::tc::{bpf_filter_names, filters};
use crate::sys::bpf::tcx::program_names;

/// TC BPF filters (ingress, egress) and TCX programs of a link, best effort: a link without a
/// clsact qdisc or a kernel without TCX simply has none.
pub(super) async fn ebpf_programs(handle: &Handle, r: &mut LinkRecord) {
    let filters = filters(handle, r.index).await.unwrap_or_default();
    let (any_filter, names) = bpf_filter_names(&filters);
    let tcx = program_names(&r.name);
    r.ebpf = any_filter || !tcx.is_empty();
    r.tc_filter_names = names;
    r.tcx_program_names = tcx;
}
