#!/usr/bin/env python3
"""Checks the identity rules of deploy/extension.yaml (README "Who can obtain CAPI's
identity"). Usage: python3 deploy/check-extension.py [--self-test] [FILE]

Rules, each a line on stderr naming the document when broken (exit 1):
- every document parses and is one of the kinds the manifest is meant to hold; no
  ClusterIssuer, no Secret;
- every Certificate names an Issuer (kind: Issuer) of its own namespace, a commonName of at
  most 64 characters (X.509 ub-common-name), and privateKey.rotationPolicy: Never when it
  is a CA (so a renewal keeps the key and every trust copy stays valid), Always otherwise;
- every CA Issuer reads a Secret an isCA Certificate of its namespace writes (the one
  exception: the agents' client CA, made outside the cluster);
- each [[server.clients]] URI identity is issued in the namespace its SPIFFE ID names, by
  a CA of that namespace rooted in a selfSigned Issuer of that namespace, and the
  NetworkPolicy admits exactly those namespaces to the server port;
- server.client_ca is mounted from a ConfigMap the manifest does not define (created at
  install; applying the manifest again does not reset it), and no CA key Secret is
  mounted into the extension;
- the ExtensionConfig's CA comes from a Certificate issued by a CA Issuer (a self-signed
  serving certificate would change what CAPI trusts at each renewal).

--self-test applies one mutation per rule to the file and expects each to be reported.
Needs python3 (3.11+, tomllib) and PyYAML.
"""

import re
import sys
import tomllib

import yaml

