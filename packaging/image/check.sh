#!/usr/bin/env bash
# Runs the image packaging/image/build.sh made with a real container runtime (runc, from
# Debian's packages) under the security context of deploy/extension.yaml's Deployment,
# and calls it the way CAPI does: Discovery and CanUpdateMachine over HTTPS with CAPI's
# client certificate (mutual TLS), the hook answered by asking a real inplaced agent on
# this machine over the agents' mutual TLS.
#
#   bash packaging/image/build.sh && bash packaging/image/check.sh
#
# What the Deployment's securityContext becomes in runc's config.json (what the kubelet
# and containerd would write): runAsNonRoot -> the image's user must be numeric and not 0
# (checked on the image config, as the kubelet does), and runs as that user;
# readOnlyRootFilesystem -> root.readonly; allowPrivilegeEscalation: false ->
# process.noNewPrivileges; capabilities drop ALL -> every capability set empty. The
# volumes are read-only bind mounts at the Deployment's mountPaths. The container shares
# this machine's network namespace (a pod's network is the CNI's business, not the
# image's), so it reaches the agent on loopback.
#
# Needs root (runc creates the namespaces and mounts). Prints `image: N passed, M failed`.
set -euo pipefail
shopt -s inherit_errexit 2>/dev/null || true
cd "$(dirname "$0")/../.."

