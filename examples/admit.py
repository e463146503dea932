"""Admit a share on this node's agent, print what its container would get, release it.

    python examples/admit.py            # 8 GiB and 25 % of the threads
    python examples/admit.py 20GiB 50

The agent is found as ``gpushare`` finds it (``GPUSHARE_SOCKET``, the config file, or a
simulated agent started with ``gpushare serve --sim``). Exits 1 when it is refused."""

from __future__ import annotations

import asyncio
import sys
import uuid

from agent.client import AgentClient, Priority, find_socket
from agent.core.units import parse_bytes


async def main(memory: str, thread_pct: float) -> int:
    socket = find_socket()
    async with AgentClient(f"unix://{socket}") as agent:
        result = await agent.admit(
            request_id=f"example-{uuid.uuid4()}",  # the same id again answers the same lease
            tenant="example",
            trust_domain="example",
            priority=Priority.BURSTABLE,
            memory_bytes=parse_bytes(memory),
            thread_pct=thread_pct,
        )
        decision = result.decision
        if not decision.admitted:
            print(f"refused: {decision.reason}: {decision.message}")
            return 1
        print(f"lease {result.lease.lease_id} on {decision.device_uuid} ({socket})")
        for name, value in sorted(result.env.items()):
            print(f"  {name}={value}")
        await agent.release(result.lease.lease_id)
        print(f"released {result.lease.lease_id}")
    return 0


if __name__ == "__main__":
    size = sys.argv[1] if len(sys.argv) > 1 else "8GiB"
    threads = float(sys.argv[2]) if len(sys.argv) > 2 else 25.0
    sys.exit(asyncio.run(main(size, threads)))
