#!/usr/bin/env bash
# Builds the upstream parts crius's tests and bench drive, each with the Go toolchain from its
# published module at the version in hack/upstream.versions, into a cache keyed by part and
# version: /opt/crius-test/upstream/<part>-<version>/ (CRIUS_UPSTREAM moves it). A part already
# there is reused. One line per part says which, and how long it took.
#
#   hack/install-upstream.sh [ROLE...]   the roles named (default: every part but go, which
#                                        hack/install-build-deps.sh installs)
#   hack/install-upstream.sh --path ROLE the directory a role's part is (or would be) in
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
versions=$here/upstream.versions
cache=${CRIUS_UPSTREAM:-/opt/crius-test/upstream}

# The line of ROLE: "part version module [extra]".
line() {
    local l
    l=$(awk -v r="$1" '$1 == r { $1 = ""; print substr($0, 2); exit }' "$versions")
    [ -n "$l" ] || { echo "install-upstream: no role $1 in $versions" >&2; exit 2; }
    echo "$l"
}

# The version of crius's own programs: a digest of their sources, each file's path and
# content in path order (tests/common computes the same to find them).
sources_digest() {
    (cd "$here/clients" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) |
        LC_ALL=C sort | while read -r f; do printf '%s\n' "$f"; cat "$f"; done) |
        sha256sum | cut -c1-16
}

dir_of() {
    local part version _
    read -r part version _ <<<"$(line "$1")"
    [ "$version" = source ] && version=src-$(sources_digest)
    echo "$cache/$part-$version"
}

if [ "${1:-}" = --path ]; then
    dir_of "$2"
    exit 0
fi

# The Go toolchain: the proxy's toolchain module, checked against the digest pinned above.
install_go() {
    local dir zip version module want
    dir=$(dir_of go)
    [ -x "$dir/bin/go" ] && return 0
    read -r _ version module want <<<"$(line go)"
    zip=$(mktemp)
    curl -fsSL --retry 3 -o "$zip" \
        "${GOPROXY_URL:-https://proxy.golang.org}/$module/@v/v0.0.1-go$version.linux-amd64.zip"
    if [ "sha256:$(sha256sum "$zip" | cut -d' ' -f1)" != "$want" ]; then
        echo "install-upstream: the Go toolchain $version does not match $want" >&2
        rm -f "$zip"
        exit 1
    fi
    rm -rf "$dir.new"
    mkdir -p "$dir.new"
    unzip -q "$zip" -d "$dir.new"
    rm -f "$zip"
    # A module zip keeps no file modes: the executables are made so again.
    mv "$dir.new/$module@v0.0.1-go$version.linux-amd64" "$dir.new/go"
    chmod -R a+rX "$dir.new/go"
    chmod a+x "$dir.new/go/bin/"* "$dir.new/go/pkg/tool/"*/*
    mv "$dir.new/go" "$dir"
    rm -rf "$dir.new"
}

# A module of the script's own that requires MODULE at VERSION, where the part's packages are
# built: every other module at the version MODULE's go.mod requires. k8s.io/kubernetes
# requires its staging modules at v0.0.0: each is replaced by its release of the same minor.
wrapper() {
    local work=$1 module=$2 version=$3 gomod staging
    rm -rf "$work"
    mkdir -p "$work"
    printf 'module crius.test/upstream\n\ngo 1.26\n\nrequire %s %s\n' "$module" "$version" >"$work/go.mod"
    if [ "$module" = k8s.io/kubernetes ]; then
        gomod=$(cd "$work" && go mod download -json "$module@$version" | awk -F'"' '/"GoMod"/ { print $4 }')
        staging=v0.${version#v1.}
        awk '/^require \(/ { r = 1; next } r && /^\)/ { r = 0 } r && $2 == "v0.0.0" { print $1 }' "$gomod" |
            while read -r m; do echo "replace $m => $m $staging"; done >>"$work/go.mod"
    fi
}

# Builds ROLE's part into its directory with CMD (run in the wrapper module with $out set),
# unless it is there.
part() {
    local role=$1 build=$2 dir part version module started
    dir=$(dir_of "$role")
    read -r part version module _ <<<"$(line "$role")"
    version=${dir##*/"$part"-}
    if [ -f "$dir/.built" ]; then
        echo "install-upstream: $role ($part $version): reused, 0 s"
        return 0
    fi
    started=$(date +%s)
    rm -rf "$dir.new"
    mkdir -p "$dir.new"
    local work=$cache/build/$part-$version
    if [ "$module" = hack/clients ]; then
        rm -rf "$work"
        mkdir -p "$(dirname "$work")"
        cp -r "$here/clients" "$work"
    else
        wrapper "$work" "$module" "$version"
    fi
    if ! (cd "$work" && out=$dir.new version=$version module=$module "$build") >"$cache/build/$role.log" 2>&1; then
        echo "install-upstream: $role ($part $version): build failed:" >&2
        tail -40 "$cache/build/$role.log" >&2
        exit 1
    fi
    touch "$dir.new/.built"
    rm -rf "$dir"
    mv "$dir.new" "$dir"
    rm -rf "$work"
    echo "install-upstream: $role ($part $version): built, $(($(date +%s) - started)) s"
}

