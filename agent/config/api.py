"""The agent's gRPC and HTTP listeners: where they listen, who may call them (tokens,
TLS, observers), and how their secrets are followed."""

from __future__ import annotations

from dataclasses import dataclass

from agent.config.fields import setting


@dataclass(frozen=True, slots=True)
class ApiSettings:
    unix_socket: str = setting(
        "",
        "Path of the gRPC Unix socket the CLI uses (mode 0660). Empty: <runtime_dir>/agent.sock.",
    )
    tcp_listen: str = setting(
        "", "host:port of the gRPC listener for the scheduler. Empty: no TCP listener."
    )
    http_listen: str = setting(
        "127.0.0.1:9808",
        "host:port of the HTTP server for /metrics, /healthz and /readyz. Empty: disabled.",
    )
    token_file: str = setting(
        "",
        "File holding the bearer token TCP callers must send (authorization: Bearer <token>), "
        "or one 'NAME TOKEN' line per caller (the name owns the leases it makes): "
        "owned by the agent's user, mode 0600 or 0400, at least 128 bits of entropy. Needs "
        "server TLS (api.tls_cert_file/tls_key_file) unless api.insecure_loopback. Read at "
        "start, on SIGHUP and when it changes (api.secrets_check_s); never logged.",
    )
    tls_cert_file: str = setting(
        "", "Server certificate (PEM) of the TCP listener; re-read on SIGHUP and on a change."
    )
    tls_key_file: str = setting(
        "", "Server private key (PEM) of the TCP listener; re-read on SIGHUP and on a change."
    )
    tls_client_ca_file: str = setting(
        "",
        "CA (PEM) that client certificates must chain to: set it for mutual TLS. Empty: "
        "server TLS only, and api.token_file is required.",
    )
    insecure_loopback: bool = setting(
        False,
        "Allow a plaintext TCP listener with a bearer token, on a loopback address only (for "
        "development; logs a warning). A TCP listener without TLS is refused otherwise.",
    )
    observers: str = setting(
        "",
        "Comma-separated caller names (certificate common names or token names) with the "
        "observer role: they see every caller's lease ids in GetNode and WatchEvents. Others "
        "see only their own.",
    )
    max_batch: int = setting(1024, "Most requests in one AdmitBatch.", min=1)
    secrets_check_s: float = setting(
        30.0,
        "Seconds between checks of the token and TLS files for a change; a change reloads "
        "them as SIGHUP does (a Kubernetes Secret update reaches the agent with no signal). "
        "0: only on SIGHUP.",
        min=0.0,
    )
