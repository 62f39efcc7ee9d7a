# The VM test's scenarios (sourced by tests/vm/run.sh after boot 1). Each function returns
# non-zero or calls `fail` on a wrong value; `spec` writes the whole desired NodeSpec from
# the state the earlier scenarios left (max_pods, swappiness, kargs).

# 1. Installed from the package, started by systemd at boot.
s1_install() {
    local show
    show=$(unit_prop inplaced ActiveState; unit_prop inplaced SubState; unit_prop inplaced StatusText; unit_prop inplaced UnitFileState)
    expect "ActiveState, SubState, StatusText (sd-notify), enabled" "$(tr '\n' ' ' <<<"$show")" '^active running [^ ]+.* enabled $'
    expect "installed version" "$(gx "dpkg-query -W -f='\${Version} \${Status}' inplaced")" "^$deb_version install ok installed\$"
    expect "state directory 0700 root" "$(gx 'stat -c "%a %U" /var/lib/inplaced')" '^700 root$'
    expect "socket 0600 root" "$(gx 'stat -c "%a %U %F" /run/inplaced/inplaced.sock')" '^600 root socket$'
    expect "inplacectl in the guest (local socket)" "$(gx 'inplacectl status')" 'grub'
    local st
    st=$(ctl -o json status) || { fail "GetStatus from the host over mTLS: $st"; return 1; }
    echo "$st" >"$logdir/status-boot1.json"
    expect "GetStatus from the host: GRUB backend" "$st" '"backend": "(KERNEL_ARGS_BACKEND_)?GRUB"|grub'
    expect "GetStatus: the boot id of the running kernel" "$st" "$boot_id"
    expect "GetStatus: QEMU's DMI is a virtual machine (not preserved)" "$st" '"platform": "virtual-machine"'
    # journald: native entries (not a stderr stream) with the tracing target as a field
    local j
    j=$(gx 'journalctl -u inplaced -b -o verbose --no-pager | grep -E "^    (_TRANSPORT=journal|TARGET=|PRIORITY=)" | sort | uniq -c')
    expect "journal entries sent natively (not a stderr stream)" "$j" ' _TRANSPORT=journal$'
    expect "journal entries with the tracing target as a field" "$j" ' TARGET=inplaced'
}

# 2. A kubelet (the stand-in) under real systemd with kubeadm's unit layout; the health gate.
s2_kubelet() {
    expect "kubelet active" "$(gx 'systemctl is-active kubelet')" '^active$'
    expect "stand-in started with kubeadm's flags" "$(gx 'cat /run/kubelet-standin/args')" '^--max-pods=110$'
    expect "healthz" "$(gx 'exec 3<>/dev/tcp/127.0.0.1/10248; printf "GET /healthz HTTP/1.0\r\n\r\n" >&3; cat <&3')" 'ok'
    local pid0 pid1 pid2 out
    pid0=$(unit_prop kubelet MainPID)
    max_pods=250
    out=$(ctl apply -f "$(spec kubelet-250)" --id vm-kubelet-250 --wait 2>&1) || fail "apply max-pods=250: $out"
    expect "apply max-pods=250 Succeeded" "$(op_phase vm-kubelet-250)" '^PHASE_SUCCEEDED$'
    expect "actions: restarted kubelet.service" "$(ctl -o json get vm-kubelet-250)" 'restart.*kubelet\.service'
    pid1=$(unit_prop kubelet MainPID)
    [ "$pid1" != "$pid0" ] && [ "$pid1" != 0 ] || fail "kubelet was not restarted (MainPID $pid0 -> $pid1)"
    expect "stand-in reports --max-pods=250" "$(gx 'cat /run/kubelet-standin/args')" '^--max-pods=250$'
    local want
    want=$(sed 's/--max-pods=110/--max-pods=250/' "$work/kubeadm-flags.env.orig")
    [ "$(gx 'cat /var/lib/kubelet/kubeadm-flags.env')" = "$want" ] || fail "kubeadm-flags.env is not the original with max-pods=250: $(gx 'cat /var/lib/kubelet/kubeadm-flags.env')"
    # journald: the operation's lines carry OPERATION= and PHASE=
    expect "journalctl -u inplaced OPERATION=vm-kubelet-250" \
        "$(gx 'journalctl -u inplaced OPERATION=vm-kubelet-250 -o verbose --no-pager | grep -E "^    (OPERATION|PHASE|ITEM)=" | sort -u | tr "\n" " "')" 'ITEM=kubelet\.flags\[max-pods\].*OPERATION=vm-kubelet-250 .*PHASE='
    local sum_before
    sum_before=$(gx 'sha256sum /var/lib/kubelet/kubeadm-flags.env')
    # a value the kubelet refuses: it exits 1 at every start, the health gate fails
    max_pods=many
    out=$(ctl apply -f "$(spec kubelet-refused)" --id vm-kubelet-refused --wait 2>&1)
    local rc=$?
    max_pods=250
    [ "$rc" -ne 0 ] || fail "apply of a refused flag exited 0: $out"
    expect "refused change RolledBack" "$(op_phase vm-kubelet-refused)" '^PHASE_ROLLED_BACK$'
    expect "rollback names the health check" "$(ctl -o json get vm-kubelet-refused)" '10248|healthz|kubelet'
    [ "$(gx 'sha256sum /var/lib/kubelet/kubeadm-flags.env')" = "$sum_before" ] || fail "kubeadm-flags.env not restored byte for byte"
    expect "kubelet active again" "$(gx 'systemctl is-active kubelet')" '^active$'
    expect "and healthy" "$(gx 'exec 3<>/dev/tcp/127.0.0.1/10248; printf "GET /healthz HTTP/1.0\r\n\r\n" >&3; cat <&3')" '^ok'
    pid2=$(unit_prop kubelet MainPID)
    [ "$pid2" != "$pid1" ] || fail "kubelet not restarted after the rollback"
    expect "stand-in back on --max-pods=250" "$(gx 'cat /run/kubelet-standin/args')" '^--max-pods=250$'
    expect "journal MESSAGE of the rollback" "$(gx 'journalctl -u inplaced OPERATION=vm-kubelet-refused PHASE=PHASE_ROLLED_BACK -o cat --no-pager')" '^operation phase: kubelet health check failed'
    expect "the stand-in refused --max-pods=many (journal)" "$(gx 'journalctl -u kubelet --no-pager | grep -c "invalid argument \"many\""')" '^[1-9]'
}

