#!/usr/bin/env bash
# The Kubernetes tests: builds or reuses the real kube-apiserver and
# kube-controller-manager (build-apiserver.sh), then runs the tests in tests/k8s_*.rs,
# which are `#[ignore]`d in a plain `cargo test` (they need the server) and run here with
# `--ignored`. Each test starts its own etcd, kube-apiserver and kube-controller-manager on
# loopback (tests/k8s/harness.rs). Extra arguments go to the test binaries (a filter).
# Ends with `k8s: N passed, M failed`.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(bash tests/k8s/build-apiserver.sh | tail -1)
export INPLACED_K8S_BIN=$bin
"$bin/kube-apiserver" --version
log=${INPLACED_K8S_LOG:-/tmp/inplaced-k8s-tests.log}
: > "$log"
rc=0
for t in tests/k8s_*.rs; do
    name=$(basename "$t" .rs)
    cargo test --locked --test "$name" -- --ignored --test-threads=1 "$@" 2>&1 | tee -a "$log" || rc=1
done
awk '/^test result:/ { p += $4; f += $6 } END { printf "k8s: %d passed, %d failed\n", p, f }' "$log"
exit "$rc"
