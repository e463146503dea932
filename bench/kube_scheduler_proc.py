"""The scheduler stand-in of ``bench/kubernetes.py`` in a process of its own, as
kube-scheduler runs beside the API server rather than in its event loop.

The benchmark's side is :class:`RemoteScheduler`: the same figures as the in-process
``TimedScheduler`` (``bind_ms``, ``refused_ms``, ``refusals``, ``on_bound``), read from the
child's output. The child is this file run as a program: its settings come as one JSON line
on stdin (the API token among them, so it is never on a command line), and it prints one
JSON line per answered ``/bind``: ``{"bound": uid, "ms": ...}`` or ``{"refused": gist,
"ms": ...}``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHILD = str(Path(__file__).resolve())


class RemoteScheduler:
    def __init__(self, api_url: str, extender_url: str, nodes: list[str], *, token: str) -> None:
        self.settings = {
            "api_url": api_url,
            "extender_url": extender_url,
            "nodes": nodes,
            "token": token,
        }
        self.bind_ms: list[float] = []
        self.refused_ms: list[float] = []
        self.refusals: Counter[str] = Counter()
        self.on_bound: Any = None
        self._process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> RemoteScheduler:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
            await self._process.wait()

    async def run(self, *, concurrency: int) -> None:
        """Start the child and follow its binds until cancelled."""
        from tests.helpers import subprocess_env

        self._process = process = await asyncio.create_subprocess_exec(
            sys.executable,
            CHILD,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=subprocess_env(),
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps({**self.settings, "cycles": concurrency}).encode() + b"\n")
        await process.stdin.drain()
        process.stdin.close()
        async for line in process.stdout:
            self._record(json.loads(line))
        raise RuntimeError(f"the scheduler process exited with {await process.wait()}")

    def _record(self, answer: dict[str, Any]) -> None:
        if "bound" in answer:
            self.bind_ms.append(answer["ms"])
            if self.on_bound is not None:
                self.on_bound(answer["bound"])
        else:
            self.refused_ms.append(answer["ms"])
            self.refusals[answer["refused"]] += 1


async def _child() -> None:
    sys.path.insert(0, str(REPO))
    from bench.kubernetes_figures import TimedScheduler, _gist

    settings = json.loads(sys.stdin.readline())

    class Reporting(TimedScheduler):
        async def _post(self, url: str, body: Any) -> Any:
            result = await super()._post(url, body)
            if url.endswith("/bind"):
                if result.get("Error"):
                    answer = {"refused": _gist(result["Error"]), "ms": self.refused_ms[-1]}
                else:
                    answer = {"bound": body["PodUID"], "ms": self.bind_ms[-1]}
                sys.stdout.write(json.dumps(answer) + "\n")
                sys.stdout.flush()
            return result

    scheduler = Reporting(
        settings["api_url"], settings["extender_url"], settings["nodes"], token=settings["token"]
    )
    async with scheduler:
        await scheduler.run(concurrency=settings["cycles"])


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_child())
