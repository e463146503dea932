"""Helpers shared by integration and e2e tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from agent.config import Settings, load_settings
from agent.runtime.app import App, Ports

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def short_dir() -> Iterator[Path]:
    """A temporary directory with a short path: Unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sim_settings(root: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "paths.runtime_dir": str(root / "run"),
        "paths.state_dir": str(root / "state"),
        "api.http_listen": "127.0.0.1:0",
        "sim.enabled": True,
        "runtime.shutdown_grace_s": 5,
        "runtime.on_stop": "quit",
    }
    values.update(overrides)
    return load_settings(overrides=values)


def fake_ports(gpus: int = 2) -> Ports:
    """A simulated node's ports: ``gpus`` fake GPUs, fake MPS and telemetry."""
    from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
    from agent.mps.fake import FakeMpsManager

    return Ports(
        gpu=FakeGpuBackend.with_gpus(gpus),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource()],
        simulated=True,
    )


@contextlib.asynccontextmanager
async def running_app(
    settings: Settings,
    ports: Ports | None = None,
    *,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
) -> AsyncIterator[App]:
    """Run an App in this event loop until the block ends; fail if it does not come up."""
    app = App(settings, ports=ports, clock=clock, monotonic=monotonic)
    task = asyncio.create_task(app.run(), name="app-under-test")
    ready = asyncio.create_task(app.ready.wait())
    await asyncio.wait([task, ready], timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        ready.cancel()
        await asyncio.gather(ready, return_exceptions=True)
        await task  # raises the start-up error, if any
        raise AssertionError("the app stopped before it was ready")
    try:
        yield app
    finally:
        app.request_stop()
        await asyncio.wait_for(task, timeout=10)


def agent_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "agent", *args]


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    inherited = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{inherited}" if inherited else str(REPO)
    return env


def spawn_agent(root: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``gpushare serve --sim`` in ``root`` as a real process, logging to ``root/agent.log``
    (a pipe nobody reads would fill up and stall it)."""
    with open(root / "agent.log", "ab") as log:
        return subprocess.Popen(
            agent_command(
                "--socket",
                str(root / "agent.sock"),
                "serve",
                "--sim",
                "--http-listen",
                "",
                "--set",
                f"paths.runtime_dir={root}",
                "--set",
                f"paths.state_dir={root}/state",
                *extra,
            ),
            env=subprocess_env(),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )


class FakeClock:
    """A wall clock that moves only when told: scenario tests run windows instantly."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def run_bench_small(script: str, timeout_s: float, *extra: str) -> dict[str, Any]:
    """``bench/<script> --small`` as a process: it must exit 0; its last line, as JSON."""
    import json

    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), "--small", *extra],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result
