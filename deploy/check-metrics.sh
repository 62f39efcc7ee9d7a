#!/usr/bin/env bash
# `promtool check metrics` (format and lint) on everything the binaries export: the
# agent's /metrics and its node_exporter textfile, the extension's /metrics. Starts the
# debug binaries (cargo build) on a copy of examples/node, with certificates from
# examples/gen-certs.rs, like examples/extension-demo.sh. Needs promtool on PATH
# (deploy/check-alerts.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --locked --bin inplaced --bin inplace-extension --example gen-certs
bin=${CARGO_TARGET_DIR:-target}/debug
. examples/lib.sh
lib_work
chmod 0755 "$work"
"$bin/examples/gen-certs" "$work/pki" >/dev/null

agent_metrics=$(port)
textfile=/var/lib/node_exporter/textfile_collector/inplaced.prom
cp -r examples/node "$work/node"
mkdir -p "$work/node/$(dirname "$textfile")"
chmod -R go-w "$work/node/var"
cat > "$work/agent.toml" <<TOML
[metrics]
listen = "127.0.0.1:$agent_metrics"
textfile = "$textfile"
TOML
INPLACED_RECORD_EXEC=/usr/bin/kubelet \
"$bin/inplaced" --root "$work/node" --state-dir "$work/state" --socket "$work/agent.sock" \
    --config "$work/agent.toml" --service-manager record --log warn &
pids+=($!)

ext_metrics=$(port)
cat > "$work/extension.toml" <<TOML
[server]
listen = "127.0.0.1:$(port)"
cert = "$work/pki/extension.crt"
key = "$work/pki/extension.key"
client_ca = "$work/pki/capi-ca.crt"
[[server.clients]]
identity = "spiffe://mgmt/ns/capi-system/sa/capi-manager"
[agent]
ca = "$work/pki/agents-ca.crt"
cert = "$work/pki/client.crt"
key = "$work/pki/client.key"
[resolver]
template = "{name}.{namespace}.nodes.example.com:9443"
[metrics]
listen = "127.0.0.1:$ext_metrics"
TOML
"$bin/inplace-extension" --config "$work/extension.toml" --log warn &
pids+=($!)

get() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$1"; }
failed=0
check() { # name file
    if out=$(promtool check metrics < "$2" 2>&1); then
        echo "ok   promtool check metrics: $1 ($(grep -c '^# TYPE' "$2") families)"
    else
        echo "FAIL promtool check metrics: $1"; sed 's/^/     /' <<<"$out"; failed=1
    fi
}
wait_port "$agent_metrics"
get "http://127.0.0.1:$agent_metrics/metrics" > "$work/agent.prom"
check "inplaced /metrics" "$work/agent.prom"
for _ in $(seq 150); do [ -s "$work/node/$textfile" ] && break; sleep 0.1; done
check "inplaced textfile $textfile" "$work/node/$textfile"
wait_port "$ext_metrics"
get "http://127.0.0.1:$ext_metrics/metrics" > "$work/extension.prom"
check "inplace-extension /metrics" "$work/extension.prom"
grep -q '^process_resident_memory_bytes ' "$work/extension.prom" || { echo "FAIL extension: no process metrics"; failed=1; }
grep -q '^inplace_extension_build_info{version="' "$work/extension.prom" || { echo "FAIL extension: no build_info"; failed=1; }
[ "$failed" = 0 ]
