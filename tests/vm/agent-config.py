#!/usr/bin/env python3
"""Turns the packaged /etc/inplaced/config.toml into the VM test's: the remote API on
0.0.0.0:9443 (QEMU forwards a host loopback port to it) with the demo PKI, the extension's
identity as admin. Edits the keys in place, as an operator would; every other line stays.

Usage: agent-config.py <config.toml>
"""
import re
import sys

path = sys.argv[1]
text = open(path).read()
values = {
    "listen": '"0.0.0.0:9443"',
    "cert": '"/etc/inplaced/tls/server.crt"',
    "key": '"/etc/inplaced/tls/server.key"',
    "client_ca": '"/etc/inplaced/tls/clients-ca.crt"',
}
out, section = [], None
for line in text.splitlines():
    m = re.match(r"^\[([^\]]+)\]\s*$", line)
    if m:
        section = m.group(1)
    k = re.match(r"^([a-z_]+)\s*=", line)
    if section == "api.tcp" and k and k.group(1) in values:
        line = f"{k.group(1)} = {values.pop(k.group(1))}"
    out.append(line)
if values:
    sys.exit(f"agent-config.py: no {sorted(values)} in [api.tcp] of {path}")
out += [
    "",
    "# VM test (tests/vm): the extension's client identity (examples/gen-certs.rs) is admin",
    "[[api.tcp.clients]]",
    'identity = "spiffe://mgmt/ns/inplace-system/sa/inplace-extension"',
    'role = "admin"',
]
open(path, "w").write("\n".join(out) + "\n")
