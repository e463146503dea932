"""Talking to a control daemon through its front-end, shaped by the front-end's traps.

``SubprocessMpsControl`` runs ``nvidia-cuda-mps-control`` once per command with the
device's pipe and log directories, writes the command, closes stdin at once (the front-end
answers only at EOF) and waits with a timeout, killing the front-end if the daemon hangs.
Commands to one daemon go through one lock: the daemon serves one UI at a time and silently
drops or fails concurrent ones. The exit status is ignored except for transport failures.

``MpsControlClient`` is what the rest of the agent calls: typed operations that retry an
empty getter answer, read every ``set_*`` back, and render limits the way MPS reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping

from agent.core.errors import MpsControlError, MpsDaemonDownError
from agent.mps import commands as cmd
from agent.mps.port import ControlChannel

REAL_CONTROL_BINARY = "nvidia-cuda-mps-control"
FAKE_CONTROL_BINARY = "gpushare-fake-mps-control"

log = logging.getLogger(__name__)

DAEMON_ABSENT = "Cannot find MPS control daemon process"


class SubprocessMpsControl:
    def __init__(self, binary: str, env: Mapping[str, str], *, timeout_s: float) -> None:
        self.binary = binary
        self._env = {**os.environ, **env}
        self._timeout_s = timeout_s
        self._lock = asyncio.Lock()
        self.spawned_pids: set[int] = set()

    async def execute(self, command: str) -> str:
        async with self._lock:
            return await self._run(command)

    async def _run(self, command: str) -> str:
        try:
            process = await asyncio.create_subprocess_exec(
                self.binary,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
            )
        except OSError as exc:
            raise MpsControlError(f"cannot run {self.binary}: {exc.strerror}") from exc
        self.spawned_pids.add(process.pid)
        try:
            out, err = await asyncio.wait_for(
                process.communicate((command + "\n").encode()), timeout=self._timeout_s
            )
        except TimeoutError:
            await _kill(process)
            raise MpsControlError(
                f"{command!r} got no answer within {self._timeout_s:g} s: "
                "the control daemon looks hung"
            ) from None
        finally:
            self.spawned_pids.discard(process.pid)
        return _answer(
            command, process.returncode, out.decode(errors="replace"), err.decode(errors="replace")
        )


def _answer(command: str, returncode: int | None, out: str, err: str) -> str:
    if returncode == 0:
        return out
    detail = (err.strip() or out.strip() or f"exit status {returncode}").splitlines()[0]
    if DAEMON_ABSENT in detail:
        raise MpsDaemonDownError(detail)
    raise MpsControlError(f"{command!r} failed: {detail}")


async def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    with contextlib.suppress(Exception):
        await process.wait()


class MpsControlClient:
    """Typed control operations over any :class:`ControlChannel`."""

    def __init__(
        self, channel: ControlChannel, *, empty_retries: int = 3, retry_delay_s: float = 0.05
    ) -> None:
        self._channel = channel
        self._empty_retries = empty_retries
        self._retry_delay_s = retry_delay_s

    async def run(self, command: cmd.Command) -> str:
        """Execute and check; a getter's empty answer is retried, then is an error."""
        for attempt in range(self._empty_retries + 1):
            answer = cmd.check(command, await self._channel.execute(command.text))
            if answer.strip() or not command.getter:
                return answer
            if attempt < self._empty_retries:
                await asyncio.sleep(self._retry_delay_s * (attempt + 1))
        raise MpsControlError(
            f"{command.text!r} answered nothing {self._empty_retries + 1} times "
            "(dropped by a busy daemon?)"
        )

    async def ping(self) -> float:
        """The liveness probe: the default thread percentage, read from the daemon."""
        return cmd.parse_thread_pct(await self.run(cmd.get_default_thread_pct()))

    async def server_pids(self) -> list[int]:
        return cmd.parse_pids(await self.run(cmd.get_server_list()))

    async def client_pids(self, server_pid: int) -> list[int]:
        return cmd.parse_pids(await self.run(cmd.get_client_list(server_pid)))

    async def default_thread_pct(self) -> float:
        return await self.ping()

    async def set_default_thread_pct(self, pct: float) -> float:
        await self.run(cmd.set_default_thread_pct(pct))
        return _same_pct("default active thread percentage", pct, await self.ping())

    async def default_memory_limit(self, device: int) -> int | None:
        return cmd.parse_memory_limit(await self.run(cmd.get_default_memory_limit(device)))

    async def set_default_memory_limit(self, device: int, limit_bytes: int | None) -> None:
        if limit_bytes is None:
            await self.run(cmd.clear_default_memory_limit(device))
        else:
            await self.run(cmd.set_default_memory_limit(device, limit_bytes))
        _same_limit(
            f"default pinned memory limit of device {device}",
            limit_bytes,
            await self.default_memory_limit(device),
        )

    async def set_server_thread_pct(self, server_pid: int, pct: float) -> float:
        await self.run(cmd.set_thread_pct(server_pid, pct))
        read = cmd.parse_thread_pct(await self.run(cmd.get_thread_pct(server_pid)))
        return _same_pct(f"active thread percentage of server {server_pid}", pct, read)

    async def set_server_memory_limit(self, server_pid: int, device: int, limit_bytes: int) -> None:
        await self.run(cmd.set_memory_limit(server_pid, device, limit_bytes))
        read = cmd.parse_memory_limit(await self.run(cmd.get_memory_limit(server_pid, device)))
        _same_limit(f"pinned memory limit of server {server_pid}", limit_bytes, read)

    async def terminate_client(self, server_pid: int, client_pid: int) -> None:
        command = cmd.terminate_client(server_pid, client_pid)
        cmd.parse_terminate_reply(await self._channel.execute(command.text))

    async def shutdown_server(self, server_pid: int, *, force: bool = False) -> None:
        await self.run(cmd.shutdown_server(server_pid, force=force))

    async def ps(self) -> list[cmd.PsRow]:
        return cmd.parse_ps(await self._channel.execute(cmd.ps().text))

    async def quit(self, timeout_s: int) -> None:
        await self.run(cmd.quit_daemon(timeout_s))


def _same_pct(what: str, wanted: float, read: float) -> float:
    if abs(read - round(wanted, 1)) > 0.05:
        raise MpsControlError(f"{what}: set {wanted:.1f} but the daemon reads back {read:.1f}")
    return read


def _same_limit(what: str, wanted: int | None, read: int | None) -> None:
    expected = None if wanted is None else (wanted // (1024 * 1024)) * 1024 * 1024
    if read != expected:
        raise MpsControlError(f"{what}: set {wanted} bytes but the daemon reads back {read}")
