"""A typed Python client of the agent's gRPC API, for schedulers.

    async with AgentClient("gpu-node-1:7443", token="...") as agent:
        result = await agent.admit(tenant="team-a", trust_domain="team-a",
                                   priority=Priority.GUARANTEED, memory_bytes=20 * 2**30,
                                   thread_pct=25)
        print(result.decision.admitted, dict(result.env))
        async for event in agent.watch_events(since_seq=0):
            ...

Calls that fail with UNAVAILABLE are retried with exponential backoff, always with the same
request id, so a retry never admits twice. ``watch_events`` reconnects and resumes after the
last event it delivered.
"""

from agent.client.client import AgentClient, Priority

__all__ = ["AgentClient", "Priority"]
