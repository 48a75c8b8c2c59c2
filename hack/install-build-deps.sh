#!/usr/bin/env bash
# Installs what building crius needs on Debian 12: protoc for the CRI protobufs.
# The Rust toolchain is pinned in rust-toolchain.toml and comes from rustup.
set -euo pipefail
need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v cc >/dev/null || need+=(gcc libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
command -v cargo >/dev/null || { echo "cargo not found: install Rust with rustup (https://rustup.rs)" >&2; exit 1; }
