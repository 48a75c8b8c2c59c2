#!/usr/bin/env bash
# Installs what the tests need and runs every tier: lint, unit tests, root integration tests.
# Run as root on a Debian 12 machine. This is the command CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-bench-deps.sh
exec cargo xtask ci
