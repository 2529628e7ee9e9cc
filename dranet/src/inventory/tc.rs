//! eBPF programs attached to a link: TC BPF filters (rtnetlink dump through
//! [`crate::bpf::tc`], works in any netns) and TCX programs (`BPF_PROG_QUERY` by ifindex,
//! resolved in the calling thread's netns).

use aya::programs::SchedClassifier;
use aya::programs::tc::TcAttachType;
use rtnetlink::Handle;

use super::netlink::LinkRecord;
use crate::bpf::tc::{bpf_filter_names, filters};

/// TC BPF filters (ingress, egress) and TCX programs of a link, best effort: a link without a
/// clsact qdisc or a kernel without TCX simply has none.
pub(super) async fn ebpf_programs(handle: &Handle, r: &mut LinkRecord) {
    let filters = filters(handle, r.index).await.unwrap_or_default();
    let (any_filter, names) = bpf_filter_names(&filters);
    let mut tcx: Vec<String> = Vec::new();
    for at in [TcAttachType::Ingress, TcAttachType::Egress] {
        if let Ok((_, progs)) = SchedClassifier::query_tcx(&r.name, at) {
            tcx.extend(progs.iter().filter_map(|p| p.name_as_str().map(str::to_owned)));
        }
    }
    tcx.sort();
    tcx.dedup();
    r.ebpf = any_filter || !tcx.is_empty();
    r.tc_filter_names = names;
    r.tcx_program_names = tcx;
}
