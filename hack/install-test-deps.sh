#!/usr/bin/env bash
# Installs what crius's tests use on Debian 12: a real registry (docker-registry), htpasswd for its
# basic auth, busybox-static for test images, and the build dependencies.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/install-build-deps.sh"
pkgs=(docker-registry apache2-utils busybox-static openssl iproute2 util-linux procps)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian's package may start a registry on :5000 through its service; the tests run their own.
command -v systemctl >/dev/null && systemctl disable --now docker-registry >/dev/null 2>&1 || true
