#!/usr/bin/env bash
# Cross-version recovery: an older agent (OLD) is killed at each failpoint in the middle of
# an apply; the state directory it leaves is recovered once by OLD and once by NEW, on two
# copies. The node trees and the operation (phase, message, actions, history; times
# masked) must be the same: an agent upgraded in the middle of an operation settles it
# exactly as the old one would. Not run by CI (it needs the old agent built): run it
# before changing the journal, the state formats or recovery.
#
#   git worktree add /tmp/old <old commit> && (cd /tmp/old && cargo build --bins)
#   cargo build --bins
#   tests/compat/cross-version-recovery.sh /tmp/old/target/debug target/debug
#
# Ends with `cross-version recovery: N same, M different` and exits 1 on a difference.
set -uo pipefail
old=$(cd "$1" && pwd); new=$(cd "$2" && pwd); cd "$(dirname "$0")/../.."
# the agent obeys no state another user could write: a root-only directory, not /tmp
parent=${CARGO_TARGET_DIR:-$PWD/target}/tmp
mkdir -p "$parent" && base=$(mktemp -d -p "$parent") && chmod 700 "$base" || exit 2
trap 'rm -rf "$base"' EXIT
spec=$base/spec.yaml
cat examples/specs/full.yaml examples/specs/kernel-args.yaml > $spec
pass=0; fail=0
start() { # bin dir, work dir
  "$1/inplaced" --root "$2/root" --state-dir "$2/state" --socket "$2/s.sock" --config "$2/config.toml" --service-manager record --log error >/dev/null 2>>"$2/log" &
  echo $!
}
ready() { for _ in $(seq 200); do "$1/inplacectl" --socket "$2/s.sock" status >/dev/null 2>&1 && return 0; sleep 0.05; done; return 1; }
view() { # bin dir, work dir: the operation and status, times masked
  "$1/inplacectl" --socket "$2/s.sock" -o json get x 2>&1 | sed -E 's/"(createTime|updateTime|created|updated|seconds|nanos|bootId)": *("[^"]*"|[0-9]+)/"\1":_/g' | grep -v '"nanos"'
  "$1/inplacectl" --socket "$2/s.sock" history 2>&1 | sed -E 's/[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z/_/g'
}
for fp in stage write-temp write:1 write:3 sysctl act record applied reboot-required; do
  w=$base/$fp; mkdir -p $w; cp -r examples/node $w/root; cp examples/config.toml $w/config.toml
  pid=$(INPLACED_FAILPOINTS=$fp start "$old" $w); ready "$old" $w || { echo "$fp: old did not start"; continue; }
  "$old/inplacectl" --socket $w/s.sock apply -f $spec --id x --wait >/dev/null 2>&1
  wait $pid 2>/dev/null
  cp -a $w $w.ctl
  p1=$(start "$new" $w); p2=$(start "$old" $w.ctl)
  ready "$new" $w && ready "$old" $w.ctl || { echo "$fp: restart failed"; fail=$((fail+1)); kill $p1 $p2; continue; }
  sleep 0.3
  view "$new" $w > $w/view.new; view "$old" $w.ctl > $w/view.old
  if diff -r $w/root $w.ctl/root >/dev/null && diff $w/view.new $w/view.old >/dev/null; then
    echo "$fp: same ($(grep -o '"phase": *"[A-Za-z_]*"' $w/view.new | head -1))"; pass=$((pass+1))
  else
    echo "$fp: DIFFERENT"; diff -r $w/root $w.ctl/root | head -5; diff $w/view.new $w/view.old | head -20; fail=$((fail+1))
  fi
  kill $p1 $p2; wait $p1 $p2 2>/dev/null
done
echo "cross-version recovery: $pass same, $fail different"
[ "$fail" -eq 0 ]