# 8. The whole chain: inplace-extension on the host answers CAPI's hooks for the Machine
# running in the VM, and the change lands on the node.
s8_chain() {
    local ext_port
    ext_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # --- the extension's config: CAPI's managers must present a client certificate from
    # capi-ca.crt with the listed URI SAN; UpdateMachine checks the agent is node edge-vm
    cat >"$work/extension.toml" <<TOML
[server]
listen = "127.0.0.1:$ext_port"
cert = "$pki/extension.crt"
key = "$pki/extension.key"
client_ca = "$pki/capi-ca.crt"
[[server.clients]]
identity = "spiffe://mgmt/ns/capi-system/sa/capi-manager"
[agent]
ca = "$pki/agents-ca.crt"
cert = "$pki/client.crt"
key = "$pki/client.key"
[resolver.static]
"vm/edge-vm" = "127.0.0.1:$port"
TOML
    # ---------------------------------------------------------------------------------------
    "$bin/inplace-extension" --config "$work/extension.toml" --log warn >"$logdir/extension.log" 2>&1 &
    local ext_pid=$!
    host_pids+=("$ext_pid")
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$ext_port") 2>/dev/null && break; sleep 0.1; done
    local hooks=https://127.0.0.1:$ext_port/hooks.runtime.cluster.x-k8s.io/v1alpha1
    python3 tests/vm/capi-request.py can 250 240 >"$work/can.json"
    python3 tests/vm/capi-request.py update 250 240 >"$work/update.json"
    local r
    # without CAPI's client certificate the extension refuses before reading the request
    if python3 examples/hook.py "$hooks/updatemachine/update-machine" "$pki/extension-ca.crt" "$work/update.json" >/dev/null 2>&1; then
        fail "an UpdateMachine without a client certificate was answered"
    fi
    export HOOK_CLIENT_CERT=$pki/capi.crt HOOK_CLIENT_KEY=$pki/capi.key
    r=$(python3 examples/hook.py "$hooks/canupdatemachine/can-update-machine" "$pki/extension-ca.crt" "$work/can.json")
    echo "$r" >"$logdir/canupdatemachine-response.json"
    expect "CanUpdateMachine Success" "$r" '"status": "Success"'
    expect "CanUpdateMachine patches kubeletExtraArgs" "$r" 'kubeletExtraArgs'
    local done=
    for _ in $(seq 90); do
        r=$(python3 examples/hook.py "$hooks/updatemachine/update-machine" "$pki/extension-ca.crt" "$work/update.json")
        if grep -q '"retryAfterSeconds": 0' <<<"$r" || grep -q '"status": "Failure"' <<<"$r"; then done=1; break; fi
        sleep 2
    done
    echo "$r" >"$logdir/updatemachine-response.json"
    [ -n "$done" ] || fail "UpdateMachine did not finish: $r"
    expect "UpdateMachine Success, done" "$r" '"status": "Success"'
    expect "UpdateMachine message" "$r" 'in-place update done'
    expect "kubeadm-flags.env on the node" "$(gx 'cat /var/lib/kubelet/kubeadm-flags.env')" '--max-pods=240 '
    expect "the kubelet runs with --max-pods=240" "$(gx 'cat /run/kubelet-standin/args')" '^--max-pods=240$'
    max_pods=240
    unset HOOK_CLIENT_CERT HOOK_CLIENT_KEY
    kill "$ext_pid" 2>/dev/null
    wait "$ext_pid" 2>/dev/null
    forget_pid "$ext_pid"
}

# 3. A sysctl, live in the running kernel and persisted.
s3_sysctl() {
    local before out
    before=$(gx 'cat /proc/sys/vm/swappiness')
    swappiness=13
    [ "$before" != 13 ] || fail "vm.swappiness already 13"
    out=$(ctl apply -f "$(spec sysctl)" --id vm-sysctl --wait 2>&1) || fail "apply: $out"
    expect "Succeeded" "$(op_phase vm-sysctl)" '^PHASE_SUCCEEDED$'
    expect "live in /proc/sys" "$(gx 'cat /proc/sys/vm/swappiness')" '^13$'
    expect "persisted" "$(gx 'cat /etc/sysctl.d/99-zz-inplaced.conf')" '^vm\.swappiness ?= ?13$'
}
s3_after_reboot() {
    expect "vm.swappiness after the reboot" "$(gx 'cat /proc/sys/vm/swappiness')" '^13$'
}

