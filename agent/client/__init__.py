"""A typed Python client of the agent's gRPC API, for schedulers.

    credentials = tls_credentials("ca.crt", cert_file="client.crt", key_file="client.key")
    async with AgentClient("gpu-node-1:9807", credentials=credentials) as agent:
        result = await agent.admit(tenant="team-a", trust_domain="team-a",
                                   priority=Priority.GUARANTEED, memory_bytes=20 * 2**30,
                                   thread_pct=25, run_as_uid=1000)
        print(result.decision.admitted, dict(result.env))
        async for event in agent.watch_events(since_seq=0):
            ...

``run_as_uid`` (the UID the share's processes run as) lets the agent keep one user per
MPS device (USER_CONFLICT otherwise); left out, that rule cannot apply to the share.

Calls that fail with UNAVAILABLE are retried with exponential backoff, always with the same
request id, so a retry never admits twice. ``watch_events`` reconnects and resumes after the
last event it delivered. With a bearer token over server TLS instead of a client
certificate: ``AgentClient(target, token=read_token_file(path),
credentials=tls_credentials("ca.crt"))``.
"""

from agent.client.client import (
    AgentClient,
    Priority,
    TokenFile,
    read_token_file,
    tls_credentials,
)
from agent.client.local import find_socket

__all__ = [
    "AgentClient",
    "Priority",
    "TokenFile",
    "find_socket",
    "read_token_file",
    "tls_credentials",
]
