#!/bin/bash
# System calls the daemon makes per GetCoverage of examples/specs/full.yaml (issue 28).
# A count, not a time: stable on a loaded machine, so it suits `git bisect run`.
#
#   benches/syscalls-per-coverage.sh INPLACED [INPLACECTL] [CALLS]
#
# Starts INPLACED on a copy of examples/node (under target/, since the agent refuses a
# config in a directory others can write), makes 3 warm-up calls, then CALLS (10) calls
# under `strace -f -c`, and prints `fs/call=N syscalls/call=M load=L`: the file system
# calls (openat, openat2, close, fcntl, dup, readlinkat, statx, fstat, newfstatat, read,
# lseek, getdents64) and all calls, per call. Needs strace. Debug builds count one more
# fcntl(F_GETFD) per close than release builds.
set -euo pipefail
BIN=$1
CTL=${2:-$(dirname "$BIN")/inplacectl}
N=${3:-10}
SRC=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$SRC/target/bench-tmp"
D=$(mktemp -d "$SRC/target/bench-tmp/sc.XXXX")
trap 'kill $PID 2>/dev/null || true; rm -rf "$D"' EXIT
cp -a "$SRC/examples/node" "$D/root"
cp "$SRC/examples/config.toml" "$D/config.toml"
chmod 755 "$D"
"$BIN" --root "$D/root" --state-dir "$D/state" --socket "$D/s.sock" \
  --config "$D/config.toml" --service-manager record --log warn 2>"$D/log" &
PID=$!
for _ in $(seq 200); do [ -S "$D/s.sock" ] && break; sleep 0.05; done
cov() { "$CTL" --socket "$D/s.sock" coverage -f "$SRC/examples/specs/full.yaml" >/dev/null; }
cov; cov; cov
strace -f -c -o "$D/st" -p "$PID" 2>/dev/null &
SP=$!
sleep 0.5
for _ in $(seq "$N"); do cov; done
sleep 0.2
kill -INT $SP
wait $SP 2>/dev/null || true
all=$(awk '/total/{print $4}' "$D/st" | tail -1)
fs=$(awk '$NF ~ /^(openat|openat2|close|fcntl|dup|readlinkat|statx|fstat|newfstatat|read|lseek|getdents64)$/{s+=$4} END{print s+0}' "$D/st")
echo "fs/call=$((fs / N)) syscalls/call=$((all / N)) load=$(cut -d' ' -f1 /proc/loadavg)"