# 5. The daemon dies in the middle of a 300-file apply; systemd restarts it; the journal is
# recovered; every file wholly old or new; re-applying converges.
crash_body() { # VERSION I: the content of file I
    python3 -c 'import sys; v, i = sys.argv[1], int(sys.argv[2]); sys.stdout.write((f"{v} file {i:03d} " * 400)[:4095].rstrip() + "\n")' "$1" "$2"
}
crash_files() { # VERSION: 300 file items, 4 KiB each
    python3 - "$1" <<'PY'
import sys
v = sys.argv[1]
for i in range(300):
    body = (f"{v} file {i:03d} " * 400)[:4095].rstrip()
    print(f"  - path: /etc/vm-crash/f-{i:03d}.conf")
    print(f"    content: \"{body}\\n\"")
PY
}
crash_check() { # prints "old N new M bad K stray S files F"
    gx 'cd /etc/vm-crash && ls -A | sed "s/^/name /" && sha256sum f-*.conf' | python3 -c '
import hashlib, sys
want = {}
for v in ("v1", "v2"):
    for i in range(300):
        body = (f"{v} file {i:03d} " * 400)[:4095].rstrip() + "\n"
        want[(f"f-{i:03d}.conf", hashlib.sha256(body.encode()).hexdigest())] = v
old = new = bad = stray = files = 0
for line in sys.stdin:
    a, b = line.split(maxsplit=1)
    b = b.strip()
    if a == "name":
        files += 1
        if not (b.startswith("f-") and b.endswith(".conf")):
            stray += 1
        continue
    v = want.get((b, a))
    if v == "v1": old += 1
    elif v == "v2": new += 1
    else: bad += 1
print(f"old {old} new {new} bad {bad} stray {stray} files {files}")
'
}
s5_crash() {
    local out
    out=$(ctl apply -f "$(spec crash-v1 "files:" "$(crash_files v1)")" --id vm-crash-v1 --wait 2>&1) || { fail "apply v1: $(tail -3 <<<"$out")"; return 1; }
    expect "v1 applied" "$(crash_check)" '^old 300 new 0 bad 0 stray 0'
    # the failpoint through a drop-in, for one start only: removed (and reloaded) once the
    # daemon runs with it, so systemd's automatic restart comes up without it
    gx 'mkdir -p /etc/systemd/system/inplaced.service.d && printf "[Service]\nEnvironment=INPLACED_FAILPOINTS=write:150\n" > /etc/systemd/system/inplaced.service.d/50-vm-failpoint.conf && systemctl daemon-reload && systemctl restart inplaced && rm /etc/systemd/system/inplaced.service.d/50-vm-failpoint.conf && systemctl daemon-reload' >/dev/null ||
        { fail "installing the failpoint drop-in"; return 1; }
    wait_serving 120 || { fail "agent not serving after the restart"; return 1; }
    local n0 pid0
    n0=$(unit_prop inplaced NRestarts)
    pid0=$(unit_prop inplaced MainPID)
    out=$(ctl apply -f "$(spec crash-v2 "files:" "$(crash_files v2)")" --id vm-crash-v2 --wait 2>&1) && fail "apply v2 survived the failpoint: $out"
    local t0=$SECONDS n1=$n0
    while [ "$n1" = "$n0" ] && [ $((SECONDS - t0)) -lt 120 ]; do sleep 2; n1=$(unit_prop inplaced NRestarts); done
    [ "$n1" -gt "$n0" ] || fail "NRestarts did not grow ($n0 -> $n1)"
    wait_serving 180 || { fail "agent not serving after systemd restarted it"; return 1; }
    [ "$(unit_prop inplaced MainPID)" != "$pid0" ] || fail "same MainPID after the crash"
    expect "journal: the failpoint killed it" "$(gx 'journalctl -u inplaced --no-pager -n 300 | grep -E "failpoint reached|Main process exited, code=killed"')" 'failpoint reached'
    expect "journal: systemd restarted it" "$(gx 'journalctl -u inplaced --no-pager -n 300')" 'code=killed, status=9/KILL'
    local c
    c=$(crash_check)
    say "after the crash: $c, operation $(op_phase vm-crash-v2 2>&1)"
    expect "every file wholly old or new, no temporary file" "$c" '^old [0-9]+ new [0-9]+ bad 0 stray 0 files 300$'
    # crates/agent/src/apply/journal.rs: rolled back at the next start from its write-ahead journal, the
    # operation ends RolledBack (issue 20 §5: the phase says what happened)
    expect "interrupted operation RolledBack" "$(op_phase vm-crash-v2)" '^PHASE_ROLLED_BACK$'
    expect "interrupted operation message" "$(ctl -o json get vm-crash-v2)" '"message": ".*interrupted'
    # the write-ahead journal of the operation (<state>/journal/<id>.*) is gone once settled
    expect "journal recovered (none left in the state dir)" "$(gx 'ls -A /var/lib/inplaced/journal 2>/dev/null | wc -l')" '^0$'
    # the restart names the settled operation and every path it restored (issue 12 §1)
    local journal
    journal=$(gx 'journalctl -u inplaced --no-pager -n 2000 -o cat')
    expect "journal: the interrupted operation settled at start" "$journal" 'settled an interrupted operation'
    expect "journal: each restored path named" "$journal" 'rolled back from the journal'
    out=$(ctl apply -f "$spec_dir/crash-v2.yaml" --id vm-crash-v2b --wait 2>&1) || fail "re-apply v2: $(tail -3 <<<"$out")"
    expect "re-apply converges" "$(crash_check)" '^old 0 new 300 bad 0 stray 0'
}

