#!/usr/bin/env python3
"""CAPI hook requests for the Machine running in the VM (site "vm", Machine "edge-vm"),
built from the fixture tests/fixtures/capi/a-kubelet-args-and-sysctl: a Metal3 control
plane whose KubeadmConfig changes only joinConfiguration's kubeletExtraArgs max-pods.

Usage: capi-request.py can|update <current max-pods> <desired max-pods>
"""
import copy
import json
import os
import sys

kind, cur, want = sys.argv[1], sys.argv[2], sys.argv[3]
here = os.path.dirname(os.path.abspath(__file__))
fx = os.path.join(here, "../fixtures/capi/a-kubelet-args-and-sysctl/canupdatemachine-request.json")
base = json.load(open(fx))


def side(src, max_pods):
    s = copy.deepcopy(src)
    for obj in s.values():
        obj["metadata"]["name"] = "edge-vm"
        obj["metadata"]["namespace"] = "vm"
    s["machine"]["spec"]["providerID"] = "metal3://vm/host-01/edge-vm"
    s["machine"]["spec"]["bootstrap"]["configRef"]["name"] = "edge-vm"
    s["machine"]["spec"]["bootstrap"]["dataSecretName"] = "edge-vm"
    s["machine"]["spec"]["infrastructureRef"]["name"] = "edge-vm"
    s["infrastructureMachine"]["spec"]["providerID"] = "metal3://vm/host-01/edge-vm"
    spec = s["bootstrapConfig"]["spec"]
    spec.pop("files", None)
    spec["joinConfiguration"]["nodeRegistration"]["name"] = "edge-vm"
    spec["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"] = [
        {"name": "max-pods", "value": max_pods}
    ]
    return s


current, desired = side(base["current"], cur), side(base["desired"], want)
if kind == "can":
    req = {"apiVersion": base["apiVersion"], "kind": "CanUpdateMachineRequest",
           "settings": base.get("settings", {}), "current": current, "desired": desired}
else:
    req = {"apiVersion": base["apiVersion"], "kind": "UpdateMachineRequest",
           "settings": base.get("settings", {}), "desired": desired}
json.dump(req, sys.stdout, indent=1)
