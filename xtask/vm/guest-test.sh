#!/bin/bash
# Runs inside the dranet test VM (chroot of the host root, see init.sh). Prints one line per case:
#   VMTEST <PASS|FAIL|SKIP|NOTDONE> <case> <seconds>s <detail>
# and "VMTEST END" last; details and raw outputs go to /tmp/out (the host's target/vm/run-*/out).
set -u
OUT=/tmp/out
. "$OUT/env"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp RUST_BACKTRACE=1
trap 'echo "VMTEST END"' EXIT

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
report() { echo "VMTEST $1 $2 $(since "$3")s $4"; }

echo "VMINFO kernel $(uname -r) nics: $(ls /sys/class/net | tr '\n' ' ')"

# Tier-B probes: dranet trace while a veth moves into a netns and the netns is deleted.
case_trace() {
    local t0 pid status moving released probes state_move state_put
    t0=$(now)
    "$DRANET" trace --json --duration 20 >"$OUT/trace.json" 2>"$OUT/trace.err" &
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
    bpftool prog show >"$OUT/bpf-progs.txt" 2>&1
    grep -E -A1 'dranet_put_net|dranet_dev_netns' "$OUT/bpf-progs.txt" | tr '\n' ' ' | sed 's/^/VMINFO bpf /'
    echo
    echo "VMINFO kallsyms $(grep -w -E '__put_net|__dev_change_net_namespace' /proc/kallsyms | tr '\n' ' ')"
    echo "VMINFO enabled_functions $(grep -E '__put_net|__dev_change_net_namespace' /sys/kernel/tracing/enabled_functions 2>&1 | tr '\n' ' ')"
    wait "$pid"
    status=$?
    probes=$(head -n 1 "$OUT/trace.json")
    state_move=$(echo "$probes" | grep -o '"name":"dev_netns_move"[^}]*' | head -n 1)
    state_put=$(echo "$probes" | grep -o '"name":"netns_put"[^}]*' | head -n 1)
    moving=$(grep '"kind":"device_moving"' "$OUT/trace.json" | grep -c '"vmt-b"')
    released=$(grep -c '"kind":"netns_released"' "$OUT/trace.json")
    echo "VMINFO probes dev_netns_move: $state_move"
    echo "VMINFO probes netns_put: $state_put"
    local detail="device_moving(vmt-b)=$moving netns_released=$released exit=$status"
    if echo "$state_move$state_put" | grep -q '"state":"unsupported"'; then
        report SKIP trace-tier-b "$t0" "tier B unsupported on $(uname -r): $state_move | $state_put"
    elif ! echo "$state_move" | grep -q '"state":"active"' || ! echo "$state_put" | grep -q '"state":"active"'; then
        report FAIL trace-tier-b "$t0" "probes not active: $state_move | $state_put"
    elif [ "$moving" -ge 1 ] && [ "$released" -ge 1 ] && [ "$status" -eq 0 ]; then
        report PASS trace-tier-b "$t0" "$detail"
    else
        report FAIL trace-tier-b "$t0" "$detail"
    fi
}

# Real NIC return and dranet's repair/rescue on a virtio NIC (dranet-sim/tests/vm_nic.rs).
case_nic() {
    local t0 name
    for name in kernel_returns_a_real_nic_down_when_its_netns_dies \
        dranet_repairs_a_nic_the_kernel_handed_back \
        pinned_nic_comes_home_before_the_netns_dies; do
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
        RDMA_FAILED="$what: $(tail -n 1 "$OUT/rdma.log")"
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
    RDMA_FAILED=""
    mode=$(rdma system show 2>&1)
    echo "VMINFO rdma system: $mode"
    if ! echo "$mode" | grep -q "netns exclusive"; then
        report FAIL rdma-exclusive "$t0" "not in exclusive mode: $mode"
        return
    fi
    ip netns add vmt-rdma
    ip netns attach vmt-host 1
    # shellcheck disable=SC2015
    rdma_step add rdma link add vmrxe0 type rxe netdev eth2 &&
        rdma_step rdma-in rdma dev set vmrxe0 netns vmt-rdma &&
        rdma_step check-in pod_has_rxe &&
        rdma_step nic-in ip link set eth2 netns vmt-rdma &&
        rdma_step check-rxe-survives-nic-move pod_has_rxe &&
        rdma_step rdma-out ip netns exec vmt-rdma rdma dev set vmrxe0 netns vmt-host &&
        rdma_step nic-out ip -n vmt-rdma link set eth2 netns 1 &&
        rdma_step check-out host_has_rxe &&
        rdma_step rdma-in-again rdma dev set vmrxe0 netns vmt-rdma &&
        rdma_step nic-in-again ip link set eth2 netns vmt-rdma &&
        rdma_step netns-del ip netns del vmt-rdma &&
        rdma_step back-by-kernel wait_for_rxe_home
    if [ -z "$RDMA_FAILED" ]; then
        report PASS rdma-exclusive "$t0" "rxe moved into a netns and back with eth2 by hand, and back by the kernel on netns death"
    else
        report FAIL rdma-exclusive "$t0" "$RDMA_FAILED (steps: $OUT/rdma.log)"
        sed 's/^/VMINFO rdma.log /' "$OUT/rdma.log"
    fi
    ip netns del vmt-rdma 2>/dev/null
    ip netns del vmt-host 2>/dev/null
}

wait_for_rxe_home() {
    for _ in $(seq 1 100); do
        host_has_rxe && [ -e /sys/class/net/eth2 ] && return 0
        sleep 0.1
    done
    return 1
}

for c in trace nic rdma; do
    case " $CASES " in
    *" $c "*) "case_$c" ;;
    *) echo "VMTEST NOTDONE $c 0s not run on kernel $KERNEL_LINE" ;;
    esac
done