# 5b. A bug's panic in the middle of an apply: on the operation thread the daemon's panic
# hook ends it by SIGABRT at that instant, systemd restarts it and the journal rolls the
# operation back, as after a SIGKILL.
# Runs after 5, which leaves v2 applied; this goes back to v1.
s5b_panic() {
    gx 'mkdir -p /etc/systemd/system/inplaced.service.d && printf "[Service]\nEnvironment=INPLACED_FAILPOINTS=write:150 INPLACED_FAILPOINT_PANIC=1\n" > /etc/systemd/system/inplaced.service.d/50-vm-failpoint.conf && systemctl daemon-reload && systemctl restart inplaced && rm /etc/systemd/system/inplaced.service.d/50-vm-failpoint.conf && systemctl daemon-reload' >/dev/null ||
        { fail "installing the failpoint drop-in"; return 1; }
    wait_serving 120 || { fail "agent not serving after the restart"; return 1; }
    local n0 pid0 out
    n0=$(unit_prop inplaced NRestarts)
    pid0=$(unit_prop inplaced MainPID)
    out=$(ctl apply -f "$(spec crash-v1b "files:" "$(crash_files v1)")" --id vm-panic-v1 --wait 2>&1) && fail "apply survived the panic: $out"
    local t0=$SECONDS n1=$n0
    while [ "$n1" = "$n0" ] && [ $((SECONDS - t0)) -lt 120 ]; do sleep 2; n1=$(unit_prop inplaced NRestarts); done
    [ "$n1" -gt "$n0" ] || fail "NRestarts did not grow ($n0 -> $n1)"
    wait_serving 180 || { fail "agent not serving after systemd restarted it"; return 1; }
    [ "$(unit_prop inplaced MainPID)" != "$pid0" ] || fail "same MainPID after the panic"
    # the panic's two lines (stderr) sit before the 300 files' change lines of the
    # operation and of the rollback: filtered from the unit's whole journal
    local journal
    journal=$(gx 'journalctl -u inplaced --no-pager -n 5000 | grep -E "panicked at|failpoint write reached|Main process exited"')
    expect "journal: the panic's place" "$journal" 'panicked at crates/node/src/failpoint\.rs'
    expect "journal: the panic's message" "$journal" 'failpoint write reached \(INPLACED_FAILPOINT_PANIC=1\)'
    expect "journal: it ended by SIGABRT, not a kill" "$journal" 'status=6/ABRT'
    expect "every file wholly old or new, no temporary file" "$(crash_check)" '^old [0-9]+ new [0-9]+ bad 0 stray 0 files 300$'
    expect "interrupted operation RolledBack" "$(op_phase vm-panic-v1)" '^PHASE_ROLLED_BACK$'
    expect "files back to v2" "$(crash_check)" '^old 0 new 300 bad 0 stray 0'
    out=$(ctl apply -f "$spec_dir/crash-v1b.yaml" --id vm-panic-v1b --wait 2>&1) || fail "re-apply v1: $(tail -3 <<<"$out")"
    expect "re-apply converges" "$(crash_check)" '^old 300 new 0 bad 0 stray 0'
}

# 6. The watchdog: a SIGSTOPped daemon is killed and restarted by systemd.
s6_watchdog() {
    # WatchdogSec shortened (TCG is slow: keep tens of seconds); the abort that follows the
    # watchdog's SIGABRT cannot act on a stopped process, so the SIGKILL after
    # TimeoutAbortSec= is what ends it here
    gx 'mkdir -p /etc/systemd/system/inplaced.service.d && printf "[Service]\nWatchdogSec=20s\nTimeoutAbortSec=10s\n" > /etc/systemd/system/inplaced.service.d/50-vm-watchdog.conf && systemctl daemon-reload && systemctl restart inplaced' >/dev/null ||
        { fail "installing the watchdog drop-in"; return 1; }
    wait_serving 120 || { fail "agent not serving after the restart"; return 1; }
    expect "WatchdogUSec" "$(unit_prop inplaced WatchdogUSec)" '^20s$|^20000000$'
    sleep 25 # a whole watchdog period with pings: alive and not restarted
    local n0 pid0
    n0=$(unit_prop inplaced NRestarts)
    pid0=$(unit_prop inplaced MainPID)
    expect "still active after a watchdog period" "$(unit_prop inplaced ActiveState)" '^active$'
    gx "kill -STOP $pid0" >/dev/null
    local t0=$SECONDS n1=$n0
    while [ "$n1" = "$n0" ] && [ $((SECONDS - t0)) -lt 150 ]; do sleep 2; n1=$(unit_prop inplaced NRestarts); done
    say "watchdog restart after $((SECONDS - t0)) s"
    [ "$n1" -gt "$n0" ] || fail "NRestarts did not grow ($n0 -> $n1)"
    wait_serving 120 || fail "agent not serving after the watchdog restart"
    [ "$(unit_prop inplaced MainPID)" != "$pid0" ] || fail "same MainPID"
    expect "journal: watchdog timeout" "$(gx 'journalctl -u inplaced --no-pager -n 100 | grep -i watchdog')" '[Ww]atchdog timeout'
    gx 'rm /etc/systemd/system/inplaced.service.d/50-vm-watchdog.conf && systemctl daemon-reload && systemctl restart inplaced' >/dev/null
    wait_serving 120 || fail "agent not serving after removing the drop-in"
}

