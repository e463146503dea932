"""The real agent, except that Admit and Release answer the first answer they gave again
(the real one, computed once), for bench/floor.py: gRPC's cost of Admit- and
Release-sized calls without the admission behind them.

GPUSHARE_BENCH_CANNED=canned: no identification either; =identify: the caller is still
identified at every call (token or certificate), as the real handlers do."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.api import grpc_server
from agent.cli.main import main


def can(name: str, identify: bool) -> None:
    real = getattr(grpc_server.AgentService, name)
    first: list[Any] = []

    async def answer(self: Any, request: Any, context: Any) -> Any:
        if identify:
            self._identify(context)
        if not first:
            first.append(await real(self, request, context))
        return first[0]

    setattr(grpc_server.AgentService, name, answer)


if __name__ == "__main__":
    mode = os.environ.get("GPUSHARE_BENCH_CANNED", "canned")
    for method in ("Admit", "Release"):
        can(method, identify=mode == "identify")
    sys.argv[0] = "gpushare"
    main()
