#!/usr/bin/env bash
# Runs the cargo-fuzz targets for a bounded time each (default 60 s):
#   nri          the NRI trunk through the real mux reader, ttrpc, dispatch and Plugin service
#   http         /healthz, /readyz, /metrics: the daemon's hyper service fed raw bytes
#   ethtool      the hand-written ethtool genetlink reply decoders
#   rdma         the RDMA nldev reply decoders
#   probe_event  the probes' ring-buffer record decoder
#   config       claim opaque parameters: strict JSON decoding + validation
#   dhcp         the DHCP receive path (IPv4/UDP framing, message, lease)
#   store        the checkpoint loader (decoding, format-1 migration, identifier checks; what it
#                accepts saves and loads back unchanged)
# Each target starts from the committed seeds in fuzz/corpus/<target>/ (read only) and grows
# its working corpus in fuzz/work/<target>/ (git-ignored); full logs go to
# fuzz/work/<target>.log. Prints libFuzzer's last lines (runs, cov, exec/s) per target and
# exits 1 if any target found a crash (the input is in fuzz/artifacts/<target>/).
# cargo-fuzz needs nightly flags; Debian's rustc is stable, so RUSTC_BOOTSTRAP=1 enables them.
# Installs cargo-fuzz once (idempotent). Usage: scripts/fuzz.sh [seconds] [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(nri http ethtool rdma probe_event config dhcp store)
fi
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1
export DRANET_EBPF_OBJECT="${DRANET_EBPF_OBJECT:-$PWD/target/ebpf/bpfel-unknown-none/release/dranet-ebpf}"
cd fuzz
failed=()
for target in "${targets[@]}"; do
  mkdir -p "work/$target"
  echo "== fuzz $target (${secs} s)"
  # --debug-assertions: overflow and debug_assert! failures count as crashes.
  if cargo fuzz run --sanitizer none --debug-assertions "$target" "work/$target" "corpus/$target" -- \
      -max_total_time="$secs" -max_len=65536 -timeout=30 -print_final_stats=1 >"work/$target.log" 2>&1; then
    grep -E '^#[0-9]+[[:space:]]+DONE|^Done [0-9]+ runs' "work/$target.log" | tail -3
  else
    tail -30 "work/$target.log"
    failed+=("$target")
  fi
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz: crashes or build failures in: ${failed[*]}" >&2
  exit 1
fi
