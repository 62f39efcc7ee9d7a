#!/usr/bin/env bash
# The CAPI side, locally: two inplaced agents on copies of two nodes (A: examples/node,
# the Ubuntu 24.04 GRUB control plane edge-1-cp-7xk2p; B: the RHEL 8 grubenv control plane
# edge-2-cp-q4m8d from tests/fixtures), each serving its mTLS API, and inplace-extension
# answering the CAPI hooks for them over HTTPS. The requests are the CAPI fixtures in
# tests/fixtures/capi; examples/hook.py posts them the way CAPI does and decodes patches.
# Unit actions and reboots are recorded (--service-manager record), not performed.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --quiet --bins --example gen-certs
bin=${CARGO_TARGET_DIR:-target}/debug
. examples/lib.sh
lib_work
"$bin/examples/gen-certs" "$work/pki" >/dev/null

# Two nodes, each with its agent on a loopback mTLS port.
cp -r examples/node "$work/node-a"
cp -r tests/fixtures/nodes/rhel8-grubenv "$work/node-b"
a_addr=127.0.0.1:$(port); b_addr=127.0.0.1:$(port); ext_addr=127.0.0.1:$(port)
start_agent node-a "$a_addr"
start_agent node-b "$b_addr"

# The extension: HTTPS for CAPI (which must present its managers' client certificate),
# mTLS client of the agents, a static resolver.
cat > "$work/extension.toml" <<TOML
[server]
listen = "$ext_addr"
cert = "$work/pki/extension.crt"
key = "$work/pki/extension.key"
client_ca = "$work/pki/capi-ca.crt"
[[server.clients]]
identity = "spiffe://mgmt/ns/capi-system/sa/capi-manager"
[agent]
ca = "$work/pki/agents-ca.crt"
cert = "$work/pki/client.crt"
key = "$work/pki/client.key"
[resolver.static]
"site-a/edge-1-cp-7xk2p" = "$a_addr"
"site-b/edge-2-cp-q4m8d" = "$b_addr"
TOML
"$bin/inplace-extension" --config "$work/extension.toml" --log warn &
pids+=($!)
wait_port "${ext_addr#*:}"

hooks=https://$ext_addr/hooks.runtime.cluster.x-k8s.io/v1alpha1
fx=tests/fixtures/capi
# CAPI's managers present this client certificate (--runtime-extension-client-cert-file)
export HOOK_CLIENT_CERT=$work/pki/capi.crt HOOK_CLIENT_KEY=$work/pki/capi.key
hook() { echo; echo "\$ POST $1  < $2 ${*:3}"; python3 examples/hook.py "$hooks/$1" "$work/pki/extension-ca.crt" "${@:2}"; }

echo '{"apiVersion":"hooks.runtime.cluster.x-k8s.io/v1alpha1","kind":"DiscoveryRequest"}' > "$work/discovery.json"
hook discovery "$work/discovery.json"
# a: kubeletExtraArgs max-pods 110 -> 250 and a sysctl file: fully covered by node A.
hook canupdatemachine/can-update-machine $fx/a-kubelet-args-and-sysctl/canupdatemachine-request.json
# b: ntp servers and a new diskSetup on node B (bare metal): ntp covered, diskSetup never;
# the node recommends preservation, so the answer asks CAPI to keep the Machine.
hook canupdatemachine/can-update-machine $fx/b-disksetup-not-coverable/canupdatemachine-request.json
# e: workers, decided from the declared capabilities without asking any node.
hook canupdatemachineset/can-update-machineset $fx/e-machineset-worker-template/canupdatemachineset-request.json

# UpdateMachine for a, polled as CAPI does (it would wait retryAfterSeconds in between).
python3 - "$fx/a-kubelet-args-and-sysctl/canupdatemachine-request.json" > "$work/update-a.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
json.dump({"apiVersion": r["apiVersion"], "kind": "UpdateMachineRequest",
           "settings": r.get("settings", {}), "desired": r["desired"]}, sys.stdout)
PY
for _ in $(seq 50); do
    hook updatemachine/update-machine "$work/update-a.json" | tee "$work/update.out"
    grep -q '"retryAfterSeconds": 0' "$work/update.out" && break
    sleep 0.5
done

echo
echo "\$ diff -ru examples/node <node A>   # what UpdateMachine changed on node A"
diff -ru examples/node "$work/node-a" | sed "s|$work/node-a|<node A>|g" || true
echo
echo "\$ cat <node A state>/actions.log"
cat "$work/node-a-state/actions.log"