# 4. Kernel arguments through a real reboot, each change booted once as a trial (issue 26):
# the old command line stays GRUB's default until the trial boot is healthy.
s4_kargs() {
    cmdline_boot1=$(gx 'cat /proc/cmdline')
    kargs=(inplaced.e2e=1 'inplaced.note="two words"')
    local out
    out=$(ctl apply -f "$(spec kargs-1)" --id vm-kargs-1 --wait 2>&1) || fail "apply: $(tail -5 <<<"$out")"
    expect "RebootRequired" "$(op_phase vm-kargs-1)" '^PHASE_REBOOT_REQUIRED$'
    expect "coverage: a trial boot" "$(ctl -o json get vm-kargs-1)" 'trial boot: /etc/grub.d/99_inplaced_trial'
    expect "the default untouched: /etc/default/grub" "$(gx 'grep -c inplaced.e2e /etc/default/grub')" '^0$'
    expect "the trial script, executable" "$(gx 'stat -c %A /etc/grub.d/99_inplaced_trial')" '^-rwxr-xr-x$'
    expect "grub.cfg: the trial entry with the arguments, panic= and the watchdog" \
        "$(gx "awk '/inplaced-trial/,/^}/' /boot/grub/grub.cfg | grep -E '^[[:space:]]*linux[[:space:]]'")" \
        'inplaced\.e2e=1 .*two words.*panic=10 systemd\.watchdog_sec=60'
    expect "grub.cfg: the first (default) entry is the old command line" \
        "$(gx "grep -m1 -E '^[[:space:]]*linux[[:space:]]' /boot/grub/grub.cfg | grep -c inplaced")" '^0$'
    expect "grub.cfg honours next_entry (00_header)" "$(gx 'grep -c "set default=\"\${next_entry}\"" /boot/grub/grub.cfg')" '^1$'
    expect "grubenv next_entry (grub-reboot)" "$(gx 'grub-editenv list')" '^next_entry=inplaced-trial$'
    gx 'grep -q inplaced.e2e /proc/cmdline' && fail "/proc/cmdline already has the argument"
    return 0
}
# the service manager's own property (systemctl show without a unit)
manager_prop() { gx "systemctl show -P $1"; }
s4_after_reboot() {
    local boot_before=$boot_id out t0
    save_journal
    t0=$SECONDS
    out=$(ctl reboot vm-kargs-1 2>&1) || fail "Reboot RPC: $out"
    vm_wait_exit || { fail "the guest did not reboot (QEMU still running)"; return 1; }
    vm_boot || { fail "boot after the reboot"; return 1; }
    [ "$boot_id" != "$boot_before" ] || fail "same boot id"
    wait_serving 180 || { fail "agent not serving after the reboot"; return 1; }
    expect "Succeeded after the trial boot" "$(wait_phase vm-kargs-1 'PHASE_SUCCEEDED|PHASE_FAILED|PHASE_ROLLED_BACK' 180)" '^PHASE_SUCCEEDED$' ||
        say "operation: $(ctl -o json get vm-kargs-1)"
    timing "trial round trip (reboot, trial boot, commit)" $((SECONDS - t0))
    expect "message: committed as the default" "$(ctl -o json get vm-kargs-1)" "trial boot \(boot id $boot_id\) healthy.*committed as the default"
    cmdline_boot2=$(gx 'cat /proc/cmdline')
    say "/proc/cmdline: $cmdline_boot2"
    expect "/proc/cmdline has inplaced.e2e=1" "$cmdline_boot2" '(^| )inplaced\.e2e=1( |$)'
    expect "/proc/cmdline has the quoted value" "$cmdline_boot2" 'inplaced\.note="two words"|"inplaced\.note=two words"'
    expect "the trial boot's panic= and watchdog" "$cmdline_boot2" 'panic=10 systemd\.watchdog_sec=60'
    expect "systemd armed the hardware watchdog for the trial boot" "$(manager_prop RuntimeWatchdogUSec)" '^1min$|^60000000$'
    expect "the i6300esb is the watchdog" "$(gx 'cat /sys/class/watchdog/watchdog0/identity 2>&1')" 'i6300ESB'
    expect "committed: GRUB_CMDLINE_LINUX" "$(gx 'grep ^GRUB_CMDLINE_LINUX= /etc/default/grub')" 'inplaced\.e2e=1.*two words'
    expect "committed: the default entry" "$(gx "grep -m1 -E '^[[:space:]]*linux[[:space:]]' /boot/grub/grub.cfg")" 'inplaced\.e2e=1'
    expect "the trial script is gone" "$(gx 'ls /etc/grub.d/99_inplaced_trial 2>&1')" 'No such file'
    expect "no trial entry left in grub.cfg" "$(gx 'grep -c inplaced-trial /boot/grub/grub.cfg')" '^0$'
    expect "next_entry consumed" "$(gx 'grub-editenv list | grep -c next_entry')" '^0$'
}
s4_drop() {
    kargs=(inplaced.e2e=1)
    local out
    out=$(ctl apply -f "$(spec kargs-2)" --id vm-kargs-2 --wait 2>&1) || fail "apply: $(tail -5 <<<"$out")"
    expect "RebootRequired" "$(op_phase vm-kargs-2)" '^PHASE_REBOOT_REQUIRED$'
    save_journal
    out=$(ctl reboot vm-kargs-2 2>&1) || fail "Reboot RPC: $out"
    vm_wait_exit || { fail "the guest did not reboot"; return 1; }
    vm_boot || { fail "boot 3"; return 1; }
    wait_serving 180 || { fail "agent not serving after boot 3"; return 1; }
    expect "Succeeded after boot" "$(wait_phase vm-kargs-2 'PHASE_SUCCEEDED|PHASE_FAILED|PHASE_ROLLED_BACK' 180)" '^PHASE_SUCCEEDED$'
    local now
    now=$(gx 'cat /proc/cmdline')
    say "/proc/cmdline: $now"
    # the trial boot: boot 1's command line plus inplaced.e2e=1 and the trial's safety
    local diff
    diff=$(python3 tests/vm/cmdline-diff.py "$cmdline_boot1" "$now")
    expect "trial boot: inplaced.e2e=1 and the trial's panic=/watchdog added to boot 1's" "$diff" '^added \[inplaced\.e2e=1 panic=10 systemd\.watchdog_sec=60\] removed \[\]$'
    expect "vm.swappiness still 13" "$(gx 'cat /proc/sys/vm/swappiness')" '^13$'
}
# 4d. The committed default survives an ordinary reboot (no trial, no agent involved).
s4_ordinary_reboot() {
    local boot_before=$boot_id
    save_journal
    gx_bg 'systemctl reboot'
    vm_wait_exit || { fail "the guest did not reboot"; return 1; }
    vm_boot || { fail "boot after the ordinary reboot"; return 1; }
    [ "$boot_id" != "$boot_before" ] || fail "same boot id"
    wait_serving 180 || { fail "agent not serving"; return 1; }
    local now
    now=$(gx 'cat /proc/cmdline')
    say "/proc/cmdline: $now"
    expect "only inplaced.e2e=1 added to boot 1's command line (no trial arguments)" \
        "$(python3 tests/vm/cmdline-diff.py "$cmdline_boot1" "$now")" '^added \[inplaced\.e2e=1\] removed \[\]$'
    expect "systemd's hardware watchdog off again" "$(manager_prop RuntimeWatchdogUSec)" '^(0|infinity)$'
    expect "operation still Succeeded" "$(op_phase vm-kargs-2)" '^PHASE_SUCCEEDED$'
}

