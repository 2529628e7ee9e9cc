#!/usr/bin/env bash
# Installs what dranet needs to build its eBPF programs and run its root tests, idempotently:
# a second run checks and changes nothing (well under a few seconds).
#
#   Debian packages : rustc-web cargo-web rust-web-src (rustc 1.96 + its library sources for -Z build-std),
#                     llvm-22-dev libpolly-22-dev (for bpf-linker), bpftool, iproute2, build-essential,
#                     dnsmasq-base (the DHCP server of the DHCP client tests; the binary only, no
#                     system service that would start and take port 53), pci.ids (the PCI name
#                     database the inventory reads, as in the image; its tests check it in CI),
#                     strace (the test that embedded mode dials nothing off the machine),
#                     runc and containernetworking-plugins (bridge, host-local, loopback) for the
#                     real-containerd suite (containerd itself: `cargo xtask runtimes`, unpacked
#                     under target/runtimes/, never installed system-wide)
#   bpf-linker      : 0.13.0 built against LLVM 22 (same LLVM as Debian's rustc 1.96)
#   grpcio          : 1.84.0 from PyPI for the python3 on PATH, where it has pip (the gRPC C-core
#                     client that dranet-sim/tests/grpc_authority.rs runs against the kubelet
#                     sockets; that test fails under CI=true without it). Skipped, with a note,
#                     where python3 or pip is missing (the image's build stage).
#
# Knobs: BPF_LINKER_VERSION (0.13.0), BPF_LINKER_ROOT (cargo install --root, default ~/.cargo),
#        GRPCIO_VERSION (1.84.0),
#        EXTRA_PACKAGES (space separated, e.g. "qemu-system-x86 busybox-static" for the VM tests).
set -euo pipefail

BPF_LINKER_VERSION=${BPF_LINKER_VERSION:-0.13.0}
BPF_LINKER_ROOT=${BPF_LINKER_ROOT:-$HOME/.cargo}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

log() { printf '[install-toolchain] %s\n' "$*" >&2; }

packages=(rustc-web cargo-web rust-web-src llvm-22-dev libpolly-22-dev bpftool iproute2 build-essential
  pkg-config kmod util-linux dnsmasq-base pci.ids runc containernetworking-plugins strace)
# shellcheck disable=SC2206
[ -n "${EXTRA_PACKAGES:-}" ] && packages+=(${EXTRA_PACKAGES})

missing=()
for p in "${packages[@]}"; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$st" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "Debian packages: all present"
fi

# Sanity checks: Debian rustc must be on LLVM 22 and carry its library sources.
llvm_major=$(/usr/bin/rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
[ "$llvm_major" = "22" ] || { log "error: /usr/bin/rustc uses LLVM '$llvm_major', need 22"; exit 1; }
sysroot=$(/usr/bin/rustc --print sysroot)
[ -f "$sysroot/lib/rustlib/src/rust/library/core/Cargo.toml" ] ||
  { log "error: rust-web-src sources missing under $sysroot/lib/rustlib/src/rust"; exit 1; }
/usr/bin/rustc --print target-list | grep -qx bpfel-unknown-none ||
  { log "error: rustc lacks target bpfel-unknown-none"; exit 1; }

linker="$BPF_LINKER_ROOT/bin/bpf-linker"
if [ -x "$linker" ] && [ "$("$linker" --version 2>/dev/null)" = "bpf-linker $BPF_LINKER_VERSION" ] &&
  ldd "$linker" 2>/dev/null | grep -q 'libLLVM.so.22'; then
  log "bpf-linker $BPF_LINKER_VERSION (LLVM 22): present"
else
  log "building bpf-linker $BPF_LINKER_VERSION against LLVM 22"
  # LLVM_PREFIX: otherwise bpf-linker's build.rs finds /usr/bin/llvm-config (LLVM 14 on bookworm).
  env -u RUSTUP_TOOLCHAIN -u RUSTFLAGS RUSTC=/usr/bin/rustc LLVM_PREFIX=/usr/lib/llvm-22 \
    /usr/bin/cargo install --locked --force "bpf-linker@$BPF_LINKER_VERSION" \
    --no-default-features --features llvm-22 --root "$BPF_LINKER_ROOT"
fi

GRPCIO_VERSION=${GRPCIO_VERSION:-1.84.0}
if python3 -c "import grpc, sys; sys.exit(grpc.__version__ != '$GRPCIO_VERSION')" 2>/dev/null; then
  log "grpcio $GRPCIO_VERSION: present"
elif command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
  log "installing grpcio $GRPCIO_VERSION (pip)"
  # PIP_BREAK_SYSTEM_PACKAGES: a Debian python3 is "externally managed" (PEP 668); pyenv's is not.
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    "grpcio==$GRPCIO_VERSION"
else
  log "note: no python3 with pip: grpcio not installed (dranet-sim's grpc_authority test needs it)"
fi

# tracefs: the syscall tracepoints need it (the daemon mounts it too; this helps the tests).
if [ ! -d /sys/kernel/tracing/events ] && [ "$(id -u)" -eq 0 ]; then
  mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || log "warning: could not mount tracefs"
fi
log "done"
