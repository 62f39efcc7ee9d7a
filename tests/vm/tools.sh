#!/usr/bin/env bash
# Installs the host tools of the VM test from Debian's packages (idempotent; root only).
# qemu-utils must come from the same suite as qemu-system-x86: a newer qemu-utils (e.g.
# a backport) conflicts with the suite's qemu-system-x86, so it is pinned to that version.
vm_tools_install() {
    local pkgs=(qemu-system-x86 mmdebstrap grub-pc-bin fdisk ovmf python3 e2fsprogs util-linux mount dosfstools mtools)
    local missing=() p
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
    done
    local sysver utilsver
    sysver=$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null || true)
    utilsver=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
    if [ ${#missing[@]} -eq 0 ] && [ -n "$sysver" ] && [ "$sysver" = "$utilsver" ]; then
        return 0
    fi
    [ "$(id -u)" -eq 0 ] || { echo "vm: need root to apt-get install ${missing[*]} qemu-utils" >&2; return 1; }
    echo "vm: apt-get update" >&2
    apt-get update -qq
    local want
    want=$(apt-cache policy qemu-system-x86 | sed -n 's/^ *Candidate: //p')
    [ -n "$want" ] && [ "$want" != "(none)" ] || { echo "vm: no qemu-system-x86 candidate" >&2; return 1; }
    echo "vm: apt-get install ${missing[*]} qemu-utils=$want" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --allow-downgrades \
        "${missing[@]}" "qemu-system-x86=$want" "qemu-utils=$want" >/dev/null
}
if [ "${BASH_SOURCE[0]}" = "$0" ]; then set -euo pipefail; vm_tools_install; fi
