#!/usr/bin/env bash
# Builds crius and runs the daemon with its default configuration (/etc/crius/config.toml if
# present; socket /run/crius/crius.sock, data in /var/lib/crius). Pods get their network from
# the CNI plugins (Debian's containernetworking-plugins): when /etc/cni/net.d has no network
# list yet, crius's default bridge network (dist/cni, 10.89.0.0/16 on bridge crius0) goes there;
# an operator's own list always wins. Needs root. Arguments go to `crius daemon`.
#
# It builds only what runs: the static release binary, with cargo directly (what `cargo xtask
# dist` does), not through xtask, whose own debug build with every dependency came first and
# took about 13 of a first run's 29 minutes on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "run.sh: $*"; }
started=$SECONDS

say "installing the build dependencies (protoc, a C toolchain, the pinned Go toolchain) where missing"
hack/install-build-deps.sh
need=()
for p in containernetworking-plugins iptables; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
mkdir -p /etc/cni/net.d
if ! ls /etc/cni/net.d/*.conflist /etc/cni/net.d/*.conf /etc/cni/net.d/*.json >/dev/null 2>&1; then
    install -m 0644 dist/cni/10-crius-bridge.conflist /etc/cni/net.d/
    say "installed crius's default network list in /etc/cni/net.d"
fi

# The static release binary, as `cargo xtask dist` builds it (the same flags and place, so
# the bench and the package find it): target/dist/crius.
triple=$(rustc -vV | sed -n 's/^host: //p')
[ -n "$triple" ] || { echo "run.sh: rustc did not say its host triple" >&2; exit 1; }
flags_var="CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUSTFLAGS"
target_dir=${CARGO_TARGET_DIR:-target}
built_at=$SECONDS
say "building the release binary: cargo build --release --bin crius --target $triple (static; a first build compiles every dependency, many minutes on 2 cores)"
env "$flags_var=-C target-feature=+crt-static -C relocation-model=static" \
    cargo build --release --bin crius --target "$triple"
mkdir -p target/dist
# Copied aside and renamed over, so a running crius (its monitors) keeps its own file.
cp "$target_dir/$triple/release/crius" target/dist/crius.new
mv -f target/dist/crius.new target/dist/crius
say "built target/dist/crius in $((SECONDS - built_at)) s ($((SECONDS - started)) s since run.sh started)"

say "starting the daemon: target/dist/crius daemon $* (Ctrl-C stops it; pods keep running)"
exec ./target/dist/crius daemon "$@"
