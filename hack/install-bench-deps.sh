#!/usr/bin/env bash
# Installs the benchmark's peer and parts on Debian 12: containerd (with its CRI plugin) and runc,
# the CNI plugins (containerd's pods get the loopback plugin), pigz (containerd uses unpigz when it
# is on PATH), the registry and busybox for the images.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/install-test-deps.sh"
pkgs=(containerd runc containernetworking-plugins pigz)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The package enables a system containerd; the benchmark runs its own, privately.
command -v systemctl >/dev/null && systemctl disable --now containerd >/dev/null 2>&1 || true
