#!/usr/bin/env bash
# Installs what the tests need and runs every tier: lint, unit tests, root integration tests on
# the host, critest, the cgroup v2 tier in a qemu VM (the kubelet tier among it), and a smoke run
# of the benchmark against containerd.
# Run as root on a Debian 12 machine. This is the command CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-build-deps.sh
# CI builds a clean clone once: incremental compilation's caches would only cost CPU there
# (crius's library took 160 CPU-seconds with them and 109 without).
export CARGO_INCREMENTAL=0
# The first build (every debug target: xtask, crius, its unit and integration tests and every
# dependency, in one cargo run so the crates compile side by side; over ten minutes) needs only
# the build dependencies, so the tests' parts (minutes of apt on a fresh machine: qemu, two
# kernels, containerd) install beside it, their output printed after. Its test binaries are the
# ones `cargo xtask ci`'s test stages run (the same units).
log=$(mktemp)
(hack/install-bench-deps.sh && hack/install-vm-deps.sh) >"$log" 2>&1 &
installs=$!
built=0
cargo build --quiet --workspace --all-targets || built=$?
installed=0
wait "$installs" || installed=$?
cat "$log"
rm -f "$log"
if [ "$installed" != 0 ]; then
    echo "hack/test.sh: installing the tests' parts failed (exit $installed; its output is above)" >&2
    exit "$installed"
fi
[ "$built" = 0 ] || exit "$built"
# The upstream parts the tiers drive (critest, crictl, kubelet, containerd, the CNI plugins,
# crius's own client-go and NRI programs), each from its module at its pinned version; a warm
# cache builds none. After the build: both want the two cores.
hack/install-upstream.sh
exec cargo xtask ci
