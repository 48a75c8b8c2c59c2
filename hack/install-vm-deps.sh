#!/usr/bin/env bash
# Installs the VM test tier's parts on Debian 12: qemu and a 6.12 kernel from bookworm-backports
# (6.12 has tmpfs noswap; the backports qemu also avoids a clash with backports qemu-utils),
# Debian 12's own 6.1 kernel beside it (the layer suite boots it: no overlay `lowerdir+`),
# busybox-static for the initramfs, the tools that unpack kernel modules, and apparmor_parser
# (the VM kernel runs AppArmor, so the AppArmor tests run there), systemd with the D-Bus
# system bus (a second VM boots them for the systemd cgroup driver test), and Debian's SELinux
# reference policy with the tools to load it and to add hack/selinux's container types (a third
# VM boots with SELinux; the host's own kernel does not run it, so nothing changes here).
set -euo pipefail
list=/etc/apt/sources.list.d/bookworm-backports.list
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "deb http://deb.debian.org/debian bookworm-backports main" > "$list"
fi
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
ls /boot/vmlinuz-6.12* >/dev/null 2>&1 || need+=(linux-image-6.12-amd64)
for p in busybox-static cpio xz-utils zstd kmod apparmor systemd dbus \
    selinux-policy-default policycoreutils selinux-utils checkpolicy semodule-utils; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends -t bookworm-backports "${need[@]}"
fi
if ! ls /boot/vmlinuz-6.1.* >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # bookworm's own candidate (6.1), not backports'.
    apt-get install -y -qq --no-install-recommends linux-image-amd64
fi
# The container types the SELinux test labels with, once.
if ! semodule -l 2>/dev/null | grep -qx crius_container; then
    work=$(mktemp -d)
    here=$(cd "$(dirname "$0")" && pwd)
    checkmodule -M -m -o "$work/crius_container.mod" "$here/selinux/crius_container.te"
    semodule_package -o "$work/crius_container.pp" -m "$work/crius_container.mod"
    semodule -i "$work/crius_container.pp"
    rm -rf "$work"
fi
