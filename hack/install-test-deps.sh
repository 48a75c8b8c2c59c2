#!/usr/bin/env bash
# Installs what crius's tests use on Debian 12: a real registry (docker-registry), htpasswd for its
# basic auth, busybox-static for test images, Debian's dynamically linked busybox unpacked aside
# (the conformance images' shell: it execs commands from PATH, as the real busybox image's does,
# where busybox-static runs its applets directly), a Python with a current grpcio (a CRI client on
# gRPC's C core), the CNI plugins and iptables (pod networks), criu (checkpoint and restore; its
# tests run in the VM tier), libseccomp's Python binding (an independent seccomp compiler the unit
# tests check crius's against), OpenBSD's netcat (the node e2e agnhost image's `nc`, which
# speaks UDP) and the build dependencies.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/install-build-deps.sh"
pkgs=(docker-registry apache2-utils busybox-static openssl iproute2 util-linux procps python3-venv
    containernetworking-plugins iptables criu python3-seccomp netcat-openbsd)
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
# gRPC's C core as current clients ship it (Debian's python3-grpcio is older and behaves
# differently), in a venv of its own.
grpcio=/opt/crius-test/grpcio
if ! "$grpcio/bin/python3" -c 'import grpc' 2>/dev/null; then
    /usr/bin/python3 -m venv "$grpcio"
    "$grpcio/bin/pip" install -q 'grpcio==1.85.3'
fi
# Debian's busybox conflicts with busybox-static as a package: its binary is unpacked aside.
busybox=/opt/crius-test/busybox
if ! "$busybox/bin/busybox" true 2>/dev/null; then
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download -q busybox >/dev/null 2>&1 || { apt-get update -qq && apt-get download -q busybox; })
    rm -rf "$busybox.new"
    dpkg-deb -x "$tmp"/busybox_*.deb "$busybox.new"
    rm -rf "$tmp" "$busybox"
    mv "$busybox.new" "$busybox"
fi
