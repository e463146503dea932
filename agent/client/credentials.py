"""The credentials a long-lived client of many agents holds (the cluster side's
``gpushare kube serve`` and ``gpushare dra controller``): TLS files read again for each new
connection, and a bearer token file read again when it changes."""

from __future__ import annotations

import logging

import grpc

from agent.client.client import TokenFile, tls_credentials
from agent.core.errors import ConfigError

log = logging.getLogger(__name__)


def agent_token(path: str) -> TokenFile | None:
    """The bearer token towards the agents (``""``: none); a ConfigError naming
    --agent-token-file when it cannot be read at start."""
    if not path:
        return None
    try:
        return TokenFile(path)
    except (OSError, ValueError) as exc:
        raise ConfigError("--agent-token-file", str(exc)) from exc


class AgentSecrets:
    """The TLS files towards the agents (none with ``insecure``), read again for each
    connection: files that cannot be read then leave the last ones read in use. At start,
    unreadable files are an error (OSError, ValueError)."""

    def __init__(self, ca_file: str, *, cert_file: str, key_file: str, insecure: bool) -> None:
        self._ca_file = ca_file
        self._cert_file = cert_file
        self._key_file = key_file
        self._insecure = insecure
        self._last = self._read()

    def _read(self) -> grpc.ChannelCredentials | None:
        if self._insecure:
            return None
        return tls_credentials(self._ca_file, cert_file=self._cert_file, key_file=self._key_file)

    def current(self) -> grpc.ChannelCredentials | None:
        try:
            self._last = self._read()
        except OSError as exc:
            log.warning("agents' TLS files not read again (the last ones kept): %s", exc)
        return self._last
