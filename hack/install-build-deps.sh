#!/usr/bin/env bash
# Installs what building crius needs on Debian 12: protoc and a C toolchain, and the Go
# toolchain (pinned in hack/upstream.versions, from the Go module proxy) that build.rs reads the
# CRI and NRI protocol definitions from their published modules with. The Rust toolchain is
# pinned in rust-toolchain.toml and comes from rustup.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v curl >/dev/null || need+=(curl ca-certificates)
command -v unzip >/dev/null || need+=(unzip)
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
"$here/install-upstream.sh" go
command -v cargo >/dev/null || { echo "cargo not found: install Rust with rustup (https://rustup.rs)" >&2; exit 1; }