# trial_failed_common OP BEFORE_CMDLINE GRUB_SUM: the agent's verdict once the old default
# booted again: RolledBack with the evidence, the staged configuration gone
trial_failed_common() {
    wait_serving 180 || { fail "agent not serving after the fallback boot"; return 1; }
    expect "RolledBack" "$(wait_phase "$1" 'PHASE_SUCCEEDED|PHASE_FAILED|PHASE_ROLLED_BACK' 180)" '^PHASE_ROLLED_BACK$'
    local j
    j=$(ctl -o json get "$1")
    echo "$j" >"$logdir/$1.json"
    expect "evidence: the boot id" "$j" "boot id $boot_id"
    expect "the old command line runs" "$(gx 'cat /proc/cmdline')" "^$(sed 's/[.[\*^$()+?{|]/\\&/g' <<<"$2")\$"
    expect "evidence: the command line the kernel had" "$j" "/proc/cmdline: $(sed 's/[.[\*^$()+?{|]/\\&/g' <<<"$2")"
    expect "staged config gone: the trial script" "$(gx 'ls /etc/grub.d/99_inplaced_trial 2>&1')" 'No such file'
    expect "staged config gone: no trial entry in grub.cfg" "$(gx 'grep -c inplaced-trial /boot/grub/grub.cfg')" '^0$'
    expect "the default never changed" "$(gx 'sha256sum /etc/default/grub')" "^$3"
    expect "no next_entry left" "$(gx 'grub-editenv list | grep -c next_entry')" '^0$'
}

# 4e. A kernel argument that panics the trial boot (init= naming a program that exits):
# the kernel's panic=10 reboots, QEMU ends (-no-reboot); started again, GRUB boots the old
# default without anyone touching the disk, and the agent rolls the operation back.
s4_panic() {
    local before grub_sum out t0
    before=$(gx 'cat /proc/cmdline')
    grub_sum=$(gx 'sha256sum /etc/default/grub' | cut -d' ' -f1)
    local keep=("${kargs[@]}")
    kargs+=(init=/bin/false)
    out=$(ctl apply -f "$(spec kargs-panic)" --id vm-kargs-panic --wait 2>&1) || fail "apply: $(tail -5 <<<"$out")"
    kargs=("${keep[@]}")
    expect "RebootRequired" "$(op_phase vm-kargs-panic)" '^PHASE_REBOOT_REQUIRED$'
    save_journal
    t0=$SECONDS
    out=$(ctl reboot vm-kargs-panic 2>&1) || fail "Reboot RPC: $out"
    vm_wait_exit || { fail "the guest did not reboot"; return 1; }
    if vm_boot; then fail "the trial boot with init=/bin/false came up"; return 1; fi
    timing "panic trial: reboot until QEMU ends" $((SECONDS - t0))
    expect "serial: the trial kernel had init=/bin/false and panic=10" "$(cat "$serial")" 'Command line:.*init=/bin/false.*panic=10'
    expect "serial: it panicked" "$(cat "$serial")" 'Kernel panic - not syncing'
    qemu_pid=
    vm_boot || { fail "the old default did not boot"; return 1; }
    timing "panic trial: reboot until the old default boots" $((SECONDS - t0))
    trial_failed_common vm-kargs-panic "$before" "$grub_sum"
    local j
    j=$(ctl -o json get vm-kargs-panic)
    expect "evidence: the fallback" "$j" 'fallback: the trial boot never reached the agent: a kernel panic'
    expect "evidence: the arguments" "$j" 'the trial of init=/bin/false'
}

# 6b. A hang in the trial boot, caught by the hardware watchdog systemd arms for it
# (systemd.watchdog_sec=60 on the trial entry, QEMU's i6300esb with a reset action). The
# hang is a stand-in (tests/vm/guest/vm-hang.service stops PID 1 when the command line has
# inplaced.vm_hang=1). QEMU resets in place (no -no-reboot) so the 6300ESB reports the
# reset to the next boot, where the agent reads it.
s4_hang() {
    local before grub_sum out t0
    cp tests/vm/guest/vm-hang.service "$share/vm-hang.service"
    gx 'install -m 0644 /mnt/vm/vm-hang.service /etc/systemd/system/vm-hang.service && systemctl enable vm-hang.service' >/dev/null ||
        { fail "installing the hang stand-in"; return 1; }
    before=$(gx 'cat /proc/cmdline')
    grub_sum=$(gx 'sha256sum /etc/default/grub' | cut -d' ' -f1)
    local keep=("${kargs[@]}")
    kargs+=(inplaced.vm_hang=1)
    out=$(ctl apply -f "$(spec kargs-hang)" --id vm-kargs-hang --wait 2>&1) || fail "apply: $(tail -5 <<<"$out")"
    kargs=("${keep[@]}")
    expect "RebootRequired" "$(op_phase vm-kargs-hang)" '^PHASE_REBOOT_REQUIRED$'
    save_journal
    t0=$SECONDS
    out=$(ctl reboot vm-kargs-hang 2>&1) || fail "Reboot RPC: $out"
    vm_wait_exit || { fail "the guest did not reboot"; return 1; }
    local bid=$boot_id
    vm_no_reboot=0 BOOT_TIMEOUT=900 vm_boot || { fail "no boot came up after the hang"; return 1; }
    timing "hang trial: reboot until the old default boots (watchdog reset)" $((SECONDS - t0))
    [ "$boot_id" != "$bid" ] || fail "same boot id"
    expect "serial: the trial boot, then the fallback boot" "$(grep -c 'Linux version' "$serial")" '^2$'
    expect "serial: the trial kernel had the hang argument and the watchdog" "$(cat "$serial")" 'Command line:.*inplaced\.vm_hang=1.*systemd\.watchdog_sec=60'
    expect "serial: no kernel panic (the reset was the watchdog's)" "$(grep -a -c 'Kernel panic' "$serial")" '^0$'
    trial_failed_common vm-kargs-hang "$before" "$grub_sum"
    # the agent names the watchdog only when the driver reports WDIOF_CARDRESET in
    # bootstatus; QEMU's 6300ESB under Debian 12's driver did not when measured, so the
    # agent says "a reset" and never more than it can tell
    expect "evidence: a reset, as far as the agent can tell" "$(ctl -o json get vm-kargs-hang)" \
        'fallback: (the hardware watchdog reset the hung trial boot|the trial boot never reached the agent: a kernel panic .* or a reset)'
    # this QEMU resets in place; every later scenario needs one that ends on a guest
    # reboot (-no-reboot), so the machine is powered off and booted again
    gx 'systemctl disable vm-hang.service' >/dev/null 2>&1 || true
    gx_bg 'systemctl poweroff'
    vm_wait_exit || { fail "the guest did not power off after the hang scenario"; return 1; }
    vm_boot || { fail "no boot after the hang scenario"; return 1; }
    wait_serving 180 || fail "the agent does not answer after the hang scenario"
}

