#!/usr/bin/env python3
"""POST a CAPI hook request to inplace-extension over HTTPS and print the response, with
every `patch` (base64 on the wire) decoded in place for reading.

Usage: hook.py <https-url> <ca-bundle> <request.json | -> [key=value ...]
Each key=value is set in the request's `settings` (the ExtensionConfig settings CAPI
merges into every request). The client certificate CAPI's managers present is read from
HOOK_CLIENT_CERT and HOOK_CLIENT_KEY (PEM files), when set. Standard library only.
"""
import base64
import json
import os
import ssl
import sys
import urllib.request


def main() -> int:
    url, ca, path = sys.argv[1:4]
    body = json.load(sys.stdin if path == "-" else open(path))
    for kv in sys.argv[4:]:
        k, v = kv.split("=", 1)
        body.setdefault("settings", {})[k] = v
    ctx = ssl.create_default_context(cafile=ca)
    if os.environ.get("HOOK_CLIENT_CERT"):
        ctx.load_cert_chain(os.environ["HOOK_CLIENT_CERT"], os.environ["HOOK_CLIENT_KEY"])
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            resp = json.load(r)
    except urllib.error.HTTPError as e:
        resp = json.load(e)
    for k, v in resp.items():
        if isinstance(v, dict) and "patch" in v:
            v["patch (decoded)"] = json.loads(base64.b64decode(v.pop("patch")))
    json.dump(resp, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
