#!/usr/bin/env bash
# Runs the cargo-fuzz targets (NRI frame decoder, opaque config parsing, DHCP receive path) for a
# bounded time each (default 60 s).
# cargo-fuzz needs nightly flags; Debian's rustc is stable, so RUSTC_BOOTSTRAP=1 enables them.
# Installs cargo-fuzz once (idempotent). Usage: scripts/fuzz.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1
export DRANET_EBPF_OBJECT="${DRANET_EBPF_OBJECT:-$PWD/target/ebpf/bpfel-unknown-none/release/dranet-ebpf}"
cd fuzz
for target in frames config dhcp; do
  mkdir -p "corpus/$target"
  echo "== fuzz $target (${secs} s)"
  cargo fuzz run --sanitizer none "$target" "corpus/$target" -- -max_total_time="$secs" -max_len=65536 2>&1 | tail -2
done