# 7. A newer package installed while the agent is idle with a pending reboot.
s7_upgrade() {
    local pid0 ts0 op0
    pid0=$(unit_prop inplaced MainPID)
    ts0=$(unit_prop inplaced ExecMainStartTimestampMonotonic)
    op0=$(op_phase vm-kargs-1)
    expect "pending reboot" "$op0" '^PHASE_REBOOT_REQUIRED$'
    local out
    out=$(gx 'dpkg -i /mnt/vm/inplaced-new.deb 2>&1') || fail "dpkg -i the newer package: $out"
    expect "new version installed" "$(gx "dpkg-query -W -f='\${Version}' inplaced")" "^${new_version//+/\\+}\$"
    [ "$(unit_prop inplaced MainPID)" = "$pid0" ] || fail "dpkg restarted the daemon (MainPID $pid0 -> $(unit_prop inplaced MainPID))"
    [ "$(unit_prop inplaced ExecMainStartTimestampMonotonic)" = "$ts0" ] || fail "dpkg restarted the daemon (start time changed)"
    expect "still active" "$(unit_prop inplaced ActiveState)" '^active$'
    expect "the old binary runs on" "$(gx "readlink /proc/$pid0/exe")" '\(deleted\)$'
    expect "installed binary is the new build" "$(gx 'sha256sum /usr/bin/inplaced')" "^$new_sha "
    expect "pending reboot survives the upgrade" "$(op_phase vm-kargs-1)" '^PHASE_REBOOT_REQUIRED$'
    gx 'systemctl restart inplaced' >/dev/null || fail "systemctl restart inplaced"
    wait_serving 120 || { fail "agent not serving after the restart"; return 1; }
    local pid1
    pid1=$(unit_prop inplaced MainPID)
    [ "$pid1" != "$pid0" ] || fail "not restarted"
    expect "the new build runs" "$(gx "sha256sum /proc/$pid1/exe")" "^$new_sha "
    expect "state intact after the restart" "$(op_phase vm-kargs-1)" '^PHASE_REBOOT_REQUIRED$'
    expect "history intact" "$(ctl history)" 'vm-crash-v2b'
}

# 9. The second boot path: UEFI (OVMF), systemd-boot, Type #1 entries on a FAT ESP.
s9_uefi_install() {
    local show st
    show=$(unit_prop inplaced ActiveState; unit_prop inplaced SubState)
    expect "ActiveState, SubState" "$(tr '\n' ' ' <<<"$show")" '^active running $'
    st=$(ctl -o json status) || { fail "GetStatus: $st"; return 1; }
    echo "$st" >"$logdir/status-uefi.json"
    expect "BLS backend on the ESP's entries" "$st" 'bls|BLS'
    expect "the entry on the ESP" "$(gx 'ls /boot/efi/loader/entries')" '\.conf$'
}
s9_uefi_kargs() {
    local before out entry entry_sum
    before=$(gx 'cat /proc/cmdline')
    entry=$(gx 'ls /boot/efi/loader/entries/*.conf')
    entry_sum=$(gx "sha256sum $entry" | cut -d' ' -f1)
    kargs=(inplaced.e2e=1 'inplaced.note="two words"')
    out=$(ctl apply -f "$(spec uefi-kargs)" --id vm-uefi-kargs --wait 2>&1) || fail "apply: $(tail -5 <<<"$out")"
    expect "RebootRequired" "$(op_phase vm-uefi-kargs)" '^PHASE_REBOOT_REQUIRED$'
    expect "coverage: a systemd-boot trial" "$(ctl -o json get vm-uefi-kargs)" 'bootctl set-oneshot'
    expect "the default entry untouched" "$(gx "sha256sum $entry")" "^$entry_sum"
    expect "the trial entry on the ESP" "$(gx 'grep ^options /boot/efi/loader/entries/inplaced-trial.conf')" 'inplaced\.e2e=1.*inplaced\.note="two words".*panic=10 systemd\.watchdog_sec=60'
    expect "LoaderEntryOneShot (bootctl set-oneshot)" "$(gx 'cat /sys/firmware/efi/efivars/LoaderEntryOneShot-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f | tail -c +5 | tr -d "\0"')" '^inplaced-trial\.conf$'
    save_journal
    local t0=$SECONDS
    out=$(ctl reboot vm-uefi-kargs 2>&1) || fail "Reboot RPC: $out"
    vm_wait_exit || { fail "the guest did not reboot"; return 1; }
    vm_boot || { fail "boot after the reboot"; return 1; }
    wait_serving 180 || { fail "agent not serving after the reboot"; return 1; }
    expect "Succeeded after the trial boot" "$(wait_phase vm-uefi-kargs 'PHASE_SUCCEEDED|PHASE_FAILED|PHASE_ROLLED_BACK' 180)" '^PHASE_SUCCEEDED$' ||
        say "operation: $(ctl -o json get vm-uefi-kargs)"
    timing "uefi trial round trip" $((SECONDS - t0))
    local now
    now=$(gx 'cat /proc/cmdline')
    say "/proc/cmdline: $now"
    expect "the trial entry booted once: the two arguments, panic= and the watchdog" "$(python3 tests/vm/cmdline-diff.py "$before" "$now")" '^added \[inplaced\.e2e=1 inplaced\.note=two words panic=10 systemd\.watchdog_sec=60\] removed \[\]$'
    expect "committed: the entry's options" "$(gx "grep ^options $entry")" 'inplaced\.e2e=1.*inplaced\.note="two words"'
    expect "committed: /etc/kernel/cmdline in agreement" "$(gx 'cat /etc/kernel/cmdline')" 'inplaced\.e2e=1'
    expect "the trial entry is gone" "$(gx 'ls /boot/efi/loader/entries/ | grep -c inplaced-trial')" '^0$'
    expect "the one-shot is consumed" "$(gx 'ls /sys/firmware/efi/efivars/ | grep -c LoaderEntryOneShot')" '^0$'
}

