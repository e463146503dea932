"""The node's MPS daemons: one :class:`DaemonSupervisor` per device shared through MPS.

A device whose daemon cannot start is reported down (and ``/readyz`` says so); its
supervisor keeps retrying with backoff. Nothing is admitted onto a device whose daemon is
down: the agent fails closed.

With ``mps.shm_root`` each device's servers have shared memory of their own
(:mod:`agent.mps.shm`): :meth:`SupervisedMpsManager.shm_dir` names it for the container
edits, :meth:`SupervisedMpsManager.claim_shm` makes it ready for a container of a trust
domain. Whether the daemons this agent starts can get it is decided once at start
(:func:`agent.mps.shm.decide`); a daemon of the MPS host has whatever its record says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence

from agent.core.errors import GpuError, MpsError
from agent.core.mpsstate import MpsDaemonState
from agent.core.types import Device, SharingMode
from agent.mps import shm
from agent.mps.options import DaemonDefaults, SupervisorOptions
from agent.mps.port import EventSink
from agent.mps.shmstate import Isolation
from agent.mps.supervisor import (
    ChannelFactory,
    DaemonSupervisor,
    ExclusiveModeFn,
)
from agent.mps.version import check_release

log = logging.getLogger(__name__)


async def check_multi_user(binary: str) -> None:
    """Refuse ``-M`` unless the binary's help mentions it (the 535 binary has no such mode)."""
    try:
        process = await asyncio.create_subprocess_exec(
            binary,
            "-h",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(process.communicate(), timeout=5)
    except (OSError, TimeoutError) as exc:
        raise MpsError(f"cannot ask {binary} for its options: {exc}") from exc
    text = out.decode(errors="replace").lower()
    if "-m" not in text.split() and "multiuser" not in text and "multi-user" not in text:
        raise MpsError(f"{binary} does not support multi-user mode (-M); set mps.multi_user: false")


async def _no_driver() -> str | None:
    return None


class SupervisedMpsManager:
    def __init__(
        self,
        options: SupervisorOptions,
        defaults_for: Callable[[Device], DaemonDefaults],
        *,
        channel_factory: ChannelFactory,
        emit: EventSink,
        set_exclusive: ExclusiveModeFn,
        driver_version: Callable[[], Awaitable[str | None]] = _no_driver,
    ) -> None:
        self.backend = options.binary
        self._driver_version = driver_version
        self._options = options
        self._defaults_for = defaults_for
        self._channel_factory = channel_factory
        self._emit = emit
        self._set_exclusive = set_exclusive
        self.supervisors: dict[str, DaemonSupervisor] = {}

    async def _driver(self) -> str | None:
        try:
            return await self._driver_version()
        except GpuError as exc:
            log.warning("cannot read the driver version (%s): MPS binary not checked", exc)
            return None

    async def start(self, devices: Sequence[Device]) -> None:
        if any(d.sharing_mode is SharingMode.MPS for d in devices):
            check_release(self._options.binary, await self._driver())
        if self._options.multi_user:
            await check_multi_user(self._options.binary)
        isolation = await self._isolation()
        for device in devices:
            if device.sharing_mode is SharingMode.MPS:
                self.supervisors[device.uuid] = DaemonSupervisor(
                    device,
                    self._options,
                    self._defaults_for(device),
                    channel_factory=self._channel_factory,
                    emit=self._emit,
                    set_exclusive=self._set_exclusive,
                    isolation=isolation,
                )
        results = await asyncio.gather(
            *(s.start() for s in self.supervisors.values()), return_exceptions=True
        )
        for supervisor, result in zip(self.supervisors.values(), results, strict=True):
            if isinstance(result, MpsError):
                supervisor.detail = f"start failed: {result}"
                log.error("MPS daemon of %s did not start: %s", supervisor.device.uuid, result)
            elif isinstance(result, BaseException):
                raise result
        up = sum(s.up for s in self.supervisors.values())
        log.info(
            "MPS: %d of %d daemon(s) up, binary %s", up, len(self.supervisors), self._options.binary
        )

    async def _isolation(self) -> Isolation:
        """Whether the daemons this agent starts get shared memory of their own (never asked
        with mps.launch 'host': the host starts them, and says so in each record)."""
        if self._options.by_host:
            return Isolation(False, "mps.launch 'host': the MPS host starts the daemons")
        return await shm.isolation_here(self._options.shm)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for uuid, supervisor in self.supervisors.items():
                group.create_task(supervisor.run(), name=f"mps-supervisor-{uuid}")

    async def aclose(self, *, keep: bool = False) -> None:
        """Stop every daemon, or with ``keep`` leave them running for the next agent."""
        if keep:
            for supervisor in self.supervisors.values():
                supervisor.leave_running()
            return
        await asyncio.gather(*(s.stop() for s in self.supervisors.values()))
        with contextlib.suppress(OSError):
            os.rmdir(self._options.root_dir)  # only if no other daemon lives there

    def states(self) -> list[MpsDaemonState]:
        return [s.state() for s in self.supervisors.values()]

    def supervisor(self, device_uuid: str) -> DaemonSupervisor:
        return self.supervisors[device_uuid]

    async def refresh(self) -> None:
        for supervisor in self.supervisors.values():
            if supervisor.up:
                try:
                    await supervisor.refresh_servers()
                except MpsError as exc:
                    log.warning("cannot list MPS servers of %s: %s", supervisor.device.uuid, exc)

    async def terminate_client(self, device_uuid: str, server_pid: int, client_pid: int) -> None:
        supervisor = self._supervisor_of(device_uuid)
        await supervisor.client.terminate_client(server_pid, client_pid)
        supervisor.emit(
            "mps.client_terminated",
            f"client {client_pid} of server {server_pid} terminated",
            client_pid=str(client_pid),
            server_pid=str(server_pid),
        )

    async def shutdown_server(self, device_uuid: str, server_pid: int) -> None:
        supervisor = self._supervisor_of(device_uuid)
        await supervisor.client.shutdown_server(server_pid, force=True)
        supervisor.emit(
            "mps.server_shutdown", f"server {server_pid} shut down", server_pid=str(server_pid)
        )

    def shm_dir(self, device_uuid: str) -> str:
        """The host directory a client container of ``device_uuid`` gets at /dev/shm: its
        MPS servers' own; "" when they have none (no mps.shm_root, a legacy daemon, a
        starter that could not isolate it): then the caller's shared directory
        (kubelet.shm_dir, dra.shm_dir)."""
        supervisor = self.supervisors.get(device_uuid)
        return supervisor.memory.directory if supervisor is not None else ""

    async def claim_shm(self, device_uuid: str, trust_domain: str, *, sole: bool = False) -> str:
        """Before a container of ``trust_domain`` is handed the device's shared memory: when
        the directory last served another domain, the servers are shut down, it is emptied,
        the domain recorded and the defaults set again (read back). ``sole``: no other live
        lease is on the device, so a legacy daemon may be started again with its own.
        Returns what :meth:`shm_dir` returns now; raises :class:`MpsError` when nothing may
        be handed out (daemon down, a step failed)."""
        supervisor = self.supervisors.get(device_uuid)
        if supervisor is None:
            return ""  # not an MPS device
        return await supervisor.memory.claim(trust_domain, sole=sole)

    def _supervisor_of(self, device_uuid: str) -> DaemonSupervisor:
        supervisor = self.supervisors.get(device_uuid)
        if supervisor is None or not supervisor.up:
            raise MpsError(f"no running MPS daemon for device {device_uuid}")
        return supervisor
