#!/usr/bin/env python3
"""An independent gRPC client for inplaced, built only from server reflection.

It proves the API is plain, standard gRPC: no copy of inplace.proto and no generated
code. Every message class is built at run time from the descriptors the server returns
over the gRPC server reflection service (grpcio-reflection's
ProtoReflectionDescriptorDatabase feeding a protobuf DescriptorPool).

Steps, each failing with a clear message and a non-zero exit:
  1. list the services by reflection: inplace.v1.NodeAgent and grpc.health.v1.Health
     must be there;
  2. grpc.health.v1.Health/Check for "inplace.v1.NodeAgent" must answer SERVING;
  3. inplace.v1.NodeAgent/GetStatus;
  4. inplace.v1.NodeAgent/GetCoverage of a NodeSpec built from the descriptor (one kubelet
     flag and one sysctl by default, or --spec-json);
then print a JSON summary on stdout and exit 0.

Transports: --unix PATH (target unix:PATH), or --tcp HOST:PORT with mutual TLS
(--ca, --cert, --key; --server-name overrides the name checked in the server's
certificate).

Only grpcio, grpcio-reflection and protobuf are needed (tests/python/requirements.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

try:
    import grpc
    from google.protobuf import descriptor_pool, json_format, message_factory
    from grpc_reflection.v1alpha import reflection_pb2
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )
except ImportError as e:  # pragma: no cover - environment problem
    sys.stderr.write(
        f"reflection_client: missing Python package ({e}); "
        "pip install -r tests/python/requirements.txt\n"
    )
    sys.exit(2)

AGENT_SERVICE = "inplace.v1.NodeAgent"
HEALTH_SERVICE = "grpc.health.v1.Health"

# The reflection service exists in two versions with identical messages (same field
# numbers) under different package names. grpcio-reflection's client speaks v1alpha only;
# servers built on newer stacks (tonic-reflection's build_v1, grpc-go's v1 service) may
# serve only v1. Since the wire format is the same, the v1alpha message classes are used to
# talk to either method.
REFLECTION_METHODS = {
    "v1": "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "v1alpha": "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
}


class Failure(Exception):
    """A check failed; the message says which and why."""


class _ReflectionStub:
    """Stand-in for the generated ServerReflectionStub, bound to one method path."""

    def __init__(self, channel: grpc.Channel, method: str, timeout: float):
        self._call = channel.stream_stream(
            method,
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        self._timeout = timeout

    def ServerReflectionInfo(self, requests, **kwargs):  # noqa: N802 - gRPC stub name
        kwargs.setdefault("timeout", self._timeout)
        return self._call(requests, **kwargs)


class ReflectionDatabase(ProtoReflectionDescriptorDatabase):
    """ProtoReflectionDescriptorDatabase that also speaks grpc.reflection.v1.

    It asks v1 first (the current version) and falls back to v1alpha on UNIMPLEMENTED;
    `version` says which one answered.
    """

    def __init__(self, channel: grpc.Channel, timeout: float, prefer: str = "auto"):
        super().__init__(channel)
        order = ["v1", "v1alpha"] if prefer == "auto" else [prefer]
        last: grpc.RpcError | None = None
        for version in order:
            self._stub = _ReflectionStub(channel, REFLECTION_METHODS[version], timeout)
            try:
                self.services = list(self.get_services())
            except grpc.RpcError as e:
                last = e
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    continue
                raise Failure(f"server reflection ({version}) failed: {describe(e)}") from e
            self.version = version
            return
        raise Failure(
            "the server does not implement server reflection "
            f"(tried {', '.join(order)}): {describe(last) if last else 'no answer'}"
        )


def describe(e: grpc.RpcError) -> str:
    try:
        return f"{e.code().name}: {e.details()}"
    except Exception:  # noqa: BLE001 - an RpcError that is not a Call
        return str(e)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Call inplaced using only server reflection (no .proto).",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--unix", metavar="PATH", help="Unix socket of the local API")
    where.add_argument("--tcp", metavar="HOST:PORT", help="TCP address of the mTLS API")
    p.add_argument("--ca", help="PEM CA bundle that signed the server certificate (--tcp)")
    p.add_argument("--cert", help="PEM client certificate (--tcp, mutual TLS)")
    p.add_argument("--key", help="PEM client private key (--tcp, mutual TLS)")
    p.add_argument(
        "--server-name",
        help="name to check in the server certificate instead of HOST (--tcp)",
    )
    p.add_argument(
        "--timeout", type=float, default=15.0, help="seconds per call and to connect"
    )
    p.add_argument(
        "--reflection",
        choices=["auto", "v1", "v1alpha"],
        default="auto",
        help="reflection version to use (auto: v1, then v1alpha)",
    )
    p.add_argument(
        "--spec-json",
        metavar="JSON",
        help="NodeSpec in the proto3 JSON mapping instead of the built-in one "
        "(kubelet flag max-pods=250, sysctl vm.max_map_count=262144)",
    )
    p.add_argument(
        "--expect-change",
        action="append",
        default=[],
        metavar="ID",
        help="fail unless the coverage report has a change with this id (repeatable)",
    )
    p.add_argument(
        "--expect-fully-covered",
        action="store_true",
        help="fail unless the coverage report is fully covered",
    )
    a = p.parse_args(argv)
    if a.tcp:
        if not a.ca:
            p.error("--tcp needs --ca (the API is served over TLS only)")
        if bool(a.cert) != bool(a.key):
            p.error("--cert and --key go together")
    elif a.ca or a.cert or a.key or a.server_name:
        p.error("--ca, --cert, --key and --server-name apply to --tcp only")
    return a


def read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise Failure(f"cannot read the {what} {path}: {e.strerror}") from e


def open_channel(a: argparse.Namespace) -> tuple[grpc.Channel, str]:
    if a.unix:
        path = os.path.abspath(a.unix)
        if not os.path.exists(path):
            raise Failure(f"no socket at {path}: is inplaced running with --socket {path}?")
        target = "unix:" + path
        # gRPC C-core (1.57 and later) sends the percent-encoded socket path as :authority
        # ("%2Frun%2Finplaced%2Finplaced.sock"), which is not a valid RFC 9113 authority:
        # hyper/h2 under tonic resets such a stream with PROTOCOL_ERROR (grpc/grpc#38142).
        # "localhost" is the convention for Unix sockets (grpc-go, kubelet, h2's own client).
        options = [("grpc.default_authority", "localhost")]
        return grpc.insecure_channel(target, options=options), target
    creds = grpc.ssl_channel_credentials(
        root_certificates=read(a.ca, "CA bundle"),
        private_key=read(a.key, "client key") if a.key else None,
        certificate_chain=read(a.cert, "client certificate") if a.cert else None,
    )
    options = []
    if a.server_name:
        options += [
            ("grpc.ssl_target_name_override", a.server_name),
            ("grpc.default_authority", a.server_name),
        ]
    return grpc.secure_channel(a.tcp, creds, options=options), a.tcp


class Client:
    """Unary calls whose message classes come from the reflected descriptors."""

    def __init__(self, channel: grpc.Channel, pool: descriptor_pool.DescriptorPool, timeout: float):
        self.channel = channel
        self.pool = pool
        self.timeout = timeout

    def message(self, full_name: str):
        try:
            desc = self.pool.FindMessageTypeByName(full_name)
        except KeyError as e:
            raise Failure(f"message {full_name} is not in the reflected descriptors") from e
        return message_factory.GetMessageClass(desc)

    def method(self, service: str, name: str):
        try:
            sdesc = self.pool.FindServiceByName(service)
        except KeyError as e:
            raise Failure(f"service {service} is not in the reflected descriptors") from e
        mdesc = sdesc.methods_by_name.get(name)
        if mdesc is None:
            raise Failure(
                f"{service} has no method {name} (it has {', '.join(sorted(sdesc.methods_by_name))})"
            )
        if mdesc.client_streaming or mdesc.server_streaming:
            raise Failure(f"{service}/{name} is streaming; this client calls unary methods")
        return mdesc

    def call(self, service: str, name: str, request):
        mdesc = self.method(service, name)
        if request.DESCRIPTOR.full_name != mdesc.input_type.full_name:
            raise Failure(
                f"{service}/{name} takes {mdesc.input_type.full_name}, "
                f"not {request.DESCRIPTOR.full_name}"
            )
        reply_cls = message_factory.GetMessageClass(mdesc.output_type)
        rpc = self.channel.unary_unary(
            f"/{service}/{name}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=reply_cls.FromString,
        )
        try:
            return rpc(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise Failure(f"{service}/{name} failed: {describe(e)}") from e

    def request_for(self, service: str, name: str):
        """An empty request message of the method's input type."""
        return message_factory.GetMessageClass(self.method(service, name).input_type)()