build_cri_tools() {
    local ld="-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$version"
    go build -ldflags "$ld" -o "$out/crictl" sigs.k8s.io/cri-tools/cmd/crictl
    # critest is the suite's test binary.
    go test -c -ldflags "$ld" -o "$out/critest" sigs.k8s.io/cri-tools/cmd/critest
}

# The version ldflags of a Kubernetes release's binaries: kubelet reports the version, and
# its feature gates are those of the release.
kubernetes_ldflags() {
    local minor=${version#v1.} ld="-s -w" pkg
    minor=${minor%%.*}
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    echo "$ld"
}

build_kubernetes() {
    go build -ldflags "$(kubernetes_ldflags)" -o "$out/kubelet" k8s.io/kubernetes/cmd/kubelet
}

# The node e2e suite's binaries, with kubelet's version ldflags (the suite compares the node's
# version with its own, and its feature gates are those of the release).
build_node_e2e() {
    local ld
    ld=$(kubernetes_ldflags)
    go test -c -ldflags "$ld" -o "$out/e2e_node.test" k8s.io/kubernetes/test/e2e_node
    # The suite starts the kubelet found beside its own binary.
    go build -ldflags "$ld" -o "$out/kubelet" k8s.io/kubernetes/cmd/kubelet
    go build -ldflags "-s -w" -o "$out/agnhost" k8s.io/kubernetes/test/images/agnhost
    # The ginkgo CLI at the version the suite was built with, for parallel runs.
    go build -ldflags "-s -w" -o "$out/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
    # agnhost's image version, which the suite's image list names, and the key and certificate
    # its image carries for netexec's https (the lifecycle specs' https hooks).
    local src
    src=$(go mod download -json "$module@$version" | awk -F'"' '/"Dir"/ { print $4 }')
    cat "$src/test/images/agnhost/VERSION" >"$out/agnhost.version"
    cp "$src/test/images/agnhost/porter/localhost.crt" "$src/test/images/agnhost/porter/localhost.key" "$out/"
}

build_containerd() {
    local ld="-s -w -X $module/version.Version=$version"
    go build -tags "urfave_cli_no_docs no_btrfs" -ldflags "$ld" -o "$out/containerd" "$module/cmd/containerd"
    go build -tags "urfave_cli_no_docs no_grpc" -ldflags "$ld" -o "$out/containerd-shim-runc-v2" \
        "$module/cmd/containerd-shim-runc-v2"
}

# CRI-O's daemon with cgo, as its releases are built, so the seccomp tag can compile
# RuntimeDefault profiles with libseccomp (libseccomp-dev and pkg-config); images are verified
# with Go's openpgp rather than gpgme and btrfs is left out, so no other C library is needed.
# Its version is a constant in its source: the ldflags give the commit the module was made from
# and a fixed build date. pinns, the C helper it pins pod namespaces with, is built from the
# module's own source, static as CRI-O's Makefile builds it.
build_crio() {
    local info src commit ld
    info=$(go mod download -json "$module@$version")
    src=$(awk -F'"' '/"Dir"/ { print $4 }' <<<"$info")
    commit=$(awk -F'"' '/"Hash"/ { print $4 }' <<<"$info")
    ld="-s -w -X $module/internal/version.buildCommit=${commit:-unknown}"
    ld+=" -X $module/internal/version.buildDate=1970-01-01T00:00:00Z"
    CGO_ENABLED=1 go build -tags "seccomp containers_image_openpgp exclude_graphdriver_btrfs" \
        -ldflags "$ld" -o "$out/crio" "$module/cmd/crio"
    cc -std=c99 -O3 -Wall -Wextra -static -o "$out/pinns" "$src"/pinns/src/*.c
    strip -s "$out/pinns"
}

build_cni_plugins() {
    local ld="-s -w -X $module/pkg/utils/buildversion.BuildVersion=$version" p
    for p in main/bridge main/loopback ipam/host-local meta/portmap meta/firewall meta/bandwidth meta/tuning; do
        go build -ldflags "$ld" -o "$out/${p#*/}" "$module/plugins/$p"
    done
}

build_clients() {
    go build -ldflags "-s -w" -o "$out/" ./...
}

install_go
PATH=$(dir_of go)/bin:$PATH
export PATH
export GOTOOLCHAIN=local GOPROXY=${GOPROXY:-https://proxy.golang.org} CGO_ENABLED=0
export GOFLAGS="-mod=mod -trimpath -buildvcs=false"
mkdir -p "$cache/build"

roles=("$@")
[ ${#roles[@]} -gt 0 ] || roles=(cri-tools cri-tools-oldest kubernetes kubernetes-oldest node-e2e containerd containerd-lts crio cni-plugins clients)
for role in "${roles[@]}"; do
    case $role in
    go) ;;
    cri-tools*) part "$role" build_cri_tools ;;
    kubernetes*) part "$role" build_kubernetes ;;
    node-e2e) part "$role" build_node_e2e ;;
    containerd*) part "$role" build_containerd ;;
    crio) part "$role" build_crio ;;
    cni-plugins) part "$role" build_cni_plugins ;;
    clients) part "$role" build_clients ;;
    *) echo "install-upstream: no part is built for role $role" >&2; exit 2 ;;
    esac
done
