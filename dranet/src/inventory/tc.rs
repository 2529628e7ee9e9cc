//! eBPF programs attached to a link: TC BPF filters (rtnetlink dump, works in any netns) and
//! TCX programs (`BPF_PROG_QUERY` by ifindex, resolved in the calling thread's netns).

use aya::programs::SchedClassifier;
use aya::programs::tc::TcAttachType;
use futures::TryStreamExt;
use netlink_packet_route::tc::{TcAttribute, TcFilterBpfOption, TcMessage, TcOption};
use rtnetlink::Handle;

use super::netlink::LinkRecord;

/// TC BPF filters (ingress, egress) and TCX programs of a link, best effort: a link without a
/// clsact qdisc or a kernel without TCX simply has none.
pub(super) async fn ebpf_programs(handle: &Handle, r: &mut LinkRecord) {
    let Ok(index) = i32::try_from(r.index) else {
        return;
    };
    let mut filters = Vec::new();
    for egress in [false, true] {
        let mut tf = handle.traffic_filter(index);
        let req = if egress {
            tf.get().egress()
        } else {
            tf.get().ingress()
        };
        if let Ok(msgs) = req.execute().try_collect::<Vec<TcMessage>>().await {
            filters.extend(msgs);
        }
    }
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

/// Whether any filter is a `bpf` one, and the program names of those that carry one.
fn bpf_filter_names(filters: &[TcMessage]) -> (bool, Vec<String>) {
    let mut any = false;
    let mut names = Vec::new();
    for f in filters {
        let is_bpf = f
            .attributes
            .iter()
            .any(|a| matches!(a, TcAttribute::Kind(k) if k == "bpf"));
        if !is_bpf {
            continue;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpf_filter_names_from_tc_dumps() {
        let msg = |kind: &str, name: Option<&str>| {
            let mut m = TcMessage::default();
            m.attributes.push(TcAttribute::Kind(kind.to_owned()));
            if let Some(n) = name {
                m.attributes.push(TcAttribute::Options(vec![TcOption::Bpf(
                    TcFilterBpfOption::ProgName(n.to_owned()),
                )]));
            }
            m
        };
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
}
