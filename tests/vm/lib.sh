# VM test helpers (sourced by tests/vm/run.sh): the per-run disk, QEMU, the guest command
# runner over the 9p share, and the host-side clients. Expects: work, share, disk, bin,
# pki, port, logdir set by run.sh.

say() { printf 'vm: %s\n' "$*" >&2; }

# --- cleanup: only what this run started or attached ------------------------------------
qemu_pid=
loop_dev=
mounts=()
host_pids=()
# forget_pid PID: a host process this run has already waited for (no kill at cleanup)
forget_pid() {
    local keep=() p
    for p in "${host_pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    host_pids=("${keep[@]}")
}
vm_cleanup() {
    set +e
    if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
        kill "$qemu_pid"
        for _ in $(seq 50); do kill -0 "$qemu_pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$qemu_pid" 2>/dev/null
        wait "$qemu_pid" 2>/dev/null
    fi
    for p in "${host_pids[@]}"; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    local i
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        mountpoint -q "${mounts[i]}" && umount -l "${mounts[i]}"
    done
    mounts=()
    if [ -n "$loop_dev" ]; then
        partx -d "$loop_dev" 2>/dev/null
        losetup -d "$loop_dev"
        loop_dev=
    fi
    [ -n "${work:-}" ] && rm -rf "$work"
}

# --- the per-run disk -------------------------------------------------------------------
# disk_mount [N]: attaches $disk and mounts its root partition (N, default 1) on $work/mnt
disk_mount() {
    loop_dev=$(losetup -f --show "$disk")
    partx -a "$loop_dev" 2>/dev/null || true
    local part=${loop_dev}p${1:-1}
    for _ in $(seq 50); do [ -b "$part" ] && break; sleep 0.1; done
    if [ ! -b "$part" ]; then
        local dev
        dev=$(cat "/sys/block/${loop_dev#/dev/}/${part#/dev/}/dev")
        mknod "$part" b "${dev%:*}" "${dev#*:}"
    fi
    mnt=$work/mnt
    mkdir -p "$mnt"
    mount "$part" "$mnt" && mounts+=("$mnt")
    mount -t proc proc "$mnt/proc" && mounts+=("$mnt/proc")
    mount -t tmpfs -o mode=0755 vmdev "$mnt/dev" && mounts+=("$mnt/dev")
    for n in null zero full random urandom tty; do cp -a "/dev/$n" "$mnt/dev/"; done
}
disk_umount() {
    sync
    local i
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[i]}"; done
    mounts=()
    partx -d "$loop_dev" 2>/dev/null || true
    losetup -d "$loop_dev"
    loop_dev=
}

# --- QEMU -------------------------------------------------------------------------------
boots=0
# vm_boot: starts QEMU on $disk and waits (300 s) for the guest runner's ready file
vm_boot() {
    boots=$((boots + 1))
    rm -f "$share/ready"
    serial=$logdir/serial-$boots.log
    local t0=$SECONDS
    local fw=()
    if [ "${vm_firmware:-bios}" = uefi ]; then
        fw=(-drive "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd"
            -drive "if=pflash,format=raw,unit=1,file=$work/OVMF_VARS_4M.fd")
    fi
    # -no-reboot: a guest reboot (or a watchdog reset) ends QEMU, so the test sees it and
    # starts the next boot; vm_no_reboot=0 lets the machine reset in place instead (the
    # watchdog scenario: the i6300esb then reports the reset to the next boot)
    local reboot=(-no-reboot)
    [ "${vm_no_reboot:-1}" = 1 ] || reboot=()
    # the hardware watchdog a trial boot arms (systemd.watchdog_sec=): Intel 6300ESB
    qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 2 -m 1024 "${fw[@]}" \
        -display none -vga none -monitor none -serial "file:$serial" "${reboot[@]}" \
        -device i6300esb -watchdog-action reset \
        -drive "file=$disk,format=raw,if=virtio,cache=writeback" \
        -nic "user,model=virtio-net-pci,restrict=on,hostfwd=tcp:127.0.0.1:$port-:9443" \
        -virtfs "local,path=$share,mount_tag=vmshare,security_model=none,id=vmshare" \
        >"$logdir/qemu-$boots.log" 2>&1 &
    qemu_pid=$!
    while [ ! -f "$share/ready" ]; do
        if ! kill -0 "$qemu_pid" 2>/dev/null; then
            say "QEMU exited during boot $boots"
            cat "$logdir/qemu-$boots.log" >&2
            return 1
        fi
        if [ $((SECONDS - t0)) -ge "${BOOT_TIMEOUT:-300}" ]; then
            say "boot $boots: no ready marker after $((SECONDS - t0)) s"
            return 1
        fi
        sleep 1
    done
    boot_id=$(cat "$share/ready")
    timing "boot $boots" $((SECONDS - t0))
}
# vm_wait_exit: waits (300 s) for QEMU to exit (a guest reboot with -no-reboot, or poweroff)
vm_wait_exit() {
    local t0=$SECONDS
    while kill -0 "$qemu_pid" 2>/dev/null; do
        if [ $((SECONDS - t0)) -ge "${BOOT_TIMEOUT:-300}" ]; then
            say "QEMU still running $((SECONDS - t0)) s after the reboot/poweroff request"
            return 1
        fi
        sleep 1
    done
    wait "$qemu_pid" 2>/dev/null
    qemu_pid=
    timing "shutdown $boots" $((SECONDS - t0))
}

