#!/usr/bin/env bash
# Runs the main job on the bundled example node (examples/node, a Dell bare-metal
# control-plane node with Ubuntu 24.04 and GRUB): starts inplaced on a copy of it, shows
# coverage for example specs, applies them, shows status and what changed on disk.
# Unit actions and reboots are recorded (--service-manager record), not performed.
set -euo pipefail
cd "$(dirname "$0")/.."

# INPLACED_BIN_DIR: run other builds of the binaries (packaging/check.sh runs the packaged ones)
if [ -n "${INPLACED_BIN_DIR:-}" ]; then
    bin=$INPLACED_BIN_DIR
else
    cargo build --quiet --bins
    bin=${CARGO_TARGET_DIR:-target}/debug
fi
# not under /tmp: inplaced refuses state or a config in a directory others can write
mkdir -p "${CARGO_TARGET_DIR:-target}/tmp"
work=$(mktemp -d -p "$(cd "${CARGO_TARGET_DIR:-target}/tmp" && pwd)")
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
cp -r examples/node "$work/root"
# a copy: the checkout may sit where others can write (a clone under /tmp)
cp examples/config.toml "$work/config.toml"
sock="$work/inplaced.sock"

# the recorder runs the example node's stand-in kubelet for `kubelet --version`
INPLACED_RECORD_EXEC=/usr/bin/kubelet \
    "$bin/inplaced" --root "$work/root" --state-dir "$work/state" --socket "$sock" \
    --config "$work/config.toml" --service-manager record --log warn &
pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
ctl() { echo; echo "\$ inplacectl $*"; "$bin/inplacectl" --socket "$sock" "$@"; }

ctl status
ctl coverage -f examples/specs/full.yaml
ctl apply -f examples/specs/full.yaml --id demo-full --wait
# A NodeSpec is the whole desired state: add kernel arguments to what is applied.
cat examples/specs/full.yaml examples/specs/kernel-args.yaml > "$work/full-and-kernel-args.yaml"
ctl coverage -f "$work/full-and-kernel-args.yaml"
ctl apply -f "$work/full-and-kernel-args.yaml" --id demo-kargs --wait
ctl status
# The caller (the CAPI extension, after draining) asks for the reboot.
ctl reboot demo-kargs
ctl history

echo
echo "\$ diff -ru examples/node <node copy>   # what changed on disk"
diff -ru examples/node "$work/root" | sed "s|$work/root|<node>|g" || true
echo
echo "\$ cat <state-dir>/actions.log   # unit actions, commands and reboots requested"
cat "$work/state/actions.log"