KINDS = {
    ("v1", "Namespace"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("runtime.cluster.x-k8s.io/v1beta2", "ExtensionConfig"),
}
# CA Secrets made outside the cluster: the agents' client CA (the agents' configuration
# carries its certificate).
HAND_MADE_CA = {("inplace-system", "inplaced-clients-ca")}
SPIFFE = re.compile(r"^spiffe://[^/]+/ns/([^/]+)/sa/[^/]+$")


def ident(d):
    m = d.get("metadata") or {}
    return f"{d.get('kind')} {m.get('namespace', '')}/{m.get('name')}".replace(" /", " ")


def check(text):
    """The list of broken rules of the manifest `text` (empty when it holds)."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        return [f"does not parse: {e}"]
    errs = []
    for d in docs:
        if not isinstance(d, dict) or not (d.get("metadata") or {}).get("name"):
            errs.append(f"{d!r:.60}: not an object with metadata.name")
        elif (d.get("apiVersion"), d.get("kind")) not in KINDS:
            errs.append(f"{ident(d)}: {d.get('apiVersion')} {d.get('kind')} is not expected here")
    if errs:
        return errs

    def of(kind):
        return [d for d in docs if d["kind"] == kind]

    def ns(d):
        return d["metadata"].get("namespace")

    issuers = {(ns(d), d["metadata"]["name"]): d for d in of("Issuer")}
    certs = of("Certificate")
    ca_secrets = {}  # (ns, secretName) -> isCA Certificate
    for c in certs:
        s = c.get("spec", {})
        if s.get("isCA"):
            ca_secrets[(ns(c), s.get("secretName"))] = c

    def issuer_of(c):
        ref = c.get("spec", {}).get("issuerRef", {})
        return issuers.get((ns(c), ref.get("name")))

    for c in certs:
        s = c.get("spec", {})
        ref = s.get("issuerRef", {})
        if ref.get("kind") != "Issuer" or ref.get("group", "cert-manager.io") != "cert-manager.io":
            errs.append(f"{ident(c)}: issuerRef must be a namespaced Issuer (kind: Issuer)")
        elif issuer_of(c) is None:
            errs.append(f"{ident(c)}: no Issuer {ref.get('name')} in namespace {ns(c)}")
        if len(s.get("commonName", "")) > 64:
            errs.append(f"{ident(c)}: commonName longer than 64 characters")
        want = "Never" if s.get("isCA") else "Always"
        if (s.get("privateKey") or {}).get("rotationPolicy") != want:
            errs.append(f"{ident(c)}: privateKey.rotationPolicy must be {want}")
    for key, i in issuers.items():
        ca = i.get("spec", {}).get("ca")
        if ca and (key[0], ca.get("secretName")) not in ca_secrets and (key[0], ca.get("secretName")) not in HAND_MADE_CA:
            errs.append(f"{ident(i)}: its CA Secret {ca.get('secretName')} is written by no isCA Certificate of namespace {key[0]}")

    cm = next((d for d in of("ConfigMap") if "config.toml" in (d.get("data") or {})), None)
    if cm is None:
        return errs + ["no ConfigMap with config.toml"]
    config = tomllib.loads(cm["data"]["config.toml"])
    server = config.get("server", {})
    port = int(server.get("listen", ":0").rsplit(":", 1)[1])
    client_ns = set()
    for c in server.get("clients", []):
        ident_ = c.get("identity", "")
        if c.get("match", "uri") != "uri":
            continue
        m = SPIFFE.match(ident_)
        issued = [x for x in certs if ident_ in x.get("spec", {}).get("uris", [])]
        if not m or len(issued) != 1:
            errs.append(f"server.clients {ident_}: not a SPIFFE ID issued by exactly one Certificate")
            continue
        cert, want_ns = issued[0], m.group(1)
        client_ns.add(want_ns)
        issuer = issuer_of(cert)
        ca_cert = ca_secrets.get((want_ns, ((issuer or {}).get("spec", {}).get("ca") or {}).get("secretName")))
        root = issuer_of(ca_cert) if ca_cert else None
        if ns(cert) != want_ns or ca_cert is None or root is None or "selfSigned" not in root.get("spec", {}):
            errs.append(f"server.clients {ident_}: must be issued in namespace {want_ns} by a CA of that namespace rooted in its own selfSigned Issuer")
    admitted = set()
    for p in of("NetworkPolicy"):
        for rule in p.get("spec", {}).get("ingress", []):
            if not any(x.get("port") == port for x in rule.get("ports", [])):
                continue
            for f in rule.get("from", []):
                sel = f.get("namespaceSelector") or {}
                names = list((sel.get("matchLabels") or {}).values())
                for e in sel.get("matchExpressions", []):
                    if e.get("key") == "kubernetes.io/metadata.name" and e.get("operator") == "In":
                        names += e.get("values", [])
                if not names or set(f) - {"namespaceSelector"}:
                    errs.append(f"{ident(p)}: port {port} admits more than named namespaces")
                admitted |= set(names)
    if admitted != client_ns:
        errs.append(f"NetworkPolicy admits {sorted(admitted)} to port {port}, the clients are in {sorted(client_ns)}")

    errs += check_deployment(of("Deployment"), server, ca_secrets, {d["metadata"]["name"] for d in of("ConfigMap")})
    for e in of("ExtensionConfig"):
        src = (e["metadata"].get("annotations") or {}).get("runtime.cluster.x-k8s.io/inject-ca-from-secret", "")
        sns, _, sname = src.partition("/")
        serving = [c for c in certs if ns(c) == sns and c.get("spec", {}).get("secretName") == sname]
        if len(serving) != 1 or "ca" not in (issuer_of(serving[0]) or {}).get("spec", {}):
            errs.append(f"{ident(e)}: inject-ca-from-secret {src} must be a Certificate issued by a CA Issuer")
    return errs


def check_deployment(deployments, server, ca_secrets, configmaps):
    errs = []
    ca_dir = server.get("client_ca", "").rsplit("/", 1)[0]
    for d in deployments:
        spec = d["spec"]["template"]["spec"]
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec.get("containers", []):
            for m in c.get("volumeMounts", []):
                v = vols.get(m["name"], {})
                if m["mountPath"] == ca_dir:
                    name = (v.get("configMap") or {}).get("name")
                    if name is None or name in configmaps:
                        errs.append(f"{ident(d)}: server.client_ca must come from a ConfigMap made at install, not defined in the manifest")
        for v in vols.values():
            if (d["metadata"].get("namespace"), (v.get("secret") or {}).get("secretName")) in ca_secrets:
                errs.append(f"{ident(d)}: mounts the CA key Secret {v['secret']['secretName']}")
    return errs


# (what the mutation breaks, old text, new text)
MUTATIONS = [
    ("a ClusterIssuer", "kind: Issuer\nmetadata:\n  name: capi-runtime-extension-clients\n", "kind: ClusterIssuer\nmetadata:\n  name: capi-runtime-extension-clients\n"),
    ("an issuerRef to a ClusterIssuer", "    name: capi-runtime-extension-clients\n    kind: Issuer\n", "    name: capi-runtime-extension-clients\n    kind: ClusterIssuer\n"),
    ("a CA re-keyed at renewal", "rotationPolicy: Never}", "rotationPolicy: Always}"),
    ("a CA without rotationPolicy", "rotationPolicy: Never}", "}"),
    ("a commonName over 64", "commonName: capi-kcp-runtime-extension-clients-ca", "commonName: capi-kcp-runtime-extension-clients-ca-for-the-kubeadm-control-plane-manager"),
    ("the core identity from the KCP namespace", "    - spiffe://mgmt/ns/capi-kubeadm-control-plane-system/sa/capi-kubeadm-control-plane-manager\n", "    - spiffe://mgmt/ns/capi-kubeadm-control-plane-system/sa/capi-kubeadm-control-plane-manager\n    - spiffe://mgmt/ns/capi-system/sa/capi-manager\n"),
    ("another namespace admitted", "values: [capi-system, capi-kubeadm-control-plane-system]", "values: [capi-system, capi-kubeadm-control-plane-system, default]"),
    ("a CA Secret nothing issues", "  ca:\n    secretName: capi-runtime-extension-clients-ca\n", "  ca:\n    secretName: copied-by-hand\n"),
    ("the core CA re-keyed at renewal", "rotationPolicy: Never}\n  issuerRef:\n    name: capi-runtime-extension-selfsigned\n", "rotationPolicy: Always}\n  issuerRef:\n    name: capi-runtime-extension-selfsigned\n"),
    ("client_ca read from a Secret", "          configMap:\n            name: capi-runtime-extension-clients-ca\n", "          secret:\n            secretName: capi-runtime-extension-clients-ca\n"),
    ("a CA key mounted", "secret: {secretName: inplace-extension-tls}", "secret: {secretName: inplace-extension-serving-ca}"),
    ("a self-signed serving certificate", "  issuerRef:\n    name: inplace-extension-serving\n", "  issuerRef:\n    name: inplace-extension-selfsigned\n"),
]


def self_test(text):
    if check(text):
        return ["the manifest itself does not pass"]
    missed = []
    for what, old, new in MUTATIONS:
        if old not in text:
            missed.append(f"self-test: the text of '{what}' is not in the manifest")
        elif not check(text.replace(old, new, 1)):
            missed.append(f"self-test: {what} was not reported")
    return missed


def main():
    args = [a for a in sys.argv[1:] if a != "--self-test"]
    path = args[0] if args else "deploy/extension.yaml"
    text = open(path, encoding="utf-8").read()
    errs = self_test(text) if "--self-test" in sys.argv else check(text)
    for e in errs:
        print(f"{path}: {e}", file=sys.stderr)
    if errs:
        sys.exit(1)
    n = len(MUTATIONS) if "--self-test" in sys.argv else len([d for d in yaml.safe_load_all(text) if d])
    print(f"{path}: {n} {'mutations reported' if '--self-test' in sys.argv else 'documents checked'}")


if __name__ == "__main__":
    main()
