#!/usr/bin/env bash
# Installs what the tests need and runs every tier: lint, unit tests, root integration tests on
# the host, the cgroup v2 tier in a qemu VM, and a smoke run of the benchmark against containerd.
# Run as root on a Debian 12 machine. This is the command CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-bench-deps.sh
hack/install-vm-deps.sh
exec cargo xtask ci
