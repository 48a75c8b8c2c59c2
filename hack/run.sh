#!/usr/bin/env bash
# Builds crius and runs the daemon with its default configuration (/etc/crius/config.toml if
# present; socket /run/crius/crius.sock, data in /var/lib/crius). Pods get their network from
# the CNI plugins (Debian's containernetworking-plugins): when /etc/cni/net.d has no network
# list yet, crius's default bridge network (dist/cni, 10.89.0.0/16 on bridge crius0) goes there;
# an operator's own list always wins. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-build-deps.sh
need=()
for p in containernetworking-plugins iptables; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
mkdir -p /etc/cni/net.d
if ! ls /etc/cni/net.d/*.conflist /etc/cni/net.d/*.conf /etc/cni/net.d/*.json >/dev/null 2>&1; then
    install -m 0644 dist/cni/10-crius-bridge.conflist /etc/cni/net.d/
    echo "run.sh: installed crius's default network list in /etc/cni/net.d"
fi
cargo xtask dist
exec ./target/dist/crius daemon "$@"
