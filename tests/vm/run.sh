#!/usr/bin/env bash
# The VM test: inplaced on a real Debian node under real systemd, installed from its own
# .deb, driven from the host over its mTLS API (and through inplace-extension), with a
# real update-grub, real reboots and a real /proc/cmdline. QEMU with TCG (no KVM needed).
#
#   bash tests/vm/run.sh             # as root; prints `vm: N passed, M failed` last
#
# It installs its tools (tests/vm/tools.sh), builds the .deb (packaging/check.sh, unless
# INPLACED_VM_DEB names one), the stand-in kubelet and the host clients, builds or reuses
# the cached base image (tests/vm/image.sh, cached under /var/cache/inplaced-vm), installs
# the package into a per-run copy of it, boots it and runs the scenarios. Logs (serial
# console of every boot, the guest journal on failure) land in <target>/vm-logs.
# INPLACED_VM_ONLY="1 2" runs only those scenarios (plus what they depend on being booted).
set -uo pipefail
shopt -s inherit_errexit 2>/dev/null || true
cd "$(dirname "$0")/../.."
repo=$(pwd)
t_start=$SECONDS
# shellcheck source=tests/vm/lib.sh
. tests/vm/lib.sh
. tests/vm/tools.sh

[ "$(id -u)" -eq 0 ] || { say "run as root (loop devices, chroot, apt-get)"; exit 1; }

target_dir=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
logdir=$target_dir/vm-logs
rm -rf "$logdir" && mkdir -p "$logdir"
work=$(mktemp -d /dev/shm/inplaced-vm-run.XXXXXX)
share=$work/share
disk=$work/disk.raw
pki=$work/pki
bin=$target_dir/debug
# the host's loopback port QEMU forwards to the agent's remote API (guest 0.0.0.0:9443)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$share/cmd"
# the closing line also when setup fails before the scenarios
closed=
vm_exit() {
    local rc=$?
    [ -n "$closed" ] || echo "vm: 0 passed, 1 failed (setup failed: see above)"
    vm_cleanup
    [ -n "$closed" ] || exit 1
    exit "$rc"
}
trap vm_exit EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------
# tools, builds, image

t0=$SECONDS
vm_tools_install || { say "installing the tools failed"; exit 1; }
timing "tool install" $((SECONDS - t0))

