"""A daemon's exit is noticed at once, whether it is the agent's child or adopted by PID."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from agent.mps import daemon as proc

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


class Counting(proc.DaemonProcess):
    """Counts how often the process table is asked: polling would ask every 0.1-0.2 s."""

    checks = 0

    def alive(self) -> bool:
        self.checks += 1
        return super().alive()


async def _exit_after_signal(process: Counting, send: object) -> tuple[float, object]:
    waiting = asyncio.create_task(process.wait_exit())
    await asyncio.sleep(0.6)
    assert not waiting.done()
    started = time.monotonic()
    send()  # type: ignore[operator]
    status = await asyncio.wait_for(waiting, timeout=5)
    return time.monotonic() - started, status


async def test_a_child_daemon_exit_is_noticed_with_its_status() -> None:
    child = subprocess.Popen(SLEEPER)
    process = Counting(child.pid, child)
    elapsed_s, status = await _exit_after_signal(process, lambda: child.send_signal(signal.SIGTERM))
    assert status == -signal.SIGTERM
    assert elapsed_s < 0.5
    assert process.checks <= 3  # no polling while it ran


async def test_an_adopted_daemon_exit_is_noticed() -> None:
    # A process that is not our child: a shell starts it and exits, so init adopts it.
    script = f"{sys.executable} -c 'import time; time.sleep(60)' >/dev/null 2>&1 & echo $!"
    spawn = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    pid = int(spawn.stdout.strip())
    process = Counting(pid)
    assert process.adopted and process.alive()
    elapsed_s, status = await _exit_after_signal(process, lambda: os.kill(pid, signal.SIGKILL))
    assert status is None
    assert elapsed_s < 0.5
    assert process.checks <= 4  # no polling while it ran (one check in the assert above)
    assert not process.alive()


async def test_waiting_on_a_process_already_gone_returns_at_once() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    process = Counting(child.pid, child)
    assert await asyncio.wait_for(process.wait_exit(), timeout=1) == 0


async def test_without_pidfd_the_exit_is_still_noticed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(proc.os, "pidfd_open")
    child = subprocess.Popen(SLEEPER)
    process = Counting(child.pid, child)
    _, status = await _exit_after_signal(process, lambda: child.send_signal(signal.SIGKILL))
    assert status == -signal.SIGKILL
    assert process.checks >= 4  # polled
