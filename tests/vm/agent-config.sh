#!/bin/sh
# The remote API of the agent in the VM: exactly README.md's "Install on a node" edit of
# the packaged /etc/inplaced/config.toml (the VM test proves those commands give a config
# the daemon accepts). QEMU forwards a host loopback port to 0.0.0.0:9443.
# Usage: agent-config.sh <config.toml>
set -eu
sed -i -e '/^\[api\.tcp\]$/,/^\[/ {' \
    -e 's|^listen = ""|listen = "0.0.0.0:9443"|' \
    -e 's|^cert = ""|cert = "/etc/inplaced/tls/server.crt"|' \
    -e 's|^key = ""|key = "/etc/inplaced/tls/server.key"|' \
    -e 's|^client_ca = ""|client_ca = "/etc/inplaced/tls/clients-ca.crt"|' \
    -e '}' "$1"
cat >> "$1" <<'TOML'
[[api.tcp.clients]]
identity = "spiffe://mgmt/ns/inplace-system/sa/inplace-extension"   # a URI SAN (or DNS SAN; a CN only with match = "cn")
role = "admin"                                                    # or "reader"
TOML
grep -q '^listen = "0.0.0.0:9443"$' "$1"