t0=$SECONDS
deb=${INPLACED_VM_DEB:-}
if [ -z "$deb" ]; then
    bash packaging/check.sh >"$logdir/packaging.log" 2>&1 || { tail -40 "$logdir/packaging.log"; say "packaging/check.sh failed"; exit 1; }
    deb=$(ls "$target_dir"/packages/*.deb)
fi
[ -f "$deb" ] || { say "no .deb at $deb"; exit 1; }
cargo build --locked --quiet --bins --example gen-certs || { say "host build failed"; exit 1; }
CARGO_TARGET_DIR=$target_dir/vm-standin cargo build --locked --quiet --release \
    --manifest-path tests/vm/kubelet-standin/Cargo.toml || { say "stand-in kubelet build failed"; exit 1; }
standin=$target_dir/vm-standin/release/kubelet-standin
"$bin/examples/gen-certs" "$pki" >/dev/null
timing "builds" $((SECONDS - t0))

t0=$SECONDS
image=$(bash tests/vm/image.sh) || { say "image build failed"; exit 1; }
timing "image (build or cache)" $((SECONDS - t0))

# The newer build for scenario 7: the same package with a higher version and binaries
# that differ (a trailing marker after the ELF image, which the loader ignores), so the
# running and the installed daemon can be told apart by their hashes.
deb_version=$(dpkg-deb -f "$deb" Version)
new_version=$deb_version+vm1
rm -rf "$work/newdeb" && dpkg-deb -R "$deb" "$work/newdeb"
printf '\ninplaced-vm-upgrade-marker %s\n' "$new_version" >>"$work/newdeb/usr/bin/inplaced"
sed -i "s/^Version: .*/Version: $new_version/" "$work/newdeb/DEBIAN/control"
(cd "$work/newdeb" && find usr etc -type f -print0 2>/dev/null | sort -z | xargs -0 md5sum) >"$work/newdeb/DEBIAN/md5sums" 2>/dev/null || true
dpkg-deb --root-owner-group -Zgzip -b "$work/newdeb" "$share/inplaced-new.deb" >/dev/null
new_sha=$(sha256sum "$work/newdeb/usr/bin/inplaced" | cut -d' ' -f1)
old_sha=$(dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/bin/inplaced | sha256sum | cut -d' ' -f1)
rm -rf "$work/newdeb"

# ---------------------------------------------------------------------------------------
# the per-run disk: the cached image with the package, the kubelet and the test's config

# prepare_disk IMAGE ROOTPART: $disk from the cached image, with the package (dpkg -i in
# the chroot), the stand-in kubelet under kubeadm's unit layout and the agent's config
prepare_disk() {
    local t0=$SECONDS
    qemu-img convert -O raw "$1" "$disk"
    disk_mount "$2"
    cp "$deb" "$mnt/tmp/inplaced.deb"
    if ! chroot "$mnt" env PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg -i /tmp/inplaced.deb >"$logdir/dpkg-install.log" 2>&1; then
        cat "$logdir/dpkg-install.log"
        say "dpkg -i in the image failed"
        return 1
    fi
    rm -f "$mnt/tmp/inplaced.deb"
    g=tests/vm/guest
    install -m 0755 "$g/vm-runner" "$mnt/usr/local/sbin/vm-runner"
    install -m 0644 "$g/vm-runner.service" "$mnt/etc/systemd/system/vm-runner.service"
    ln -sf /etc/systemd/system/vm-runner.service "$mnt/etc/systemd/system/multi-user.target.wants/vm-runner.service"
    # the kubelet: kubeadm's unit layout around the stand-in
    install -m 0755 "$standin" "$mnt/usr/bin/kubelet"
    install -m 0644 "$g/kubelet.service" "$mnt/usr/lib/systemd/system/kubelet.service"
    install -d "$mnt/usr/lib/systemd/system/kubelet.service.d" "$mnt/var/lib/kubelet" "$mnt/etc/kubernetes"
    install -m 0644 "$g/10-kubeadm.conf" "$mnt/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf"
    ln -sf /usr/lib/systemd/system/kubelet.service "$mnt/etc/systemd/system/multi-user.target.wants/kubelet.service"
    install -m 0644 "$g/kubeadm-flags.env" "$mnt/var/lib/kubelet/kubeadm-flags.env"
    install -m 0644 "$g/kubelet-config.yaml" "$mnt/var/lib/kubelet/config.yaml"
    install -m 0644 "$g/default-kubelet" "$mnt/etc/default/kubelet"
    cp "$mnt/var/lib/kubelet/kubeadm-flags.env" "$work/kubeadm-flags.env.orig"
    # the agent's certificates and remote API ----------------------------------------------
    install -d -m 0700 "$mnt/etc/inplaced/tls"
    install -m 0644 "$pki/agent.crt" "$mnt/etc/inplaced/tls/server.crt"
    install -m 0644 "$pki/clients-ca.crt" "$mnt/etc/inplaced/tls/clients-ca.crt"
    install -m 0600 "$pki/agent.key" "$mnt/etc/inplaced/tls/server.key"
    sh tests/vm/agent-config.sh "$mnt/etc/inplaced/config.toml"
    # the refused-kubelet rollback of scenario 2 waits out the whole health timeout: 30 s
    # instead of the packaged 60 s (the stand-in is healthy within a second of its start)
    sed -i 's|^health_timeout_secs = 60$|health_timeout_secs = 30|' "$mnt/etc/inplaced/config.toml"
    disk_umount
    timing "disk prepared (package installed)" $((SECONDS - t0))
}
prepare_disk "$image" 1 || exit 1

# ---------------------------------------------------------------------------------------
# scenarios

passed=0
failed=0
results=()
current=
failures=()
# fail MSG: records a failed assertion of the current scenario
fail() { failures+=("$current: $*"); say "FAIL $current: $*"; return 1; }
# expect NAME ACTUAL REGEX
expect() {
    if grep -Eq -- "$3" <<<"$2"; then return 0; fi
    fail "$1: expected /$3/, got: $(head -c 600 <<<"$2")"
}
scenario() { # NUMBER NAME FUNCTION
    current="$1 $2"
    if [ -n "${INPLACED_VM_ONLY:-}" ] && ! grep -qw -- "${1:0:1}" <<<"$INPLACED_VM_ONLY"; then return 0; fi
    local nfail=${#failures[@]} t0=$SECONDS
    say "--- scenario $current"
    "$3"
    local rc=$?
    if [ "$rc" -eq 0 ] && [ ${#failures[@]} -eq "$nfail" ]; then
        passed=$((passed + 1)); results+=("ok $1 $2")
        say "ok   $current ($((SECONDS - t0)) s)"
    else
        [ ${#failures[@]} -gt "$nfail" ] || fail "returned $rc"
        failed=$((failed + 1)); results+=("FAIL $1 $2")
        say "FAIL $current ($((SECONDS - t0)) s)"
        diagnose
    fi
    timing "scenario $1" $((SECONDS - t0))
}
diagnose() {
    say "serial log tail (boot $boots):"
    tail -40 "${serial:-/dev/null}" 2>/dev/null | sed 's/^/  serial| /' >&2
    if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
        say "guest journalctl -u inplaced -u kubelet:"
        GX_TIMEOUT=60 gx 'journalctl --no-pager -u inplaced -u kubelet -n 80' 2>&1 | sed 's/^/  journal| /' >&2
    fi
}

spec_dir=$work/specs
mkdir -p "$spec_dir"
# the state every spec carries over: a NodeSpec is the whole desired state
max_pods=250
swappiness=
kargs=()
spec() { # NAME [extra YAML...]: writes $spec_dir/NAME.yaml from the current state plus extras
    {
        echo "kubelet:"
        echo "  flags:"
        echo "    max-pods: \"$max_pods\""
        [ -z "$swappiness" ] || printf 'sysctls:\n  vm.swappiness: "%s"\n' "$swappiness"
        if [ ${#kargs[@]} -gt 0 ]; then
            echo "kernelArgs:"
            for a in "${kargs[@]}"; do printf "  - '%s'\n" "$a"; done
        fi
        for x in "${@:2}"; do printf '%s\n' "$x"; done
    } >"$spec_dir/$1.yaml"
    echo "$spec_dir/$1.yaml"
}

. tests/vm/scenarios.sh

t0=$SECONDS
if vm_boot; then
    say "booted: boot id $boot_id"
    # the UEFI image (when not cached) builds while the first scenarios mostly wait
    uefi_image_pid=
    if [ "${INPLACED_VM_UEFI:-1}" != 0 ]; then
        bash tests/vm/image.sh uefi >"$work/image-uefi.path" 2>"$logdir/image-uefi.log" &
        uefi_image_pid=$!
        host_pids+=("$uefi_image_pid")
    fi
    wait_serving 180 || say "the agent does not answer from the host"
    scenario 1 install-from-package s1_install
    scenario 2 kubelet-under-systemd s2_kubelet
    scenario 8 whole-chain-extension s8_chain
    scenario 3a sysctl-live s3_sysctl
    scenario 5 crash-under-systemd s5_crash
    scenario 5b panic-under-systemd s5b_panic
    scenario 6 watchdog s6_watchdog
    # the hardware watchdog of a trial boot (needs nothing before it; INPLACED_VM_ONLY=6)
    scenario 6b kernel-args-trial-hangs-watchdog s4_hang
    scenario 4a kernel-args-staged s4_kargs
    scenario 7 upgrade-without-restart s7_upgrade
    scenario 4b kernel-args-reboot s4_after_reboot
    scenario 3b sysctl-after-reboot s3_after_reboot
    scenario 4c kernel-args-drop-reboot s4_drop
    scenario 4d kernel-args-ordinary-reboot-keeps-it s4_ordinary_reboot
    scenario 4e kernel-args-trial-panics s4_panic
    scenario k kexec-vs-full-reboot sk_kexec
    if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
        save_journal
        gx_bg 'systemctl poweroff'
        vm_wait_exit || true
    fi
else
    failed=$((failed + 1)); results+=("FAIL boot")
    diagnose
fi

# ---------------------------------------------------------------------------------------
# the second boot path: UEFI (OVMF) with systemd-boot and Type #1 (BLS) entries on the ESP.
# INPLACED_VM_UEFI=0 skips it.
if [ "${INPLACED_VM_UEFI:-1}" != 0 ] && { [ -z "${INPLACED_VM_ONLY:-}" ] || grep -qw 9 <<<"$INPLACED_VM_ONLY"; }; then
    t0=$SECONDS
    if [ -n "${uefi_image_pid:-}" ]; then
        wait "$uefi_image_pid"
        uefi_rc=$?
        forget_pid "$uefi_image_pid"
        cat "$logdir/image-uefi.log" >&2
    else
        bash tests/vm/image.sh uefi >"$work/image-uefi.path"
        uefi_rc=$?
    fi
    image_uefi=$(cat "$work/image-uefi.path")
    if [ "$uefi_rc" -eq 0 ] && [ -f "$image_uefi" ]; then
        timing "uefi image (build or cache)" $((SECONDS - t0))
        rm -f "$disk" "$share"/ready "$share"/cmd/*
        disk=$work/disk-uefi.raw
        cp /usr/share/OVMF/OVMF_VARS_4M.fd "$work/OVMF_VARS_4M.fd"
        vm_firmware=uefi
        max_pods=110 swappiness= kargs=()
        if prepare_disk "$image_uefi" 2 && vm_boot; then
            wait_serving 180 || say "the agent does not answer from the host"
            scenario 9a uefi-install s9_uefi_install
            scenario 9b uefi-bls-kernel-args-reboot s9_uefi_kargs
            if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
                save_journal
                gx_bg 'systemctl poweroff'
                vm_wait_exit || true
            fi
        else
            failed=$((failed + 1)); results+=("FAIL 9 uefi-boot")
            diagnose
        fi
    else
        failed=$((failed + 1)); results+=("FAIL 9 uefi-image")
    fi
fi

say "timings: $(printf '%s; ' "${timings[@]}")total: $((SECONDS - t_start)) s"
for r in "${results[@]}"; do say "$r"; done
for f in "${failures[@]}"; do say "failure: $f"; done
names=$(printf '%s, ' "${results[@]}")
echo "vm: $passed passed, $failed failed (${names%, })"
closed=1
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