# k. Fast reboots by policy (issue 26 item 3): a kernel argument reached through kexec
# (the installed kernel and initrd loaded with the new command line, `systemctl kexec`:
# no firmware, QEMU never resets), then one through a full reboot, each timed by the
# agent's own report (RebootReport: from the reboot request to the agent's start in the
# new boot, and the new kernel's age then) and by the host's clock (request to serving).
# reboot_json ID FIELD: a field of the operation's reboot report
reboot_json() {
    ctl -o json get "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("reboot",{}).get(sys.argv[1],""))' "$2"
}
sk_kexec() {
    local out boot_before=$boot_id t0 secs uptime
    # kexec-tools is in the image (image.sh); its own kexec on every reboot is off
    expect "kexec-tools installed" "$(gx 'command -v kexec')" '/kexec$'
    expect "kexec permitted" "$(gx 'cat /proc/sys/kernel/kexec_load_disabled')" '^0$'
    # 1. kexec
    kargs+=(inplaced.kexec=1)
    out=$(ctl apply -f "$(spec kexec-1)" --id vm-kexec --reboot-method kexec --wait 2>&1) || fail "apply: $(tail -5 <<<"$out")"
    expect "RebootRequired" "$(op_phase vm-kexec)" '^PHASE_REBOOT_REQUIRED$'
    save_journal
    rm -f "$share/ready"
    t0=$SECONDS
    out=$(ctl reboot vm-kexec 2>&1) || fail "Reboot RPC: $out"
    while [ ! -f "$share/ready" ]; do
        kill -0 "$qemu_pid" 2>/dev/null || { fail "QEMU exited: the kexec reset the machine"; return 1; }
        [ $((SECONDS - t0)) -lt "${BOOT_TIMEOUT:-300}" ] || { fail "no ready marker after the kexec"; return 1; }
        sleep 0.2
    done
    boot_id=$(cat "$share/ready")
    [ "$boot_id" != "$boot_before" ] || fail "same boot id after the kexec"
    wait_serving 180 || { fail "agent not serving after the kexec"; return 1; }
    timing "kexec: request to serving (host clock)" $((SECONDS - t0))
    expect "Succeeded after the kexec" "$(wait_phase vm-kexec 'PHASE_SUCCEEDED|PHASE_FAILED' 180)" '^PHASE_SUCCEEDED$' ||
        say "operation: $(ctl -o json get vm-kexec)"
    expect "/proc/cmdline has inplaced.kexec=1" "$(gx 'cat /proc/cmdline')" '(^| )inplaced\.kexec=1( |$)'
    expect "method kexec" "$(reboot_json vm-kexec method)" '^REBOOT_METHOD_KEXEC$'
    secs=$(reboot_json vm-kexec seconds) uptime=$(reboot_json vm-kexec kernelUptimeSeconds)
    expect "kexec time reported" "$secs" '^[0-9.]+$'
    timing "kexec: request to agent start (RebootReport.seconds)" "$secs"
    timing "kexec: kernel age at agent start (RebootReport.kernel_uptime_seconds)" "$uptime"
    kexec_secs=$secs
    # 2. a full reboot in the same run
    kargs+=(inplaced.full=1)
    boot_before=$boot_id
    out=$(ctl apply -f "$(spec kexec-2)" --id vm-full --reboot-method full --wait 2>&1) || fail "apply: $(tail -5 <<<"$out")"
    expect "RebootRequired" "$(op_phase vm-full)" '^PHASE_REBOOT_REQUIRED$'
    save_journal
    t0=$SECONDS
    out=$(ctl reboot vm-full 2>&1) || fail "Reboot RPC: $out"
    vm_wait_exit || { fail "the guest did not reboot"; return 1; }
    vm_boot || { fail "boot after the full reboot"; return 1; }
    [ "$boot_id" != "$boot_before" ] || fail "same boot id"
    wait_serving 180 || { fail "agent not serving after the full reboot"; return 1; }
    timing "full: request to serving (host clock, QEMU restarted by the test)" $((SECONDS - t0))
    expect "Succeeded after the full reboot" "$(wait_phase vm-full 'PHASE_SUCCEEDED|PHASE_FAILED' 180)" '^PHASE_SUCCEEDED$'
    expect "/proc/cmdline has both arguments" "$(gx 'cat /proc/cmdline')" 'inplaced\.kexec=1.*inplaced\.full=1|inplaced\.full=1.*inplaced\.kexec=1'
    expect "method full" "$(reboot_json vm-full method)" '^REBOOT_METHOD_FULL$'
    secs=$(reboot_json vm-full seconds) uptime=$(reboot_json vm-full kernelUptimeSeconds)
    timing "full: request to agent start (RebootReport.seconds)" "$secs"
    timing "full: kernel age at agent start (RebootReport.kernel_uptime_seconds)" "$uptime"
    say "reboot time, kexec vs full (agent's report): $kexec_secs s vs $secs s"
}
