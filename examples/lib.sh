# What the scripts that start the real binaries locally share (examples/extension-demo.sh,
# deploy/check-metrics.sh, packaging/image/check.sh): a work directory the agent accepts,
# the clean-up of started processes, free loopback ports, and an agent serving mTLS with
# the certificates of examples/gen-certs.rs. Source it after `cd` to the repository root,
# with `bin` set to the directory of the built binaries.

# A work directory under the target dir, not /tmp: inplaced refuses a config in a directory
# others can write (StrictModes). Started processes go in `pids` and are stopped at exit.
lib_work() {
    mkdir -p "${CARGO_TARGET_DIR:-target}/tmp"
    work=$(mktemp -d -p "$(cd "${CARGO_TARGET_DIR:-target}/tmp" && pwd)")
    pids=()
    trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
}

# A free TCP port on 127.0.0.1.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Waits (15 s at most) until something accepts connections on 127.0.0.1:$1.
wait_port() {
    for _ in $(seq 150); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done
    echo "nothing listens on $1" >&2
    return 1
}

# Starts inplaced on the node copy "$work/$1" (state "$work/$1-state", socket
# "$work/$1.sock", recorded unit actions, the node's stand-in kubelet run for its
# version), serving mTLS on address $2 to the extension's
# identity as admin, with the certificates in "$work/pki"; $3 is more config (TOML, after
# the [api.tcp] table). Waits for its socket.
start_agent() {
    cat > "$work/$1.toml" <<TOML
[api.tcp]
listen = "$2"
cert = "$work/pki/agent.crt"
key = "$work/pki/agent.key"
client_ca = "$work/pki/clients-ca.crt"
[[api.tcp.clients]]
identity = "spiffe://mgmt/ns/inplace-system/sa/inplace-extension"
role = "admin"
${3:-}
TOML
    # the recorder runs the node's stand-in kubelet for `kubelet --version` (README)
    INPLACED_RECORD_EXEC=/usr/bin/kubelet \
        "$bin/inplaced" --root "$work/$1" --state-dir "$work/$1-state" --socket "$work/$1.sock" \
        --config "$work/$1.toml" --service-manager record --log warn &
    pids+=($!)
    for _ in $(seq 100); do [ -S "$work/$1.sock" ] && return; sleep 0.1; done
    echo "agent $1 did not start" >&2
    return 1
}
