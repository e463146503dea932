"""The MPS host: each device's control daemon run by a process apart from the agent
(``mps.launch: host``), so that replacing or upgrading the agent never restarts a daemon.

The host starts a daemon for every MPS device that has none (a live daemon holding its lock
is left alone), starts it again after a backoff when it exits, and quits them all when it is
stopped itself (SIGTERM: ``quit``, then SIGTERM, then SIGKILL). With ``mps.shm_root`` it
mounts each device's shared memory and starts the daemon in its mount namespace
(:mod:`agent.mps.shm`), and detaches that memory when it quits the daemon. The agent adopts these
daemons, applies their defaults and per-lease limits, and watches their health; it never
starts or stops them. A daemon the agent finds hung is killed by the agent and started
again here. Under Kubernetes the host runs in a DaemonSet of its own with
``updateStrategy: OnDelete``; under systemd in a unit of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from agent.core.errors import MpsError
from agent.core.types import Device, SharingMode
from agent.mps import daemon as proc
from agent.mps import shm
from agent.mps.control import MpsControlClient, SubprocessMpsControl
from agent.mps.limits import DaemonPaths, daemon_environment
from agent.mps.options import SupervisorOptions
from agent.mps.pipes import PipeWatch, resolve_access
from agent.mps.shmstate import OFF, Isolation

log = logging.getLogger(__name__)
HEALTHY_S = 30.0  # a daemon that ran this long restarts without added backoff


class DaemonKeeper:
    """Keeps one device's control daemon running."""

    def __init__(
        self,
        device: Device,
        options: SupervisorOptions,
        command_timeout_s: float,
        isolation: Isolation = OFF,
    ) -> None:
        self.device = device
        self.isolation = isolation
        self.options = options
        self.command_timeout_s = command_timeout_s
        self.paths = DaemonPaths(options.root_dir, device.uuid)
        self.env = daemon_environment(device, self.paths)
        self.process: proc.DaemonProcess | None = None
        self.starts = 0

    async def ensure_running(self) -> proc.DaemonProcess:
        """The live daemon of the device: the one holding the lock, else a new one."""
        access = resolve_access(self.options.client_gid, self.options.client_group)
        try:
            PipeWatch(self.paths, access).prepare()
        except OSError as exc:
            raise MpsError(f"cannot prepare {self.paths.base}: {exc}") from exc
        holder = proc.lock_holder(self.paths.pipe_dir)
        if holder:
            log.info("MPS host: daemon %d of %s is running: kept", holder, self.device.uuid)
            self.process = proc.DaemonProcess(holder)
            return self.process
        removed = proc.clear_stale_files(self.paths.pipe_dir)
        if removed:
            log.info("MPS host: removed %s of a dead daemon", ", ".join(removed))
        self.process = await shm.spawn(self.options, self.env, self.paths, isolation=self.isolation)
        self.starts += 1
        log.info("MPS host: started daemon %d of %s", self.process.pid, self.device.uuid)
        return self.process

    async def run(self) -> None:
        """Start the daemon, and again whenever it ends, until cancelled; a daemon that
        ends soon after its start doubles the wait before the next one."""
        failures = 0
        while True:
            started = time.monotonic()
            try:
                process = await self.ensure_running()
                status = await process.wait_exit()
                log.warning(
                    "MPS host: daemon %d of %s %s",
                    process.pid,
                    self.device.uuid,
                    proc.exit_text(status),
                )
            except MpsError as exc:
                log.error("MPS host: daemon of %s did not start: %s", self.device.uuid, exc)
            failures = 0 if time.monotonic() - started > HEALTHY_S else failures + 1
            delay = min(self.options.backoff_max_s, self.options.backoff_initial_s * 2**failures)
            await asyncio.sleep(delay)

    async def stop(self) -> str:
        """Quit the daemon (then SIGTERM, SIGKILL); how it ended."""
        process = self.process
        if process is None or not process.alive():
            self._release_shm()
            return "not running"
        channel = SubprocessMpsControl(
            self.options.binary, self.env, timeout_s=self.command_timeout_s
        )
        quit_sent = True
        try:
            await MpsControlClient(channel).quit(self.options.quit_timeout_s)
        except MpsError as exc:
            log.warning("MPS host: quit of daemon %d failed: %s", process.pid, exc)
            quit_sent = False
        how = await proc.stop_ladder(
            process,
            quit_sent=quit_sent,
            quit_wait_s=self.options.quit_timeout_s + 1.0,
            term_wait_s=2.0,
            device=self.device.uuid,
        )
        self._release_shm()
        return how

    def _release_shm(self) -> None:
        """The device's shared memory goes with its daemon: the next one gets a fresh tmpfs
        (containers still holding the old one keep it, and nobody else sees it)."""
        if self.isolation.isolated:
            shm.release_dir(self.options.shm, self.device.uuid)


class MpsHost:
    """One keeper per MPS device; :meth:`run` until cancelled, then :meth:`stop`."""

    def __init__(
        self, devices: Sequence[Device], options: SupervisorOptions, command_timeout_s: float
    ) -> None:
        self.options = options
        self.keepers = [
            DaemonKeeper(d, options, command_timeout_s)
            for d in devices
            if d.sharing_mode is SharingMode.MPS
        ]

    async def run(self) -> None:
        isolation = await shm.isolation_here(self.options.shm)
        for keeper in self.keepers:
            keeper.isolation = isolation
        log.info(
            "MPS host: keeping %d daemon(s); shared memory: %s",
            len(self.keepers),
            "one tmpfs per device"
            if isolation.isolated
            else f"the host's /dev/shm ({isolation.reason})",
        )
        async with asyncio.TaskGroup() as group:
            for keeper in self.keepers:
                group.create_task(keeper.run(), name=f"mps-host-{keeper.device.index}")

    async def stop(self) -> None:
        ended = await asyncio.gather(*(k.stop() for k in self.keepers))
        for keeper, how in zip(self.keepers, ended, strict=True):
            log.info("MPS host: daemon of %s stopped: %s", keeper.device.uuid, how)
