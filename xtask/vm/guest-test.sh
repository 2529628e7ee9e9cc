#!/bin/bash
# Runs inside the dranet test VM (chroot of the host root, see init.sh). Prints one line per case:
#   VMTEST <PASS|FAIL|SKIP|NOTDONE> <case> <seconds>s <detail>
# and "VMTEST END" last; details and raw outputs go to /tmp/out (the host's target/vm/run-*/out).
set -u
OUT=/tmp/out
. "$OUT/env"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp RUST_BACKTRACE=1
# The simulated runtime's NRI request timeout (2 s on a node, as CRI-O's and containerd's) scaled
# for qemu TCG, ~10x slower than the host: a 4-device RunPodSandbox took 2.4 s in the 6.12 and
# 5.10 guests on a loaded host (docs/kernels.md). dranet's own timeouts are unchanged.
export DRANET_SIM_REQUEST_TIMEOUT_MS=20000
trap 'echo "VMTEST END"' EXIT

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
report() { echo "VMTEST $1 $2 $(since "$3")s $4"; }

echo "VMINFO kernel $(uname -r) nics: $(ls /sys/class/net | tr '\n' ' ')"

# Tier-B probes: dranet trace while a veth moves into a netns and the netns is deleted (the
# nsfs path: the last reference goes with the bind mount), then while a netns dies with its
# only task (the exit path: free_nsproxy -> put_net).
released_count() { grep -c '"kind":"netns_released"' "$OUT/trace.json"; }
prog_runs() {
    bpftool prog show name "$1" 2>/dev/null | grep -o 'run_cnt [0-9]*' | awk '{ print $2 }' | grep . || echo 0
}
put_net_runs() {
    bpftool prog show name dranet_put_net 2>/dev/null | grep -o 'run_cnt [0-9]*' | awk '{ print $2 }' | grep . || echo 0
}