# --- the guest runner ---------------------------------------------------------------------
# command files are named uniquely: gx also runs in command substitutions (subshells)
cmd_name() { printf '%s-%s' "$(date +%s%N)" "$BASHPID"; }
# gx SCRIPT...: runs the bash script in the guest as root; prints its output, returns its
# status (124 on timeout: GX_TIMEOUT, 180 s)
gx() {
    local n
    n=$(cmd_name)
    local f=$share/cmd/$n t0=$SECONDS
    mkdir -p "$share/cmd"
    printf '%s\n' "$*" >"$f.tmp"
    mv "$f.tmp" "$f.sh"
    while [ ! -f "$f.rc" ]; do
        if [ $((SECONDS - t0)) -ge "${GX_TIMEOUT:-180}" ]; then
            say "guest command $n timed out: $*"
            return 124
        fi
        if [ -n "$qemu_pid" ] && ! kill -0 "$qemu_pid" 2>/dev/null; then
            say "guest command $n: QEMU is gone"
            return 125
        fi
        sleep 0.2
    done
    cat "$f.out"
    return "$(cat "$f.rc")"
}
# gx_bg SCRIPT: drops a command without waiting (a reboot, a poweroff)
gx_bg() {
    local n
    n=$(cmd_name)
    mkdir -p "$share/cmd"
    printf '%s\n' "$*" >"$share/cmd/$n.tmp"
    mv "$share/cmd/$n.tmp" "$share/cmd/$n.sh"
}
# save_journal: the guest's journal of this boot (volatile: lost at the reboot) to the logs
save_journal() {
    GX_TIMEOUT=60 gx 'journalctl -b --no-pager -o short-monotonic' >"$logdir/journal-boot$boots.txt" 2>&1 || true
}
# unit_prop UNIT PROP
unit_prop() { gx "systemctl show -P $2 $1"; }

# --- host-side clients ----------------------------------------------------------------------
# ctl ARGS...: inplacectl on the host over the forwarded mTLS port
ctl() {
    "$bin/inplacectl" --connect "127.0.0.1:$port" --tls-ca "$pki/agents-ca.crt" \
        --tls-cert "$pki/client.crt" --tls-key "$pki/client.key" "$@"
}
# wait_serving: the agent answers GetStatus from the host (120 s)
wait_serving() {
    local t0=$SECONDS
    until ctl status >/dev/null 2>&1; do
        [ $((SECONDS - t0)) -lt "${1:-120}" ] || return 1
        sleep 1
    done
}
# op_phase ID: the operation's phase (SUCCEEDED, ROLLED_BACK, ...) as the host sees it
op_phase() {
    ctl -o json get "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("phase",""))'
}
# wait_phase ID REGEX [SECONDS]: waits until the phase matches
wait_phase() {
    local t0=$SECONDS ph=
    while :; do
        ph=$(op_phase "$1" 2>/dev/null)
        if grep -Eq "^($2)\$" <<<"$ph"; then echo "$ph"; return 0; fi
        [ $((SECONDS - t0)) -lt "${3:-180}" ] || { echo "$ph"; return 1; }
        sleep 2
    done
}

# --- results -------------------------------------------------------------------------------
timings=()
timing() { timings+=("$1: $2 s"); say "$1: $2 s"; }
