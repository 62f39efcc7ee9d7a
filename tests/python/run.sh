#!/usr/bin/env bash
# Interop check: an independent Python gRPC client (grpcio + grpcio-reflection + protobuf
# only, no copy of the .proto) talks to a real inplaced over its Unix socket.
#
# Creates (or reuses) a venv under the cargo target dir, installs the pinned requirements,
# builds inplaced, starts it on a copy of examples/node with --service-manager record,
# runs tests/python/reflection_client.py over the socket, stops the daemon and exits with
# the client's status. Installs what it needs itself (python3-venv through apt-get when
# `python3 -m venv` is not available).
set -euo pipefail
cd "$(dirname "$0")/../.."
say() { printf 'python-interop: %s\n' "$*" >&2; }

# Debian's python3 first: a pyenv shim may point at an interpreter CI does not have.
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
command -v "$py" >/dev/null || {
    say "python3 missing: installing it"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
    py=/usr/bin/python3
}

target_dir=${CARGO_TARGET_DIR:-}
if [ -z "$target_dir" ]; then
    target_dir=$(cargo metadata --format-version 1 --no-deps |
        "$py" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
fi

# the venv, rebuilt when the requirements or the interpreter change
venv=$target_dir/python-interop-venv
stamp=$(cat tests/python/requirements.txt <("$py" -V 2>&1) | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$venv"
    if ! "$py" -m venv "$venv" 2>/dev/null; then
        say "python3 -m venv failed: installing python3-venv"
        rm -rf "$venv"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
        "$py" -m venv "$venv"
    fi
    "$venv/bin/pip" install -q --disable-pip-version-check -r tests/python/requirements.txt
    echo "$stamp" >"$venv/.stamp"
fi

cargo build --locked --quiet --bin inplaced
daemon=$target_dir/debug/inplaced

# not under /tmp: inplaced refuses a config in a directory others can write (StrictModes)
mkdir -p "$target_dir/tmp"
tmp=$(mktemp -d -p "${INPLACED_TEST_TMPDIR:-$target_dir/tmp}" inplaced-pyinterop.XXXXXX)
pid=
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

cp -a examples/node "$tmp/node"

# certificates for the mTLS leg: a server CA, a client CA, the server for localhost and an
# allowlisted admin client (openssl, from Debian's openssl package)
command -v openssl >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
}
pki=$tmp/pki
mkdir -p "$pki"
mkcert() { # name cn ca_name ext
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" \
        -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
    printf '%s\n' "$4" >"$pki/$1.ext"
    openssl x509 -req -in "$pki/$1.csr" -CA "$pki/$3.crt" -CAkey "$pki/$3.key" -CAcreateserial \
        -days 2 -extfile "$pki/$1.ext" -out "$pki/$1.crt" 2>/dev/null
}
for ca in server-ca client-ca; do
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -subj "/CN=$ca" -keyout "$pki/$ca.key" -out "$pki/$ca.crt" 2>/dev/null
done
mkcert server node-1 server-ca "subjectAltName=DNS:localhost,IP:127.0.0.1"
mkcert client capi-extension client-ca "subjectAltName=URI:spiffe://mgmt/capi/extension"
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$tmp/config.toml" <<EOF_TOML
[api.tcp]
listen = "127.0.0.1:$port"
cert = "$pki/server.crt"
key = "$pki/server.key"
client_ca = "$pki/client-ca.crt"
[[api.tcp.clients]]
identity = "spiffe://mgmt/capi/extension"
role = "admin"
EOF_TOML
sock=$tmp/s.sock
"$daemon" --root "$tmp/node" --state-dir "$tmp/state" --socket "$sock" \
    --config "$tmp/config.toml" --service-manager record >"$tmp/daemon.log" 2>&1 &
pid=$!
for _ in $(seq 300); do
    [ -S "$sock" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then
        say "inplaced exited before serving:"; cat "$tmp/daemon.log" >&2; exit 1
    fi
    sleep 0.1
done
[ -S "$sock" ] || { say "no socket after 30 s:"; cat "$tmp/daemon.log" >&2; exit 1; }

status=0
say "over the Unix socket"
"$venv/bin/python" tests/python/reflection_client.py --unix "$sock" \
    --expect-change 'kubelet.flags[max-pods]' --expect-change 'sysctls[vm.max_map_count]' \
    --expect-fully-covered || status=$?
if [ "$status" -eq 0 ]; then
    say "over TCP with mutual TLS"
    "$venv/bin/python" tests/python/reflection_client.py --tcp "127.0.0.1:$port" \
        --ca "$pki/server-ca.crt" --cert "$pki/client.crt" --key "$pki/client.key" \
        --server-name localhost \
        --expect-change 'kubelet.flags[max-pods]' --expect-change 'sysctls[vm.max_map_count]' \
        --expect-fully-covered || status=$?
fi

kill -TERM "$pid"
wait "$pid" || { rc=$?; say "inplaced exited $rc on SIGTERM"; [ "$status" -ne 0 ] || status=$rc; }
pid=
if [ "$status" -ne 0 ]; then
    say "FAILED (client exit $status); daemon log:"; cat "$tmp/daemon.log" >&2
else
    say "ok"
fi
exit "$status"