say() { printf 'image-check: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }
command -v runc >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runc >/dev/null ||
    die "runc is needed (Debian package runc)"
command -v umoci >/dev/null || die "umoci is needed: run packaging/image/build.sh first"

target_dir=$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
layout=$target_dir/image/oci
tag=$(cat "$target_dir/image/tag" 2>/dev/null) || die "no image: run packaging/image/build.sh first"
cargo build --quiet --locked --bin inplaced --example gen-certs
bin=$target_dir/debug

passed=0
failed=0
ok() { passed=$((passed + 1)); printf 'ok   %s\n' "$1"; }
fail() { failed=$((failed + 1)); printf 'FAIL %s\n' "$1"; [ -z "${2:-}" ] || printf '%s\n' "$2" | sed 's/^/     /'; }
check() { if eval "$2"; then ok "$1"; else fail "$1" "${3:-}"; fi; }
. examples/lib.sh # port, wait_port, start_agent

# not under /tmp: inplaced refuses a config in a directory others can write (StrictModes)
mkdir -p "$target_dir/tmp"
work=$(mktemp -d -p "$target_dir/tmp")
chmod 0755 "$work"
cid=inplace-extension-check-$$
pids=()
cleanup() {
    runc kill "$cid" KILL >/dev/null 2>&1 || true
    for _ in $(seq 20); do runc state "$cid" 2>/dev/null | grep -q '"status": "stopped"' && break; sleep 0.1; done
    runc delete --force "$cid" >/dev/null 2>&1 || true
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# --- the image config, as the kubelet reads it
umoci stat --image "$layout:$tag" --json > "$work/stat.json"
umoci unpack --image "$layout:$tag" "$work/bundle" >/dev/null
user=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["process"]["user"]["uid"])' "$work/bundle/config.json")
check "image user is numeric and not root (runAsNonRoot): uid $user" '[ "$user" -gt 0 ]'
cfg=$(python3 - "$layout" "$tag" <<'PY'
import json, os, sys
layout, tag = sys.argv[1:3]
blob = lambda d: os.path.join(layout, "blobs", *d.split(":"))
idx = json.load(open(os.path.join(layout, "index.json")))
m = next(m for m in idx["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == tag)
c = json.load(open(blob(json.load(open(blob(m["digest"])))["config"]["digest"])))
print(c["config"]["User"])
for k, v in sorted(c["config"]["Labels"].items()):
    print(f"{k}={v}")
PY
)
check "image config User is 65532:65532" '[ "$(head -1 <<<"$cfg")" = 65532:65532 ]' "$cfg"
for l in org.opencontainers.image.version org.opencontainers.image.source org.opencontainers.image.revision io.inplaced.glibc-baseline io.inplaced.base.packages; do
    check "label $l" 'grep -q "^$l=." <<<"$cfg"' "$cfg"
done
rootfs=$work/bundle/rootfs
check "no shell in the image" '! ls "$rootfs"/bin/sh "$rootfs"/usr/bin/sh "$rootfs"/bin/bash "$rootfs"/usr/bin/bash 2>/dev/null | grep -q .'
check "the binary is the only executable" '[ "$(find "$rootfs" -type f -perm -u+x ! -name "*.so*" | sed "s|^$rootfs||")" = /usr/bin/inplace-extension ]' \
    "$(find "$rootfs" -type f -perm -u+x ! -name '*.so*')"

# --- certificates, one agent on loopback (the node), the extension's config
"$bin/examples/gen-certs" "$work/pki" >/dev/null
# a Secret or ConfigMap volume's files are 0644 (defaultMode 420): the image's user reads them
chmod 0755 "$work/pki" && chmod 0644 "$work/pki"/*
a_addr=127.0.0.1:$(port)
ext_port=$(port)
metrics_port=$(port)
cp -r examples/node "$work/node-a"
start_agent node-a "$a_addr"

# the Deployment's volumes, at its mountPaths
vol=$work/volumes
mkdir -p "$vol/config" "$vol/tls" "$vol/capi-clients-ca" "$vol/agent" "$vol/agents-ca"
cp "$work/pki/extension.crt" "$vol/tls/tls.crt"; cp "$work/pki/extension.key" "$vol/tls/tls.key"
cp "$work/pki/capi-ca.crt" "$vol/capi-clients-ca/ca.crt"
cp "$work/pki/client.crt" "$vol/agent/tls.crt"; cp "$work/pki/client.key" "$vol/agent/tls.key"
cp "$work/pki/agents-ca.crt" "$vol/agents-ca/ca.crt"
cat > "$vol/config/config.toml" <<TOML
[server]
listen = "127.0.0.1:$ext_port"
cert = "/etc/inplace-extension/tls/tls.crt"
key = "/etc/inplace-extension/tls/tls.key"
client_ca = "/etc/inplace-extension/capi-clients-ca/ca.crt"
[[server.clients]]
identity = "spiffe://mgmt/ns/capi-system/sa/capi-manager"
[agent]
ca = "/etc/inplace-extension/agents-ca/ca.crt"
cert = "/etc/inplace-extension/agent/tls.crt"
key = "/etc/inplace-extension/agent/tls.key"
[resolver.static]
"site-a/edge-1-cp-7xk2p" = "$a_addr"
[metrics]
listen = "127.0.0.1:$metrics_port"
TOML
chmod -R a+rX "$vol"

# --- the OCI runtime config: the Deployment's securityContext
python3 - "$work/bundle/config.json" "$vol" <<'PY'
import json, sys
path, vol = sys.argv[1:3]
c = json.load(open(path))
p = c["process"]
p["terminal"] = False
p["noNewPrivileges"] = True                                   # allowPrivilegeEscalation: false
p["capabilities"] = {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")}  # drop ALL
c["root"]["readonly"] = True                                  # readOnlyRootFilesystem: true
c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"] if n["type"] != "network"]
for name in ("config", "tls", "capi-clients-ca", "agent", "agents-ca"):
    c["mounts"].append({"destination": f"/etc/inplace-extension/{name}", "type": "bind",
                        "source": f"{vol}/{name}", "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]})
json.dump(c, open(path, "w"), indent=2)
PY

say "runc run $cid"
(cd "$work/bundle" && runc run --detach --pid-file "$work/pid" "$cid") > "$work/runc.log" 2>&1 ||
    die "runc refused to start the container: $(cat "$work/runc.log")"
up=0
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$ext_port") 2>/dev/null && { up=1; break; }
    sleep 0.1
done
check "the container listens on its port" '[ "$up" = 1 ]' "$(runc state "$cid" 2>&1)"
pid=$(cat "$work/pid")
status=$(cat "/proc/$pid/status")
check "runs as uid 65532" 'grep -Eq "^Uid:\s+65532\s+65532\s+65532\s+65532$" <<<"$status"' "$(grep ^Uid <<<"$status")"
check "no capabilities (drop ALL)" 'grep -Eq "^CapEff:\s+0+$" <<<"$status" && grep -Eq "^CapBnd:\s+0+$" <<<"$status"' "$(grep ^Cap <<<"$status")"
check "no new privileges" 'grep -Eq "^NoNewPrivs:\s+1$" <<<"$status"'
check "root file system read-only" 'awk "\$5 == \"/\" { print \$6 }" "/proc/$pid/mountinfo" | grep -Eq "^ro(,|$)"' \
    "$(awk '$5 == "/"' "/proc/$pid/mountinfo")"

# --- CAPI's calls over mutual TLS
hooks=https://127.0.0.1:$ext_port/hooks.runtime.cluster.x-k8s.io/v1alpha1
export HOOK_CLIENT_CERT=$work/pki/capi.crt HOOK_CLIENT_KEY=$work/pki/capi.key
echo '{"apiVersion":"hooks.runtime.cluster.x-k8s.io/v1alpha1","kind":"DiscoveryRequest"}' > "$work/discovery.json"
disc=$(python3 examples/hook.py "$hooks/discovery" "$work/pki/extension-ca.crt" "$work/discovery.json" 2>&1 || true)
check "Discovery over mTLS lists the three in-place hooks" \
    'grep -q "\"status\": \"Success\"" <<<"$disc" && [ "$(grep -c "\"name\": \"\(can-update-machine\|can-update-machineset\|update-machine\)\"" <<<"$disc")" = 3 ]' "$disc"
can=$(python3 examples/hook.py "$hooks/canupdatemachine/can-update-machine" "$work/pki/extension-ca.crt" \
    tests/fixtures/capi/a-kubelet-args-and-sysctl/canupdatemachine-request.json 2>&1 || true)
check "CanUpdateMachine over mTLS, answered by the agent: covered, patches returned" \
    'grep -q "\"status\": \"Success\"" <<<"$can" && grep -q "max-pods" <<<"$can"' "$can"
unset HOOK_CLIENT_CERT HOOK_CLIENT_KEY
noclient=$(python3 examples/hook.py "$hooks/discovery" "$work/pki/extension-ca.crt" "$work/discovery.json" 2>&1 || true)
check "a caller without CAPI's client certificate is refused" '! grep -q "\"status\": \"Success\"" <<<"$noclient"' "$noclient"
metrics=$(python3 -c 'import sys,urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
    "http://127.0.0.1:$metrics_port/metrics" 2>&1 || true)
check "metrics: the hook call counted" 'grep -q "^inplace_extension_hook_calls_total{hook=\"CanUpdateMachine\"" <<<"$metrics"' "$(head -20 <<<"$metrics")"

echo "image: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