def node_spec(client: Client, spec_json: str | None):
    """The NodeSpec to ask coverage for, typed by the reflected descriptor."""
    req = client.request_for(AGENT_SERVICE, "GetCoverage")
    field = req.DESCRIPTOR.fields_by_name.get("desired")
    if field is None or field.message_type is None:
        raise Failure("GetCoverageRequest has no message field 'desired'")
    spec = message_factory.GetMessageClass(field.message_type)()
    if spec_json:
        try:
            json_format.Parse(spec_json, spec)
        except json_format.ParseError as e:
            raise Failure(f"--spec-json is not a valid {spec.DESCRIPTOR.full_name}: {e}") from e
    else:
        spec.kubelet.flags["max-pods"] = "250"
        spec.sysctls["vm.max_map_count"] = "262144"
    req.desired.CopyFrom(spec)
    return req


def run(a: argparse.Namespace) -> dict:
    channel, target = open_channel(a)
    try:
        grpc.channel_ready_future(channel).result(timeout=a.timeout)
    except grpc.FutureTimeoutError as e:
        hint = (
            " (is the listener up? a failed TLS handshake looks the same: check --ca, "
            "--cert/--key and --server-name against the server certificate)"
            if a.tcp
            else ""
        )
        raise Failure(f"cannot connect to {target} within {a.timeout:g}s{hint}") from e

    db = ReflectionDatabase(channel, a.timeout, a.reflection)
    services = sorted(db.services)
    missing = [s for s in (AGENT_SERVICE, HEALTH_SERVICE) if s not in services]
    if missing:
        raise Failure(
            f"reflection does not list {', '.join(missing)} (it lists {', '.join(services) or 'nothing'})"
        )
    pool = descriptor_pool.DescriptorPool(db)
    client = Client(channel, pool, a.timeout)

    # grpc.health.v1.Health/Check
    check = client.request_for(HEALTH_SERVICE, "Check")
    check.service = AGENT_SERVICE
    health = client.call(HEALTH_SERVICE, "Check", check)
    status_field = health.DESCRIPTOR.fields_by_name["status"]
    health_status = status_field.enum_type.values_by_number[health.status].name
    if health_status != "SERVING":
        raise Failure(f"health of {AGENT_SERVICE} is {health_status}, not SERVING")

    # inplace.v1.NodeAgent/GetStatus
    status = client.call(AGENT_SERVICE, "GetStatus", client.request_for(AGENT_SERVICE, "GetStatus"))

    # inplace.v1.NodeAgent/GetCoverage
    report = client.call(AGENT_SERVICE, "GetCoverage", node_spec(client, a.spec_json))
    ids = [c.id for c in report.changes]
    absent = [i for i in a.expect_change if i not in ids]
    if absent:
        raise Failure(
            f"coverage has no change {', '.join(absent)} (it has {', '.join(ids) or 'none'})"
        )
    if a.expect_fully_covered and not report.fully_covered:
        uncovered = {c.id: c.reason for c in report.changes if not c.covered}
        raise Failure(f"coverage is not fully covered: {json.dumps(uncovered)}")

    return {
        "target": target,
        "reflection": db.version,
        "services": services,
        "health": health_status,
        "version": status.version,
        "platform": status.facts.platform,
        "fullyCovered": report.fully_covered,
        "changes": len(ids),
        "changeIds": ids,
    }


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    try:
        summary = run(a)
    except Failure as e:
        sys.stderr.write(f"reflection_client: FAIL: {e}\n")
        return 1
    except grpc.RpcError as e:
        sys.stderr.write(f"reflection_client: FAIL: {describe(e)}\n")
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