case_trace() {
    local t0 pid status moving rel_nsfs rel_exit probes state_move state_put state_nsfs runs_nsfs runs_exit nsfs_runs host_rel
    t0=$(now)
    "$DRANET" trace --json --duration 25 >"$OUT/trace.json" 2>"$OUT/trace.err" &
    pid=$!
    for _ in $(seq 1 900); do
        [ -s "$OUT/trace.json" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if [ ! -s "$OUT/trace.json" ]; then
        wait "$pid"
        report FAIL trace-tier-b "$t0" "dranet trace exited $? before its probe line: $(tail -c 300 "$OUT/trace.err" | tr '\n' ' ')"
        return
    fi
    echo "VMINFO trace started after $(since "$t0")s"
    sysctl -qw kernel.bpf_stats_enabled=1
    ip netns add vmt-trace
    ip link add vmt-a type veth peer name vmt-b
    ip link set vmt-b netns vmt-trace
    sleep 1
    ip netns del vmt-trace
    sleep 2
    rel_nsfs=$(released_count)
    runs_nsfs=$(put_net_runs)
    nsfs_runs=$(prog_runs dranet_nsfs_put)
    unshare -n true
    sleep 2
    rel_exit=$(($(released_count) - rel_nsfs))
    runs_exit=$(($(put_net_runs) - runs_nsfs))
    echo "VMINFO kallsyms $(grep -w -E '__put_net|netns_put|__dev_change_net_namespace' /proc/kallsyms | tr '\n' ' ')"
    wait "$pid"
    status=$?
    probes=$(head -n 1 "$OUT/trace.json")
    # dev_netns_move (fentry __dev_change_net_namespace), or on kernels without that function
    # (5.10) dev_netns_move_legacy (fentry dev_change_net_namespace): whichever is active.
    state_move=$(echo "$probes" | grep -o '"name":"dev_netns_move[a-z_]*"[^}]*' | grep '"state":"active"' | head -n 1)
    [ -n "$state_move" ] || state_move=$(echo "$probes" | grep -o '"name":"dev_netns_move"[^}]*' | head -n 1)
    state_put=$(echo "$probes" | grep -o '"name":"netns_put"[^}]*' | head -n 1)
    moving=$(grep '"kind":"device_moving"' "$OUT/trace.json" | grep -c '"vmt-b"')
    echo "VMINFO probes dev_netns_move: $state_move"
    echo "VMINFO probes netns_put: $state_put"
    if echo "$state_move$state_put" | grep -q '"state":"unsupported"'; then
        report KNOWN trace-tier-b "$t0" "tier B unsupported on $(uname -r): $state_move | $state_put"
        return
    fi
    if echo "$state_move" | grep -q '"state":"active"' && [ "$moving" -ge 1 ] && [ "$status" -eq 0 ]; then
        report PASS trace-dev-netns-move "$t0" "device_moving(vmt-b)=$moving"
    else
        report FAIL trace-dev-netns-move "$t0" "device_moving(vmt-b)=$moving exit=$status $state_move"
    fi
    if echo "$state_put" | grep -q '"state":"active"' && [ "$rel_exit" -ge 1 ]; then
        report PASS trace-netns-put-exit "$t0" "netns_released=$rel_exit (dranet_put_net ran $runs_exit times)"
    else
        report FAIL trace-netns-put-exit "$t0" "netns_released=$rel_exit (dranet_put_net ran $runs_exit times) $state_put"
    fi
    host_rel=$(grep '"kind":"netns_released"' "$OUT/trace.json" | grep -c "\"inode\":$(stat -L -c %i /proc/1/ns/net)")
    if [ "$host_rel" -eq 0 ]; then
        report PASS trace-no-host-release "$t0" "no netns_released for the host netns"
    else
        report FAIL trace-no-host-release "$t0" "$host_rel netns_released events name the host netns"
    fi
    state_nsfs=$(echo "$probes" | grep -o '"name":"netns_put_nsfs"[^}]*' | head -n 1)
    echo "VMINFO probes netns_put_nsfs: $state_nsfs"
    if echo "$state_put$state_nsfs" | grep -q '"state":"active"' && [ "$rel_nsfs" -ge 1 ]; then
        report PASS trace-netns-put-nsfs "$t0" "netns_released=$rel_nsfs (dranet_put_net ran $runs_nsfs times, dranet_nsfs_put ran $nsfs_runs times)"
    elif echo "$state_nsfs" | grep -q '"state":"active"'; then
        report FAIL trace-netns-put-nsfs "$t0" "netns_released=$rel_nsfs for ip netns del, want at least 1 (dranet_put_net ran $runs_nsfs times, dranet_nsfs_put ran $nsfs_runs times)"
    else
        report KNOWN trace-netns-put-nsfs "$t0" "no netns_released for ip netns del: fentry __put_net ran $runs_nsfs times and fentry netns_put is not available: $state_nsfs"
    fi
}

# Which tier each probe gets on this kernel and boot, in `dranet trace`'s probe table and the
# daemon's /metrics, against the matrix's expectation (EXPECT_PROBES, from the xtask).
case_tiers() {
    local t0 name=probe_tiers_in_trace_and_metrics_are_what_this_kernel_allows log
    t0=$(now)
    log="$OUT/tiers.log"
    if DRANET_VM_NIC=eth1 DRANET_VM_EXPECT_PROBES="$EXPECT_PROBES" "$VM_NIC_TEST" --exact "$name" \
        --test-threads=1 --nocapture >"$log" 2>&1 && grep -q "test result: ok. 1 passed" "$log"; then
        report PASS probe-tiers "$t0" "not active: $(grep '^probe tier ' "$log" | grep -v ': active' | sed 's/^probe tier //' | tr '\n' ';' | cut -c 1-900)"
    else
        report FAIL probe-tiers "$t0" "$(grep -E 'panicked|Error|error|trace:|metrics:' "$log" | head -n 6 | tr '\n' ' ' | cut -c 1-600)"
    fi
    grep '^probe tier' "$log" | sed 's/^/VMINFO /'
}

# Real NIC return, dranet's repair/rescue and adoption on a virtio NIC (dranet-sim/tests/vm_nic.rs).
case_nic() {
    local t0 name
    for name in kernel_returns_a_real_nic_down_when_its_netns_dies \
        kernel_names_a_returned_nic_devn_when_its_name_is_taken \
        dranet_repairs_a_nic_the_kernel_handed_back \
        pinned_nic_comes_home_before_the_netns_dies \
        a_nic_moved_in_by_hand_is_adopted_at_synchronize_and_comes_home_in_crio_order \
        a_daemon_with_a_wiped_state_dir_adopts_its_nic_and_brings_it_home_in_crio_order; do
        t0=$(now)
        if DRANET_VM_NIC=eth1 "$VM_NIC_TEST" --exact "$name" --test-threads=1 --nocapture \
            >"$OUT/nic-$name.log" 2>&1 && grep -q "test result: ok. 1 passed" "$OUT/nic-$name.log"; then
            report PASS "nic:$name" "$t0" "$(grep -E 'returned|rescued' "$OUT/nic-$name.log" | head -n 1)"
        else
            report FAIL "nic:$name" "$t0" "$(grep -E 'panicked|Error|error' "$OUT/nic-$name.log" | head -n 2 | tr '\n' ' ' | cut -c 1-300)"
        fi
    done
}

# RDMA exclusive mode (7.3): rxe on eth2 into a netns with its NIC, back by hand, and back by
# the kernel when the netns dies. Each step and the devices after it go to $OUT/rdma.log.
rdma_step() {
    local what=$1
    shift
    echo "== $what: $*" >>"$OUT/rdma.log"
    if ! "$@" >>"$OUT/rdma.log" 2>&1; then
        echo "   failed" >>"$OUT/rdma.log"
        RDMA_FAILED="step $what failed: $(grep -v '^==' "$OUT/rdma.log" | tail -n 2 | head -n 1 | tr -s ' ' | cut -c 1-160)"
        return 1
    fi
    {
        echo "   host: $(rdma dev show 2>&1 | tr '\n' ' ')"
        echo "   pod:  $(ip netns exec vmt-rdma rdma dev show 2>&1 | tr '\n' ' ')"
    } >>"$OUT/rdma.log"
}

host_has_rxe() { rdma dev show 2>/dev/null | grep -q vmrxe0; }
pod_has_rxe() { ip netns exec vmt-rdma rdma dev show 2>/dev/null | grep -q vmrxe0; }

case_rdma() {
    local t0 mode
    t0=$(now)
    mode=$(rdma system show 2>&1)
    echo "VMINFO rdma system: $mode"
    if ! echo "$mode" | grep -q "netns exclusive"; then
        report FAIL rdma-exclusive "$t0" "not in exclusive mode: $mode"
        return
    fi
    if [ "$KERNEL_LINE" != 7.3 ]; then
        # rxe has no disassociate_ucontext before 7.3: the move must be refused.
        rdma_dranet unsupported
        return
    fi
    ip netns attach vmt-host 1
    # 1. The RDMA device alone: in, back by hand, in again, back by the kernel on netns death.
    RDMA_FAILED=""
    ip netns add vmt-rdma
    rdma_step add rdma link add vmrxe0 type rxe netdev eth2 &&
        rdma_step rdma-in rdma dev set vmrxe0 netns vmt-rdma &&
        rdma_step check-in pod_has_rxe &&
        rdma_step rdma-out ip netns exec vmt-rdma rdma dev set vmrxe0 netns vmt-host &&
        rdma_step check-out host_has_rxe &&
        rdma_step rdma-in-again rdma dev set vmrxe0 netns vmt-rdma &&
        rdma_step netns-del ip netns del vmt-rdma &&
        rdma_step back-by-kernel wait_for_rxe_home
    if [ -z "$RDMA_FAILED" ]; then
        report PASS rdma-exclusive "$t0" "vmrxe0 into a netns, back by hand, back by the kernel on netns death"
    else
        report FAIL rdma-exclusive "$t0" "$RDMA_FAILED (steps: $OUT/rdma.log)"
    fi
    ip netns del vmt-rdma 2>/dev/null
    # 2. With its NIC, as dranet moves a RoCE device: RDMA device first, then the netdev; and
    # the other order.
    rdma_with_nic rdma-first
    rdma_with_nic netdev-first
    ip netns del vmt-host 2>/dev/null
    rdma link delete vmrxe0 2>/dev/null
    sed 's/^/VMINFO rdma.log /' "$OUT/rdma.log"
    rdma_dranet supported
}

# dranet's own RDMA netlink move (dranet-sim/tests/vm_nic.rs) on a fresh rxe over eth2.
rdma_dranet() {
    local t0 name=dranet_moves_an_rdma_device_in_exclusive_mode log
    t0=$(now)
    log="$OUT/nic-$name.log"
    if DRANET_VM_NIC=eth1 DRANET_VM_RDMA=eth2 DRANET_VM_RDMA_EXPECT=$1 "$VM_NIC_TEST" --exact "$name" \
        --test-threads=1 --nocapture >"$log" 2>&1 && grep -q "test result: ok. 1 passed" "$log"; then
        report PASS "rdma:$name" "$t0" "expect=$1: $(grep -E 'returned|refused' "$log" | head -n 1)"
    else
        report FAIL "rdma:$name" "$t0" "expect=$1: $(grep -E 'panicked|Error|error' "$log" | head -n 2 | tr '\n' ' ' | cut -c 1-300)"
    fi
}

rdma_with_nic() {
    local t0 order=$1
    t0=$(now)
    RDMA_FAILED=""
    ip netns add vmt-rdma
    echo "== order $order" >>"$OUT/rdma.log"
    if ! host_has_rxe; then
        rdma_step add-again rdma link add vmrxe0 type rxe netdev eth2
    fi
    if [ -z "$RDMA_FAILED" ]; then
        if [ "$order" = rdma-first ]; then
            rdma_step rdma-in rdma dev set vmrxe0 netns vmt-rdma &&
                rdma_step nic-in ip link set eth2 netns vmt-rdma
        else
            rdma_step nic-in ip link set eth2 netns vmt-rdma &&
                rdma_step rdma-in rdma dev set vmrxe0 netns vmt-rdma
        fi &&
            rdma_step rxe-still-there-with-its-netdev-moved pod_has_rxe &&
            rdma_step rdma-out ip netns exec vmt-rdma rdma dev set vmrxe0 netns vmt-host &&
            rdma_step nic-out ip -n vmt-rdma link set eth2 netns 1 &&
            rdma_step check-out host_has_rxe
    fi
    if [ -z "$RDMA_FAILED" ]; then
        report PASS "rdma-with-nic:$order" "$t0" "vmrxe0 and eth2 into a netns and back"
    else
        report KNOWN "rdma-with-nic:$order" "$t0" "soft-RoCE unregisters when its netdev changes netns; $RDMA_FAILED; rdma dev: host [$(rdma dev show 2>&1 | tr '\n' ' ')] pod [$(ip netns exec vmt-rdma rdma dev show 2>&1 | tr '\n' ' ')]"
    fi
    ip -n vmt-rdma link set eth2 netns 1 2>/dev/null
    ip netns del vmt-rdma 2>/dev/null
}

# Tier B with the BPF LSM (boot with lsm=...,bpf): lsm/sb_umount is active (and the fentry
# fallback stands down), and `ip netns del` shows up as nsfs_unmounting with the netns inode.
case_lsm() {
    local t0 pid status probes state_lsm state_fentry count lsms
    t0=$(now)
    "$DRANET" trace --json --duration 12 >"$OUT/trace-lsm.json" 2>"$OUT/trace-lsm.err" &
    pid=$!
    for _ in $(seq 1 900); do
        [ -s "$OUT/trace-lsm.json" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    lsms=$(cat /sys/kernel/security/lsm 2>/dev/null)
    echo "VMINFO lsm: $lsms"
    ip netns add vmt-lsm
    sleep 1
    ip netns del vmt-lsm
    sleep 2
    wait "$pid"
    status=$?
    probes=$(head -n 1 "$OUT/trace-lsm.json")
    state_lsm=$(echo "$probes" | grep -o '"name":"nsfs_umount"[^}]*' | head -n 1)
    state_fentry=$(echo "$probes" | grep -o '"name":"nsfs_umount_fentry"[^}]*' | head -n 1)
    count=$(grep -c '"kind":"nsfs_unmounting"' "$OUT/trace-lsm.json")
    echo "VMINFO probes nsfs_umount: $state_lsm"
    echo "VMINFO probes nsfs_umount_fentry: $state_fentry"
    if ! echo ",$lsms," | grep -q ',bpf,'; then
        report FAIL lsm-sb-umount "$t0" "booted with lsm=...,bpf but the active LSMs are [$lsms]"
    elif echo "$state_lsm" | grep -q '"state":"active"' && [ "$count" -ge 1 ] && [ "$status" -eq 0 ]; then
        report PASS lsm-sb-umount "$t0" "nsfs_unmounting=$count; fentry fallback: $(echo "$state_fentry" | grep -o '"state":"[a-z]*"')"
    else
        report FAIL lsm-sb-umount "$t0" "nsfs_unmounting=$count exit=$status $state_lsm"
    fi
}

# The daemon end to end in the guest (dranet-sim/tests/e2e.rs: `dranet run` with the kubelet
# and NRI harnesses) in CRI-O order, with this kernel's probes (tier B where it loads).
case_e2e() {
    local t0 name
    for name in crio_1_alive crio_4_down_during_teardown stop_hook_missing_entirely; do
        t0=$(now)
        if "$E2E_TEST" --exact "$name" --test-threads=1 >"$OUT/e2e-$name.log" 2>&1 &&
            grep -q "test result: ok. 1 passed" "$OUT/e2e-$name.log"; then
            report PASS "e2e:$name" "$t0" ""
        else
            report FAIL "e2e:$name" "$t0" "$(grep -E 'panicked|Error|error' "$OUT/e2e-$name.log" | head -n 2 | tr '\n' ' ' | cut -c 1-300)"
        fi
    done
}

# interface.vrf and the IP sysctls on a kernel with vrf.ko (the CI kernel has no VRF, so there
# dranet-sim/tests/rescue.rs only checks the clear refusal).
case_vrf() {
    local t0 name
    for name in vrf_enslaves_the_device_and_takes_its_routes_or_fails_clearly \
        a_vrf_name_taken_by_another_device_in_the_pod_is_refused_and_rolled_back \
        arp_and_forwarding_are_set_in_the_pod_and_host_ip_sysctls_come_back; do
        t0=$(now)
        if DRANET_EXPECT_VRF=1 "$RESCUE_TEST" --exact "$name" --test-threads=1 >"$OUT/vrf-$name.log" 2>&1 &&
            grep -q "test result: ok. 1 passed" "$OUT/vrf-$name.log"; then
            report PASS "vrf:$name" "$t0" ""
        else
            report FAIL "vrf:$name" "$t0" "$(grep -E 'panicked|Error|error' "$OUT/vrf-$name.log" | head -n 2 | tr '\n' ' ' | cut -c 1-300)"
        fi
    done
}

wait_for_rxe_home() {
    for _ in $(seq 1 100); do
        host_has_rxe && [ -e /sys/class/net/eth2 ] && return 0
        sleep 0.1
    done
    return 1
}

for c in tiers trace nic rdma vrf lsm e2e; do
    case " $CASES " in
    *" $c "*) "case_$c" ;;
    *) echo "VMTEST NOTDONE $c 0s not in this boot of $KERNEL_LINE (cases: $CASES)" ;;
    esac
done
