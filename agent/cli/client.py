"""Calls to the agent, with errors people can act on: over its Unix socket (a path), or
over TCP to an :class:`Endpoint` with TLS (a CA, optionally a client certificate) and an
optional bearer token."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc


class AgentUnreachable(Exception):
    """The agent's socket is missing or nobody answers on it."""


class AgentRefused(Exception):
    """The agent answered with an error status (bad input, not found, ...)."""

    def __init__(self, message: str, *, invalid_argument: bool = False) -> None:
        super().__init__(message)
        self.invalid_argument = invalid_argument  # the request itself was malformed


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The agent's TCP listener: ``target`` host:port, the CA its certificate chains to,
    a client certificate and key for mutual TLS, a token file for a bearer token."""

    target: str
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    token_file: str = ""
    server_name: str = ""

    def channel(self) -> grpc.Channel:
        if not self.ca_file:
            raise AgentUnreachable(
                f"{self.target}: the agent's TCP listener speaks TLS: give --tls-ca "
                "(and --tls-cert/--tls-key for mutual TLS)"
            )
        try:
            cert = Path(self.cert_file).read_bytes() if self.cert_file else None
            key = Path(self.key_file).read_bytes() if self.key_file else None
            credentials = grpc.ssl_channel_credentials(
                root_certificates=Path(self.ca_file).read_bytes(),
                private_key=key,
                certificate_chain=cert,
            )
        except OSError as exc:
            raise AgentUnreachable(f"cannot read TLS material: {exc}") from exc
        options = [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
        return grpc.secure_channel(self.target, credentials, options=options)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        if not self.token_file:
            return ()
        try:
            token = Path(self.token_file).read_text().strip()
        except OSError as exc:
            raise AgentUnreachable(f"cannot read {self.token_file}: {exc.strerror}") from exc
        return (("authorization", f"Bearer {token}"),)


Where = str | Endpoint  # a Unix socket path, or a TCP endpoint


def _channel(where: Where) -> grpc.Channel:
    if isinstance(where, Endpoint):
        return where.channel()
    if not os.path.exists(where):
        raise AgentUnreachable(
            f"no agent socket at {where}: is the agent running (gpushare serve)? "
            "Use --socket or GPUSHARE_SOCKET if it listens elsewhere"
        )
    _probe(where)
    return grpc.insecure_channel(f"unix:{where}")


def restart_hint(environ: Mapping[str, str] | None = None) -> str:
    """How to start the agent again and read why it stopped, where the CLI runs: in the
    agent's pod (Kubernetes), or on a host with the systemd unit."""
    env = os.environ if environ is None else environ
    if env.get("KUBERNETES_SERVICE_HOST"):
        node = env.get("GPUSHARE_RUNTIME_NODE_NAME") or "<this node>"
        return (
            "The agent's pod restarts it (its container exits with the agent); why it "
            "stopped: kubectl -n gpushare-system logs --previous "
            f"$(kubectl -n gpushare-system get pod -l app.kubernetes.io/name=gpushare-agent "
            f"--field-selector spec.nodeName={node} -o name)"
        )
    return (
        "Start the agent again (systemctl start gpushare-agent, or gpushare serve), which "
        "replaces it; why it stopped: journalctl -u gpushare-agent -n 100"
    )


def _probe(path: str) -> None:
    """Tell a stale socket (left by an agent killed with SIGKILL or crashed) and a socket
    this user may not open from an agent that does not answer, with what to do."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            raise AgentUnreachable(
                f"{path} is a stale socket: no agent listens on it (the agent that made it "
                f"stopped without removing it: killed, crashed or out of memory). {restart_hint()}"
            ) from None
        except PermissionError:
            raise AgentUnreachable(
                f"permission denied on {path}: run as root or as the agent's user"
            ) from None
        except OSError:
            return  # a slow or full listener: gRPC reports it with its deadline


def _name(where: Where) -> str:
    return where.target if isinstance(where, Endpoint) else where


def _metadata(where: Where) -> tuple[tuple[str, str], ...]:
    return where.metadata() if isinstance(where, Endpoint) else ()


def call(where: Where, method: str, request: Any, *, timeout_s: float = 5.0) -> Any:
    """One unary call of ``gpushare.v1.Agent``; errors become AgentUnreachable/Refused."""
    metadata = _metadata(where)
    with _channel(where) as channel:
        stub = pb_grpc.AgentStub(channel)
        try:
            return getattr(stub, method)(request, timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            code = exc.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise AgentUnreachable(
                    f"the agent at {_name(where)} did not answer: {code.name}: {exc.details()}"
                ) from exc
            raise AgentRefused(
                f"{code.name}: {exc.details()}",
                invalid_argument=code is grpc.StatusCode.INVALID_ARGUMENT,
            ) from exc


def get_node(where: Where, *, timeout_s: float = 5.0) -> pb.GetNodeResponse:
    response: pb.GetNodeResponse = call(where, "GetNode", pb.GetNodeRequest(), timeout_s=timeout_s)
    return response


def report_progress(
    where: Where, lease_id: str, units_done: float, *, timeout_s: float = 5.0
) -> pb.ReportProgressResponse:
    request = pb.ReportProgressRequest(lease_id=lease_id, units_done=units_done)
    response: pb.ReportProgressResponse = call(
        where, "ReportProgress", request, timeout_s=timeout_s
    )
    return response


def retrain_estimator(where: Where, *, timeout_s: float = 600.0) -> pb.RetrainEstimatorResponse:
    """RetrainEstimator (admin: the Unix socket); training takes a while."""
    response: pb.RetrainEstimatorResponse = call(
        where, "RetrainEstimator", pb.RetrainEstimatorRequest(), timeout_s=timeout_s
    )
    return response


def watch_events(where: Where, since_seq: int) -> Iterator[pb.Event]:
    metadata = _metadata(where)
    with _channel(where) as channel:
        stub = pb_grpc.AgentStub(channel)
        try:
            yield from stub.WatchEvents(
                pb.WatchEventsRequest(since_seq=since_seq), metadata=metadata
            )
        except grpc.RpcError as exc:
            raise AgentUnreachable(f"event stream ended: {exc.code().name}") from exc
