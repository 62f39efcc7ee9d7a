#!/usr/bin/env python3
"""Checks docs/nodespec.schema.json with an independent JSON Schema validator (Python
jsonschema, Debian's python3-jsonschema): every example spec in examples/specs passes, and
specs the parser refuses for their shape (a misspelt section, an unquoted mode, a kernel
argument that is not a string) fail. Exits 1 on the first surprise."""
import glob
import json
import sys

import jsonschema
import yaml

schema = json.load(open("docs/nodespec.schema.json"))
jsonschema.Draft202012Validator.check_schema(schema)
v = jsonschema.Draft202012Validator(schema)
bad = 0
for f in sorted(glob.glob("examples/specs/*.yaml")):
    errs = list(v.iter_errors(yaml.safe_load(open(f)) or {}))
    print(("ok   " if not errs else "FAIL ") + f, *[e.message for e in errs[:3]])
    bad += bool(errs)
for name, doc in [
    ("a misspelt section", "filez: []\n"),
    ("an unquoted mode", "files:\n- path: /etc/x\n  mode: 0644\n"),
    ("a kernel argument that is a map", "kernelArgs:\n- console: ttyS1\n"),
    ("an unknown key in a file", "files:\n- path: /etc/x\n  contents: a\n"),
]:
    refused = not v.is_valid(yaml.safe_load(doc))
    print(("ok   " if refused else "FAIL ") + "refused: " + name)
    bad += not refused
print(f"schema: {'failed' if bad else 'ok'}")
sys.exit(1 if bad else 0)
