#!/usr/bin/env bash
# Installs the benchmark's parts from Debian 12: runc (every peer's runtime; the peers
# themselves are built by hack/install-upstream.sh), conmon (CRI-O's monitor), libseccomp-dev and
# pkg-config (CRI-O is built with cgo and its seccomp tag), pigz (containerd uses unpigz when it
# is on PATH), nftables (`nft`, which portmap's nftables backend runs), the registry and busybox
# for the images.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/install-test-deps.sh"
pkgs=(runc conmon libseccomp-dev pkg-config pigz nftables)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
