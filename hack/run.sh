#!/usr/bin/env bash
# Builds crius and runs the daemon with its default configuration (/etc/crius/config.toml if
# present; socket /run/crius/crius.sock, data in /var/lib/crius). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-build-deps.sh
cargo xtask dist
exec ./target/dist/crius daemon "$@"
